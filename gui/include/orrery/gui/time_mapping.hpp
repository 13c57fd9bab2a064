// Time <-> pixel mapping of a timeline and the time axis ticks drawn above it.
//
// Kept apart from any widget so zooming, panning and the axis labels are tested without painting.
// The origin is an integer nanosecond plus a fraction, so zooming in far on a trace whose clock
// reads 1.7e18 ns (Unix epoch) stays exact to the pixel; a double alone would round to 256 ns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace orrery::gui {

struct TimeMapping {
  static constexpr double kMinNsPerPx = 1e-2;  // 1 ns spans 100 px at the deepest zoom
  static constexpr double kMaxNsPerPx = 1e12;

  int64_t origin_ns = 0;    // integer part of the time at x = 0
  double origin_frac = 0;   // fractional part, in [0, 1)
  double ns_per_px = 1;

  // x of time t (x = 0 is the left edge of the track area).
  double x_of(int64_t t_ns) const {
    return (static_cast<double>(t_ns - origin_ns) - origin_frac) / ns_per_px;
  }
  // Time at x, rounded down / up to whole nanoseconds.
  int64_t t_floor(double x) const;
  int64_t t_ceil(double x) const;

  // Zooms by `factor` (> 1 zooms in) keeping the time under anchor_x where it is.
  void zoom(double factor, double anchor_x);
  // Moves the content right by dx pixels (a drag to the right shows earlier times).
  void pan_px(double dx);
  // Shows [t0, t1] across width_px (at least 1 ns).
  void fit(int64_t t0_ns, int64_t t1_ns, double width_px);

 private:
  void shift_ns(double delta_ns);  // origin += delta, renormalising the fraction
};

struct AxisTick {
  int64_t t_ns = 0;   // absolute time of the tick
  double x = 0;       // its x under the mapping
  std::string label;  // relative to the axis zero, with a unit ("1.5 ms")
};

struct AxisTicks {
  int64_t step_ns = 0;    // 1, 2 or 5 times a power of ten
  std::string unit;       // "ns", "us", "ms" or "s": the largest unit not above the largest label
  std::vector<AxisTick> ticks;
};

// Ticks visible across [0, width_px], at least min_spacing_px apart, labelled relative to zero_ns.
AxisTicks compute_ticks(const TimeMapping& m, double width_px, int64_t zero_ns,
                        double min_spacing_px = 90);

// A tick label: value_ns in the largest unit not above max(step_ns, magnitude_ns) (the largest
// value on the axis), with as many decimals as the step needs to tell neighbouring ticks apart.
std::string format_tick(int64_t value_ns, int64_t step_ns, int64_t magnitude_ns = 0);

}  // namespace orrery::gui
