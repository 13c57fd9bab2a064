// Workload builder: exact op counts per schedule and layout, textbook 1F1B/GPipe orders, buckets,
// names, placement, and that GPT-3 175B builds cheaply.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/model/flops.hpp"
#include "orrery/sim/workload.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim {
namespace {

using testing::h100_cost;
using testing::small_scenario;
constexpr uint32_t kNoOp = 0xffffffffu;

std::string order_string(const std::vector<int>& order) {
  std::string s;
  for (int x : order)
    s += (s.empty() ? "" : " ") + (x >= 0 ? "F" + std::to_string(x) : "B" + std::to_string(-x - 1));
  return s;
}

TEST(Schedule, OneFOneBTextbookOrderP4M8) {
  // Narayanan et al. 2021, Fig. 4 (top): p - s - 1 warm-up forwards, then 1F1B, then cool-down.
  EXPECT_EQ(order_string(schedule_order(Schedule::OneFOneB, 4, 0, 8)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(order_string(schedule_order(Schedule::OneFOneB, 4, 1, 8)),
            "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(order_string(schedule_order(Schedule::OneFOneB, 4, 2, 8)),
            "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(order_string(schedule_order(Schedule::OneFOneB, 4, 3, 8)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
}

TEST(Schedule, GPipeOrderP4M8) {
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(order_string(schedule_order(Schedule::GPipe, 4, s, 8)),
              "F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7");
}

TEST(Schedule, FewerMicroBatchesThanStages) {
  EXPECT_EQ(order_string(schedule_order(Schedule::OneFOneB, 4, 0, 2)), "F0 F1 B0 B1");
  // An unknown name stops at the one parser; interleaved has no flat per-stage order.
  EXPECT_FALSE(parse_schedule("zigzag").has_value());
  EXPECT_THROW(schedule_order(Schedule::Interleaved, 4, 0, 2), InputError);
}

// Counts ops of a program by name.
std::map<std::string, int> count_by_name(const Workload& w, const StageProgram& p) {
  std::map<std::string, int> n;
  for (const auto& op : p.ops) ++n[w.names[op.name]];
  return n;
}

TEST(Workload, OpCountsPerStage1F1B) {
  // 8 layers, pp 4 (2 per stage), tp 2, dp 2, m 8.
  const int L = 8, pp = 4, tp = 2, dp = 2, m = 8, lps = L / pp;
  const Scenario s = small_scenario(L, dp, tp, pp, m);
  const Workload w = build_workload(s, h100_cost());
  ASSERT_EQ(w.micro_batches, m);
  ASSERT_EQ(w.stages.size(), size_t(pp));
  for (int st = 0; st < pp; ++st) {
    const auto& p = w.stages[st];
    auto n = count_by_name(w, p);
    // tp > 1: each block's forward and backward are three pieces around two tp all-reduces.
    EXPECT_EQ(n[std::string(names::kBlockForward)], 3 * m * lps);
    EXPECT_EQ(n[std::string(names::kBlockBackward)], 3 * m * lps);
    EXPECT_EQ(n[std::string(names::kTpAllReduce)],
              4 * m * lps);  // 2 in forward + 2 in backward per block
    EXPECT_EQ(n[std::string(names::kEmbedForward)], st == 0 ? m : 0);
    EXPECT_EQ(n[std::string(names::kEmbedBackward)], st == 0 ? m : 0);
    EXPECT_EQ(n[std::string(names::kHeadForward)], st == pp - 1 ? m : 0);
    EXPECT_EQ(n[std::string(names::kHeadBackward)], st == pp - 1 ? m : 0);
    EXPECT_EQ(n[std::string(names::kSendActivation)], st < pp - 1 ? m : 0);
    EXPECT_EQ(n[std::string(names::kRecvActivation)], st > 0 ? m : 0);
    EXPECT_EQ(n[std::string(names::kSendGradient)], st > 0 ? m : 0);
    EXPECT_EQ(n[std::string(names::kRecvGradient)], st < pp - 1 ? m : 0);
    EXPECT_EQ(n[std::string(names::kDataLoad)], (st == 0 || st == pp - 1) ? m : 0);
    // One gradient all-reduce per bucket, on the last micro-batch only.
    EXPECT_EQ(n[std::string(names::kDpAllReduce)], int(p.bucket_params.size()));
    EXPECT_EQ(n[std::string(names::kEmbedAllReduce)], (st == 0 || st == pp - 1) ? 1 : 0);
    EXPECT_EQ(n[std::string(names::kOptimizerStep)], 1);
    EXPECT_EQ(n[std::string(names::kZeroGrad)], 1);
    // Buckets hold every parameter of the rank exactly once.
    int64_t sum = 0;
    for (auto b : p.bucket_params) sum += b;
    EXPECT_EQ(sum, p.param_count);
    // Streams: every op is on exactly one stream list.
    size_t on_streams = 0;
    for (const auto& so : p.stream_ops) on_streams += so.size();
    EXPECT_EQ(on_streams, p.ops.size());
  }
}

// Activation recomputation (model/block.hpp): in the backward, before each block's "bwd.block",
// full adds the two recomputation pieces around one more tp all-reduce (tp > 1), selective one
// attention-core op; their FLOPs are the closed forms of model/flops.hpp; the op bound holds.
TEST(Workload, RecomputationOps) {
  const int L = 8, pp = 2, tp = 2, dp = 1, m = 4, lps = L / pp;
  for (const char* mode : {"full", "selective"}) {
    Scenario s = small_scenario(L, dp, tp, pp, m);
    s.training.recompute = mode;
    const Workload w = build_workload(s, h100_cost());
    const bool full = std::string(mode) == "full";
    const model::flops::Dims fd{2, 128, 256, 1024, tp};
    for (int st = 0; st < pp; ++st) {
      const auto& p = w.stages[st];
      auto n = count_by_name(w, p);
      EXPECT_EQ(n[std::string(names::kBlockRecompute)], full ? 2 * m * lps : 0) << mode;
      EXPECT_EQ(n[std::string(names::kAttentionRecompute)], full ? 0 : m * lps) << mode;
      EXPECT_EQ(n[std::string(names::kTpAllReduce)], (full ? 5 : 4) * m * lps) << mode;
      EXPECT_EQ(n[std::string(names::kBlockBackward)], 3 * m * lps) << mode;
      EXPECT_LE(double(p.ops.size()), workload_ops_bound(s, 1)) << mode;
      double recompute_flops = 0;
      for (size_t i = 0; i < p.ops.size(); ++i) {
        const auto& op = p.ops[i];
        const std::string name = w.names[op.name];
        if (name != names::kBlockRecompute && name != names::kAttentionRecompute) continue;
        recompute_flops += op.flops;
        EXPECT_EQ(op.phase, PhaseKind::Backward);
        EXPECT_GT(op.duration_ns, 0);
      }
      const double per_block = full ? model::flops::recompute_block_piece(fd, 0, 2) +
                                          model::flops::recompute_block_piece(fd, 1, 2)
                                    : model::flops::recompute_attention(fd);
      EXPECT_DOUBLE_EQ(recompute_flops, m * lps * per_block) << mode;
    }
  }
}

// Sequence parallelism (model/block.hpp): five pieces per block each way, 4 all-gathers and 4
// reduce-scatters of the whole (B,T,C) per block and micro-batch instead of 4 all-reduces, the
// head's and the embedding's all-gathers, one replicated-gradient all-reduce (6·C values) per block
// and one (2·C) for the head, pipeline messages 1/tp of the activation; FLOPs per piece sum to the
// block's.
TEST(Workload, SequenceParallelOps) {
  const int L = 8, pp = 2, tp = 2, dp = 1, m = 4, lps = L / pp;
  Scenario s = small_scenario(L, dp, tp, pp, m);
  s.parallel.sequence_parallel = true;
  const Workload w = build_workload(s, h100_cost());
  const int64_t act = int64_t(2) * 128 * 256 * 4;  // B·T·C fp32
  const model::flops::Dims fd{2, 128, 256, 1024, tp};
  for (int st = 0; st < pp; ++st) {
    const auto& p = w.stages[st];
    auto n = count_by_name(w, p);
    const bool first = st == 0, last = st == pp - 1;
    EXPECT_EQ(n[std::string(names::kTpAllReduce)], 0);
    EXPECT_EQ(n[std::string(names::kBlockForward)], 5 * m * lps);
    EXPECT_EQ(n[std::string(names::kBlockBackward)], 5 * m * lps);
    EXPECT_EQ(n[std::string(names::kTpReduceScatter)], 4 * m * lps);
    EXPECT_EQ(n[std::string(names::kTpAllGather)], 4 * m * lps + (first ? m : 0) + (last ? m : 0));
    EXPECT_EQ(n[std::string(names::kTpGradAllReduce)], m * lps + (last ? m : 0));
    EXPECT_EQ(n[std::string(names::kHeadForward)], last ? 2 * m : 0);
    EXPECT_LE(double(p.ops.size()), workload_ops_bound(s, 1));
    double block_flops = 0;
    for (const auto& op : p.ops) {
      const std::string name = w.names[op.name];
      if (name == names::kTpAllGather || name == names::kTpReduceScatter) {
        EXPECT_EQ(op.bytes, act);
      }
      if (name == names::kTpGradAllReduce)
        EXPECT_TRUE(op.bytes == 6 * 256 * 4 || op.bytes == 2 * 256 * 4);
      if (name == names::kSendActivation || name == names::kRecvGradient ||
          name == names::kSendGradient || name == names::kRecvActivation)
        EXPECT_EQ(op.bytes, act / tp);
      if (name == names::kBlockForward || name == names::kBlockBackward) block_flops += op.flops;
    }
    EXPECT_DOUBLE_EQ(block_flops, m * lps * 3 * model::flops::block_forward(fd));
  }
}

// Fewer kv heads than tp ranks (multi-query over tp 2, 2 kv heads over tp 4): each block's shared
// k and v gradients are summed over tp once a step after DDP (ZeRO 0, and ZeRO 1 before its
// reduce-scatter), once per micro-batch with ZeRO 2 and 3, carrying a slot per kv head of 2·hs·C
// values (biases: 2·hs more); none when the kv heads divide over tp.
TEST(Workload, ReplicatedKvHeadsSumTheirGradientsOverTp) {
  const int L = 4, pp = 2, m = 4, C = 256, hs = 256 / 8;
  for (const auto& [kv, tp] : {std::pair<int, int>{1, 2}, std::pair<int, int>{2, 4}}) {
    for (int zero : {0, 1, 2, 3}) {
      Scenario s = small_scenario(L, 2, tp, zero == 3 ? 1 : pp, m);
      s.model.kv_heads = kv;
      s.parallel.zero = zero;
      const int stages = s.parallel.pp, blocks = L / stages;
      const int64_t values = int64_t(kv) * 2 * hs * (C + 1);  // GPT blocks have biases
      EXPECT_EQ(kv_grad_values(s), values);
      const Workload w = build_workload(s, h100_cost());
      for (int st = 0; st < stages; ++st) {
        const auto& p = w.stages[st];
        auto n = count_by_name(w, p);
        EXPECT_EQ(n[std::string(names::kTpKvGradAllReduce)], zero >= 2 ? m * blocks : blocks)
            << "kv " << kv << " tp " << tp << " zero " << zero;
        for (const auto& op : p.ops) {
          if (w.names[op.name] != names::kTpKvGradAllReduce) continue;
          EXPECT_EQ(op.bytes, values * w.precision.grad_bytes);
          EXPECT_EQ(op.group, GroupRole::TP);
          EXPECT_EQ(op.coll, traces::CollOp::AllReduce);
        }
        EXPECT_LE(double(p.ops.size()), workload_ops_bound(s, 1));
      }
    }
  }
  Scenario whole = small_scenario(L, 1, 2, 1, m);
  whole.model.kv_heads = 2;  // one per rank: nothing shared
  EXPECT_EQ(kv_grad_values(whole), 0);
  const Workload w = build_workload(whole, h100_cost());
  EXPECT_EQ(count_by_name(w, w.stages[0])[std::string(names::kTpKvGradAllReduce)], 0);
}

TEST(Workload, ComputeOrderFollowsTheSchedule) {
  for (const char* sched : {"1f1b", "gpipe"}) {
    const Scenario s = small_scenario(4, 1, 1, 4, 8, sched);
    const Workload w = build_workload(s, h100_cost());
    for (int st = 0; st < 4; ++st) {
      // The passes as they appear on the compute stream: fwd.block of the stage's first layer,
      // bwd.block of its (only) layer.
      std::vector<int> seen;
      for (uint32_t id : w.stages[st].stream_ops[kStreamCompute]) {
        const Op& op = w.stages[st].ops[id];
        if (w.names[op.name] == names::kBlockForward && op.layer == st)
          seen.push_back(op.micro_batch);
        if (w.names[op.name] == names::kBlockBackward && op.layer == st)
          seen.push_back(-op.micro_batch - 1);
      }
      EXPECT_EQ(seen, schedule_order(schedule_of(s.parallel), 4, st, 8))
          << sched << " stage " << st;
    }
  }
}

TEST(Workload, BucketsFromBucketSize) {
  Scenario s = small_scenario(4, 2, 1, 1, 2);
  s.parallel.bucket_mb = 1e6;  // everything in one bucket
  const Workload one = build_workload(s, h100_cost());
  EXPECT_EQ(one.stages[0].bucket_params.size(), 1u);
  s.parallel.bucket_mb = 1e-9;  // every segment is a bucket: final LayerNorm, 4 blocks, embedding
  const Workload each = build_workload(s, h100_cost());
  const int64_t c = 256, block = 12 * c * c + 13 * c;
  EXPECT_EQ(each.stages[0].bucket_params,
            (std::vector<int64_t>{2 * c, block, block, block, block, 1024 * c + 128 * c}));
  // The runtime's rule (ddp.hpp): close a bucket before the segment that would take it past the cap.
  // 1.5 blocks of fp32 gradients: lnf + block 3 | block 2 | block 1 | block 0 + embedding (0.37 block).
  s.parallel.bucket_mb = 1.5 * block * 4 / (1024.0 * 1024.0);
  const Workload rule = build_workload(s, h100_cost());
  EXPECT_EQ(rule.stages[0].bucket_params,
            (std::vector<int64_t>{2 * c + block, block, block, block + 1024 * c + 128 * c}));
  // Without overlap the all-reduces wait for the whole backward: they all depend on the last op.
  s.parallel.overlap = false;
  const Workload no = build_workload(s, h100_cost());
  const auto& p = no.stages[0];
  uint32_t last_bwd = 0;
  for (uint32_t i = 0; i < p.ops.size(); ++i)
    if (no.names[p.ops[i].name] == names::kEmbedBackward) last_bwd = i;
  for (const auto& op : p.ops) {
    if (no.names[op.name] != names::kDpAllReduce) continue;
    ASSERT_EQ(op.dep_count, 1u);
    EXPECT_EQ(p.deps[op.dep_begin], last_bwd);
  }
}

TEST(Workload, ZeroStagesOps) {
  // The runtime's op order (runtime/include/orrery/runtime/trainer.hpp): ZeRO 1/2 treat the whole
  // array as one bucket, ZeRO 3 works per segment (embedding, each block, final LayerNorm).
  const int m = 4, L = 4;
  for (int zero = 1; zero <= 3; ++zero) {
    Scenario s = small_scenario(L, 4, 1, 1, m);
    s.parallel.zero = zero;
    const Workload w = build_workload(s, h100_cost());
    auto n = count_by_name(w, w.stages[0]);
    EXPECT_EQ(n[std::string(names::kDpAllReduce)], 0);
    // ZeRO 1: one reduce-scatter per step; ZeRO 2: one per micro-batch; ZeRO 3: one per segment
    // (L blocks, the final LayerNorm, the embedding) per micro-batch.
    EXPECT_EQ(n[std::string(names::kDpReduceScatter)], zero == 1   ? 1
                                                       : zero == 2 ? m
                                                                   : m * (L + 2))
        << zero;
    // ZeRO 1/2: one all-gather of the updated parameters after the optimizer.
    EXPECT_EQ(n[std::string(names::kDpAllGather)], zero <= 2 ? 1 : 0) << zero;
    // ZeRO 3: each block before its forward and its backward, every micro-batch, plus the embedding
    // and final LayerNorm once per step.
    EXPECT_EQ(n[std::string(names::kZeroAllGather)], zero == 3 ? 2 * L * m + 2 : 0) << zero;
    // Sizes: the padded whole array (ZeRO 1/2), the padded block (ZeRO 3), 4 bytes per element.
    const int64_t count = w.stages[0].param_count, padded = (count + 3) / 4 * 4;
    for (const auto& op : w.stages[0].ops) {
      const std::string& name = w.names[op.name];
      if (zero <= 2 && (name == names::kDpReduceScatter || name == names::kDpAllGather))
        EXPECT_EQ(op.bytes, 4 * padded);
    }
  }
}

TEST(Workload, ZeroOverlapOpsPerBucketAndTheGathersConsumers) {
  // zero.overlap_grad_reduce: one reduce-scatter per ZeRO bucket (every segment a bucket here:
  // final LayerNorm, 4 blocks, embedding) on each synchronised micro-batch (ZeRO 1: the last; 2:
  // each), one all-gather per bucket after the optimizer. dp = 3: the boundaries move up to
  // multiples of 3. Memory (c = 256): embedding [0, 1152c), block l from 1152c + l·B (B = 12c² +
  // 13c, B ≡ 1 mod 3), the final LayerNorm's 2c at the top; n ≡ 0 mod 3. Rounding each bucket's
  // bottom up: lnf 2c - 2, block 3 B + 2, block 2 B - 1, block 1 B - 1, block 0 B + 2, embedding.
  const int m = 3, L = 4, dp = 3;
  const int64_t c = 256, B = 12 * c * c + 13 * c;
  for (int zero : {1, 2}) {
    for (bool param_gather : {false, true}) {
      Scenario s = small_scenario(L, dp, 1, 1, m);
      s.parallel.zero = zero;
      s.parallel.bucket_mb = 1e-9;
      s.zero.overlap_grad_reduce = true;
      s.zero.overlap_param_gather = param_gather;
      const Workload w = build_workload(s, h100_cost(), {2, {}});
      const auto& p = w.stages[0];
      EXPECT_EQ(p.bucket_params,
                (std::vector<int64_t>{2 * c - 2, B + 2, B - 1, B - 1, B + 2, 1152 * c}));
      auto n = count_by_name(w, p);
      const int K = L + 2;
      EXPECT_EQ(n[std::string(names::kDpReduceScatter)], 2 * K * (zero == 1 ? 1 : m));
      EXPECT_EQ(n[std::string(names::kDpAllGather)], 2 * K);
      // Every collective moves its bucket (the precision's bytes per element).
      const int64_t bytes = w.precision.grad_bytes;
      std::vector<uint32_t> gathers;  // step 0's, in issue order
      uint32_t first_rs = kNoOp, bwd_head = kNoOp;
      for (uint32_t i = 0; i < p.ops.size(); ++i) {
        const Op& op = p.ops[i];
        const std::string& name = w.names[op.name];
        if (op.step != 0) continue;
        if (name == names::kHeadBackward && op.micro_batch == m - 1) bwd_head = i;
        if (name == names::kDpReduceScatter && first_rs == kNoOp && op.micro_batch == m - 1)
          first_rs = i;
        if (name == names::kDpAllGather) gathers.push_back(i);
      }
      // Forward order: the embedding's bucket (layer -1) first, the final LayerNorm's last.
      ASSERT_EQ(gathers.size(), size_t(K));
      EXPECT_EQ(p.ops[gathers.front()].layer, -1);
      EXPECT_EQ(p.ops[gathers.back()].layer, L);
      EXPECT_EQ(p.ops[gathers.front()].bytes, 1152 * c * w.precision.param_bytes);
      // The final LayerNorm's bucket goes out right after its backward, during the blocks'.
      ASSERT_NE(first_rs, kNoOp);
      EXPECT_EQ(p.ops[first_rs].bytes, (2 * c - 2) * bytes);
      ASSERT_EQ(p.ops[first_rs].dep_count, 1u);
      EXPECT_EQ(p.deps[p.ops[first_rs].dep_begin], bwd_head);
      // Step 1's consumers: with overlap_param_gather fwd.embed (mb 0) waits for the embedding's
      // gather, block 0's forward for its bucket's, block 1's for its own (the bottom 2 elements
      // it gave to block 0's bucket are waited for already: each gather is waited for once);
      // zero_grad for none. Without, zero_grad waits for all of them.
      auto deps_of = [&](uint32_t i) {
        const Op& op = p.ops[i];
        return std::vector<uint32_t>(p.deps.begin() + op.dep_begin,
                                     p.deps.begin() + op.dep_begin + op.dep_count);
      };
      auto has = [](const std::vector<uint32_t>& v, uint32_t x) {
        return std::find(v.begin(), v.end(), x) != v.end();
      };
      for (uint32_t i = 0; i < p.ops.size(); ++i) {
        const Op& op = p.ops[i];
        const std::string& name = w.names[op.name];
        if (op.step != 1 || (op.micro_batch > 0 && name != names::kZeroGrad)) continue;
        const auto d = deps_of(i);
        if (name == names::kZeroGrad) {
          for (uint32_t g : gathers) EXPECT_EQ(has(d, g), !param_gather) << zero;
        } else if (name == names::kEmbedForward) {
          EXPECT_EQ(has(d, gathers[0]), param_gather);
          EXPECT_FALSE(has(d, gathers[1]));
        } else if (name == names::kBlockForward && op.layer == 0) {
          EXPECT_EQ(has(d, gathers[1]), param_gather);  // block 0's bucket
          EXPECT_FALSE(has(d, gathers[2]));
        } else if (name == names::kBlockForward && op.layer == 1) {
          EXPECT_EQ(has(d, gathers[2]), param_gather);  // block 1's
          EXPECT_FALSE(has(d, gathers[1]));             // waited for by block 0 already
          EXPECT_FALSE(has(d, gathers[3]));
        }
      }
    }
  }
}

TEST(Workload, PipelineLossAndEmbeddingUnderZero) {
  // pp > 1: the last stage broadcasts the loss once per step over the pp group; the tied wte is
  // summed once per step without ZeRO, before each reduce-scatter under ZeRO 2 (every micro-batch).
  const int m = 3;
  for (int zero : {0, 2}) {
    Scenario s = small_scenario(4, 2, 1, 2, m);
    s.parallel.zero = zero;
    const Workload w = build_workload(s, h100_cost(), {2, {}});
    for (const auto& st : w.stages) {
      auto n = count_by_name(w, st);
      EXPECT_EQ(n[std::string(names::kPipelineLoss)], 2) << zero;
      EXPECT_EQ(n[std::string(names::kEmbedAllReduce)], zero == 0 ? 2 : 2 * m) << zero;
    }
  }
}

TEST(Workload, ModelFlopsMatchTheSpans) {
  // The model FLOPs of the step equal the FLOPs on the compute ops, summed over all ranks (each
  // tp rank's block ops carry 1/tp; the head is computed by every tp rank, counted once in the model).
  const Scenario s = small_scenario(8, 2, 1, 4, 4);
  const Workload w = build_workload(s, h100_cost());
  double span_flops = 0;
  for (const auto& p : w.stages)
    for (const auto& op : p.ops) span_flops += op.flops;
  EXPECT_NEAR(span_flops * s.parallel.dp, w.model_flops_per_step, 1e-9 * w.model_flops_per_step);
}

TEST(Workload, PlacementTpFastest) {
  Scenario s = small_scenario(8, 2, 4, 2, 2);
  const Layout l = Layout::from(s);
  EXPECT_EQ(l.rank_of(0, 1, 0), 1);
  EXPECT_EQ(l.rank_of(1, 0, 0), 4);
  EXPECT_EQ(l.rank_of(0, 0, 1), 8);
  for (int r = 0; r < l.world(); ++r) {
    const auto c = l.coord(r);
    EXPECT_EQ(l.rank_of(c.dp, c.tp, c.pp), r);
  }
  s.parallel.placement = "pp,dp,tp";
  const Layout l2 = Layout::from(s);
  EXPECT_EQ(l2.rank_of(0, 0, 1), 1);
  EXPECT_EQ(l2.rank_of(1, 0, 0), 2);
  EXPECT_EQ(l2.rank_of(0, 1, 0), 4);
}

// parallel.pp_layers: each stage's program runs its own blocks (layer ids from model/'s ranges), the
// head's stage its three after the embedding's stage's one; stage_compute counts them, and its
// block FLOPs are m x blocks x (forward + backward) of model/flops.hpp, exactly: 3x on the 3-block
// stage. Under tp the pieces carry 1/tp each. The per-stage ops bound holds for the larger stage.
TEST(Workload, UnevenStagesFollowPpLayers) {
  const int L = 4, pp = 2, m = 4;
  for (int tp : {1, 2}) {
    Scenario s = small_scenario(L, 1, tp, pp, m);
    s.parallel.pp_layers = {1, 3};
    const Workload w = build_workload(s, h100_cost());
    const model::flops::Dims fd{2, 128, 256, 1024, tp};
    const double per_block = model::flops::block_forward(fd) + model::flops::block_backward(fd);
    const auto sc = stage_compute(w);
    ASSERT_EQ(sc.size(), 2u);
    const int first[2] = {0, 1}, blocks[2] = {1, 3};
    for (int st = 0; st < pp; ++st) {
      const auto& p = w.stages[st];
      EXPECT_EQ(p.layers, blocks[st]);
      auto n = count_by_name(w, p);
      const int pieces = tp == 1 ? 1 : 3;
      EXPECT_EQ(n[std::string(names::kBlockForward)], pieces * m * blocks[st]) << tp;
      EXPECT_EQ(n[std::string(names::kBlockBackward)], pieces * m * blocks[st]) << tp;
      for (const auto& op : p.ops) {
        const std::string name = w.names[op.name];
        if (name != names::kBlockForward && name != names::kBlockBackward) continue;
        EXPECT_GE(op.layer, first[st]);
        EXPECT_LT(op.layer, first[st] + blocks[st]);
      }
      EXPECT_EQ(sc[st].stage, st);
      EXPECT_EQ(sc[st].layers, blocks[st]);
      EXPECT_DOUBLE_EQ(sc[st].block_flops, m * blocks[st] * per_block) << "stage " << st;
      EXPECT_GT(sc[st].compute_ns, 0);
      EXPECT_LE(double(p.ops.size()), workload_ops_bound(s, 1));
      int64_t sum = 0;
      for (auto b : p.bucket_params) sum += b;
      EXPECT_EQ(sum, p.param_count);
    }
    EXPECT_DOUBLE_EQ(sc[1].block_flops, 3 * sc[0].block_flops);
    // The head on stage 1, the embedding's zero FLOPs on stage 0: stage flops = blocks + head.
    const double head = model::flops::head_forward(fd) + model::flops::head_backward(fd);
    EXPECT_DOUBLE_EQ(sc[0].flops, sc[0].block_flops);
    EXPECT_NEAR(sc[1].flops, sc[1].block_flops + m * head, 1e-9 * sc[1].flops);
  }
  // Without pp_layers: 2 blocks each, the same total.
  const Workload even = build_workload(small_scenario(L, 1, 1, pp, m), h100_cost());
  EXPECT_EQ(even.stages[0].layers, 2);
  EXPECT_EQ(even.stages[1].layers, 2);
}

TEST(Workload, BadLayoutsAreInputErrors) {
  Scenario s = small_scenario(8, 1, 3, 1, 2);  // 8 heads % tp 3
  EXPECT_THROW(build_workload(s, h100_cost()), InputError);
  s = small_scenario(6, 1, 1, 4, 4);  // 6 layers % pp 4
  EXPECT_THROW(build_workload(s, h100_cost()), InputError);
  s = small_scenario(8, 1, 1, 2, 4, "interleaved");
  s.parallel.virtual_stages = 3;  // 8 layers % (pp 2 x 3 chunks)
  EXPECT_THROW(build_workload(s, h100_cost()), InputError);
  EXPECT_THROW(precision_config("fp8"), InputError);
  s = small_scenario(8, 1, 1, 2, 4);
  s.parallel.pp_layers = {3, 4};  // 7 layers of 8
  EXPECT_THROW(build_workload(s, h100_cost()), InputError);
  s.parallel.pp_layers = {8};  // one entry for two stages
  EXPECT_THROW(build_workload(s, h100_cost()), InputError);
  s = small_scenario(8, 1, 1, 2, 4, "interleaved");
  s.parallel.virtual_stages = 2, s.parallel.pp_layers = {4, 4};
  EXPECT_THROW(build_workload(s, h100_cost()), InputError);
}

TEST(Workload, Gpt3On1024GpusBuildsOneProgramPerStage) {
  const Scenario s = testing::gpt3_175b(8);
  const Workload w = build_workload(s, h100_cost(), {1, precision_config("mixed")});
  EXPECT_EQ(w.micro_batches, 192);
  ASSERT_EQ(w.stages.size(), 16u);
  // Middle stage: 6 layers × 192 micro-batches × (3 fwd + 3 bwd pieces + 4 tp all-reduces)
  // + 192 × (recv act, send act, recv grad, send grad) + buckets + zero_grad + optimizer + the
  // pp.loss broadcast.
  const auto& p = w.stages[5];
  const size_t expected = size_t(6) * 192 * 10 + 192 * 4 + p.bucket_params.size() + 1 + 1 + 1;
  EXPECT_EQ(p.ops.size(), expected);
  // Parameters summed over the stages and the tp slices: the blocks' 12C^2 + 7C are sliced, the
  // replicated LayerNorms and row-parallel biases (6C) are held by every tp rank, and so are the
  // (unsliced, as in the runtime) wte, wpe, the final LayerNorm and the last stage's copy of wte.
  double total = 0;
  for (const auto& st : w.stages) total += double(st.param_count);
  const double c = 12288, v = 51200, t = 2048, tp = 8;
  const double expected_total =
      96 * (12 * c * c + 7 * c + 6 * c * tp) / tp * tp + tp * (2 * v * c + t * c + 2 * c);
  EXPECT_EQ(total * tp, expected_total);
  // The model itself is GPT-3's 175B (Narayanan et al.'s P formula): blocks and one embedding.
  EXPECT_NEAR((96 * (12 * c * c + 13 * c) + v * c + t * c + 2 * c) / 1e9, 174.6, 0.1);
}

}  // namespace
}  // namespace orrery::sim
