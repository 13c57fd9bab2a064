// Gradient compression metrics (compression_metrics.hpp) on a hand-built 2-rank trace: per-rank
// wire bytes (an all-gather's span bytes / group size), the buckets' fp32 bytes from "ddp.compress",
// the saving and ratio, and the compression time, all worked by hand.
#include <gtest/gtest.h>

#include "builder.hpp"
#include "orrery/profiler/compression_metrics.hpp"

namespace orrery::profiler {
namespace {

using testing::Builder;
using traces::CollOp;
using traces::Span;
using traces::SpanKind;

TEST(CompressionMetrics, WireBytesSavingsAndTimeByHand) {
  Builder b(2);
  b.t.comms.push_back({1, traces::CommKind::DP, "dp", {0, 1}});
  // Each span finished before the next is added (the builder's vector may move).
  const auto compute = [&](int r, const char* name, int64_t t0, int64_t t1, int layer,
                           int64_t bytes) {
    Span& s = b.add(r, 0, SpanKind::Compute, name, t0, t1, 1);
    s.layer = layer;
    s.bytes = bytes;
  };
  const auto coll = [&](int r, const char* name, CollOp op, int64_t t0, int64_t bytes, int layer) {
    Span& s = b.coll(r, t0, t0 + 5, op, 1, t0, bytes, 1);
    s.name = b.t.strings.intern(name);
    s.layer = layer;
  };
  for (int r = 0; r < 2; ++r) {
    // int8 bucket (layer 3): 1000 fp32 entries = 4000 B; its all-gather holds 2 x 1016 B.
    compute(r, "ddp.compress", 0, 10, 3, 4000);
    coll(r, "ddp.int8_all_gather", CollOp::AllGather, 10, 2 * 1016, 3);
    compute(r, "ddp.decompress", 40, 45, 3, 0);
    // PowerSGD bucket (layer 0): 8000 B, P 400 B + Q 200 B + vectors 100 B, two compress spans.
    compute(r, "ddp.compress", 50, 52, 0, 8000);
    compute(r, "ddp.compress", 60, 61, 0, 0);
    coll(r, "ddp.powersgd_p", CollOp::AllReduce, 70, 400, 0);
    coll(r, "ddp.powersgd_q", CollOp::AllReduce, 80, 200, 0);
    coll(r, "ddp.powersgd_vectors", CollOp::AllReduce, 90, 100, 0);
  }
  b.add(0, 1, SpanKind::Collective, "ddp.all_reduce", 200, 210, 0).bytes = 4000;  // not counted
  const CompressionMetrics m = compression_metrics(b.t);
  ASSERT_EQ(m.collectives.size(), 4u);
  EXPECT_EQ(m.collectives[0].name, "ddp.int8_all_gather");
  EXPECT_EQ(m.collectives[0].calls, 2);
  EXPECT_EQ(m.collectives[0].wire_bytes, 2 * 1016);
  EXPECT_EQ(m.collectives[0].raw_bytes, 2 * 4000);
  EXPECT_EQ(m.collectives[0].saved_bytes(), 2 * (4000 - 1016));
  EXPECT_EQ(m.collectives[1].name, "ddp.powersgd_p");
  EXPECT_EQ(m.collectives[1].wire_bytes, 800);
  EXPECT_EQ(m.collectives[1].raw_bytes, 0);  // shares its bucket with Q and the vectors
  EXPECT_EQ(m.buckets, 4);
  EXPECT_EQ(m.raw_bytes, 2 * (4000 + 8000));
  EXPECT_EQ(m.wire_bytes, 2 * (1016 + 700));
  EXPECT_EQ(m.saved_bytes(), 2 * (12000 - 1716));
  EXPECT_DOUBLE_EQ(m.ratio(), 12000.0 / 1716.0);
  EXPECT_EQ(m.compress_ns, 2 * (10 + 2 + 1));
  EXPECT_EQ(m.decompress_ns, 2 * 5);
  EXPECT_EQ(m.ranks, 2);
  EXPECT_EQ(m.steps, 1);
}

TEST(CompressionMetrics, EmptyWithoutCompression) {
  Builder b(1);
  b.coll(0, 0, 10, CollOp::AllReduce, 0, 0, 4000, 0);
  EXPECT_TRUE(compression_metrics(b.t).empty());
}

}  // namespace
}  // namespace orrery::profiler
