// Time <-> pixel mapping: zoom around an anchor, pan, fit, and adaptive time-axis ticks.
#include "orrery/gui/time_mapping.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace orrery::gui {

int64_t TimeMapping::t_floor(double x) const {
  const double rel = origin_frac + x * ns_per_px;
  return origin_ns + static_cast<int64_t>(std::floor(rel));
}

int64_t TimeMapping::t_ceil(double x) const {
  const double rel = origin_frac + x * ns_per_px;
  return origin_ns + static_cast<int64_t>(std::ceil(rel));
}

void TimeMapping::shift_ns(double delta_ns) {
  const double f = origin_frac + delta_ns;
  const double whole = std::floor(f);
  origin_ns += static_cast<int64_t>(whole);
  origin_frac = f - whole;
}

void TimeMapping::zoom(double factor, double anchor_x) {
  if (!(factor > 0)) return;
  const double npp = std::clamp(ns_per_px / factor, kMinNsPerPx, kMaxNsPerPx);
  // The anchor's time is origin + anchor_x * npp before and after: move the origin by the difference.
  shift_ns(anchor_x * (ns_per_px - npp));
  ns_per_px = npp;
}

void TimeMapping::pan_px(double dx) { shift_ns(-dx * ns_per_px); }

void TimeMapping::fit(int64_t t0_ns, int64_t t1_ns, double width_px) {
  if (t1_ns <= t0_ns) t1_ns = t0_ns + 1;
  if (width_px < 1) width_px = 1;
  origin_ns = t0_ns;
  origin_frac = 0;
  ns_per_px = std::clamp(static_cast<double>(t1_ns - t0_ns) / width_px, kMinNsPerPx, kMaxNsPerPx);
}

namespace {

struct Unit {
  int64_t ns;
  const char* name;
};
constexpr Unit kUnits[] = {{1'000'000'000, "s"}, {1'000'000, "ms"}, {1'000, "us"}, {1, "ns"}};

const Unit& unit_for(int64_t step_ns) {
  for (const auto& u : kUnits) {
    if (step_ns >= u.ns) return u;
  }
  return kUnits[3];
}

}  // namespace

std::string format_tick(int64_t value_ns, int64_t step_ns, int64_t magnitude_ns) {
  step_ns = std::max<int64_t>(step_ns, 1);
  // The unit suits the largest value on the axis, so every label on it uses the same unit.
  const Unit& u = unit_for(std::max(step_ns, magnitude_ns));
  // As many decimals as the step needs: a 200 us step in ms needs one ("0.2 ms", "0.4 ms").
  int decimals = 0;
  for (int64_t scaled = step_ns; scaled % u.ns != 0 && decimals < 9; scaled *= 10) ++decimals;
  const long double v = static_cast<long double>(value_ns) / static_cast<long double>(u.ns);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*Lf %s", decimals, v, u.name);
  return buf;
}

AxisTicks compute_ticks(const TimeMapping& m, double width_px, int64_t zero_ns,
                        double min_spacing_px) {
  AxisTicks out;
  const double min_step_ns = std::max(1.0, m.ns_per_px * min_spacing_px);
  int64_t step = 1;
  for (int64_t decade = 1;; decade *= 10) {
    bool found = false;
    for (int64_t mult : {1, 2, 5}) {
      if (static_cast<double>(decade * mult) >= min_step_ns) {
        step = decade * mult;
        found = true;
        break;
      }
    }
    if (found || decade > INT64_MAX / 100) break;
  }
  out.step_ns = step;
  const int64_t t0 = m.t_floor(0) - zero_ns;
  const int64_t t1 = m.t_ceil(width_px) - zero_ns;
  const int64_t magnitude = std::max({step, t0 < 0 ? -t0 : t0, t1 < 0 ? -t1 : t1});
  out.unit = unit_for(magnitude).name;
  // First multiple of step at or after t0 (floor division that works for negative t0).
  int64_t first = t0 / step * step;
  if (first < t0) first += step;
  for (int64_t rel = first; rel <= t1; rel += step) {
    AxisTick tick;
    tick.t_ns = zero_ns + rel;
    tick.x = m.x_of(tick.t_ns);
    tick.label = format_tick(rel, step, magnitude);
    out.ticks.push_back(std::move(tick));
    if (out.ticks.size() > 10000) break;  // a guard; the spacing keeps it to width/min_spacing
  }
  return out;
}

}  // namespace orrery::gui
