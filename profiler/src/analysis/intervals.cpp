// Interval arithmetic behind the metrics: merging, total length and intersection of merged lists.
#include <algorithm>

#include "orrery/profiler/metrics.hpp"

namespace orrery::profiler {

std::vector<Interval> merge_intervals(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(),
            [](const Interval& a, const Interval& b) { return a.start_ns < b.start_ns; });
  size_t out = 0;
  for (const Interval& iv : v) {
    if (iv.end_ns <= iv.start_ns) continue;  // empty intervals cover no time
    if (out > 0 && iv.start_ns <= v[out - 1].end_ns) {
      v[out - 1].end_ns = std::max(v[out - 1].end_ns, iv.end_ns);
    } else {
      v[out++] = iv;
    }
  }
  v.resize(out);
  return v;
}

int64_t total_length(const std::vector<Interval>& merged) {
  int64_t sum = 0;
  for (const Interval& iv : merged) sum += iv.end_ns - iv.start_ns;
  return sum;
}

int64_t intersection_length(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  int64_t sum = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].start_ns, b[j].start_ns);
    const int64_t hi = std::min(a[i].end_ns, b[j].end_ns);
    if (hi > lo) sum += hi - lo;
    if (a[i].end_ns < b[j].end_ns) {
      ++i;
    } else {
      ++j;
    }
  }
  return sum;
}

namespace {

// The part of merged list m inside [a, b).
std::vector<Interval> clip(const std::vector<Interval>& m, int64_t a, int64_t b) {
  std::vector<Interval> out;
  auto it = std::upper_bound(m.begin(), m.end(), a,
                             [](int64_t x, const Interval& v) { return x < v.end_ns; });
  for (; it != m.end() && it->start_ns < b; ++it) {
    const Interval x{std::max(it->start_ns, a), std::min(it->end_ns, b)};
    if (x.end_ns > x.start_ns) out.push_back(x);
  }
  return out;
}

std::vector<Interval> unite(std::vector<Interval> a, const std::vector<Interval>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return merge_intervals(std::move(a));
}

}  // namespace

StepAccount& StepAccount::operator+=(const StepAccount& o) {
  window_ns += o.window_ns;
  compute_ns += o.compute_ns;
  exposed_tp_ns += o.exposed_tp_ns;
  exposed_dp_ns += o.exposed_dp_ns;
  p2p_ns += o.p2p_ns;
  rest_ns += o.rest_ns;
  return *this;
}

StepAccount account_step(const StepIntervals& merged, int64_t ws, int64_t we) {
  StepAccount a;
  if (we <= ws) return a;
  const auto C = clip(merged.compute, ws, we), TP = clip(merged.tp, ws, we),
             DP = clip(merged.dp, ws, we), PP = clip(merged.p2p, ws, we);
  const auto C_TP = unite(C, TP);
  const auto busy = unite(C_TP, DP);
  a.window_ns = we - ws;
  a.compute_ns = total_length(C);
  a.exposed_tp_ns = total_length(TP) - intersection_length(TP, C);
  a.exposed_dp_ns = total_length(DP) - intersection_length(DP, C_TP);
  a.p2p_ns = total_length(PP) - intersection_length(PP, busy);
  a.rest_ns = a.window_ns - total_length(busy);
  return a;
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  q = std::clamp(q, 0.0, 1.0);
  const double pos = q * double(values.size() - 1);
  const auto lo = static_cast<size_t>(pos);
  const double frac = pos - double(lo);
  if (lo + 1 >= values.size()) return values.back();
  return values[lo] + frac * (values[lo + 1] - values[lo]);
}

}  // namespace orrery::profiler
