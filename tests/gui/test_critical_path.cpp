// The critical path of a step (critical_path.hpp) on hand-built 2-rank traces whose path is
// worked out by hand, without widgets.
#include <gtest/gtest.h>

#include <QAbstractItemModelTester>

#include "orrery/gui/critical_path.hpp"
#include "orrery/gui/models.hpp"

using namespace orrery::gui;
namespace traces = orrery::traces;
using Via = CriticalLink::Via;

namespace {

uint32_t add(traces::Trace& t, int32_t rank, int32_t stream, traces::SpanKind kind,
             const char* name, int64_t s, int64_t e) {
  traces::Span sp;
  sp.rank = rank;
  sp.stream = stream;
  sp.kind = kind;
  sp.name = t.strings.intern(name);
  sp.step = 0;
  sp.start_ns = s;
  sp.end_ns = e;
  t.spans.push_back(sp);
  return static_cast<uint32_t>(t.spans.size() - 1);
}

uint32_t add_comm(traces::Trace& t, int32_t rank, traces::SpanKind kind, traces::CollOp op,
                  int32_t peer, int64_t s, int64_t e) {
  const uint32_t i = add(t, rank, 1, kind, "comm", s, e);
  auto& sp = t.spans[i];
  sp.comm = 0;
  sp.seq = 0;
  sp.op = op;
  sp.peer = peer;
  return i;
}

}  // namespace

// Rank 1's backward is 100 ns longer, so it arrives last at the all-reduce; rank 0's waits 100 ns
// (300 -> 400) and its optimizer, after the all-reduce, ends the step at 500:
//   rank 0: fwd [0,100] bwd [100,300] | allreduce [300,450] | opt [450,500]
//   rank 1: fwd [0,100] bwd [100,400] | allreduce [400,450] | opt [450,480]
// Path: fwd1, bwd1 (stream), allreduce1 (cross), allreduce0 (last arrival), opt0 (cross);
// 500 ns long, 100 ns of it waited by allreduce0.
TEST(GuiCriticalPath, TheLateArriverOfACollectiveIsOnThePath) {
  traces::Trace t;
  using K = traces::SpanKind;
  add(t, 0, 2, K::Phase, "step", 0, 500);  // phases are not on the path
  add(t, 0, 0, K::Compute, "fwd", 0, 100);
  add(t, 0, 0, K::Compute, "bwd", 100, 300);
  const uint32_t ar0 = add_comm(t, 0, K::Collective, traces::CollOp::AllReduce, -1, 300, 450);
  const uint32_t opt0 = add(t, 0, 0, K::Optimizer, "opt", 450, 500);
  const uint32_t fwd1 = add(t, 1, 0, K::Compute, "fwd", 0, 100);
  const uint32_t bwd1 = add(t, 1, 0, K::Compute, "bwd", 100, 400);
  const uint32_t ar1 = add_comm(t, 1, K::Collective, traces::CollOp::AllReduce, -1, 400, 450);
  add(t, 1, 0, K::Optimizer, "opt", 450, 480);
  const auto p = critical_path(t, 0);
  ASSERT_EQ(p.links.size(), 5u);
  const std::vector<uint32_t> want = {fwd1, bwd1, ar1, ar0, opt0};
  const std::vector<Via> vias = {Via::First, Via::Stream, Via::CrossStream, Via::LastArrival,
                                 Via::CrossStream};
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(p.links[k].span, want[k]) << k;
    EXPECT_EQ(p.links[k].via, vias[k]) << k;
  }
  // allreduce0 is on the path from the late arrival (400) on.
  EXPECT_EQ(p.links[3].from_ns, 400);
  EXPECT_EQ(p.links[3].to_ns, 450);
  EXPECT_EQ(p.start_ns, 0);
  EXPECT_EQ(p.end_ns, 500);
  EXPECT_EQ(p.length_ns(), 500);
  EXPECT_EQ(p.wait_ns, 100);
  EXPECT_TRUE(critical_path(t, 7).empty());

  // The details list: allreduce0 (4th) after the last arrival, 50 ns on the path, 100 waited.
  CriticalPathModel m;
  QAbstractItemModelTester tester(&m, QAbstractItemModelTester::FailureReportingMode::Fatal);
  m.set_path(&t, p);
  ASSERT_EQ(m.rowCount(), 5);
  EXPECT_EQ(m.index(3, CriticalPathModel::kIndex).data(Qt::UserRole).toLongLong(), ar0);
  EXPECT_EQ(m.index(3, CriticalPathModel::kRank).data().toInt(), 0);
  EXPECT_EQ(m.index(3, CriticalPathModel::kVia).data().toString(), "last arrival");
  EXPECT_EQ(m.index(3, CriticalPathModel::kOnPath).data(Qt::UserRole).toLongLong(), 50);
  EXPECT_EQ(m.index(3, CriticalPathModel::kWaited).data(Qt::UserRole).toLongLong(), 100);
  EXPECT_EQ(m.index(1, CriticalPathModel::kName).data().toString(), "bwd");
  EXPECT_EQ(m.index(1, CriticalPathModel::kOnPath).data(Qt::UserRole).toLongLong(), 300);
  EXPECT_EQ(m.index(1, CriticalPathModel::kWaited).data().toString(), "-");
  m.set_path(nullptr, {});
  EXPECT_EQ(m.rowCount(), 0);
}

// A receive posted at 20 waits for its send, which starts once rank 0's forward is done:
//   rank 0: fwd [0,100] | send [100,130]
//   rank 1: recv [20,130] | fwd [130,200]
// Path: fwd0, send0 (cross), recv1 (send), fwd1 (cross); 200 ns, 80 ns waited by the receive.
TEST(GuiCriticalPath, AReceiveWaitsForItsSend) {
  traces::Trace t;
  using K = traces::SpanKind;
  const uint32_t f0 = add(t, 0, 0, K::Compute, "fwd", 0, 100);
  const uint32_t s0 = add_comm(t, 0, K::P2P, traces::CollOp::Send, 1, 100, 130);
  const uint32_t r1 = add_comm(t, 1, K::P2P, traces::CollOp::Recv, 0, 20, 130);
  const uint32_t f1 = add(t, 1, 0, K::Compute, "fwd", 130, 200);
  const auto p = critical_path(t, 0);
  ASSERT_EQ(p.links.size(), 4u);
  EXPECT_EQ(p.links[0].span, f0);
  EXPECT_EQ(p.links[1].span, s0);
  EXPECT_EQ(p.links[1].via, Via::CrossStream);
  EXPECT_EQ(p.links[2].span, r1);
  EXPECT_EQ(p.links[2].via, Via::Send);
  EXPECT_EQ(p.links[2].from_ns, 100);
  EXPECT_EQ(p.links[3].span, f1);
  EXPECT_EQ(p.links[3].via, Via::CrossStream);
  EXPECT_EQ(p.length_ns(), 200);
  EXPECT_EQ(p.wait_ns, 80);
}
