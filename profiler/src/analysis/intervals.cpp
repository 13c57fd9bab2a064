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
