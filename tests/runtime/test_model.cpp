// The GPT model on a tiny configuration: whole-model gradients against central finite differences,
// layout and hook order, span names and FLOPs, gradient accumulation, pipeline stages chained by
// hand, and tensor-parallel shards (two threads summing at the Megatron points) against the full
// model.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fd_check.hpp"
#include "orrery/common/error.hpp"
#include "orrery/model/flops.hpp"
#include "orrery/runtime/kernels.hpp"
#include "orrery/runtime/model.hpp"

namespace orrery::runtime {
namespace {

GptConfig tiny() { return GptConfig{2, 16, 2, 32, 8}; }  // L, C, H, V, T
constexpr int kB = 2;
constexpr int kT = 8;

using fd::scramble;
using fd::tokens;

struct Run {
  float loss;
  std::vector<float> grads;
};

Run forward_backward(Gpt& m, const std::vector<int32_t>& in, const std::vector<int32_t>& tg, int B,
                     int T, const GptHooks& hooks = {}) {
  auto acts = gpt_activations(m, B, T);
  auto scratch = gpt_grad_scratch(m, B, T);
  gpt_zero_grad(m);
  const float loss = gpt_forward(m, acts, in.data(), tg.data(), hooks);
  gpt_backward(m, acts, scratch, 1.0f, hooks);
  return Run{loss, std::vector<float>(m.grads.begin(), m.grads.end())};
}

TEST(Model, ParameterCountAndLayout) {
  const auto cfg = tiny();
  auto m = gpt_create(cfg, GptShard{}, 1);
  const int64_t C = cfg.n_embd;
  const int64_t expected = flops::params_non_embedding(cfg.n_layer, C) +
                           flops::params_embedding(cfg.vocab, cfg.max_seq, C);
  EXPECT_EQ(static_cast<int64_t>(m.num_params()), expected);
  // Segments tile the array in memory order: embedding, blocks, final LayerNorm.
  std::size_t pos = 0;
  for (int seg : {kEmbedSegment, 0, 1, cfg.n_layer}) {
    const auto r = m.segment_range(seg);
    EXPECT_EQ(r.offset, pos) << "segment " << seg;
    EXPECT_GT(r.count, 0u);
    pos = r.end();
  }
  EXPECT_EQ(pos, m.num_params());
  // Decay on matrices only: wte, wpe and the four block matrices per layer.
  std::size_t decayed = 0;
  for (const auto& r : m.decay_ranges()) decayed += r.count;
  EXPECT_EQ(decayed,
            static_cast<std::size_t>(cfg.vocab * C + cfg.max_seq * C + cfg.n_layer * 12 * C * C));
}

TEST(Model, InitialisationFollowsTheReference) {
  GptConfig cfg{4, 64, 4, 512, 32};
  auto m = gpt_create(cfg, GptShard{}, 7);
  auto stddev = [&](const std::string& name) {
    const auto& t = m.tensor(name);
    double s = 0.0, s2 = 0.0;
    for (std::size_t i = 0; i < t.count; ++i) {
      s += m.params[t.offset + i];
      s2 += static_cast<double>(m.params[t.offset + i]) * m.params[t.offset + i];
    }
    const double mean = s / static_cast<double>(t.count);
    return std::sqrt(s2 / static_cast<double>(t.count) - mean * mean);
  };
  EXPECT_NEAR(stddev("wte"), 0.02, 0.0005);
  EXPECT_NEAR(stddev("h.0.qkvw"), 0.02, 0.001);
  EXPECT_NEAR(stddev("h.1.fcw"), 0.02, 0.001);
  EXPECT_NEAR(stddev("h.2.projw"), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_NEAR(stddev("h.3.fcprojw"), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_EQ(m.params[m.tensor("h.0.ln1w").offset], 1.0f);
  EXPECT_EQ(m.params[m.tensor("h.0.qkvb").offset], 0.0f);
  // Same seed, same model; another seed, another model.
  auto again = gpt_create(cfg, GptShard{}, 7);
  auto other = gpt_create(cfg, GptShard{}, 8);
  EXPECT_TRUE(std::equal(m.params.begin(), m.params.end(), again.params.begin()));
  EXPECT_FALSE(std::equal(m.params.begin(), m.params.end(), other.params.begin()));
}

TEST(Model, BadConfigsAreInputErrors) {
  EXPECT_THROW(gpt_create(GptConfig{2, 15, 2, 32, 8}, GptShard{}, 1), InputError);
  GptShard tp3;
  tp3.tp_size = 3;
  EXPECT_THROW(gpt_create(tiny(), tp3, 1), InputError);
  GptShard far;
  far.layer_begin = 1;
  far.layer_end = 5;
  EXPECT_THROW(gpt_create(tiny(), far, 1), InputError);
  auto m = gpt_create(tiny(), GptShard{}, 1);
  EXPECT_THROW(gpt_activations(m, 1, 9), InputError);
}

TEST(Model, InitialLossIsNearLogV) {
  auto m = gpt_create(tiny(), GptShard{}, 3);
  const auto in = tokens(kB * kT, 32, 1), tg = tokens(kB * kT, 32, 2);
  auto acts = gpt_activations(m, kB, kT);
  const float loss = gpt_forward(m, acts, in.data(), tg.data());
  EXPECT_NEAR(loss, std::log(32.0), 0.1);
}

// Central differences on every parameter of the tiny model (about 8k of them, 2 forwards each).
TEST(Model, GradientsMatchFiniteDifferences) {
  auto m = gpt_create(tiny(), GptShard{}, 4);
  scramble(m, 5);
  const auto in = tokens(kB * kT, 32, 6), tg = tokens(kB * kT, 32, 7);
  const auto run = forward_backward(m, in, tg, kB, kT);
  fd::expect_model_gradients(m, run.grads, in, tg, kB, kT);
}

TEST(Model, HooksFireInReverseOrderWithCompleteSegments) {
  auto m = gpt_create(tiny(), GptShard{}, 8);
  const auto in = tokens(kB * kT, 32, 9), tg = tokens(kB * kT, 32, 10);
  const auto reference = forward_backward(m, in, tg, kB, kT);
  std::vector<int> order;
  std::vector<std::vector<float>> snapshots;
  GptHooks hooks;
  hooks.on_grads_ready = [&](int seg) {
    order.push_back(seg);
    const auto r = m.segment_range(seg);
    snapshots.emplace_back(m.grads.begin() + static_cast<std::ptrdiff_t>(r.offset),
                           m.grads.begin() + static_cast<std::ptrdiff_t>(r.end()));
  };
  forward_backward(m, in, tg, kB, kT, hooks);
  EXPECT_EQ(order, (std::vector<int>{2, 1, 0, kEmbedSegment}));
  // At the moment a segment is reported its gradient is final.
  for (std::size_t k = 0; k < order.size(); ++k) {
    const auto r = m.segment_range(order[k]);
    EXPECT_TRUE(std::equal(snapshots[k].begin(), snapshots[k].end(),
                           reference.grads.begin() + static_cast<std::ptrdiff_t>(r.offset)))
        << "segment " << order[k];
  }
}

class Recorder : public OpObserver {
 public:
  void begin(const char* name, int layer, double f) override {
    EXPECT_FALSE(open_);
    open_ = true;
    names.push_back(std::string(name) + ":" + std::to_string(layer));
    total_flops += f;
  }
  void end() override {
    EXPECT_TRUE(open_);
    open_ = false;
  }
  std::vector<std::string> names;
  double total_flops = 0.0;

 private:
  bool open_ = false;
};

TEST(Model, SpansNameEveryPieceAndCountTheReferenceFlops) {
  const auto cfg = tiny();
  auto m = gpt_create(cfg, GptShard{}, 11);
  const auto in = tokens(kB * kT, 32, 12), tg = tokens(kB * kT, 32, 13);
  Recorder rec;
  GptHooks hooks;
  hooks.observer = &rec;
  forward_backward(m, in, tg, kB, kT, hooks);
  EXPECT_EQ(rec.names,
            (std::vector<std::string>{"fwd.embed:-1", "fwd.block:0", "fwd.block:1", "fwd.head:2",
                                      "bwd.head:2", "bwd.block:1", "bwd.block:0", "bwd.embed:-1"}));
  // gpt.md: forward per token = 2 N_nonembedding + 2 L T C + 2 C V; step = 3 x forward.
  const double C = cfg.n_embd, L = cfg.n_layer, V = cfg.vocab;
  const double per_token =
      2.0 * static_cast<double>(flops::params_non_embedding(cfg.n_layer, cfg.n_embd)) +
      2.0 * L * kT * C + 2.0 * C * V;
  EXPECT_NEAR(rec.total_flops, 3.0 * per_token * kB * kT, 1e-6 * rec.total_flops);
  EXPECT_DOUBLE_EQ(rec.total_flops,
                   flops::model_step(flops::Dims{kB, kT, cfg.n_embd, cfg.vocab, 1}, cfg.n_layer));
}

// Two micro-batches of B with loss_scale 1/2 accumulate the gradient of one batch of 2B.
TEST(Model, GradientAccumulationEqualsTheLargerBatch) {
  auto m = gpt_create(tiny(), GptShard{}, 14);
  const auto in = tokens(2 * kB * kT, 32, 15), tg = tokens(2 * kB * kT, 32, 16);
  const auto big = forward_backward(m, in, tg, 2 * kB, kT);
  gpt_zero_grad(m);
  auto acts = gpt_activations(m, kB, kT);
  auto scratch = gpt_grad_scratch(m, kB, kT);
  float loss = 0.0f;
  for (int k = 0; k < 2; ++k) {
    const std::size_t off = static_cast<std::size_t>(k) * kB * kT;
    loss += 0.5f * gpt_forward(m, acts, in.data() + off, tg.data() + off);
    gpt_backward(m, acts, scratch, 0.5f);
  }
  EXPECT_NEAR(loss, big.loss, 1e-5);
  double maxdiff = 0.0;
  for (std::size_t i = 0; i < big.grads.size(); ++i) {
    maxdiff = std::max(maxdiff, static_cast<double>(std::abs(big.grads[i] - m.grads[i])));
  }
  EXPECT_LT(maxdiff, 1e-6);
}

// Two pipeline stages chained by hand give the full model's loss and gradients.
TEST(Model, PipelineStagesChainToTheFullModel) {
  const auto cfg = tiny();
  auto full = gpt_create(cfg, GptShard{}, 17);
  scramble(full, 18);
  auto s0 = gpt_create(cfg, GptShard::pipeline_stage(cfg, 0, 2), 17);
  auto s1 = gpt_create(cfg, GptShard::pipeline_stage(cfg, 1, 2), 17);
  // Copy the scrambled parameters into the stages by tensor name.
  for (Gpt* s : {&s0, &s1}) {
    for (const auto& t : s->tensors) {
      const auto& f = full.tensor(t.name);
      ASSERT_EQ(f.count, t.count);
      std::copy_n(full.params.data() + f.offset, t.count, s->params.data() + t.offset);
    }
  }
  EXPECT_TRUE(s0.shard.has_embed && !s0.shard.has_head);
  EXPECT_TRUE(!s1.shard.has_embed && s1.shard.has_head);
  const auto in = tokens(kB * kT, 32, 19), tg = tokens(kB * kT, 32, 20);
  const auto ref = forward_backward(full, in, tg, kB, kT);

  auto a0 = gpt_activations(s0, kB, kT);
  auto a1 = gpt_activations(s1, kB, kT);
  auto g0 = gpt_grad_scratch(s0, kB, kT);
  auto g1 = gpt_grad_scratch(s1, kB, kT);
  gpt_zero_grad(s0);
  gpt_zero_grad(s1);
  gpt_forward(s0, a0, in.data(), nullptr);
  std::copy_n(a0.stage_output(), a0.boundary_elems, a1.stage_input());  // send activation
  const float loss = gpt_forward(s1, a1, nullptr, tg.data());
  std::vector<int> ready1;
  GptHooks h1;
  h1.on_grads_ready = [&](int seg) { ready1.push_back(seg); };
  gpt_backward(s1, a1, g1, 1.0f, h1);
  std::copy_n(g1.dres, a1.boundary_elems, g0.dres);  // send gradient back
  gpt_backward(s0, a0, g0);
  EXPECT_EQ(ready1, (std::vector<int>{2, 1, kEmbedSegment}));

  EXPECT_EQ(loss, ref.loss);
  for (const Gpt* s : {&s0, &s1}) {
    for (const auto& t : s->tensors) {
      const auto& f = full.tensor(t.name);
      if (t.name == "wte") continue;  // split over the two stages, checked below
      for (std::size_t i = 0; i < t.count; ++i) {
        ASSERT_EQ(s->grads[t.offset + i], ref.grads[f.offset + i]) << t.name << "[" << i << "]";
      }
    }
  }
  // The tied embedding: the stages' two copies sum to the full gradient (Megatron's embedding group).
  const auto& w0 = s0.tensor("wte");
  const auto& w1 = s1.tensor("wte");
  const auto& wf = full.tensor("wte");
  for (std::size_t i = 0; i < wf.count; ++i) {
    EXPECT_NEAR(s0.grads[w0.offset + i] + s1.grads[w1.offset + i], ref.grads[wf.offset + i], 1e-6);
  }
}

// Sums over an in-process tensor-parallel group of two threads.
class ThreadGroupSum {
 public:
  explicit ThreadGroupSum(int n) : n_(n), slots_(static_cast<std::size_t>(n)), sync_(n) {}
  void all_reduce(int rank, float* data, std::size_t count) {
    slots_[static_cast<std::size_t>(rank)] = data;
    sync_.arrive_and_wait();
    std::vector<float> sum(count, 0.0f);
    for (int r = 0; r < n_; ++r) {  // same order on every rank: identical results
      for (std::size_t i = 0; i < count; ++i) sum[i] += slots_[static_cast<std::size_t>(r)][i];
    }
    sync_.arrive_and_wait();
    std::copy(sum.begin(), sum.end(), data);
    sync_.arrive_and_wait();
  }

 private:
  int n_;
  std::vector<float*> slots_;
  std::barrier<> sync_;
};

TEST(Model, TensorParallelShardsMatchTheFullModel) {
  GptConfig cfg{2, 16, 4, 32, 8};
  auto full = gpt_create(cfg, GptShard{}, 21);
  const auto in = tokens(kB * kT, 32, 22), tg = tokens(kB * kT, 32, 23);
  const auto ref = forward_backward(full, in, tg, kB, kT);

  constexpr int kTp = 2;
  std::vector<Gpt> shards;
  for (int r = 0; r < kTp; ++r) {
    GptShard sh;
    sh.tp_rank = r;
    sh.tp_size = kTp;
    shards.push_back(gpt_create(cfg, sh, 21));
  }
  ThreadGroupSum group(kTp);
  std::vector<float> losses(kTp);
  std::vector<std::vector<TpPoint>> points(kTp);
  std::vector<Recorder> recorders(kTp);
  std::vector<std::thread> threads;
  for (int r = 0; r < kTp; ++r) {
    threads.emplace_back([&, r] {
      GptHooks hooks;
      hooks.observer = &recorders[static_cast<std::size_t>(r)];
      hooks.tp_all_reduce = [&, r](TpPoint p, int, float* data, std::size_t n) {
        points[static_cast<std::size_t>(r)].push_back(p);
        group.all_reduce(r, data, n);
      };
      losses[static_cast<std::size_t>(r)] =
          forward_backward(shards[static_cast<std::size_t>(r)], in, tg, kB, kT, hooks).loss;
    });
  }
  for (auto& t : threads) t.join();

  for (int r = 0; r < kTp; ++r) EXPECT_NEAR(losses[static_cast<std::size_t>(r)], ref.loss, 1e-6);
  EXPECT_EQ(points[0].size(), 8u);  // 2 layers x (2 forward + 2 backward)
  EXPECT_EQ(points[0][0], TpPoint::kAttnProjForward);
  EXPECT_EQ(points[0][1], TpPoint::kMlpProjForward);
  EXPECT_EQ(points[0][4], TpPoint::kMlpInputBackward);
  EXPECT_EQ(points[0][5], TpPoint::kAttnInputBackward);
  // Block spans are split at the sums; the FLOPs over both ranks add up to the full model's.
  EXPECT_EQ(recorders[0].names.size(), 2u + 2u * 2u * 3u + 2u);
  const auto fd = flops::Dims{kB, kT, cfg.n_embd, cfg.vocab, 1};
  const double head_and_embed = 3.0 * flops::head_forward(fd);
  EXPECT_NEAR(recorders[0].total_flops + recorders[1].total_flops - head_and_embed,
              flops::model_step(fd, cfg.n_layer), 1e-6 * flops::model_step(fd, cfg.n_layer));

  // Every shard tensor equals its slice of the full gradient.
  const int C = cfg.n_embd, Cl = C / kTp, F = 4 * C / kTp;
  for (int r = 0; r < kTp; ++r) {
    const Gpt& s = shards[static_cast<std::size_t>(r)];
    for (const auto& t : s.tensors) {
      const auto& f = full.tensor(t.name);
      const float* g = s.grads.data() + t.offset;
      const float* gf = ref.grads.data() + f.offset;
      auto full_index = [&](int row, int col) -> std::size_t {
        const std::string n = t.name.substr(t.name.rfind('.') + 1);
        if (n == "qkvw") {
          const int part = row / Cl, k = row % Cl;
          return static_cast<std::size_t>(part * C + r * Cl + k) *
                     static_cast<std::size_t>(f.cols) +
                 col;
        }
        if (n == "fcw") return static_cast<std::size_t>(r * F + row) * f.cols + col;
        if (n == "projw") return static_cast<std::size_t>(row) * f.cols + r * Cl + col;
        if (n == "fcprojw") return static_cast<std::size_t>(row) * f.cols + r * F + col;
        return static_cast<std::size_t>(row) * f.cols + col;
      };
      for (int row = 0; row < t.rows; ++row) {
        for (int col = 0; col < t.cols; ++col) {
          // Vectors are stored as one row; qkvb/fcb slice along that row.
          std::size_t fi;
          const std::string n = t.name.substr(t.name.rfind('.') + 1);
          if (n == "qkvb") {
            fi = static_cast<std::size_t>((col / Cl) * C + r * Cl + col % Cl);
          } else if (n == "fcb") {
            fi = static_cast<std::size_t>(r * F + col);
          } else {
            fi = full_index(row, col);
          }
          ASSERT_NEAR(g[static_cast<std::size_t>(row) * t.cols + col], gf[fi], 2e-6)
              << "rank " << r << " " << t.name << " (" << row << "," << col << ")";
        }
      }
    }
  }
}

}  // namespace
}  // namespace orrery::runtime
