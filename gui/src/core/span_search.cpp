// Name search over a trace's spans.
#include "orrery/gui/span_search.hpp"

#include <algorithm>
#include <cctype>

namespace orrery::gui {
namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

void SpanSearch::clear() {
  trace_ = nullptr;
  matches_.clear();
  current_ = -1;
}

void SpanSearch::run(const traces::Trace& t, const std::string& query, KindMask kinds) {
  clear();
  trace_ = &t;
  if (query.empty()) return;
  const std::string q = lower(query);
  std::vector<char> name_hit(t.strings.size(), 0);
  for (size_t i = 0; i < t.strings.size(); ++i) {
    name_hit[i] = lower(t.strings.all()[i]).find(q) != std::string::npos;
  }
  for (size_t i = 0; i < t.spans.size(); ++i) {
    const auto& s = t.spans[i];
    if (s.name < name_hit.size() && name_hit[s.name] && (kinds & kind_bit(s.kind))) {
      matches_.push_back(static_cast<uint32_t>(i));
    }
  }
  std::stable_sort(matches_.begin(), matches_.end(), [&](uint32_t a, uint32_t b) {
    const auto& x = t.spans[a];
    const auto& y = t.spans[b];
    if (x.start_ns != y.start_ns) return x.start_ns < y.start_ns;
    if (x.rank != y.rank) return x.rank < y.rank;
    return x.stream < y.stream;
  });
}

int64_t SpanSearch::next() {
  if (matches_.empty()) return -1;
  current_ = (current_ + 1) % static_cast<int64_t>(matches_.size());
  return matches_[static_cast<size_t>(current_)];
}

int64_t SpanSearch::previous() {
  if (matches_.empty()) return -1;
  const auto n = static_cast<int64_t>(matches_.size());
  current_ = current_ <= 0 ? n - 1 : current_ - 1;
  return matches_[static_cast<size_t>(current_)];
}

int64_t SpanSearch::first_at_or_after(int64_t t_ns) {
  if (matches_.empty() || !trace_) return -1;
  auto it = std::lower_bound(matches_.begin(), matches_.end(), t_ns, [&](uint32_t a, int64_t t) {
    return trace_->spans[a].start_ns < t;
  });
  if (it == matches_.end()) it = matches_.begin();
  current_ = it - matches_.begin();
  return *it;
}

}  // namespace orrery::gui
