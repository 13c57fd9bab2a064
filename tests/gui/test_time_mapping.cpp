// The time<->pixel mapping and the time axis: exact positions, zoom around an anchor, pan, fit and
// the adaptive tick step and labels.
#include <gtest/gtest.h>

#include "orrery/gui/time_mapping.hpp"

using orrery::gui::AxisTicks;
using orrery::gui::compute_ticks;
using orrery::gui::format_tick;
using orrery::gui::TimeMapping;

TEST(TimeMapping, FitMapsTheRangeOntoTheWidth) {
  TimeMapping m;
  m.fit(1000, 2000, 100);
  EXPECT_DOUBLE_EQ(m.ns_per_px, 10.0);
  EXPECT_DOUBLE_EQ(m.x_of(1000), 0.0);
  EXPECT_DOUBLE_EQ(m.x_of(1500), 50.0);
  EXPECT_DOUBLE_EQ(m.x_of(2000), 100.0);
  EXPECT_EQ(m.t_floor(50), 1500);
  EXPECT_EQ(m.t_floor(50.05), 1500);
  EXPECT_EQ(m.t_ceil(50.05), 1501);
}

TEST(TimeMapping, ZoomKeepsTheAnchorInPlace) {
  TimeMapping m;
  m.fit(0, 1000, 100);  // 10 ns/px
  m.zoom(2.0, 50);      // the time at x = 50 (500 ns) stays at x = 50
  EXPECT_DOUBLE_EQ(m.ns_per_px, 5.0);
  EXPECT_DOUBLE_EQ(m.x_of(500), 50.0);
  EXPECT_EQ(m.origin_ns, 250);
  m.zoom(0.5, 0);  // zoom out around the left edge: the origin stays
  EXPECT_DOUBLE_EQ(m.ns_per_px, 10.0);
  EXPECT_EQ(m.origin_ns, 250);
}

TEST(TimeMapping, DeepZoomOnEpochTimestampsStaysExact) {
  // 1.7e18 ns (a Unix-epoch clock) is beyond a double's integer precision (2^53 ~ 9e15); the
  // integer origin keeps the anchor exact to the nanosecond after zooming in a million times.
  const int64_t t0 = 1'700'000'000'123'456'789;
  TimeMapping m;
  m.fit(t0, t0 + 1'000'000'000, 1000);  // 1 s across 1000 px
  const int64_t anchor_t = m.t_floor(333);
  for (int i = 0; i < 20; ++i) m.zoom(2.0, 333);
  EXPECT_NEAR(m.ns_per_px, 1e6 / (1 << 20), 1e-9);
  EXPECT_NEAR(m.x_of(anchor_t), 333.0, 1e-3);
  EXPECT_EQ(m.t_floor(333), anchor_t);
}

TEST(TimeMapping, PanMovesTheContent) {
  TimeMapping m;
  m.fit(0, 1000, 100);
  m.pan_px(10);  // drag right by 10 px: earlier times come into view
  EXPECT_EQ(m.origin_ns, -100);
  EXPECT_DOUBLE_EQ(m.x_of(0), 10.0);
  m.pan_px(-2.5);
  EXPECT_EQ(m.origin_ns, -75);
  EXPECT_DOUBLE_EQ(m.origin_frac, 0.0);
  m.zoom(4.0, 0);
  m.pan_px(0.1);  // 0.25 ns: kept as a fraction
  EXPECT_EQ(m.origin_ns, -76);
  EXPECT_DOUBLE_EQ(m.origin_frac, 0.75);
}

TEST(TimeMapping, ZoomIsClamped) {
  TimeMapping m;
  m.fit(0, 1000, 100);
  m.zoom(1e9, 0);
  EXPECT_DOUBLE_EQ(m.ns_per_px, TimeMapping::kMinNsPerPx);
  m.zoom(1e-30, 0);
  EXPECT_DOUBLE_EQ(m.ns_per_px, TimeMapping::kMaxNsPerPx);
}

TEST(TimeAxis, StepIsOneTwoFiveAndLabelsShareAUnit) {
  TimeMapping m;
  m.fit(0, 1'000'000, 1000);  // 1 us per px; 90 px -> at least 90 us -> 100 us
  const AxisTicks t = compute_ticks(m, 1000, 0, 90);
  EXPECT_EQ(t.step_ns, 100'000);
  EXPECT_EQ(t.unit, "ms");
  ASSERT_EQ(t.ticks.size(), 11u);
  EXPECT_EQ(t.ticks[0].label, "0.0 ms");
  EXPECT_EQ(t.ticks[1].label, "0.1 ms");
  EXPECT_EQ(t.ticks[10].label, "1.0 ms");
  EXPECT_DOUBLE_EQ(t.ticks[3].x, 300.0);
}

TEST(TimeAxis, AdaptsToTheZoomLevel) {
  TimeMapping m;
  m.fit(0, 200, 1000);  // 0.2 ns/px: 90 px = 18 ns -> 20 ns steps
  AxisTicks t = compute_ticks(m, 1000, 0, 90);
  EXPECT_EQ(t.step_ns, 20);
  EXPECT_EQ(t.unit, "ns");
  EXPECT_EQ(t.ticks[1].label, "20 ns");
  m.fit(0, 50'000'000'000, 1000);  // 50 ms/px: 4.5 s -> 5 s steps
  t = compute_ticks(m, 1000, 0, 90);
  EXPECT_EQ(t.step_ns, 5'000'000'000);
  EXPECT_EQ(t.unit, "s");
  EXPECT_EQ(t.ticks[2].label, "10 s");
}

TEST(TimeAxis, LabelsAreRelativeToZero) {
  TimeMapping m;
  m.fit(1'000'500, 1'001'500, 100);  // 10 ns/px: 50 px -> 500 ns
  const AxisTicks t = compute_ticks(m, 100, 1'000'000, 50);
  EXPECT_EQ(t.step_ns, 500);
  ASSERT_EQ(t.ticks.size(), 3u);
  EXPECT_EQ(t.ticks[1].label, "1.0 us");
  ASSERT_FALSE(t.ticks.empty());
  EXPECT_EQ(t.ticks[0].t_ns, 1'000'500);
  EXPECT_EQ(t.ticks[0].label, "0.5 us");
  EXPECT_EQ(t.ticks.back().label, "1.5 us");
}

TEST(TimeAxis, FormatTick) {
  EXPECT_EQ(format_tick(2'500'000'000, 500'000'000, 2'500'000'000), "2.5 s");
  EXPECT_EQ(format_tick(2'500'000'000, 500'000'000), "2500 ms");  // the unit follows the step alone
  EXPECT_EQ(format_tick(1500, 500, 2000), "1.5 us");
  EXPECT_EQ(format_tick(-200, 100), "-200 ns");
  EXPECT_EQ(format_tick(30'000'000, 10'000'000, 1'000'000'000), "0.03 s");
}
