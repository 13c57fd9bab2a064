// Step windows and markers (see navigation.hpp).
#include "orrery/gui/navigation.hpp"

#include <algorithm>
#include <map>

namespace orrery::gui {

std::vector<StepWindow> step_windows(const traces::Trace& t) {
  std::map<int32_t, StepWindow> by_step;
  for (const auto& s : t.spans) {
    if (s.step < 0) continue;
    auto [it, fresh] = by_step.try_emplace(s.step, StepWindow{s.step, s.start_ns, s.end_ns});
    if (!fresh) {
      it->second.start_ns = std::min(it->second.start_ns, s.start_ns);
      it->second.end_ns = std::max(it->second.end_ns, s.end_ns);
    }
  }
  std::vector<StepWindow> out;
  out.reserve(by_step.size());
  for (const auto& [step, w] : by_step) out.push_back(w);
  return out;
}

std::optional<StepWindow> find_step(const std::vector<StepWindow>& steps, int32_t step) {
  auto it = std::lower_bound(steps.begin(), steps.end(), step,
                             [](const StepWindow& w, int32_t s) { return w.step < s; });
  if (it == steps.end() || it->step != step) return std::nullopt;
  return *it;
}

bool Markers::add(int64_t t_ns) {
  auto it = std::lower_bound(times_.begin(), times_.end(), t_ns);
  if (it != times_.end() && *it == t_ns) return false;
  times_.insert(it, t_ns);
  return true;
}

bool Markers::remove_near(int64_t t_ns, int64_t tolerance_ns) {
  auto best = times_.end();
  int64_t best_d = tolerance_ns;
  for (auto it = times_.begin(); it != times_.end(); ++it) {
    const int64_t d = *it > t_ns ? *it - t_ns : t_ns - *it;
    if (d <= best_d) {
      best_d = d;
      best = it;
    }
  }
  if (best == times_.end()) return false;
  times_.erase(best);
  return true;
}

std::optional<int64_t> Markers::next_after(int64_t t_ns) const {
  if (times_.empty()) return std::nullopt;
  auto it = std::upper_bound(times_.begin(), times_.end(), t_ns);
  return it == times_.end() ? times_.front() : *it;
}

std::optional<int64_t> Markers::previous_before(int64_t t_ns) const {
  if (times_.empty()) return std::nullopt;
  auto it = std::lower_bound(times_.begin(), times_.end(), t_ns);
  return it == times_.begin() ? times_.back() : *(it - 1);
}

}  // namespace orrery::gui
