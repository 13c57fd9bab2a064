// The router's load step by step (see expert_load.hpp).
#include "orrery/gui/expert_load.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

namespace orrery::gui {

bool parse_moe_counter(const std::string& name, int& layer, int& expert) {
  char close = 0;
  expert = -1;
  if (std::sscanf(name.c_str(), "moe.tokens[l=%d,e=%d%c", &layer, &expert, &close) == 3)
    return close == ']' && layer >= 0 && expert >= 0;
  expert = -1;
  return std::sscanf(name.c_str(), "moe.dropped[l=%d%c", &layer, &close) == 2 && close == ']' &&
         layer >= 0;
}

int ExpertLoad::max_experts() const {
  return experts_.empty() ? 0 : *std::max_element(experts_.begin(), experts_.end());
}

size_t ExpertLoad::at(int step, int block) const {
  const int s = step == kAllSteps ? steps_ : step;
  return static_cast<size_t>(s) * layers_.size() + static_cast<size_t>(block);
}

double ExpertLoad::tokens(int step, int block, int expert) const {
  return tokens_[at(step, block) * static_cast<size_t>(width_) + static_cast<size_t>(expert)];
}

double ExpertLoad::dropped(int step, int block) const { return dropped_[at(step, block)]; }

double ExpertLoad::total(int step, int block) const {
  double n = 0;
  for (int e = 0; e < experts(block); ++e) n += tokens(step, block, e);
  return n;
}

double ExpertLoad::mean(int step, int block) const {
  return experts(block) > 0 ? total(step, block) / experts(block) : 0;
}

double ExpertLoad::imbalance(int step, int block) const {
  const double m = mean(step, block);
  if (m <= 0) return 0;
  double mx = 0;
  for (int e = 0; e < experts(block); ++e) mx = std::max(mx, tokens(step, block, e));
  return mx / m;
}

double ExpertLoad::share(int step, int block, int expert) const {
  const double m = mean(step, block);
  return m > 0 ? tokens(step, block, expert) / m : 0;
}

double ExpertLoad::dropped_fraction(int step, int block) const {
  const double t = total(step, block);
  return t > 0 ? dropped(step, block) / t : 0;
}

ExpertLoad::Worst ExpertLoad::worst() const {
  Worst w;
  for (int s = 0; s < steps_; ++s)
    for (int b = 0; b < blocks(); ++b)
      if (const double x = imbalance(s, b); x > w.imbalance) w = {s, b, x};
  return w;
}

ExpertLoad expert_load(const std::vector<CounterTrack>& tracks) {
  struct Moe {
    const CounterTrack* track;
    int layer, expert;
  };
  std::vector<Moe> moe;
  std::map<int, int> width;  // layer -> highest expert + 1
  std::set<int32_t> ranks;
  ExpertLoad out;
  for (const CounterTrack& c : tracks) {
    int layer = 0, expert = -1;
    if (!parse_moe_counter(c.name, layer, expert)) continue;
    moe.push_back({&c, layer, expert});
    int& w = width[layer];
    w = std::max(w, expert + 1);
    ranks.insert(c.rank);
    out.steps_ = std::max(out.steps_, static_cast<int>(c.value.size()));
  }
  if (moe.empty()) return out;
  std::map<int, int> block_of;
  for (const auto& [layer, w] : width) {
    block_of[layer] = static_cast<int>(out.layers_.size());
    out.layers_.push_back(layer);
    out.experts_.push_back(w);
    out.width_ = std::max(out.width_, w);
  }
  out.ranks_ = static_cast<int>(ranks.size());
  const size_t rows = static_cast<size_t>(out.steps_ + 1) * out.layers_.size();
  out.tokens_.assign(rows * static_cast<size_t>(out.width_), 0.0);
  out.dropped_.assign(rows, 0.0);
  for (const Moe& m : moe) {
    const int b = block_of[m.layer];
    for (size_t k = 0; k < m.track->value.size(); ++k) {
      const double v = m.track->value[k];
      for (int s : {static_cast<int>(k), static_cast<int>(ExpertLoad::kAllSteps)}) {
        if (m.expert < 0)
          out.dropped_[out.at(s, b)] += v;
        else
          out.tokens_[out.at(s, b) * static_cast<size_t>(out.width_) +
                      static_cast<size_t>(m.expert)] += v;
      }
    }
  }
  return out;
}

}  // namespace orrery::gui
