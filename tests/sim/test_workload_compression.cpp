// Gradient compression in the simulated workload (issue 18 items 1 and 4): after the uncompressed
// warm-up (compression.start_step) each DDP bucket's dp collectives carry the closed-form bytes of
// model/compression.hpp (per rank: an all-gather's size / dp), the same as the runtime's hooks;
// "ddp.compress" carries the bucket's fp32 bytes; ZeRO 1's reduce-scatter gives way to them.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "orrery/model/compression.hpp"
#include "orrery/model/names.hpp"
#include "orrery/model/parameters.hpp"
#include "orrery/sim/workload.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim {
namespace {

using testing::h100_cost;
using testing::small_scenario;

struct PerStep {
  std::map<int, int64_t> wire;  // by bucket layer: per-rank bytes of the compressed collectives
  std::map<int, int64_t> raw;   // "ddp.compress" bytes
  std::map<std::string, int> count;
};

PerStep step_ops(const Workload& w, int step) {
  PerStep out;
  const int dp = w.scenario.parallel.dp;
  for (const auto& op : w.stages[0].ops) {
    if (op.step != step) continue;
    const std::string& name = w.names[op.name];
    ++out.count[name];
    if (name == names::kDpCompress) out.raw[op.layer] += op.bytes;
    const bool compressed = name == names::kDpInt8AllGather || name == names::kDpTopkAllGather ||
                            name == names::kDpPowerSgdP || name == names::kDpPowerSgdQ ||
                            name == names::kDpPowerSgdVectors;
    if (compressed) {
      out.wire[op.layer] += op.coll == traces::CollOp::AllGather ? op.bytes / dp : op.bytes;
    }
  }
  return out;
}

// Each segment its own bucket (bucket_mb tiny): the expected bytes of segment `seg`.
int64_t expected_bytes(const Scenario& s, int seg) {
  int64_t n = 0, powersgd = 0;
  const int r = s.compression.powersgd_rank;
  for (const auto& p :
       model::parameter_tensors(model::model_shape(s), model::stage_contents(s, 0))) {
    if (p.segment != seg) continue;
    n += p.count();
    const bool compresses = model::powersgd_compresses(size_t(p.rows), size_t(p.cols), r);
    powersgd += compresses
                    ? int64_t(model::powersgd_payload_bytes(size_t(p.rows), size_t(p.cols), r))
                    : 4 * p.count();
  }
  const std::string& c = s.parallel.grad_compression;
  if (c == "int8") return int64_t(model::int8_payload_bytes(size_t(n)));
  if (c == "topk") return int64_t(model::topk_payload_bytes(size_t(n), s.compression.topk_ratio));
  return powersgd;
}

// parallel.grad_dtype bf16 / fp16 (issue 18 item 2): DDP's all-reduce carries 2 bytes per gradient,
// half of fp32's, bucket for bucket; fp32 keeps 4.
TEST(SimGradDtype, SixteenBitDdpAllReduceHalvesTheBytes) {
  for (const char* dtype : {"fp32", "bf16", "fp16"}) {
    Scenario s = small_scenario(4, 2, 1, 1, 2);
    s.parallel.bucket_mb = 1e-9;  // every segment a bucket
    s.parallel.grad_dtype = dtype;
    WorkloadOptions opt;
    opt.steps = 1;
    const Workload w = build_workload(s, h100_cost(), opt);  // precision fp32 (4-byte grads)
    const std::vector<int64_t>& buckets = w.stages[0].bucket_params;
    ASSERT_EQ(buckets.size(), 6u);
    const int64_t per = std::string(dtype) == "fp32" ? 4 : 2;
    std::vector<int64_t> bytes;
    for (const auto& op : w.stages[0].ops)
      if (w.names[op.name] == names::kDpAllReduce) bytes.push_back(op.bytes);
    ASSERT_EQ(bytes.size(), buckets.size()) << dtype;
    for (size_t b = 0; b < buckets.size(); ++b) EXPECT_EQ(bytes[b], per * buckets[b]) << dtype;
  }
}

class SimCompression : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

TEST_P(SimCompression, DpBytesEqualTheClosedFormAfterTheWarmUp) {
  const auto [scheme, zero] = GetParam();
  Scenario s = small_scenario(4, 2, 1, 1, 2);
  s.parallel.bucket_mb = 1e-9;  // every segment a bucket: final LayerNorm, blocks 3..0, embedding
  s.parallel.zero = zero;
  s.parallel.grad_compression = scheme;
  s.compression.powersgd_rank = 4;
  s.compression.topk_ratio = 0.01;
  s.compression.start_step = 1;
  WorkloadOptions opt;
  opt.steps = 2;
  const Workload w = build_workload(s, h100_cost(), opt);
  const std::vector<int64_t>& buckets = w.stages[0].bucket_params;
  ASSERT_EQ(buckets.size(), 6u);

  const PerStep warm = step_ops(w, 0);
  EXPECT_TRUE(warm.wire.empty());
  EXPECT_EQ(warm.count.count(std::string(names::kDpCompress)), 0u);
  if (zero == 0) EXPECT_EQ(warm.count.at(std::string(names::kDpAllReduce)), 6);
  if (zero == 1) EXPECT_EQ(warm.count.at(std::string(names::kDpReduceScatter)), 1);

  const PerStep comp = step_ops(w, 1);
  EXPECT_EQ(comp.count.count(std::string(names::kDpAllReduce)), 0u);
  EXPECT_EQ(comp.count.count(std::string(names::kDpReduceScatter)), 0u);
  const std::vector<int> segments{4, 3, 2, 1, 0, -1};  // the buckets' layers, in bucket order
  ASSERT_EQ(comp.wire.size(), 6u);
  int64_t wire = 0, raw = 0;
  for (size_t b = 0; b < segments.size(); ++b) {
    const int seg = segments[b];
    EXPECT_EQ(comp.wire.at(seg), expected_bytes(s, seg)) << scheme << " segment " << seg;
    EXPECT_EQ(comp.raw.at(seg), 4 * buckets[b]) << scheme << " segment " << seg;
    wire += comp.wire.at(seg);
    raw += 4 * buckets[b];
  }
  EXPECT_LT(wire, raw / 3);  // the three schemes at these settings: under a third of fp32
  if (std::string(scheme) != "powersgd") {
    // One decompress per all-gather, after the backward.
    EXPECT_EQ(comp.count.at(std::string(names::kDpDecompress)), 6);
  }
  if (std::string(scheme) == "int8" && zero == 0) {
    // The runtime's compute-stream order (training_loop.hpp) with overlap: each bucket compressed
    // once its last segment's backward is done, every bucket decompressed after "bwd.embed".
    std::string order;
    for (const auto& op : w.stages[0].ops) {
      const std::string& name = w.names[op.name];
      if (op.step != 1 || op.micro_batch != 1 || op.stream != kStreamCompute) continue;
      if (name.rfind("bwd.", 0) == 0 || name.rfind("ddp.", 0) == 0)
        order += (order.empty() ? "" : " ") + name + ":" + std::to_string(op.layer);
    }
    EXPECT_EQ(order,
              "bwd.head:4 ddp.compress:4 bwd.block:3 ddp.compress:3 bwd.block:2 ddp.compress:2 "
              "bwd.block:1 ddp.compress:1 bwd.block:0 ddp.compress:0 bwd.embed:-1 "
              "ddp.compress:-1 ddp.decompress:4 ddp.decompress:3 ddp.decompress:2 "
              "ddp.decompress:1 ddp.decompress:0 ddp.decompress:-1");
  }
}

INSTANTIATE_TEST_SUITE_P(Schemes, SimCompression,
                         ::testing::Combine(::testing::Values("int8", "topk", "powersgd"),
                                            ::testing::Values(0, 1)));

}  // namespace
}  // namespace orrery::sim
