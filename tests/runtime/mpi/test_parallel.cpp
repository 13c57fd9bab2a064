// Tensor, pipeline and ZeRO parallelism, alone and combined, against a serial run under mpirun:
// the same loss curve and the same final parameters on the same global batch; pipelines also cut
// unevenly (parallel.pp_layers). Each case runs only
// when its dp*tp*pp equals the world size (the suite is started with 2, 4 and 8 ranks).
//
// Tolerances: the parallel runs sum in another order (tp splits the matmul reductions, dp and ZeRO
// average in MPI's order, micro-batches accumulate in fp32), so values differ by a few fp32 ulps
// per operation (gradients agree to ~1e-7 relative): loss curve relative 1e-5; parameters after 3
// AdamW steps max|Δ| / max|p| < 1e-4. Parameters get a looser bound than the DDP test's 1e-5
// because AdamW's update lr·m/(sqrt(v)+eps) turns a gradient difference δg into an update
// difference of about lr·δg/|g|: large on the few elements whose gradient is near zero, and tp
// changes the order of every matmul reduction, not only the final average. Observed: at most
// 2.9e-5 (tp4), 2e-5 (dp4 ZeRO 1), 1.7e-5 (dp2·pp2 ZeRO 2/3), below 1e-5 for the others. The serial
// run accumulates the same number of micro-batches (each dp times larger), so the grouping of the
// global batch is the same.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_env.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/pipeline.hpp"
#include "orrery/runtime/tensor_parallel.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime {
namespace {

using testing::world;

struct Case {
  const char* name;
  int dp, tp, pp, zero;
  const char* schedule;
  std::vector<int> pp_layers = {};  // parallel.pp_layers; empty: 2 blocks per stage
  bool sequence_parallel = false;
  Recompute recompute = Recompute::None;
  bool llama = false;  // Llama-style blocks: 2 kv heads, SwiGLU, RMSNorm, RoPE, untied, no biases
  int kv_heads = 2;    // of the Llama-style blocks' 4 heads (fewer than tp: each replicated)
};

Scenario tiny(const Case& c) {
  Scenario s;
  s.name = "parallel-test";
  s.model.layers = 4;
  s.model.d_model = 32;
  s.model.heads = 4;
  s.model.vocab = 64;
  s.model.seq = 16;
  s.training.steps = 3;
  s.training.global_batch = 8;
  s.training.micro_batch = c.pp > 1 ? 8 / (c.dp * 4) : 8 / c.dp;  // pipelines get 4 micro-batches
  s.training.seed = 42;
  s.training.lr = 1e-3;
  s.parallel.dp = c.dp;
  s.parallel.tp = c.tp;
  s.parallel.pp = c.pp;
  s.parallel.zero = c.zero;
  s.parallel.schedule = c.schedule;
  s.parallel.pp_layers = c.pp_layers;
  s.parallel.bucket_mb = 0.01;
  s.parallel.sequence_parallel = c.sequence_parallel;
  s.training.recompute = recompute_name(c.recompute);
  s.runtime.threads = 1;
  if (c.llama) {
    s.model.kv_heads = c.kv_heads;
    s.model.ffn_hidden = 48;
    s.model.activation = "swiglu";
    s.model.norm = "rmsnorm";
    s.model.position = "rope";
    s.model.tied_embeddings = false;
    s.model.bias = false;
  }
  return s;
}

class ParallelEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(ParallelEquivalence, SameLossAndParametersAsSerial) {
  const Case c = GetParam();
  if (c.dp * c.tp * c.pp != world().size())
    GTEST_SKIP() << "needs " << c.dp * c.tp * c.pp << " ranks";
  const Scenario s = tiny(c);
  check_supported(s);
  Trainer par(s, world(), nullptr);
  par.prepare();
  std::vector<float> losses;
  for (int i = 0; i < s.training.steps; ++i) losses.push_back(par.step().loss);
  par.dp_group().all_reduce(losses.data(), losses.size(), DType::F32, ReduceOp::Avg).wait();

  Case serial_case{"serial", 1, 1, 1, 0, "gpipe", {}};
  serial_case.llama = c.llama;
  serial_case.kv_heads = c.kv_heads;
  Scenario ss = tiny(serial_case);
  // The same micro-batches per step as the parallel run, each dp times larger: the same global batch
  // accumulated in the same grouping, so only the parallel reductions differ in order.
  ss.training.micro_batch = s.training.micro_batch * c.dp;
  auto local = make_local_communicator();
  Trainer ser(ss, *local, nullptr);
  ser.prepare();
  std::vector<float> serial_losses;
  for (int i = 0; i < ss.training.steps; ++i) serial_losses.push_back(ser.step().loss);

  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], serial_losses[i], 1e-5 * std::abs(serial_losses[i])) << "step " << i;
  }
  // Final parameters: every tensor this rank holds against its slice of the serial model.
  const Layout& L = par.layout();
  if (!c.pp_layers.empty()) {  // the stage holds the blocks parallel.pp_layers gives it
    int first = 0;
    for (int i = 0; i < L.pp_rank; ++i) first += c.pp_layers[size_t(i)];
    EXPECT_EQ(par.model().shard.layer_begin, first);
    EXPECT_EQ(par.model().num_blocks(), c.pp_layers[size_t(L.pp_rank)]);
  }
  double max_diff = 0, max_ref = 0;
  const Gpt& m = par.model();
  const std::vector<float> params = par.parameters();  // ZeRO 3: gathered over dp
  for (const auto& t : m.tensors) {
    const std::vector<float> want = tp_slice_of_full(ser.model(), t, L.tp_rank, L.tp);
    for (size_t i = 0; i < t.count; ++i) {
      max_diff = std::max(max_diff, std::abs(static_cast<double>(params[t.offset + i]) - want[i]));
      max_ref = std::max(max_ref, std::abs(static_cast<double>(want[i])));
    }
  }
  const double err = max_diff / max_ref;
  double worst = err;
  world().all_reduce(&worst, 1, DType::F64, ReduceOp::Max).wait();
  if (world().rank() == 0) {
    std::printf("  %-22s loss %.6f (serial %.6f)  max relative parameter error %.3g\n", c.name,
                losses.back(), serial_losses.back(), worst);
  }
  EXPECT_LT(err, 1e-4) << c.name;

  // Replicated tensors (LayerNorms, row-parallel biases, embeddings) are identical on every tp rank.
  if (L.tp > 1) {
    for (const auto& t : m.tensors) {
      if (t.name.find("qkv") != std::string::npos || t.name.find("fcw") != std::string::npos ||
          t.name.find("fcb") != std::string::npos || t.name.find("projw") != std::string::npos)
        continue;
      std::vector<float> mine(params.begin() + static_cast<std::ptrdiff_t>(t.offset),
                              params.begin() + static_cast<std::ptrdiff_t>(t.offset + t.count));
      std::vector<float> root = mine;
      par.tp_group().broadcast(root.data(), root.size(), DType::F32, 0).wait();
      EXPECT_EQ(mine, root) << t.name << " differs across tp ranks";
    }
  }
  // Replicated kv heads (fewer than tp): the ranks sharing a head hold its k and v rows to the bit.
  const int replicas = m.config.arch.kv_replicas(L.tp);
  if (replicas > 1) {
    const std::size_t from = std::size_t(m.dims.Cl) * m.dims.C,
                      n = 2 * std::size_t(m.dims.Ckvl) * m.dims.C;
    int checked = 0;
    for (const auto& t : m.tensors) {
      if (t.name.find("qkvw") == std::string::npos) continue;
      std::vector<float> all(n * std::size_t(L.tp));
      par.tp_group().all_gather(params.data() + t.offset + from, all.data(), n, DType::F32).wait();
      const std::size_t first = std::size_t(L.tp_rank / replicas * replicas);
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(all[first * n + i], params[t.offset + from + i])
            << t.name << " kv row value " << i;
      ++checked;
    }
    EXPECT_EQ(checked, m.num_blocks());
  }

  // ZeRO memory (fp32 Adam): parameters 4Ψ, gradients 4Ψ (stage 2: 4Ψ/N), optimizer 8Ψ/N (stage
  // >= 1), with Ψ the rank's parameter count; padding: the arrays grow to N*ceil(Ψ/N) elements.
  // Stage 3: all three are sharded per segment, 16 Ψ/N bytes plus below N elements per segment.
  size_t psi = 0;
  for (const auto& t : m.tensors) psi += t.count;
  const double N = L.dp;
  const double k = std::ceil(psi / N);
  const Trainer::MemoryBytes mem = par.memory();
  if (c.zero == 3) {
    const double segments = (L.pp_rank == 0 || L.pp_rank == L.pp - 1 ? 1 : 0) +
                            (L.pp_rank == L.pp - 1 ? 1 : 0) + static_cast<double>(m.num_blocks());
    EXPECT_EQ(mem.gradients, mem.parameters);
    EXPECT_EQ(mem.optimizer, 2 * mem.parameters);
    EXPECT_GE(mem.parameters, 4.0 * psi / N);
    EXPECT_LT(mem.parameters - 4.0 * psi / N, 4.0 * N * segments);
    if (world().rank() == 0)
      std::printf(
          "  zero3 rank 0: psi %zu, N %d: params %.0f B (4psi/N %.0f), grads %.0f, optimizer "
          "%.0f\n",
          psi, L.dp, mem.parameters, 4.0 * psi / N, mem.gradients, mem.optimizer);
    return;
  }
  EXPECT_EQ(mem.parameters, 4 * (c.zero >= 1 ? N * k : psi));
  EXPECT_EQ(mem.optimizer, c.zero >= 1 ? 8 * k : 8.0 * psi);
  EXPECT_EQ(mem.gradients, c.zero == 2 ? 4 * k : 4 * (c.zero >= 1 ? N * k : psi));
  if (c.zero >= 1) {
    EXPECT_LT(mem.optimizer - 8.0 * psi / N, 8.0 * N);  // padding below N elements
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ParallelEquivalence,
    ::testing::Values(
        Case{"dp2_zero1", 2, 1, 1, 1, "gpipe", {}}, Case{"dp2_zero2", 2, 1, 1, 2, "gpipe", {}},
        Case{"dp2_zero3", 2, 1, 1, 3, "gpipe", {}}, Case{"dp2_pp2_zero3", 2, 1, 2, 3, "1f1b", {}},
        Case{"dp2_tp2_zero3", 2, 2, 1, 3, "gpipe", {}}, Case{"tp2", 1, 2, 1, 0, "gpipe", {}},
        Case{"pp2_gpipe", 1, 1, 2, 0, "gpipe", {}}, Case{"pp2_1f1b", 1, 1, 2, 0, "1f1b", {}},
        Case{"tp4", 1, 4, 1, 0, "gpipe", {}}, Case{"pp4_1f1b", 1, 1, 4, 0, "1f1b", {}},
        Case{"dp2_tp2", 2, 2, 1, 0, "gpipe", {}}, Case{"tp2_pp2", 1, 2, 2, 0, "1f1b", {}},
        Case{"dp2_pp2_zero2", 2, 1, 2, 2, "1f1b", {}}, Case{"dp4_zero1", 4, 1, 1, 1, "gpipe", {}},
        Case{"dp2_tp2_pp2_zero1", 2, 2, 2, 1, "1f1b", {}},
        Case{"dp2_tp2_pp2_gpipe", 2, 2, 2, 0, "gpipe", {}},
        // Stages cut unevenly (parallel.pp_layers): the embedding's stage 1 block, the head's 3,
        // and the other way round.
        Case{"pp2_1f1b_layers_1_3", 1, 1, 2, 0, "1f1b", {1, 3}},
        Case{"pp2_gpipe_layers_3_1", 1, 1, 2, 0, "gpipe", {3, 1}},
        Case{"dp2_pp2_zero1_layers_1_3", 2, 1, 2, 1, "1f1b", {1, 3}},
        Case{"tp2_pp2_layers_3_1", 1, 2, 2, 0, "1f1b", {3, 1}},
        Case{"dp2_pp2_zero3_layers_1_3", 2, 1, 2, 3, "1f1b", {1, 3}},
        // Sequence parallelism (the tp all-reduces as reduce-scatters and all-gathers, the
        // residual stream sharded over tp), alone and with pipelines, ZeRO and recomputation.
        Case{"tp2_sp", 1, 2, 1, 0, "gpipe", {}, true},
        Case{"tp4_sp", 1, 4, 1, 0, "gpipe", {}, true},
        Case{"dp2_tp2_sp", 2, 2, 1, 0, "gpipe", {}, true},
        Case{"tp2_pp2_sp", 1, 2, 2, 0, "1f1b", {}, true},
        Case{"dp2_tp2_sp_zero3_full", 2, 2, 1, 3, "gpipe", {}, true, Recompute::Full},
        Case{"dp2_tp2_pp2_sp_full", 2, 2, 2, 0, "1f1b", {}, true, Recompute::Full},
        Case{"dp2_tp2_pp2_sp_selective", 2, 2, 2, 1, "1f1b", {}, true, Recompute::Selective},
        // Llama-style blocks (grouped-query attention, SwiGLU, RMSNorm, RoPE, an untied LM head,
        // no biases) under each parallelism: the q|k|v and gate|up bands split over tp, the
        // untied head's stage without an embedding copy.
        Case{"llama_tp2", 1, 2, 1, 0, "gpipe", {}, false, Recompute::None, true},
        Case{"llama_pp2_1f1b", 1, 1, 2, 0, "1f1b", {}, false, Recompute::None, true},
        Case{"llama_dp2_zero3", 2, 1, 1, 3, "gpipe", {}, false, Recompute::None, true},
        Case{"llama_dp2_pp2_zero3", 2, 1, 2, 3, "1f1b", {}, false, Recompute::None, true},
        Case{"llama_dp2_tp2_pp2_zero1", 2, 2, 2, 1, "1f1b", {}, false, Recompute::None, true},
        Case{"llama_tp2_sp", 1, 2, 1, 0, "gpipe", {}, true, Recompute::None, true},
        Case{"llama_dp2_tp2_sp_zero2_full", 2, 2, 1, 2, "gpipe", {}, true, Recompute::Full, true},
        Case{"llama_tp2_pp2_sp_sel", 1, 2, 2, 0, "1f1b", {}, true, Recompute::Selective, true},
        Case{"llama_dp2_tp2_pp2_sp_full", 2, 2, 2, 0, "1f1b", {}, true, Recompute::Full, true},
        // Fewer kv heads than tp ranks, each head replicated (its gradient summed over its ranks
        // after DDP, before ZeRO 1/2's reduce-scatter, before each ZeRO 3 block's): multi-query
        // over 2 ranks, 2 kv heads over 4, under DDP, every ZeRO stage, pipelines and sp.
        Case{"llama_mqa_tp2", 1, 2, 1, 0, "gpipe", {}, false, Recompute::None, true, 1},
        Case{"llama_kv2_tp4", 1, 4, 1, 0, "gpipe", {}, false, Recompute::None, true, 2},
        Case{"llama_mqa_dp2_tp2", 2, 2, 1, 0, "gpipe", {}, false, Recompute::None, true, 1},
        Case{"llama_mqa_dp2_tp2_zero1", 2, 2, 1, 1, "gpipe", {}, false, Recompute::None, true, 1},
        Case{"llama_mqa_dp2_tp2_sp_zero2", 2, 2, 1, 2, "gpipe", {}, true, Recompute::None, true, 1},
        Case{"llama_mqa_dp2_tp2_zero3_full",
             2,
             2,
             1,
             3,
             "gpipe",
             {},
             false,
             Recompute::Full,
             true,
             1},
        Case{"llama_mqa_tp4_sp", 1, 4, 1, 0, "gpipe", {}, true, Recompute::None, true, 1},
        Case{"llama_mqa_dp2_tp2_pp2_sp", 2, 2, 2, 0, "1f1b", {}, true, Recompute::None, true, 1},
        Case{"llama_mqa_tp2_pp2", 1, 2, 2, 0, "1f1b", {}, false, Recompute::Selective, true, 1}),
    [](const auto& info) { return std::string(info.param.name); });

// Activation recomputation under each parallelism: the same layout run with training.recompute
// none and with selective / full gives bit-identical losses and final parameters (the recomputed
// buffers are the forward's to the bit, and the tp all-reduce the full recomputation repeats sums
// the same values in the same order), and mem.activations is lower by the closed form: full saves
// every block's buffers of every micro-batch in flight less the one workspace block, selective the
// attention probabilities (B·heads/tp·T·T floats) of each less one.
struct RecomputeCase {
  const char* name;
  int dp, tp, pp, zero;
  Recompute mode;
};

class RecomputeEquivalence : public ::testing::TestWithParam<RecomputeCase> {};

TEST_P(RecomputeEquivalence, BitIdenticalToNoRecomputation) {
  const RecomputeCase c = GetParam();
  if (c.dp * c.tp * c.pp != world().size())
    GTEST_SKIP() << "needs " << c.dp * c.tp * c.pp << " ranks";
  Scenario s = tiny(Case{c.name, c.dp, c.tp, c.pp, c.zero, "1f1b", {}});
  auto train = [&](Recompute mode, std::vector<float>& losses, Trainer::MemoryBytes& mem) {
    Scenario r = s;
    r.training.recompute = recompute_name(mode);
    check_supported(r);
    Trainer t(r, world(), nullptr);
    t.prepare();
    for (int i = 0; i < r.training.steps; ++i) losses.push_back(t.step().loss);
    mem = t.memory();
    return t.parameters();
  };
  std::vector<float> ref_losses, losses;
  Trainer::MemoryBytes ref_mem, mem;
  const std::vector<float> ref = train(Recompute::None, ref_losses, ref_mem);
  const std::vector<float> got = train(c.mode, losses, mem);
  EXPECT_EQ(losses, ref_losses) << c.name;
  ASSERT_EQ(got.size(), ref.size());
  EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0) << c.name;

  // Closed form of the saving (tiny(): C = 32, 4 heads, F = 4C, T = 16; every buffer a multiple
  // of 16 floats, so alignment adds nothing).
  const double B = s.training.micro_batch, T = s.model.seq, C = s.model.d_model;
  const double Cl = C / c.tp, F = 4 * C / c.tp, NH = double(s.model.heads) / c.tp;
  const double BT = B * T, probs = B * NH * T * T;
  const double block = 5 * BT * C + 4 * BT + 3 * BT * Cl + BT * Cl + probs + 2 * BT * F;
  const int stage = world().rank() / (c.dp * c.tp);  // placement tp,dp,pp: pp slowest
  const int m = s.training.global_batch / (c.dp * s.training.micro_batch);
  const double in_flight = c.pp > 1 ? pipeline_in_flight(Schedule::OneFOneB, c.pp, stage, m) : 1;
  const double blocks = double(s.model.layers) / c.pp;
  const double saved = c.mode == Recompute::Full ? (in_flight * blocks - 1) * block
                                                 : (in_flight * blocks - 1) * probs;
  EXPECT_EQ(ref_mem.activations - mem.activations, 4 * saved) << c.name << " stage " << stage;
  EXPECT_EQ(mem.parameters, ref_mem.parameters);
  if (world().rank() == 0)
    std::printf("  %-26s mem.activations %.0f -> %.0f bytes on rank 0\n", c.name,
                ref_mem.activations, mem.activations);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RecomputeEquivalence,
    ::testing::Values(RecomputeCase{"tp2_full", 1, 2, 1, 0, Recompute::Full},
                      RecomputeCase{"tp2_selective", 1, 2, 1, 0, Recompute::Selective},
                      RecomputeCase{"pp2_full", 1, 1, 2, 0, Recompute::Full},
                      RecomputeCase{"pp2_selective", 1, 1, 2, 0, Recompute::Selective},
                      RecomputeCase{"dp2_zero3_full", 2, 1, 1, 3, Recompute::Full},
                      RecomputeCase{"dp2_zero1_selective", 2, 1, 1, 1, Recompute::Selective},
                      RecomputeCase{"tp2_pp2_full", 1, 2, 2, 0, Recompute::Full},
                      RecomputeCase{"dp2_tp2_pp2_full", 2, 2, 2, 0, Recompute::Full},
                      RecomputeCase{"dp2_tp2_pp2_selective", 2, 2, 2, 0, Recompute::Selective}),
    [](const auto& info) { return std::string(info.param.name); });

// zero.overlap_grad_reduce / zero.overlap_param_gather (Megatron's distributed optimizer: the
// shard cut per bucket, each bucket reduce-scattered during the backward and all-gathered after the
// optimizer): the same layout with the keys off and on gives the same losses and final parameters.
// Each gradient element is still the average of the same dp values; with 2 ranks their sum a + b
// is exact whatever the order, so the runs agree bit for bit; with 4, MPI's reduce-scatter of a
// bucket may group the four sums differently than that of the whole array (its algorithm depends
// on the message size): fp32 rounding only, bounded as the serial equivalence above (loss 1e-5
// relative, parameters 1e-4). d_model 34: a block holds 12·34² + 13·34 ≡ 2 (mod 4) elements, so
// under dp 4 the bucket boundaries move (model/buckets.hpp zero_buckets). The buckets' wire bytes
// (the trace's zero.reduce_scatter and zero.all_gather spans of step 1) equal the closed form
// 4·(⌈hi/N⌉ − ⌈lo/N⌉)·N for each DDP bucket's range [lo, hi) of the flat array.
struct ZeroOverlapCase {
  const char* name;
  int dp, tp, pp, zero;
  bool param_gather;
};

class ZeroOverlapEquivalence : public ::testing::TestWithParam<ZeroOverlapCase> {};

TEST_P(ZeroOverlapEquivalence, SameLossAndParametersAsOneReduceScatter) {
  const ZeroOverlapCase c = GetParam();
  if (c.dp * c.tp * c.pp != world().size())
    GTEST_SKIP() << "needs " << c.dp * c.tp * c.pp << " ranks";
  Scenario s = tiny(Case{c.name, c.dp, c.tp, c.pp, c.zero, "1f1b", {}});
  s.model.d_model = 34;
  s.model.heads = 2;
  const std::string path = ::testing::TempDir() + "orrery_zero_overlap_" +
                           std::to_string(::getppid()) + "_rank" + std::to_string(world().rank()) +
                           ".db";
  std::vector<DdpBucket> nominal, zb;
  auto train = [&](bool on, std::vector<float>& losses) {
    Scenario r = s;
    r.zero.overlap_grad_reduce = on;
    r.zero.overlap_param_gather = on && c.param_gather;
    check_supported(r);
    std::unique_ptr<traces::TraceWriter> writer;
    std::unique_ptr<profiler::Recorder> rec;
    if (on) {
      writer = std::make_unique<traces::TraceWriter>(path);
      rec = std::make_unique<profiler::Recorder>(writer.get(), world().rank());
      world().set_recorder(rec.get());
    }
    std::vector<float> params;
    {
      Trainer t(r, world(), rec.get());
      t.prepare();
      for (int i = 0; i < r.training.steps; ++i) losses.push_back(t.step().loss);
      params = t.parameters();
      if (on) {
        nominal = make_ddp_buckets(t.model(), r.parallel.bucket_mb);
        zb = t.ddp().buckets();
      }
    }
    if (on) {
      world().synchronize();
      world().set_recorder(nullptr);
      rec->flush();
      writer->close();
    }
    return params;
  };
  std::vector<float> ref_losses, losses;
  const std::vector<float> ref = train(false, ref_losses);
  const std::vector<float> got = train(true, losses);
  ASSERT_EQ(got.size(), ref.size());
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(double(got[i]) - double(ref[i])));
    max_ref = std::max(max_ref, std::abs(double(ref[i])));
  }
  double worst = max_diff / max_ref;
  world().all_reduce(&worst, 1, DType::F64, ReduceOp::Max).wait();
  if (world().rank() == 0)
    std::printf("  %-24s buckets %zu, max relative parameter difference %.3g\n", c.name, zb.size(),
                worst);
  if (c.dp == 2) {
    EXPECT_EQ(losses, ref_losses) << c.name;
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0) << c.name;
  } else {
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_NEAR(losses[i], ref_losses[i], 1e-5 * std::abs(ref_losses[i])) << "step " << i;
    EXPECT_LT(worst, 1e-4) << c.name;
  }

  // Wire bytes per bucket against the closed form.
  traces::Trace tr = traces::load_trace(path);
  std::remove(path.c_str());
  ASSERT_EQ(zb.size(), nominal.size());
  ASSERT_GT(zb.size(), 2u);
  const auto N = std::size_t(c.dp);
  auto up = [N](std::size_t x) { return (x + N - 1) / N * N; };
  std::vector<int64_t> want;
  std::vector<int> layers;
  for (const auto& b : nominal) {
    want.push_back(int64_t(4 * (up(b.range.end()) - up(b.range.offset))));
    layers.push_back(b.lowest_layer);
  }
  const int m = s.training.global_batch / (c.dp * s.training.micro_batch);
  std::vector<int64_t> rs, ag;
  std::vector<int> rs_layers, ag_layers;
  std::vector<const traces::Span*> spans;
  for (const auto& sp : tr.spans) {
    if (sp.step == 1 && sp.kind == traces::SpanKind::Collective) spans.push_back(&sp);
  }
  std::sort(spans.begin(), spans.end(), [](auto* a, auto* b) { return a->seq < b->seq; });
  for (const traces::Span* sp : spans) {
    const std::string name = tr.name_of(*sp);
    if (name == "zero.reduce_scatter" && sp->micro_batch == m - 1) {
      rs.push_back(sp->bytes);
      rs_layers.push_back(sp->layer);
    } else if (name == "zero.all_gather") {
      ag.push_back(sp->bytes);
      ag_layers.push_back(sp->layer);
    }
  }
  EXPECT_EQ(rs, want) << c.name;
  EXPECT_EQ(rs_layers, layers) << c.name;
  std::reverse(want.begin(), want.end());  // the all-gathers go in forward order
  std::reverse(layers.begin(), layers.end());
  EXPECT_EQ(ag, want) << c.name;
  EXPECT_EQ(ag_layers, layers) << c.name;
  int moved = 0;
  for (size_t i = 0; i < zb.size(); ++i) moved += zb[i].range.count != nominal[i].range.count;
  if (c.dp == 4) EXPECT_GT(moved, 0) << "the dp 4 cases cover moved boundaries";
}

INSTANTIATE_TEST_SUITE_P(Layouts, ZeroOverlapEquivalence,
                         ::testing::Values(ZeroOverlapCase{"dp2_zero1", 2, 1, 1, 1, true},
                                           ZeroOverlapCase{"dp2_zero2", 2, 1, 1, 2, true},
                                           ZeroOverlapCase{"dp2_zero1_no_param_gather", 2, 1, 1, 1,
                                                           false},
                                           ZeroOverlapCase{"dp4_zero1", 4, 1, 1, 1, true},
                                           ZeroOverlapCase{"dp4_zero2", 4, 1, 1, 2, true},
                                           ZeroOverlapCase{"dp2_pp2_zero1", 2, 1, 2, 1, true},
                                           ZeroOverlapCase{"dp2_pp2_zero2", 2, 1, 2, 2, true},
                                           ZeroOverlapCase{"dp2_tp2_zero1", 2, 2, 1, 1, true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace orrery::runtime
