// The model with Llama-style blocks (model.kv_heads, ffn_hidden, activation swiglu, norm rmsnorm,
// position rope, tied_embeddings false, bias false) on tiny configurations: the parameter table,
// whole-model gradients against central finite differences, pipeline stages chained by hand (the
// untied head's stage holds no embedding), tensor-parallel shards (two threads summing at the
// Megatron points, plain and sequence-parallel) against the full model, the tp slices of the
// q|k|v and gate|up bands, and recomputation bit-identical to none.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fd_check.hpp"
#include "orrery/common/error.hpp"
#include "orrery/model/flops.hpp"
#include "orrery/runtime/buffers.hpp"
#include "orrery/runtime/model.hpp"
#include "orrery/runtime/tensor_parallel.hpp"

namespace orrery::runtime {
namespace {

constexpr int kB = 2;
constexpr int kT = 8;

BlockArch llama_arch() {
  BlockArch a;
  a.kv_heads = 2;
  a.ffn_hidden = 24;
  a.activation = Activation::Swiglu;
  a.norm = Norm::RmsNorm;
  a.position = Position::Rope;
  a.rope_theta = 100.0;  // larger angles than 10000 gives at T = 8
  a.tied_embeddings = false;
  a.bias = false;
  return a;
}
GptConfig tiny_llama() { return GptConfig{2, 16, 4, 32, 8, llama_arch()}; }  // L, C, H, V, T
// A mix the other way round: multi-query, GELU, LayerNorm without shift, rope, tied head.
GptConfig tiny_mixed() {
  BlockArch a;
  a.kv_heads = 1;
  a.position = Position::Rope;
  a.bias = false;
  return GptConfig{2, 16, 4, 32, 8, a};
}

using fd::scramble;
using fd::tokens;

struct Run {
  float loss;
  std::vector<float> grads;
};

Run forward_backward(Gpt& m, const std::vector<int32_t>& in, const std::vector<int32_t>& tg,
                     const GptHooks& hooks = {}, Recompute rc = Recompute::None) {
  auto acts = gpt_activations(m, kB, kT, rc);
  auto scratch = gpt_grad_scratch(m, kB, kT, rc);
  bind_workspace(acts, scratch);
  gpt_zero_grad(m);
  const float loss = gpt_forward(m, acts, in.data(), tg.data(), hooks);
  gpt_backward(m, acts, scratch, 1.0f, hooks);
  return Run{loss, std::vector<float>(m.grads.begin(), m.grads.end())};
}

std::vector<std::string> names_of(const Gpt& m) {
  std::vector<std::string> out;
  for (const auto& t : m.tensors) out.push_back(t.name);
  return out;
}

TEST(LlamaModel, ParameterTable) {
  const auto cfg = tiny_llama();
  auto m = gpt_create(cfg, GptShard{}, 1);
  EXPECT_EQ(names_of(m),
            (std::vector<std::string>{"wte", "h.0.ln1w", "h.0.qkvw", "h.0.projw", "h.0.ln2w",
                                      "h.0.fcw", "h.0.fcprojw", "h.1.ln1w", "h.1.qkvw", "h.1.projw",
                                      "h.1.ln2w", "h.1.fcw", "h.1.fcprojw", "lnfw", "lmw"}));
  // C = 16, 4 heads of 4, 2 kv heads: qkv (16 + 2·8, 16); SwiGLU fc1 (2·24, 16); fc2 (16, 24).
  EXPECT_EQ(m.tensor("h.0.qkvw").rows, 32);
  EXPECT_EQ(m.tensor("h.0.fcw").rows, 48);
  EXPECT_EQ(m.tensor("h.0.fcprojw").cols, 24);
  const int64_t C = 16, V = 32;
  const int64_t per_block = 2 * C + C * (C + 2 * 8) + C * C + 2 * 24 * C + 24 * C;
  flops::Dims d = flop_dims(m, kB, kT);
  EXPECT_EQ(flops::params_per_block(d), per_block);
  EXPECT_EQ(static_cast<int64_t>(m.num_params()), 2 * per_block + V * C + C + V * C);
  EXPECT_EQ(m.embed.wpe, nullptr);
  EXPECT_EQ(m.head.lnfb, nullptr);
  EXPECT_EQ(m.blocks[0].qkvb, nullptr);
  EXPECT_EQ(m.blocks[1].fcprojb, nullptr);
  EXPECT_NE(m.head.lmw, nullptr);
  // FLOPs per token of the forward, op by op (model/flops.hpp): norms 2C, qkv 2·C·32, attention
  // 2·T·C, proj 2·C², fc1 2·2·24·C, fc2 2·24·C; head 2C + 2CV.
  const double tok = kB * kT;
  EXPECT_DOUBLE_EQ(flops::block_forward(d), tok * (2 * 2 * C + 2.0 * C * 32 + 2.0 * kT * C +
                                                   2.0 * C * C + 4.0 * 24 * C + 2.0 * 24 * C));
  EXPECT_DOUBLE_EQ(flops::head_forward(d), tok * (2.0 * C + 2.0 * C * V));
  // A pipeline's head-only stage: no wte copy when the head is untied.
  auto s1 = gpt_create(cfg, GptShard::pipeline_stage(cfg, 1, 2), 1);
  EXPECT_EQ(names_of(s1), (std::vector<std::string>{"h.1.ln1w", "h.1.qkvw", "h.1.projw", "h.1.ln2w",
                                                    "h.1.fcw", "h.1.fcprojw", "lnfw", "lmw"}));
  EXPECT_FALSE(holds_embedding_segment(s1));
  EXPECT_EQ(s1.segment_range(kEmbedSegment).count, 0u);
}

TEST(LlamaModel, BadShapesAreInputErrors) {
  GptConfig c = tiny_llama();
  c.arch.kv_heads = 3;  // does not divide 4 heads
  EXPECT_THROW(gpt_create(c, GptShard{}, 1), InputError);
  // 4 kv heads over 6 ranks: neither divides the other (12 heads, head size 2, MLP 48).
  BlockArch a = llama_arch();
  a.kv_heads = 4;
  a.ffn_hidden = 48;
  c = GptConfig{2, 24, 12, 32, 8, a};
  GptShard sh;
  sh.tp_size = 6;
  EXPECT_THROW(gpt_create(c, sh, 1), InputError);
  sh.tp_size = 4;  // 4 over 4, and 2 kv heads over 4 ranks (each replicated twice): accepted
  EXPECT_NO_THROW(gpt_create(c, sh, 1));
  c.arch.kv_heads = 2;
  EXPECT_NO_THROW(gpt_create(c, sh, 1));
  c = GptConfig{2, 12, 4, 32, 8, llama_arch()};  // head size 3: rope needs it even
  EXPECT_THROW(gpt_create(c, GptShard{}, 1), InputError);
}

void check_finite_differences(const GptConfig& cfg, uint32_t seed, float eps = 1e-2f) {
  auto m = gpt_create(cfg, GptShard{}, seed);
  scramble(m, seed + 1);
  const auto in = tokens(kB * kT, cfg.vocab, seed + 2), tg = tokens(kB * kT, cfg.vocab, seed + 3);
  const auto run = forward_backward(m, in, tg);
  fd::expect_model_gradients(m, run.grads, in, tg, kB, kT, eps);
}

// eps 3e-3: at 1e-2 the central difference's truncation error on one embedding entry (wte[165],
// through RMSNorm's and SwiGLU's curvature) is 2.3 %; at 3e-3 every entry agrees within 1 %.
TEST(LlamaModel, GradientsMatchFiniteDifferences) {
  check_finite_differences(tiny_llama(), 4, 3e-3f);
}
TEST(LlamaModel, MixedBlockGradientsMatchFiniteDifferences) {
  check_finite_differences(tiny_mixed(), 14);
}

TEST(LlamaModel, PipelineStagesChainToTheFullModel) {
  const auto cfg = tiny_llama();
  auto full = gpt_create(cfg, GptShard{}, 17);
  scramble(full, 18);
  auto s0 = gpt_create(cfg, GptShard::pipeline_stage(cfg, 0, 2), 17);
  auto s1 = gpt_create(cfg, GptShard::pipeline_stage(cfg, 1, 2), 17);
  for (Gpt* s : {&s0, &s1}) {
    for (const auto& t : s->tensors) {
      const auto& f = full.tensor(t.name);
      std::copy_n(full.params.data() + f.offset, t.count, s->params.data() + t.offset);
    }
  }
  const auto in = tokens(kB * kT, 32, 19), tg = tokens(kB * kT, 32, 20);
  const auto ref = forward_backward(full, in, tg);
  auto a0 = gpt_activations(s0, kB, kT);
  auto a1 = gpt_activations(s1, kB, kT);
  auto g0 = gpt_grad_scratch(s0, kB, kT);
  auto g1 = gpt_grad_scratch(s1, kB, kT);
  gpt_zero_grad(s0);
  gpt_zero_grad(s1);
  gpt_forward(s0, a0, in.data(), nullptr);
  std::copy_n(a0.stage_output(), a0.boundary_elems, a1.stage_input());
  const float loss = gpt_forward(s1, a1, nullptr, tg.data());
  std::vector<int> ready1;
  GptHooks h1;
  h1.on_grads_ready = [&](int seg) { ready1.push_back(seg); };
  gpt_backward(s1, a1, g1, 1.0f, h1);
  std::copy_n(g1.dres, a1.boundary_elems, g0.dres);
  gpt_backward(s0, a0, g0);
  EXPECT_EQ(ready1, (std::vector<int>{2, 1}));  // no embedding segment on the untied head's stage
  EXPECT_EQ(loss, ref.loss);
  // Untied: every gradient, wte included, lives on one stage and equals the full model's bit for bit.
  std::size_t checked = 0;
  for (const Gpt* s : {&s0, &s1}) {
    for (const auto& t : s->tensors) {
      const auto& f = full.tensor(t.name);
      for (std::size_t i = 0; i < t.count; ++i) {
        ASSERT_EQ(s->grads[t.offset + i], ref.grads[f.offset + i]) << t.name << "[" << i << "]";
      }
      checked += t.count;
    }
  }
  EXPECT_EQ(checked, full.num_params());
}

// Sums (and, for sequence parallelism, gathers and reduce-scatters) over an in-process group.
class ThreadGroup {
 public:
  explicit ThreadGroup(int n) : n_(n), in_(static_cast<std::size_t>(n)), sync_(n) {}
  void all_reduce(int rank, float* data, std::size_t count) {
    in_[static_cast<std::size_t>(rank)] = data;
    sync_.arrive_and_wait();
    std::vector<float> sum(count, 0.0f);
    for (int r = 0; r < n_; ++r)
      for (std::size_t i = 0; i < count; ++i) sum[i] += in_[static_cast<std::size_t>(r)][i];
    sync_.arrive_and_wait();
    std::copy(sum.begin(), sum.end(), data);
    sync_.arrive_and_wait();
  }
  void all_gather(int rank, const float* send, float* recv, std::size_t count) {
    in_[static_cast<std::size_t>(rank)] = const_cast<float*>(send);
    sync_.arrive_and_wait();
    for (int r = 0; r < n_; ++r)
      std::copy_n(in_[static_cast<std::size_t>(r)], count, recv + r * count);
    sync_.arrive_and_wait();
  }
  void reduce_scatter(int rank, const float* send, float* recv, std::size_t count) {
    in_[static_cast<std::size_t>(rank)] = const_cast<float*>(send);
    sync_.arrive_and_wait();
    for (std::size_t i = 0; i < count; ++i) {
      float s = 0.0f;
      for (int r = 0; r < n_; ++r) s += in_[static_cast<std::size_t>(r)][rank * count + i];
      recv[i] = s;
    }
    sync_.arrive_and_wait();
  }

 private:
  int n_;
  std::vector<float*> in_;
  std::barrier<> sync_;
};

// tp ranks against the full model: losses, and every shard gradient against its slice of the
// full gradient (tp_slice_of_full on a model whose parameters are the full gradients). With fewer
// kv heads than ranks (each head on tp / kv_heads ranks) the pieces leave each rank the part of its
// head's k and v gradient its own query heads produced: the training loop sums them over the
// head's ranks (kv_grad_all_reduce), which this test does by hand before comparing (unless
// sum_replicas is false: the qkv gradients are then not checked). Returns the largest relative
// error of a qkv gradient.
double check_tensor_parallel(bool sequence_parallel, Recompute rc, int kTp = 2, int kv_heads = 2,
                             bool sum_replicas = true) {
  auto cfg = tiny_llama();
  cfg.arch.kv_heads = kv_heads;
  auto full = gpt_create(cfg, GptShard{}, 21);
  scramble(full, 22);
  const auto in = tokens(kB * kT, 32, 23), tg = tokens(kB * kT, 32, 24);
  const auto ref = forward_backward(full, in, tg);
  Gpt grads_of_full = gpt_create(cfg, GptShard{}, 21);
  std::copy(ref.grads.begin(), ref.grads.end(), grads_of_full.params.begin());
  std::vector<Gpt> shards;
  for (int r = 0; r < kTp; ++r) {
    GptShard sh;
    sh.tp_rank = r;
    sh.tp_size = kTp;
    sh.sequence_parallel = sequence_parallel;
    Gpt s = gpt_create(cfg, sh, 21);
    for (const auto& t : s.tensors) {
      const auto v = tp_slice_of_full(full, t, r, kTp);
      std::copy(v.begin(), v.end(), s.params.begin() + static_cast<std::ptrdiff_t>(t.offset));
    }
    shards.push_back(std::move(s));
  }
  ThreadGroup group(kTp);
  std::vector<float> losses(kTp);
  std::vector<std::thread> threads;
  for (int r = 0; r < kTp; ++r) {
    threads.emplace_back([&, r] {
      GptHooks hooks;
      hooks.tp_all_reduce = [&, r](TpPoint, int, float* data, std::size_t n) {
        group.all_reduce(r, data, n);
      };
      hooks.tp_all_gather = [&, r](TpPoint, int, const float* send, float* recv, std::size_t n) {
        group.all_gather(r, send, recv, n);
      };
      hooks.tp_reduce_scatter = [&, r](TpPoint, int, const float* send, float* recv,
                                       std::size_t n) { group.reduce_scatter(r, send, recv, n); };
      losses[static_cast<std::size_t>(r)] =
          forward_backward(shards[static_cast<std::size_t>(r)], in, tg, hooks, rc).loss;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kTp; ++r)
    EXPECT_NEAR(losses[static_cast<std::size_t>(r)], ref.loss, 1e-5 * ref.loss);
  const int replicas = cfg.arch.kv_replicas(kTp);
  if (replicas > 1 && sum_replicas) {
    // The k and v rows (after the query rows) of each block's qkvw, summed over a head's ranks.
    const BlockDims& d = shards[0].dims;
    EXPECT_EQ(d.NKV, 1);
    for (int l = 0; l < cfg.n_layer; ++l) {
      const std::string name = "h." + std::to_string(l) + ".qkvw";
      const std::size_t from = std::size_t(d.Cl) * d.C, n = 2 * std::size_t(d.hs) * d.C;
      for (int head = 0; head < kTp / replicas; ++head) {
        std::vector<float> sum(n, 0.0f);
        for (int r = head * replicas; r < (head + 1) * replicas; ++r) {
          const float* g = shards[std::size_t(r)].grads.data() +
                           shards[std::size_t(r)].tensor(name).offset + from;
          for (std::size_t i = 0; i < n; ++i) sum[i] += g[i];
        }
        for (int r = head * replicas; r < (head + 1) * replicas; ++r)
          std::copy(
              sum.begin(), sum.end(),
              shards[std::size_t(r)].grads.begin() +
                  static_cast<std::ptrdiff_t>(shards[std::size_t(r)].tensor(name).offset + from));
      }
    }
  }
  double worst_qkv = 0;
  for (int r = 0; r < kTp; ++r) {
    const Gpt& s = shards[static_cast<std::size_t>(r)];
    for (const auto& t : s.tensors) {
      const auto want = tp_slice_of_full(grads_of_full, t, r, kTp);
      double worst = 0, scale = 1e-3;
      for (std::size_t i = 0; i < t.count; ++i) {
        worst = std::max(worst, static_cast<double>(std::abs(s.grads[t.offset + i] - want[i])));
        scale = std::max(scale, static_cast<double>(std::abs(want[i])));
      }
      const bool qkv = t.name.find("qkv") != std::string::npos;
      if (qkv) worst_qkv = std::max(worst_qkv, worst / scale);
      if (sum_replicas || !qkv) {
        EXPECT_LT(worst / scale, 1e-5) << "rank " << r << " " << t.name;
      }
    }
  }
  return worst_qkv;
}

TEST(LlamaModel, TensorParallelShardsMatchTheFullModel) {
  check_tensor_parallel(false, Recompute::None);
}
TEST(LlamaModel, SequenceParallelShardsMatchTheFullModel) {
  check_tensor_parallel(true, Recompute::None);
}
TEST(LlamaModel, SequenceParallelWithFullRecomputation) {
  check_tensor_parallel(true, Recompute::Full);
}
// Fewer kv heads than tp ranks: multi-query over 2 and 4 ranks, 2 kv heads over 4 (each twice).
TEST(LlamaModel, ReplicatedKvHeadsMatchTheFullModel) {
  check_tensor_parallel(false, Recompute::None, 2, 1);
  check_tensor_parallel(false, Recompute::None, 4, 1);
  check_tensor_parallel(false, Recompute::None, 4, 2);
  check_tensor_parallel(true, Recompute::Full, 4, 2);
}
// Without the sum over a head's ranks the shards' kv gradients are not the full model's: the
// check above can fail.
TEST(LlamaModel, ReplicatedKvHeadsHoldOnlyTheirQueriesPart) {
  EXPECT_GT(check_tensor_parallel(false, Recompute::None, 2, 1, false), 1e-2);
}

TEST(LlamaModel, TensorParallelSlicesPartitionTheBands) {
  const auto cfg = tiny_llama();
  Gpt full = gpt_create(cfg, GptShard{}, 11);
  for (std::size_t i = 0; i < full.params.size(); ++i) full.params[i] = static_cast<float>(i);
  const int tp = 2;
  for (const char* name : {"h.0.qkvw", "h.0.projw", "h.1.fcw", "h.1.fcprojw"}) {
    std::set<float> seen;
    for (int r = 0; r < tp; ++r) {
      GptShard sh;
      sh.tp_rank = r;
      sh.tp_size = tp;
      Gpt part = gpt_create(cfg, sh, 11);
      for (float v : tp_slice_of_full(full, part.tensor(name), r, tp))
        EXPECT_TRUE(seen.insert(v).second) << name;
    }
    EXPECT_EQ(seen.size(), full.tensor(name).count) << name;
  }
  // Rank 1's qkv: q rows 8..15, k rows 16 + 4..7, v rows 24 + 4..7 of the full (32, 16) tensor.
  GptShard sh;
  sh.tp_rank = 1;
  sh.tp_size = tp;
  Gpt part = gpt_create(cfg, sh, 11);
  const auto q = tp_slice_of_full(full, part.tensor("h.0.qkvw"), 1, tp);
  const float base = static_cast<float>(full.tensor("h.0.qkvw").offset);
  ASSERT_EQ(q.size(), 16u * 16u);
  EXPECT_EQ(q[0], base + 8 * 16);
  EXPECT_EQ(q[8 * 16], base + 20 * 16);
  EXPECT_EQ(q[12 * 16], base + 28 * 16);
  // Multi-query over 2 ranks: each holds the one kv head whole (k rows 16..19, v rows 20..23 of
  // the full (24, 16) qkvw) after its own 8 query rows; 2 kv heads over 4 ranks: ranks 2 and 3
  // hold the second head (k rows 16 + 4..7, v rows 24 + 4..7 of (32, 16)).
  for (const auto& [kv, ranks] : {std::pair<int, int>{1, 2}, std::pair<int, int>{2, 4}}) {
    GptConfig c = cfg;
    c.arch.kv_heads = kv;
    Gpt whole = gpt_create(c, GptShard{}, 11);
    for (std::size_t i = 0; i < whole.params.size(); ++i) whole.params[i] = static_cast<float>(i);
    const float b = static_cast<float>(whole.tensor("h.0.qkvw").offset);
    const int q_rows = 16 / ranks, kv_full = 4 * kv;
    for (int r = 0; r < ranks; ++r) {
      GptShard rs;
      rs.tp_rank = r;
      rs.tp_size = ranks;
      Gpt pr = gpt_create(c, rs, 11);
      const auto& t = pr.tensor("h.0.qkvw");
      ASSERT_EQ(t.rows, q_rows + 8) << kv << " over " << ranks;
      const auto got = tp_slice_of_full(whole, t, r, ranks);
      const int head = r / (ranks / kv);
      EXPECT_EQ(got[0], b + float(r * q_rows * 16));
      EXPECT_EQ(got[std::size_t(q_rows) * 16], b + float((16 + head * 4) * 16)) << r;
      EXPECT_EQ(got[std::size_t(q_rows + 4) * 16], b + float((16 + kv_full + head * 4) * 16)) << r;
      // gpt_create's own initialisation cuts the same rows (the drawn full tensor, as tp = 1 draws).
      Gpt drawn = gpt_create(c, GptShard{}, 11);
      const auto want = tp_slice_of_full(drawn, t, r, ranks);
      const std::vector<float> mine(
          pr.params.begin() + static_cast<std::ptrdiff_t>(t.offset),
          pr.params.begin() + static_cast<std::ptrdiff_t>(t.offset + t.count));
      EXPECT_EQ(mine, want) << r;
    }
  }
  // Rank 1's SwiGLU fc1: gate rows 12..23 and up rows 24 + 12..23 of the full (48, 16) tensor.
  const auto f = tp_slice_of_full(full, part.tensor("h.0.fcw"), 1, tp);
  const float fbase = static_cast<float>(full.tensor("h.0.fcw").offset);
  EXPECT_EQ(f[0], fbase + 12 * 16);
  EXPECT_EQ(f[12 * 16], fbase + 36 * 16);
}

TEST(LlamaModel, RecomputationIsBitIdentical) {
  const auto cfg = tiny_llama();
  auto m = gpt_create(cfg, GptShard{}, 31);
  scramble(m, 32);
  const auto in = tokens(kB * kT, 32, 33), tg = tokens(kB * kT, 32, 34);
  const auto none = forward_backward(m, in, tg);
  for (Recompute rc : {Recompute::Selective, Recompute::Full}) {
    const auto got = forward_backward(m, in, tg, {}, rc);
    EXPECT_EQ(got.loss, none.loss);
    ASSERT_EQ(got.grads.size(), none.grads.size());
    EXPECT_EQ(std::memcmp(got.grads.data(), none.grads.data(), got.grads.size() * sizeof(float)), 0)
        << recompute_name(rc);
  }
}

}  // namespace
}  // namespace orrery::runtime
