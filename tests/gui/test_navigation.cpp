// Step windows and markers (navigation.hpp), on a hand-built trace, without widgets.
#include <gtest/gtest.h>

#include "orrery/gui/navigation.hpp"

using namespace orrery::gui;
namespace traces = orrery::traces;

TEST(GuiNavigation, StepWindowsSpanTheRanks) {
  traces::Trace t;
  const auto n = t.strings.intern("op");
  auto add = [&](int32_t rank, int32_t step, int64_t s, int64_t e) {
    traces::Span sp;
    sp.rank = rank;
    sp.name = n;
    sp.step = step;
    sp.start_ns = s;
    sp.end_ns = e;
    t.spans.push_back(sp);
  };
  add(0, 0, 100, 400);
  add(1, 0, 150, 520);  // step 0 ends on rank 1
  add(0, 2, 900, 1000);
  add(1, 2, 880, 990);  // step 2 starts on rank 1
  add(0, -1, 0, 2000);  // outside any step
  const auto w = step_windows(t);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].step, 0);
  EXPECT_EQ(w[0].start_ns, 100);
  EXPECT_EQ(w[0].end_ns, 520);
  EXPECT_EQ(w[1].step, 2);
  EXPECT_EQ(w[1].start_ns, 880);
  EXPECT_EQ(w[1].end_ns, 1000);
  EXPECT_FALSE(find_step(w, 1));
  ASSERT_TRUE(find_step(w, 2));
  EXPECT_EQ(find_step(w, 2)->start_ns, 880);
}

TEST(GuiNavigation, MarkersAreSortedAndWrap) {
  Markers m;
  EXPECT_FALSE(m.next_after(0));
  EXPECT_TRUE(m.add(300));
  EXPECT_TRUE(m.add(100));
  EXPECT_TRUE(m.add(200));
  EXPECT_FALSE(m.add(200));  // already there
  EXPECT_EQ(m.times(), (std::vector<int64_t>{100, 200, 300}));
  EXPECT_EQ(*m.next_after(100), 200);
  EXPECT_EQ(*m.next_after(300), 100);  // wraps
  EXPECT_EQ(*m.previous_before(200), 100);
  EXPECT_EQ(*m.previous_before(100), 300);  // wraps
  EXPECT_FALSE(m.remove_near(250, 40));     // 50 from 200 and 300
  EXPECT_TRUE(m.remove_near(260, 40));      // 300
  EXPECT_EQ(m.times(), (std::vector<int64_t>{100, 200}));
}
