// Compare's per-op-name table (diff_ops, OpDiffModel) on two small hand-built traces whose
// totals are worked out by hand, without widgets.
#include <gtest/gtest.h>

#include <QAbstractItemModelTester>
#include <cmath>

#include "orrery/gui/document.hpp"
#include "orrery/gui/models.hpp"

using namespace orrery::gui;
namespace traces = orrery::traces;

namespace {

void add(traces::Trace& t, int32_t rank, const char* name, int64_t s, int64_t e) {
  traces::Span sp;
  sp.rank = rank;
  sp.name = t.strings.intern(name);
  sp.step = 0;
  sp.start_ns = s;
  sp.end_ns = e;
  t.spans.push_back(sp);
}

// A (a "real" run), 2 ranks: fwd 100 + 120 = 220, bwd 200 + 200 = 400, allreduce 50 + 30 = 80.
traces::Trace trace_a() {
  traces::Trace t;
  add(t, 0, "fwd", 0, 100);
  add(t, 0, "bwd", 100, 300);
  add(t, 0, "allreduce", 300, 350);
  add(t, 1, "fwd", 0, 120);
  add(t, 1, "bwd", 120, 320);
  add(t, 1, "allreduce", 320, 350);
  return t;
}

// B (its "simulation"): fwd 110 + 110 = 220, bwd 300 + 290 = 590, allreduce 20 + 30 = 50, and an
// optimizer of 10 that A does not have.
traces::Trace trace_b() {
  traces::Trace t;
  add(t, 0, "optimizer", 430, 440);
  add(t, 0, "fwd", 0, 110);
  add(t, 0, "bwd", 110, 410);
  add(t, 0, "allreduce", 410, 430);
  add(t, 1, "fwd", 0, 110);
  add(t, 1, "bwd", 110, 400);
  add(t, 1, "allreduce", 400, 430);
  return t;
}

}  // namespace

TEST(GuiCompareOps, TotalsPerNameLargestDifferenceFirst) {
  const auto d = diff_ops(trace_a(), trace_b());
  ASSERT_EQ(d.size(), 4u);
  // Both traces have 2 rank-steps (ranks 0 and 1, step 0): per rank-step, bwd 200 against 295,
  // allreduce 40 against 25, optimizer 0 against 5, fwd 110 against 110. |B - A|: 95, 15, 5, 0.
  EXPECT_EQ(d[0].name, "bwd");
  EXPECT_EQ(d[0].a_total_ns, 400);
  EXPECT_EQ(d[0].b_total_ns, 590);
  EXPECT_EQ(d[0].a_rank_steps, 2);
  EXPECT_EQ(d[0].b_rank_steps, 2);
  EXPECT_EQ(d[0].a_ns, 200);
  EXPECT_EQ(d[0].b_ns, 295);
  EXPECT_EQ(d[0].diff_ns(), 95);
  EXPECT_DOUBLE_EQ(d[0].ratio(), 1.475);
  EXPECT_EQ(d[0].a_count, 2);
  EXPECT_EQ(d[1].name, "allreduce");
  EXPECT_EQ(d[1].a_ns, 40);
  EXPECT_EQ(d[1].b_ns, 25);
  EXPECT_EQ(d[1].diff_ns(), -15);
  EXPECT_DOUBLE_EQ(d[1].ratio(), 0.625);
  EXPECT_EQ(d[2].name, "optimizer");
  EXPECT_EQ(d[2].a_ns, 0);
  EXPECT_EQ(d[2].a_count, 0);
  EXPECT_EQ(d[2].b_ns, 5);
  EXPECT_TRUE(std::isinf(d[2].ratio()));
  EXPECT_EQ(d[3].name, "fwd");
  EXPECT_EQ(d[3].diff_ns(), 0);
  EXPECT_DOUBLE_EQ(d[3].ratio(), 1.0);
}

// A simulation of one rank and one step against a run of 2 ranks and 2 steps: per rank-step.
TEST(GuiCompareOps, OneSimulatedRankStepAgainstManyRealOnes) {
  traces::Trace real;
  for (int32_t rank = 0; rank < 2; ++rank) {
    for (int32_t step = 0; step < 2; ++step) {
      add(real, rank, "bwd", 1000 * step, 1000 * step + 300 + 100 * rank);  // 300, 400 ns
      real.spans.back().step = step;
    }
  }
  traces::Trace sim;
  add(sim, 0, "bwd", 0, 330);
  const auto d = diff_ops(real, sim);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].a_total_ns, 1400);  // 2 x (300 + 400)
  EXPECT_EQ(d[0].a_rank_steps, 4);
  EXPECT_EQ(d[0].a_ns, 350);
  EXPECT_EQ(d[0].b_rank_steps, 1);
  EXPECT_EQ(d[0].b_ns, 330);
  EXPECT_EQ(d[0].diff_ns(), -20);
}

TEST(GuiCompareOps, ModelShowsTheTable) {
  OpDiffModel m;
  QAbstractItemModelTester tester(&m, QAbstractItemModelTester::FailureReportingMode::Fatal);
  m.set_diffs(diff_ops(trace_a(), trace_b()));
  ASSERT_EQ(m.rowCount(), 4);
  EXPECT_EQ(m.columnCount(), OpDiffModel::kColumnCount);
  EXPECT_EQ(m.index(0, OpDiffModel::kName).data().toString(), "bwd");
  EXPECT_EQ(m.index(0, OpDiffModel::kA).data(Qt::UserRole).toLongLong(), 200);
  EXPECT_EQ(m.index(0, OpDiffModel::kB).data(Qt::UserRole).toLongLong(), 295);
  EXPECT_EQ(m.index(0, OpDiffModel::kDiff).data(Qt::UserRole).toLongLong(), 95);
  EXPECT_EQ(m.index(0, OpDiffModel::kDiff).data().toString(), "+95 ns");
  EXPECT_EQ(m.index(0, OpDiffModel::kRatio).data().toString(), "1.475 x");
  EXPECT_EQ(m.index(1, OpDiffModel::kDiff).data().toString(), "-15 ns");
  EXPECT_EQ(m.index(1, OpDiffModel::kRatio).data().toString(), "0.625 x");
  EXPECT_EQ(m.index(2, OpDiffModel::kRatio).data().toString(), "only in B");
  EXPECT_EQ(m.index(2, OpDiffModel::kBCount).data().toString(), "1");
  EXPECT_EQ(m.headerData(OpDiffModel::kDiff, Qt::Horizontal).toString(), "B - A");
  m.set_diffs({});
  EXPECT_EQ(m.rowCount(), 0);
}
