// MoE metrics (moe_metrics.hpp) on a hand-built 2-rank trace: the all-to-alls' bytes, time, algbw
// and busbw (nccl-tests' (n-1)/n), the time no compute span covers, and the router's load per block
// (max / mean tokens per expert, the dropped fraction) from the counters, all worked by hand.
#include <gtest/gtest.h>

#include "builder.hpp"
#include "orrery/profiler/moe_metrics.hpp"

namespace orrery::profiler {
namespace {

using testing::Builder;
using traces::CollOp;
using traces::Span;
using traces::SpanKind;

TEST(MoeMetrics, AllToAllBusbwExposedAndLoadByHand) {
  Builder b(2);
  b.t.comms.push_back({7, traces::CommKind::Other, "ep[g=0,tp=0,pp=0]", {0, 1}});
  const auto a2a = [&](int r, const char* name, int64_t t0, int64_t t1, int64_t bytes) {
    Span& s = b.coll(r, t0, t1, CollOp::AllToAll, 7, t0, bytes, 0);
    s.name = b.t.strings.intern(name);
  };
  for (int r = 0; r < 2; ++r) {
    b.add(r, 0, SpanKind::Compute, "moe.router", 0, 100, 0);
    a2a(r, "moe.dispatch", 100, 200, 4000);                      // 4000 B in 100 ns: 40 GB/s
    b.add(r, 0, SpanKind::Compute, "moe.experts", 150, 300, 0);  // covers [150, 200)
    a2a(r, "moe.combine", 300, 400, 2000);                       // not covered: 100 ns exposed
  }
  b.counter(0, "moe.tokens[l=0,e=0]", 1, 30);
  b.counter(0, "moe.tokens[l=0,e=1]", 1, 10);
  b.counter(1, "moe.tokens[l=0,e=0]", 1, 20);
  b.counter(1, "moe.tokens[l=0,e=1]", 1, 20);
  b.counter(0, "moe.dropped[l=0]", 1, 6);
  b.counter(1, "moe.dropped[l=0]", 1, 2);
  b.counter(0, "mem.parameters", 1, 1e6);  // not MoE's
  const MoeMetrics m = moe_metrics(b.t);
  ASSERT_EQ(m.all_to_alls.size(), 2u);
  const AllToAllStats& c = m.all_to_alls[0];  // by name: combine, dispatch
  const AllToAllStats& d = m.all_to_alls[1];
  EXPECT_EQ(d.name, "moe.dispatch");
  EXPECT_EQ(d.calls, 2);
  EXPECT_EQ(d.bytes, 8000);
  EXPECT_EQ(d.time_ns, 200);
  EXPECT_EQ(d.group_size, 2);
  EXPECT_DOUBLE_EQ(d.algbw_gbps(), 40.0);
  EXPECT_DOUBLE_EQ(d.busbw_gbps(), 20.0);  // x (2-1)/2
  EXPECT_EQ(d.exposed_ns, 2 * 50);         // moe.experts covers [150, 200) of each
  EXPECT_EQ(c.name, "moe.combine");
  EXPECT_EQ(c.exposed_ns, 2 * 100);
  EXPECT_DOUBLE_EQ(c.busbw_gbps(), 10.0);
  EXPECT_EQ(m.all_to_all_ns, 400);
  EXPECT_EQ(m.exposed_ns, 300);
  ASSERT_EQ(m.blocks.size(), 1u);
  const MoeBlockLoad& l = m.blocks[0];
  EXPECT_EQ(l.tokens, (std::vector<double>{50, 30}));
  EXPECT_DOUBLE_EQ(l.imbalance(), 50.0 / 40.0);
  EXPECT_DOUBLE_EQ(l.dropped, 8);
  EXPECT_DOUBLE_EQ(l.dropped_fraction(), 8.0 / 80.0);
}

TEST(MoeMetrics, EmptyWithoutMoe) {
  Builder b(1);
  b.coll(0, 0, 10, CollOp::AllReduce, 0, 0, 4000, 0);
  b.counter(0, "mem.parameters", 1, 1e6);
  EXPECT_TRUE(moe_metrics(b.t).empty());
}

}  // namespace
}  // namespace orrery::profiler
