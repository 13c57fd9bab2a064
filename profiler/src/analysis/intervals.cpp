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
  a.window_ns = we - ws;
  // One sweep over the window's boundaries of the four merged lists, no allocation: between two
  // boundaries each list either covers the time or not.
  const std::vector<Interval>* lists[4] = {&merged.compute, &merged.tp, &merged.dp, &merged.p2p};
  size_t at[4];
  for (int k = 0; k < 4; ++k) {
    const auto& v = *lists[k];
    at[k] = size_t(std::upper_bound(v.begin(), v.end(), ws,
                                    [](int64_t x, const Interval& iv) { return x < iv.end_ns; }) -
                   v.begin());
  }
  int64_t t = ws;
  while (t < we) {
    bool in[4];
    int64_t next = we;
    for (int k = 0; k < 4; ++k) {
      const auto& v = *lists[k];
      in[k] = at[k] < v.size() && v[at[k]].start_ns <= t;
      if (at[k] < v.size()) next = std::min(next, in[k] ? v[at[k]].end_ns : v[at[k]].start_ns);
    }
    const int64_t len = next - t;
    if (in[0]) {
      a.compute_ns += len;
    } else if (in[1]) {
      a.exposed_tp_ns += len;
    } else if (in[2]) {
      a.exposed_dp_ns += len;
    } else {
      a.rest_ns += len;
      if (in[3]) a.p2p_ns += len;
    }
    t = next;
    for (int k = 0; k < 4; ++k)
      while (at[k] < lists[k]->size() && (*lists[k])[at[k]].end_ns <= t) ++at[k];
  }
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
