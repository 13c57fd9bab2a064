// The router's load step by step (gui/expert_load.hpp): closed forms on a hand-built trace, and
// over all steps the same figures as `orrery report` (profiler::moe_metrics).
#include <gtest/gtest.h>

#include "moe_trace.hpp"
#include "orrery/gui/expert_load.hpp"
#include "orrery/gui/palette.hpp"
#include "orrery/profiler/moe_metrics.hpp"

using namespace orrery::gui;

TEST(ExpertLoad, ParsesOnlyTheRuntimesCounterNames) {
  int l = 0, e = 0;
  EXPECT_TRUE(parse_moe_counter("moe.tokens[l=3,e=5]", l, e));
  EXPECT_EQ(l, 3);
  EXPECT_EQ(e, 5);
  EXPECT_TRUE(parse_moe_counter("moe.dropped[l=12]", l, e));
  EXPECT_EQ(l, 12);
  EXPECT_EQ(e, -1);
  EXPECT_FALSE(parse_moe_counter("moe.tokens[l=3,e=5", l, e));
  EXPECT_FALSE(parse_moe_counter("moe.tokens[l=-1,e=5]", l, e));
  EXPECT_FALSE(parse_moe_counter("moe.dropped[l=2", l, e));
  EXPECT_FALSE(parse_moe_counter("mem.activations", l, e));
}

TEST(ExpertLoad, ClosedFormsPerStepAndOverAllSteps) {
  const auto t = test::moe_trace();
  const ExpertLoad load = expert_load(counter_tracks(t));
  ASSERT_EQ(load.blocks(), 2);
  EXPECT_EQ(load.layers(), (std::vector<int>{1, 3}));
  EXPECT_EQ(load.experts(0), 4);
  EXPECT_EQ(load.steps(), 2);
  EXPECT_EQ(load.ranks(), 2);
  // Block 0, step 0: 20(e + 1) + 1 summed over the two ranks; step 1: 200 more each.
  for (int e = 0; e < 4; ++e) {
    EXPECT_EQ(load.tokens(0, 0, e), 20.0 * (e + 1) + 1);
    EXPECT_EQ(load.tokens(1, 0, e), 20.0 * (e + 1) + 201);
    EXPECT_EQ(load.tokens(ExpertLoad::kAllSteps, 0, e), 40.0 * (e + 1) + 202);
  }
  EXPECT_EQ(load.total(0, 0), 204);
  EXPECT_EQ(load.imbalance(0, 0), 81.0 / 51.0);
  EXPECT_EQ(load.imbalance(1, 0), 281.0 / 251.0);
  EXPECT_EQ(load.imbalance(ExpertLoad::kAllSteps, 0), 362.0 / 302.0);
  EXPECT_EQ(load.dropped(0, 0), 1);
  EXPECT_EQ(load.dropped(1, 0), 11);
  EXPECT_EQ(load.dropped_fraction(ExpertLoad::kAllSteps, 0), 12.0 / 1208.0);
  // Block 1: every token to expert 0: max / mean = 4 = the expert count, the others share 0.
  EXPECT_EQ(load.imbalance(0, 1), 4.0);
  EXPECT_EQ(load.share(1, 1, 0), 4.0);
  EXPECT_EQ(load.share(1, 1, 3), 0.0);
  EXPECT_EQ(load.dropped_fraction(ExpertLoad::kAllSteps, 1), 28.0 / 160.0);
  const ExpertLoad::Worst w = load.worst();
  EXPECT_EQ(w.block, 1);
  EXPECT_EQ(w.step, 0);  // the first of the two steps at 4
  EXPECT_EQ(w.imbalance, 4.0);
}

TEST(ExpertLoad, OverAllStepsEqualsTheReport) {
  const auto t = test::moe_trace(3);
  const ExpertLoad load = expert_load(counter_tracks(t));
  const auto report = orrery::profiler::moe_metrics(t);
  ASSERT_EQ(static_cast<int>(report.blocks.size()), load.blocks());
  for (int b = 0; b < load.blocks(); ++b) {
    const auto& r = report.blocks[static_cast<size_t>(b)];
    EXPECT_EQ(r.layer, load.layers()[static_cast<size_t>(b)]);
    EXPECT_EQ(r.imbalance(), load.imbalance(ExpertLoad::kAllSteps, b));
    EXPECT_EQ(r.dropped_fraction(), load.dropped_fraction(ExpertLoad::kAllSteps, b));
    for (int e = 0; e < load.experts(b); ++e)
      EXPECT_EQ(r.tokens[static_cast<size_t>(e)], load.tokens(ExpertLoad::kAllSteps, b, e));
  }
}

TEST(ExpertLoad, ATraceWithoutMoeCountersIsEmpty) {
  orrery::traces::Trace t;
  t.counters.push_back({0, t.strings.intern("mem.activations"), 10, 1.0});
  t.counters.push_back({0, t.strings.intern("moe.tokens[l=1,e=2"), 10, 1.0});  // malformed
  EXPECT_TRUE(expert_load(counter_tracks(t)).empty());
}

TEST(ExpertLoad, ColoursWhiteAtTheMeanRedAboveBlueBelow) {
  EXPECT_EQ(palette::load_color(1.0), palette::kLoadEven);
  EXPECT_EQ(palette::load_color(2.0), palette::kLoadOver);
  EXPECT_EQ(palette::load_color(7.5), palette::kLoadOver);
  EXPECT_EQ(palette::load_color(0.0), palette::kLoadUnder);
  const QColor half = palette::load_color(1.5);  // half-way from white to red
  EXPECT_EQ(half.red(), (255 + palette::kLoadOver.red() + 1) / 2);
  EXPECT_EQ(half.blue(), (255 + palette::kLoadOver.blue() + 1) / 2);
}
