// Counter tracks (see counter_tracks.hpp).
#include "orrery/gui/counter_tracks.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>

#include "orrery/common/format.hpp"

namespace orrery::gui {

std::vector<CounterTrack> counter_tracks(const traces::Trace& t) {
  std::map<std::pair<int32_t, std::string>, std::vector<size_t>> by_track;
  for (size_t i = 0; i < t.counters.size(); ++i) {
    const auto& c = t.counters[i];
    by_track[{c.rank, t.strings.str(c.name)}].push_back(i);
  }
  std::vector<CounterTrack> out;
  out.reserve(by_track.size());
  for (auto& [key, ids] : by_track) {
    std::stable_sort(ids.begin(), ids.end(),
                     [&](size_t a, size_t b) { return t.counters[a].ts_ns < t.counters[b].ts_ns; });
    CounterTrack tr;
    tr.rank = key.first;
    tr.name = key.second;
    tr.ts_ns.reserve(ids.size());
    tr.value.reserve(ids.size());
    for (size_t i : ids) {
      tr.ts_ns.push_back(t.counters[i].ts_ns);
      tr.value.push_back(t.counters[i].value);
    }
    tr.min = *std::min_element(tr.value.begin(), tr.value.end());
    tr.max = *std::max_element(tr.value.begin(), tr.value.end());
    out.push_back(std::move(tr));
  }
  return out;
}

std::optional<double> counter_value_at(const CounterTrack& c, int64_t t_ns) {
  const auto it = std::upper_bound(c.ts_ns.begin(), c.ts_ns.end(), t_ns);
  if (it == c.ts_ns.begin()) return std::nullopt;
  return c.value[static_cast<size_t>(it - c.ts_ns.begin()) - 1];
}

void fold_counter(const CounterTrack& c, const TimeMapping& m, int width_px, int64_t end_ns,
                  std::vector<CounterColumn>& out) {
  if (c.ts_ns.empty() || width_px <= 0) return;
  const int64_t last_t = std::max(end_ns, c.ts_ns.back());
  // The first column with a value, and the sample in effect at its left edge.
  int x = 0;
  size_t i = static_cast<size_t>(std::upper_bound(c.ts_ns.begin(), c.ts_ns.end(), m.t_floor(0)) -
                                 c.ts_ns.begin());
  if (i == 0) {
    const double x_first = m.x_of(c.ts_ns.front());
    if (x_first >= width_px) return;
    x = std::max(0, static_cast<int>(std::floor(x_first)));
  }
  double cur = i > 0 ? c.value[i - 1] : c.value.front();
  for (; x < width_px; ++x) {
    const int64_t col_t0 = m.t_floor(x);
    if (col_t0 > last_t) break;
    const int64_t col_end = m.t_floor(x + 1);  // samples before the next column's start
    CounterColumn col;
    col.x = x;
    col.lo = col.hi = cur;
    bool any = i > 0;
    while (i < c.ts_ns.size() && c.ts_ns[i] < col_end) {
      cur = c.value[i];
      if (!any) {
        col.lo = col.hi = cur;
        any = true;
      }
      col.lo = std::min(col.lo, cur);
      col.hi = std::max(col.hi, cur);
      ++i;
    }
    if (!any) continue;
    col.last = cur;
    out.push_back(col);
  }
}

std::string format_counter(const std::string& name, double v) {
  if (name.rfind("mem.", 0) == 0) return format_bytes(v);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace orrery::gui
