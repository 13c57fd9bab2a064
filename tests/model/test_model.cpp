// model/: the rank grid and the placement parser, the DDP bucket rule, ZeRO's partition and the
// parameter table, in closed form; and that the runtime and the simulator, which both take these
// from model/, agree on a stage's parameters and buckets.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>

#include "orrery/common/error.hpp"
#include "orrery/model/activations.hpp"
#include "orrery/model/block.hpp"
#include "orrery/model/buckets.hpp"
#include "orrery/model/grid.hpp"
#include "orrery/model/names.hpp"
#include "orrery/model/parameters.hpp"
#include "orrery/model/zero_partition.hpp"

#if ORRERY_MODEL_TESTS_CROSS
#include "orrery/runtime/ddp.hpp"
#include "orrery/runtime/model.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/cost_model.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/sim/workload.hpp"
#endif

namespace orrery::model {
namespace {

// The per-op activation table sums to Korthikanti et al. 2022's closed forms (section 4.1): a GPT
// block keeps s·b·h·(34 + 5·a·s/h), 10 of it replicated under plain tp, all of it split with
// sequence parallelism; a Llama-2-7B block (h 4096, F 11008, SwiGLU, no dropout, no GQA) keeps
// s·b·h·(8 + (4 + 4 + 2·2·F/h + 2·F/h)/t + 2·a·s/(h·t)).
TEST(Activations, PerOpTableSumsToThePapersClosedForms) {
  BlockArch gpt;
  gpt = gpt.resolve(/*heads=*/16, /*d_model=*/1024);
  const int a = 16, h = 1024, s = 2048;
  const double as_h = double(a) * s / h;
  const auto terms = block_activation_terms(gpt, a, h, s, 1);
  ASSERT_EQ(terms.size(), 12u);
  double total = 0, core = 0;
  for (const auto& x : terms) {
    total += x.sbh;
    if (x.core) core += x.sbh;
  }
  EXPECT_DOUBLE_EQ(total, 34.0 + 5.0 * as_h);
  EXPECT_DOUBLE_EQ(core, 5.0 * as_h);
  for (const int t : {1, 2, 8}) {
    const auto at_t = block_activation_terms(gpt, a, h, s, t);
    const BlockActivations plain = block_activations(at_t, t, false);
    EXPECT_DOUBLE_EQ(plain.rest, 10.0 + 24.0 / t) << t;
    EXPECT_DOUBLE_EQ(plain.core, 5.0 * as_h / t) << t;
    const BlockActivations sp = block_activations(at_t, t, true);
    EXPECT_DOUBLE_EQ(sp.rest, 34.0 / t) << t;
    EXPECT_DOUBLE_EQ(sp.core, 5.0 * as_h / t) << t;
  }
  BlockArch llama;
  llama.activation = Activation::Swiglu;
  llama.norm = Norm::RmsNorm;
  llama.position = Position::Rope;
  llama.bias = false;
  llama.ffn_hidden = 11008;
  llama = llama.resolve(32, 4096);
  const double f = 11008.0 / 4096.0, as_h7 = 32.0 * 4096 / 4096;
  for (const int t : {1, 4}) {
    const BlockActivations b =
        block_activations(block_activation_terms(llama, 32, 4096, 4096, t), t, false);
    EXPECT_DOUBLE_EQ(b.rest, 8.0 + (8.0 + 4.0 * f + 2.0 * f) / t) << t;
    EXPECT_DOUBLE_EQ(b.core, 2.0 * as_h7 / t) << t;
  }
  // Grouped-query attention: 8 kv heads of 32 keep k and v at a quarter; on 16 tp ranks (more
  // ranks than kv heads) each rank keeps one replicated head's, r = tp / heads.
  BlockArch gqa = llama;
  gqa.kv_heads = 8;
  auto attention = [&](int t) {
    for (const auto& x : block_activation_terms(gqa, 32, 4096, 4096, t))
      if (x.op == "attention") return x.sbh;
    return -1.0;
  };
  EXPECT_DOUBLE_EQ(attention(1), 2.0 + 4.0 * 0.25);
  EXPECT_DOUBLE_EQ(attention(16), 2.0 + 4.0 * 0.5);
}

TEST(Placement, ParsesPermutationsOnly) {
  EXPECT_EQ(parse_placement("tp,dp,pp"), (std::array<int, 3>{1, 0, 2}));
  EXPECT_EQ(parse_placement("pp,dp,tp"), (std::array<int, 3>{2, 0, 1}));
  EXPECT_EQ(parse_placement("dp,tp,pp"), (std::array<int, 3>{0, 1, 2}));
  for (const char* bad :
       {"", "tp,dp", "tp,dp,pp,dp", "dp,dp,pp", "tp, dp, pp", "tp,,dp", "tp,dp,xx"}) {
    EXPECT_FALSE(parse_placement(bad).has_value()) << bad;
  }
}

TEST(RankGrid, TpFastestByDefaultAndRoundTrips) {
  Scenario s;
  s.parallel.dp = 2, s.parallel.tp = 4, s.parallel.pp = 3;
  const RankGrid g = RankGrid::from(s);
  EXPECT_EQ(g.world(), 24);
  EXPECT_EQ(g.rank_of(0, 1, 0), 1);
  EXPECT_EQ(g.rank_of(1, 0, 0), 4);
  EXPECT_EQ(g.rank_of(0, 0, 1), 8);
  for (int r = 0; r < g.world(); ++r) {
    const auto c = g.coord(r);
    EXPECT_EQ(g.rank_of(c.dp, c.tp, c.pp), r);
  }
  s.parallel.placement = "dp,pp,tp";
  const RankGrid h = RankGrid::from(s);
  EXPECT_EQ(h.rank_of(1, 0, 0), 1);
  EXPECT_EQ(h.rank_of(0, 0, 1), 2);
  EXPECT_EQ(h.rank_of(0, 1, 0), 6);
  s.parallel.placement = "dp,dp,pp";
  EXPECT_THROW(RankGrid::from(s), InputError);
}

TEST(DdpBuckets, ClosedBeforeTheSegmentThatWouldPassTheCap) {
  // Cap 100 bytes, 4 bytes per element: 25 elements per bucket at most.
  const std::vector<BucketSegment> order{{4, 10}, {3, 10}, {2, 10}, {1, 40}, {0, 0}, {-1, 5}};
  const auto b = ddp_buckets(order, 100.0, 4);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0].begin, 0u);
  EXPECT_EQ(b[0].end, 2u);
  EXPECT_EQ(b[0].elements, 20);
  EXPECT_EQ(b[0].lowest_segment, 3);
  // 20 + 10 = 30 elements = 120 bytes > 100: block 2 opens a bucket.
  EXPECT_EQ(b[1].begin, 2u);
  EXPECT_EQ(b[1].end, 3u);
  EXPECT_EQ(b[1].elements, 10);
  EXPECT_EQ(b[1].lowest_segment, 2);
  // Block 1 (160 bytes, past the cap by itself) is a bucket of its own.
  EXPECT_EQ(b[2].begin, 3u);
  EXPECT_EQ(b[2].end, 4u);
  EXPECT_EQ(b[2].elements, 40);
  EXPECT_EQ(b[2].lowest_segment, 1);
  // The empty segment 0 is skipped; the embedding (5) cannot join block 1's: a bucket of its own.
  EXPECT_EQ(b[3].begin, 5u);
  EXPECT_EQ(b[3].end, 6u);
  EXPECT_EQ(b[3].elements, 5);
  EXPECT_EQ(b[3].lowest_segment, -1);
  // Exactly at the cap stays in: 25 elements x 4 = 100 bytes.
  const std::vector<BucketSegment> exact{{1, 15}, {0, 10}};
  EXPECT_EQ(ddp_buckets(exact, 100.0, 4).size(), 1u);
}

TEST(ZeroBuckets, BoundariesMovedUpToMultiplesOfTheRanks) {
  // Memory: segment 0 [0, 7), 1 [7, 17), 2 [17, 27), 3 [27, 37); one segment per bucket (cap 10
  // elements); 4 ranks: the array padded to 40. Each bucket's bottom rounded up to a multiple of 4:
  // bucket 0 = [28, 40), 1 = [20, 28), 2 = [8, 20), 3 = [0, 8).
  const std::vector<BucketSegment> order{{3, 10}, {2, 10}, {1, 10}, {0, 7}};
  const auto z = zero_buckets(order, 40.0, 4, 4);
  ASSERT_EQ(z.size(), 4u);
  const int64_t offset[] = {28, 20, 8, 0}, elements[] = {12, 8, 12, 8},
                shard_offset[] = {0, 3, 5, 8};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(z[i].begin, i);
    EXPECT_EQ(z[i].end, i + 1);
    EXPECT_EQ(z[i].lowest_segment, 3 - int(i));
    EXPECT_EQ(z[i].offset, offset[i]) << i;
    EXPECT_EQ(z[i].elements, elements[i]) << i;
    EXPECT_EQ(z[i].shard, elements[i] / 4) << i;
    EXPECT_EQ(z[i].shard_offset, shard_offset[i]) << i;
  }
  // A segment lies in its bucket and the one below that took its bottom elements.
  EXPECT_EQ(zero_buckets_overlapping(z, 27, 10), (std::vector<int>{0, 1}));
  EXPECT_EQ(zero_buckets_overlapping(z, 7, 10), (std::vector<int>{2, 3}));
  EXPECT_EQ(zero_buckets_overlapping(z, 0, 7), (std::vector<int>{3}));
  // One rank: the DDP buckets unchanged.
  const auto one = zero_buckets(order, 40.0, 4, 1);
  ASSERT_EQ(one.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(one[i].elements, order[i].elements);
  // A bucket of 2 elements emptied by the move joins the next: memory 1 [0, 10), 2 [10, 12),
  // 3 [12, 22), padded to 24: [12, 24) and [0, 12) holding segments 2 and 1.
  const std::vector<BucketSegment> small{{3, 10}, {2, 2}, {1, 10}};
  const auto e = zero_buckets(small, 40.0, 4, 4);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].offset, 12);
  EXPECT_EQ(e[0].elements, 12);
  EXPECT_EQ(e[1].begin, 1u);
  EXPECT_EQ(e[1].end, 3u);
  EXPECT_EQ(e[1].lowest_segment, 1);
  EXPECT_EQ(e[1].offset, 0);
  EXPECT_EQ(e[1].elements, 12);
  EXPECT_EQ(e[1].shard_offset, 3);
  // Any sizes: the buckets tile [0, N·ceil(n / N)) downwards, each a multiple of N and equal to
  // N·(ceil(hi / N) - ceil(lo / N)) for its DDP bucket's range [lo, hi) (no bucket emptied here).
  for (int ranks : {2, 3, 5, 8}) {
    std::vector<BucketSegment> segs;
    int64_t n = 0;
    for (int i = 0; i < 9; ++i) {
      segs.push_back({8 - i, 37 + 11 * i});
      n += 37 + 11 * i;
    }
    const auto d = ddp_buckets(segs, 4.0 * 120, 4);
    const auto zb = zero_buckets(segs, 4.0 * 120, 4, ranks);
    ASSERT_EQ(zb.size(), d.size());
    auto up = [ranks](int64_t x) { return (x + ranks - 1) / ranks * ranks; };
    int64_t hi = n, top = up(n), shards = 0;
    for (size_t i = 0; i < zb.size(); ++i) {
      const int64_t lo = hi - d[i].elements;
      EXPECT_EQ(zb[i].elements, up(hi) - up(lo)) << ranks << " bucket " << i;
      EXPECT_EQ(zb[i].elements % ranks, 0);
      EXPECT_EQ(zb[i].offset + zb[i].elements, top);
      EXPECT_EQ(zb[i].shard_offset, shards);
      shards += zb[i].shard;
      top = zb[i].offset;
      hi = lo;
    }
    EXPECT_EQ(top, 0);
    EXPECT_EQ(shards * ranks, up(n));
  }
}

TEST(ZeroPartition, PadsToAMultipleOfTheRanks) {
  const std::vector<size_t> expect{3, 3, 3, 1};
  for (int r = 0; r < 4; ++r) {
    const auto p = zero_partition(10, r, 4);
    EXPECT_EQ(p.shard, 3u);
    EXPECT_EQ(p.padded(), 12u);
    EXPECT_EQ(p.begin(), 3u * r);
    EXPECT_EQ(p.count(), expect[r]);
  }
  EXPECT_EQ(zero_partition(2, 3, 4).count(), 0u);  // a rank past the end owns only padding
  EXPECT_THROW(zero_partition(10, 4, 4), std::invalid_argument);
}

Scenario model_scenario(int layers, int d_model, int heads, int vocab, int seq, int tp, int pp) {
  Scenario s;
  s.model.layers = layers, s.model.d_model = d_model, s.model.heads = heads, s.model.vocab = vocab,
  s.model.seq = seq;
  s.parallel.tp = tp, s.parallel.pp = pp;
  return s;
}

int64_t total(const std::vector<ParamSpec>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t(0),
                         [](int64_t a, const ParamSpec& p) { return a + p.count(); });
}

TEST(Parameters, WholeModelIsGptMdsCount) {
  // gpt.md: L (12 C^2 + 13 C) + 2 C non-embedding, V C + T C embedding.
  const int64_t L = 4, C = 64, V = 512, T = 32;
  const Scenario s = model_scenario(int(L), int(C), 4, int(V), int(T), 1, 1);
  const auto p = parameter_tensors(model_shape(s), stage_contents(s, 0));
  EXPECT_EQ(total(p), L * (12 * C * C + 13 * C) + 2 * C + V * C + T * C);
  EXPECT_EQ(p.front().name, "wte");
  EXPECT_EQ(p[1].name, "wpe");
  EXPECT_EQ(p[2].name, "h.0.ln1w");
  EXPECT_EQ(p.back().name, "lnfb");
  EXPECT_EQ(p.back().segment, int(L));
  EXPECT_EQ(p.size(), size_t(2 + 12 * L + 2));
}

TEST(Parameters, TensorParallelSlicesSumToTheWholeBlock) {
  const int C = 64, tp = 4;
  const Scenario s = model_scenario(2, C, 8, 256, 16, tp, 1);
  const auto p = parameter_tensors(model_shape(s), stage_contents(s, 0));
  int64_t block = 0;
  for (const auto& t : p) {
    if (t.segment != 0) continue;
    block += t.count();
    // A sliced tensor's full shape is tp times its local one along the slice.
    // (Bands of a vector, the column-parallel biases qkvb and fcb, cut its entries.)
    const bool vector = t.rows == 1 && t.full_rows == 1;
    if (t.slice == Slice::Rows || (t.slice == Slice::Bands && !vector)) {
      EXPECT_EQ(t.full_rows, t.rows * tp) << t.name;
    }
    if (t.slice == Slice::Cols || (t.slice == Slice::Bands && vector)) {
      EXPECT_EQ(t.full_cols, t.cols * tp) << t.name;
    }
    // Replicated (not sliced) drawn tensors are whole.
    if (t.slice == Slice::None && t.init == Init::Normal) {
      EXPECT_EQ(t.count(), int64_t(t.full_rows) * t.full_cols) << t.name;
    }
    if (t.slice == Slice::None && t.count() != int64_t(t.full_rows) * t.full_cols) {
      EXPECT_EQ(t.init, Init::Zero) << t.name;
    }
  }
  // Sliced: qkvw, qkvb, projw, fcw, fcb, fcprojw (12 C^2 + 7 C over tp); replicated: 4 LayerNorm
  // vectors, projb and fcprojb (6 C).
  EXPECT_EQ(block, (12 * C * C + 7 * C) / tp + 6 * C);
}

TEST(Parameters, PipelineStagesPartitionTheLayersAndCopyWte) {
  const Scenario s = model_scenario(8, 32, 4, 128, 16, 1, 4);
  std::map<std::string, int> seen;
  for (int st = 0; st < 4; ++st) {
    for (const auto& t : parameter_tensors(model_shape(s), stage_contents(s, st))) ++seen[t.name];
  }
  EXPECT_EQ(seen["wte"], 2);  // stage 0 and the last stage's tied copy
  EXPECT_EQ(seen["wpe"], 1);
  EXPECT_EQ(seen["lnfw"], 1);
  for (int l = 0; l < 8; ++l) EXPECT_EQ(seen["h." + std::to_string(l) + ".qkvw"], 1) << l;
  // Interleaved: stage 1 of pp 2 with 2 chunks holds virtual stages 1 and 3.
  Scenario v = model_scenario(8, 32, 4, 128, 16, 1, 2);
  v.parallel.schedule = "interleaved", v.parallel.virtual_stages = 2;
  const auto c = stage_contents(v, 1);
  ASSERT_EQ(c.layers.size(), 2u);
  EXPECT_EQ(c.layers[0], (std::pair<int, int>{2, 4}));
  EXPECT_EQ(c.layers[1], (std::pair<int, int>{6, 8}));
}

// parallel.pp_layers: the stages' blocks as given, contiguous from layer 0; without it the even
// split (the first layers % pp stages one more when pp does not divide the layers).
TEST(Parameters, StageLayersFollowPpLayersOrSplitEvenly) {
  EXPECT_EQ(stage_layer_counts(48, 4, {}), (std::vector<int>{12, 12, 12, 12}));
  EXPECT_EQ(stage_layer_counts(5, 2, {}), (std::vector<int>{3, 2}));
  EXPECT_EQ(stage_layer_counts(48, 4, {11, 12, 12, 13}), (std::vector<int>{11, 12, 12, 13}));
  const std::vector<std::pair<int, int>> want{{0, 11}, {11, 23}, {23, 35}, {35, 48}};
  Scenario s = model_scenario(48, 32, 4, 128, 16, 1, 4);
  s.parallel.pp_layers = {11, 12, 12, 13};
  std::map<std::string, int> seen;
  for (int st = 0; st < 4; ++st) {
    EXPECT_EQ(stage_layer_range(48, 4, s.parallel.pp_layers, st), want[size_t(st)]) << st;
    const StageContents c = stage_contents(s, st);
    ASSERT_EQ(c.layers.size(), 1u);
    EXPECT_EQ(c.layers[0], want[size_t(st)]) << st;
    EXPECT_EQ(c.embed, st == 0);
    EXPECT_EQ(c.head, st == 3);
    int blocks = 0;
    for (const auto& p : parameter_tensors(model_shape(s), c)) {
      ++seen[p.name];
      blocks += p.name.ends_with(".qkvw");
    }
    EXPECT_EQ(blocks, want[size_t(st)].second - want[size_t(st)].first) << st;
  }
  for (int l = 0; l < 48; ++l) EXPECT_EQ(seen["h." + std::to_string(l) + ".qkvw"], 1) << l;
  // Even split, in closed form, against the counts.
  EXPECT_EQ(stage_layer_range(5, 2, {}, 0), (std::pair<int, int>{0, 3}));
  EXPECT_EQ(stage_layer_range(5, 2, {}, 1), (std::pair<int, int>{3, 5}));
  // A list that does not describe the stages is refused, naming the key.
  for (const std::vector<int>& bad : {std::vector<int>{1, 3}, {1, 1, 1}, {0, 2, 2}, {2, 2, 1}}) {
    try {
      stage_layer_counts(4, 3, bad);
      ADD_FAILURE() << "accepted " << bad.size() << " entries";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("key 'parallel.pp_layers'"), std::string::npos);
    }
  }
  EXPECT_THROW(stage_layer_range(4, 2, {}, 2), InputError);
}

TEST(Block, TpPiecesPartitionTheOpsAndCutAfterThePartialSums) {
  // Forward: every op once, in order; the tp sums follow the row-parallel proj and fc2.
  int next = 0;
  for (const auto& r : kForwardPieces) {
    EXPECT_EQ(r.begin, next);
    next = r.end;
  }
  EXPECT_EQ(next, kBlockOps);
  EXPECT_EQ(kForwardPieces[0].end - 1, int(BlockOp::Proj));
  EXPECT_EQ(kForwardPieces[1].end - 1, int(BlockOp::Fc2));
  // Backward: every op once, last first; the tp sums follow the column-parallel fc1 and qkv.
  next = kBlockOps;
  for (const auto& r : kBackwardPieces) {
    EXPECT_EQ(r.end, next);
    next = r.begin;
  }
  EXPECT_EQ(next, 0);
  EXPECT_EQ(kBackwardPieces[0].begin, int(BlockOp::Fc1));
  EXPECT_EQ(kBackwardPieces[1].begin, int(BlockOp::Qkv));
}

TEST(Names, CommunicatorNamesFromCoordinates) {
  EXPECT_EQ(names::dp_group(1, 2), "dp[tp=1,pp=2]");
  EXPECT_EQ(names::tp_group(3, 0), "tp[dp=3,pp=0]");
  EXPECT_EQ(names::pp_group(0, 1), "pp[dp=0,tp=1]");
  EXPECT_EQ(names::embed_group(2, 1), "embed[dp=2,tp=1]");
}

#if ORRERY_MODEL_TESTS_CROSS
// The runtime's model and the simulator's workload take their tensors and buckets from model/: the
// same stage gives the same parameters (names, segments, counts) and the same DDP buckets.
// Also with the stages cut unevenly (parallel.pp_layers, 1 block then 3).
class RuntimeAndSimulator : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(RuntimeAndSimulator, SameParametersAndBucketsPerStage) {
  Scenario s = model_scenario(4, 64, 4, 512, 32, 2, 2);
  s.parallel.pp_layers = GetParam();
  s.parallel.bucket_mb = 0.05;  // several buckets per stage
  s.training.global_batch = 8, s.training.micro_batch = 4;
  const sim::Device d = *sim::device_preset("H100-SXM");
  const sim::CostModel cost(sim::default_hardware_profile("H100-SXM", true), d.peak_bf16_flops,
                            d.mem_bandwidth_bytes_per_s);
  const auto w = sim::build_workload(s, cost);
  for (int st = 0; st < 2; ++st) {
    runtime::GptShard sh = runtime::GptShard::pipeline_stage(runtime::gpt_config(s.model), st, 2,
                                                             s.parallel.pp_layers);
    const auto [first, last] = stage_layer_range(4, 2, s.parallel.pp_layers, st);
    EXPECT_EQ(sh.layer_begin, first);
    EXPECT_EQ(sh.layer_end, last);
    EXPECT_EQ(w.stages[size_t(st)].layers, last - first);
    sh.tp_rank = 1, sh.tp_size = 2;
    const runtime::Gpt g = runtime::gpt_create(runtime::gpt_config(s.model), sh, 7);
    const auto simp = sim::stage_parameters(s, st);
    ASSERT_EQ(g.tensors.size(), simp.size()) << st;
    for (size_t i = 0; i < simp.size(); ++i) {
      EXPECT_EQ(g.tensors[i].name, simp[i].name);
      EXPECT_EQ(g.tensors[i].segment, simp[i].segment);
      EXPECT_EQ(int64_t(g.tensors[i].count), simp[i].count) << simp[i].name;
    }
    const auto rb = runtime::make_ddp_buckets(g, s.parallel.bucket_mb);
    const auto& sb = w.stages[size_t(st)].bucket_params;
    ASSERT_EQ(rb.size(), sb.size()) << st;
    EXPECT_GT(rb.size(), 1u);  // several (a 1-block stage: its block and the embedding)
    for (size_t i = 0; i < rb.size(); ++i)
      EXPECT_EQ(int64_t(rb[i].range.count), sb[i]) << st << " bucket " << i;
  }
}
// zero.overlap_grad_reduce: the runtime's ZeRO buckets (make_zero_buckets) and the simulator's are
// the same, dp = 3 so that the boundaries move (the blocks hold 12·64² + 13·64 ≡ 1 (mod 3)).
TEST(RuntimeAndSimulatorZero, SameZeroBucketsPerStage) {
  Scenario s = model_scenario(4, 64, 4, 512, 32, 1, 2);
  s.parallel.dp = 3;
  s.parallel.zero = 1;
  s.zero.overlap_grad_reduce = true;
  s.parallel.bucket_mb = 0.05;
  s.training.global_batch = 12, s.training.micro_batch = 4;
  const sim::Device d = *sim::device_preset("H100-SXM");
  const sim::CostModel cost(sim::default_hardware_profile("H100-SXM", true), d.peak_bf16_flops,
                            d.mem_bandwidth_bytes_per_s);
  sim::WorkloadOptions opt;
  opt.precision = sim::precision_config("fp32");
  const auto w = sim::build_workload(s, cost, opt);
  int moved = 0;
  for (int st = 0; st < 2; ++st) {
    const runtime::GptShard sh =
        runtime::GptShard::pipeline_stage(runtime::gpt_config(s.model), st, 2, {});
    const runtime::Gpt g = runtime::gpt_create(runtime::gpt_config(s.model), sh, 7);
    const auto rb = runtime::make_zero_buckets(g, s.parallel.bucket_mb, 3);
    const auto plain = runtime::make_ddp_buckets(g, s.parallel.bucket_mb);
    const auto& sb = w.stages[size_t(st)].bucket_params;
    ASSERT_EQ(rb.size(), sb.size()) << st;
    ASSERT_EQ(rb.size(), plain.size()) << st;
    for (size_t i = 0; i < rb.size(); ++i) {
      EXPECT_EQ(int64_t(rb[i].range.count), sb[i]) << st << " bucket " << i;
      EXPECT_EQ(rb[i].range.count % 3, 0u);
      EXPECT_EQ(rb[i].shard * 3, rb[i].range.count);
      moved += rb[i].range.count != plain[i].range.count;
    }
  }
  EXPECT_GT(moved, 0);  // the check covers moved boundaries
}

INSTANTIATE_TEST_SUITE_P(PpLayers, RuntimeAndSimulator,
                         ::testing::Values(std::vector<int>{}, std::vector<int>{1, 3}),
                         [](const auto& tp_info) {
                           return tp_info.param.empty() ? std::string("even") : std::string("1_3");
                         });
#endif

}  // namespace
}  // namespace orrery::model

// Issue 19: the MoE rules of model/moe.hpp on hand-built routings.
#include "orrery/model/moe.hpp"

namespace orrery::model {
TEST(Moe, RoutingTopKRenormalisesAndDropsInGShardOrder) {
  // 4 tokens, 3 experts, top 2. Token rows of probabilities (each sums to 1).
  const std::vector<float> p = {0.5f, 0.3f, 0.2f,   // t0: e0 then e1
                                0.6f, 0.1f, 0.3f,   // t1: e0 then e2
                                0.2f, 0.2f, 0.6f,   // t2: e2 then e0 (tie e0/e1: lower index)
                                0.7f, 0.2f, 0.1f};  // t3: e0 then e1
  MoeConfig cfg;
  cfg.experts = 3;
  cfg.top_k = 2;
  cfg.capacity_factor = 1.0;
  EXPECT_EQ(moe::capacity(cfg, 4), 3);  // ceil(1.0 * 4 * 2 / 3)
  const moe::Routing r = moe::route(p.data(), 4, 3, 2, moe::capacity(cfg, 4));
  EXPECT_EQ(r.expert, (std::vector<int>{0, 1, 0, 2, 2, 0, 0, 1}));
  EXPECT_FLOAT_EQ(r.weight[0], 0.5f / 0.8f);
  EXPECT_FLOAT_EQ(r.weight[5], 0.2f / 0.8f);
  // First choices: e0 takes t0, t1, t3 (its capacity 3), e2 takes t2. Second choices: t0's e1
  // kept, t1's e2 kept, t2's e0 dropped (e0 full), t3's e1 kept.
  EXPECT_EQ(r.kept, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0, 1, 1}));
  EXPECT_EQ(r.dropped, 1);
  EXPECT_EQ(r.routed, (std::vector<int64_t>{4, 2, 2}));
  EXPECT_EQ(r.taken, (std::vector<int64_t>{3, 2, 2}));
  cfg.capacity_factor = 0;
  EXPECT_EQ(moe::capacity(cfg, 4), -1);
  EXPECT_EQ(moe::route(p.data(), 4, 3, 2, -1).dropped, 0);
}

TEST(Moe, AuxLossClosedFormAndGradient) {
  const std::vector<float> p = {0.5f, 0.3f, 0.2f, 0.6f, 0.1f, 0.3f,
                                0.2f, 0.2f, 0.6f, 0.7f, 0.2f, 0.1f};
  const moe::Routing r = moe::route(p.data(), 4, 3, 2, -1);
  // f = (4, 2, 2) / 8; P = (2.0, 0.8, 1.2) / 4; aux = coef * 3 * sum f_e P_e.
  const double expect = 0.01 * 3 * (0.5 * 0.5 + 0.25 * 0.2 + 0.25 * 0.3);
  EXPECT_NEAR(moe::aux_loss(p.data(), r, 0.01), expect, 1e-9);
  std::vector<float> d(12, 0.0f);
  moe::aux_loss_backward(d.data(), r, 0.01);
  for (int t = 0; t < 4; ++t) {
    EXPECT_FLOAT_EQ(d[static_cast<size_t>(t * 3 + 0)], float(0.01 * 3 * 0.5 / 4));
    EXPECT_FLOAT_EQ(d[static_cast<size_t>(t * 3 + 1)], float(0.01 * 3 * 0.25 / 4));
  }
  // Uniform routing gives the minimum, coef (Switch, eq. 4).
  const std::vector<float> u(4 * 2, 0.5f);
  const moe::Routing ru = moe::route(u.data(), 4, 2, 1, -1);  // ties: all to e0
  EXPECT_NEAR(moe::aux_loss(u.data(), ru, 1.0), 2 * (1.0 * 0.5), 1e-9);
}

TEST(Moe, BlocksExpertsAndShares) {
  MoeConfig cfg;
  cfg.experts = 8;
  cfg.every = 2;
  EXPECT_TRUE(moe::is_moe_block(cfg, 0));
  EXPECT_FALSE(moe::is_moe_block(cfg, 1));
  EXPECT_EQ(moe::moe_blocks(cfg, 0, 12), 6);
  EXPECT_EQ(moe::moe_blocks(cfg, 3, 8), 2);  // 4, 6
  // DeepSeek-V3's 61 blocks, the first three dense: 58 MoE blocks, block 3 the first.
  MoeConfig ds;
  ds.experts = 256;
  ds.first_dense = 3;
  EXPECT_FALSE(moe::is_moe_block(ds, 2));
  EXPECT_TRUE(moe::is_moe_block(ds, 3));
  EXPECT_EQ(moe::moe_blocks(ds, 0, 61), 58);
  cfg.first_dense = 3;  // with every 2: blocks 4, 6, 8, 10 of 12
  EXPECT_FALSE(moe::is_moe_block(cfg, 0));
  EXPECT_FALSE(moe::is_moe_block(cfg, 3));
  EXPECT_EQ(moe::moe_blocks(cfg, 0, 12), 4);
  cfg.first_dense = 0;
  EXPECT_EQ(moe::local_experts(8, 4, 3).first, 6);
  EXPECT_EQ(moe::local_experts(8, 4, 3).count, 2);
  EXPECT_EQ(moe::ep_rank(5, 2), 1);
  EXPECT_EQ(moe::ep_group_index(5, 2), 2);
  // GPT expert: 4C x C + 4C + C x 4C + C; SwiGLU without bias: 3 matrices.
  EXPECT_EQ(moe::expert_parameters(64, 256, false, true), 256 * 64 + 256 + 64 * 256 + 64);
  EXPECT_EQ(moe::expert_parameters(64, 256, true, false), 3 * 256 * 64);
  const auto u = moe::expert_load_shares(4, 0);
  for (double x : u) EXPECT_DOUBLE_EQ(x, 0.25);
  const auto z = moe::expert_load_shares(3, 1);  // 1, 1/2, 1/3 over 11/6
  EXPECT_NEAR(z[0], 6.0 / 11, 1e-12);
  EXPECT_NEAR(z[2], 2.0 / 11, 1e-12);
  EXPECT_EQ(moe::moe_tokens_counter(3, 5), "moe.tokens[l=3,e=5]");
}
}  // namespace orrery::model
