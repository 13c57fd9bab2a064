// The trace model's small pieces: enum names round-trip, nccl-tests bus-bandwidth factors,
// string interning and the canonical span order.
#include <gtest/gtest.h>

#include "orrery/traces/trace.hpp"

namespace orrery::traces {
namespace {

TEST(Span, EnumNamesRoundTrip) {
  for (int i = 0; i < kSpanKindCount; ++i) {
    const auto k = static_cast<SpanKind>(i);
    EXPECT_EQ(span_kind_from_string(to_string(k)), k);
  }
  for (int i = 0; i <= 9; ++i) {
    const auto op = static_cast<CollOp>(i);
    EXPECT_EQ(coll_op_from_string(to_string(op)), op);
  }
  for (int i = 0; i <= 4; ++i) {
    const auto k = static_cast<CommKind>(i);
    EXPECT_EQ(comm_kind_from_string(to_string(k)), k);
  }
  for (int i = 0; i <= 3; ++i) {
    const auto s = static_cast<TraceSource>(i);
    EXPECT_EQ(trace_source_from_string(to_string(s)), s);
  }
  EXPECT_EQ(to_string(CollOp::AllReduce), "all_reduce");
  EXPECT_EQ(to_string(TraceSource::Sim), "sim");
  EXPECT_FALSE(span_kind_from_string("nope").has_value());
  EXPECT_FALSE(coll_op_from_string("").has_value());
}

TEST(Span, BusBandwidthFactorsAsNcclTests) {
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::AllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::ReduceScatter, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::AllGather, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::AllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::Broadcast, 16), 1.0);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::Reduce, 16), 1.0);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::Send, 2), 1.0);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::Barrier, 8), 0.0);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::AllReduce, 1), 0.0);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::AllReduce, 0), 0.0);
}

TEST(StringTable, InternsOnce) {
  StringTable t;
  EXPECT_EQ(t.intern("a"), 0u);
  EXPECT_EQ(t.intern("b"), 1u);
  EXPECT_EQ(t.intern("a"), 0u);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.str(1), "b");
  EXPECT_EQ(t.find("b"), 1u);
  EXPECT_EQ(t.find("c"), UINT32_MAX);
}

TEST(Trace, SortIsStableByRankStreamStart) {
  Trace t;
  t.spans.push_back({1, 0, SpanKind::Compute, 0, 5, 6});
  t.spans.push_back({0, 1, SpanKind::Compute, 0, 5, 6});
  t.spans.push_back({0, 0, SpanKind::Compute, 1, 7, 9});
  t.spans.push_back({0, 0, SpanKind::Compute, 2, 7, 8});
  t.spans.push_back({0, 0, SpanKind::Compute, 3, 3, 100});
  t.sort_spans();
  EXPECT_EQ(t.spans[0].name, 3u);
  EXPECT_EQ(t.spans[1].name, 1u);  // equal starts keep their order
  EXPECT_EQ(t.spans[2].name, 2u);
  EXPECT_EQ(t.spans[3].stream, 1);
  EXPECT_EQ(t.spans[4].rank, 1);
  t.comms.push_back({4, CommKind::TP, "tp", {0, 1}});
  ASSERT_NE(t.comm(4), nullptr);
  EXPECT_EQ(t.comm(4)->name, "tp");
  EXPECT_EQ(t.comm(5), nullptr);
}

}  // namespace
}  // namespace orrery::traces
