// Activation recomputation (training.recompute) on the CPU model, one process: gradients and losses
// bit for bit those of the run without recomputation (the same kernels on the same inputs, in the
// same order), also with two micro-batches in flight sharing the one workspace (as a pipeline
// stage holds them) and on a stage without the embedding or the head; the activation memory by its
// closed form; the recomputation spans named, counted and carrying their FLOPs.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "orrery/runtime/buffers.hpp"
#include "orrery/runtime/data.hpp"
#include "orrery/runtime/kernels.hpp"
#include "orrery/runtime/model.hpp"

namespace orrery::runtime {
namespace {

const GptConfig kCfg{3, 32, 2, 64, 16};  // L, C, heads, V, max T
constexpr int kB = 2, kT = 16;

struct Pass {
  std::vector<float> grads;
  std::vector<float> losses;
  std::vector<float> input_grad;  // scratch.dres after the backward (the stage input's gradient)
};

// Two micro-batches through `shard`: forward 0, forward 1, backward 1, backward 0 (the order a
// pipeline stage may run them in), each micro-batch with its own activations, one scratch.
Pass run(const GptShard& shard, Recompute mode, OpObserver* obs = nullptr) {
  set_compute_threads(1);
  Gpt m = gpt_create(kCfg, shard, 3);
  std::vector<GptActivations> acts;
  for (int i = 0; i < 2; ++i) acts.push_back(gpt_activations(m, kB, kT, mode));
  GptGradScratch scratch = gpt_grad_scratch(m, kB, kT, mode);
  for (auto& a : acts) bind_workspace(a, scratch);
  MarkovSource src(kCfg.vocab, 3, 4096, 2, 4);
  DataLoader loader(src, kT, kB, 0, 1, 5);
  std::vector<Batch> batches(2);
  GptHooks hooks;
  hooks.observer = obs;
  Pass out;
  gpt_zero_grad(m);
  const std::size_t n = acts[0].boundary_elems;
  for (int i = 0; i < 2; ++i) {
    loader.next_batch(batches[size_t(i)]);
    if (!shard.has_embed) {  // a received activation: deterministic values
      for (std::size_t j = 0; j < n; ++j)
        acts[size_t(i)].stage_input()[j] = 0.01f * float(j % 97) - 0.4f;
    }
    out.losses.push_back(gpt_forward(m, acts[size_t(i)], batches[size_t(i)].inputs.data(),
                                     batches[size_t(i)].targets.data(), hooks));
  }
  for (int i = 1; i >= 0; --i) {
    if (!shard.has_head) {  // a received output gradient
      for (std::size_t j = 0; j < n; ++j) scratch.dres[j] = 0.001f * float(j % 89) - 0.04f;
    }
    gpt_backward(m, acts[size_t(i)], scratch, 0.5f, hooks);
    out.input_grad.insert(out.input_grad.end(), scratch.dres, scratch.dres + n);
  }
  out.grads.assign(m.grads.data(), m.grads.data() + m.grads.size());
  return out;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Recompute, GradientsBitIdenticalToNoRecomputation) {
  GptShard middle;  // a pipeline stage holding block 1 only: no embedding, no head
  middle.layer_begin = 1;
  middle.layer_end = 2;
  middle.has_embed = false;
  middle.has_head = false;
  GptShard first = GptShard::pipeline_stage(kCfg, 0, 2),
           last = GptShard::pipeline_stage(kCfg, 1, 2);
  for (const auto& [name, shard] : std::vector<std::pair<std::string, GptShard>>{
           {"whole", GptShard{}}, {"middle", middle}, {"first", first}, {"last", last}}) {
    const Pass ref = run(shard, Recompute::None);
    for (Recompute mode : {Recompute::Selective, Recompute::Full}) {
      const Pass p = run(shard, mode);
      EXPECT_TRUE(bit_equal(p.grads, ref.grads)) << name << " " << recompute_name(mode);
      EXPECT_TRUE(bit_equal(p.losses, ref.losses)) << name << " " << recompute_name(mode);
      EXPECT_TRUE(bit_equal(p.input_grad, ref.input_grad)) << name << " " << recompute_name(mode);
    }
  }
}

// Floats per buffer are all multiples of 16 here (B·T = 32), so the 16-float alignment adds
// nothing and the sizes are the closed forms.
TEST(Recompute, ActivationMemoryClosedForm) {
  const Gpt m = gpt_create(kCfg, GptShard{}, 1);
  const double C = 32, NH = 2, F = 4 * C, V = 64, L = 3, BT = kB * kT;
  // A block without recomputation: ln1, attproj, res2, ln2, fcproj (B,T,C) + qkv (B,T,3C) + atty
  // (B,T,C) + four (B,T) statistics + fch, fch_gelu (B,T,F) + the probabilities (B,NH,T,T).
  const double probs = kB * NH * kT * kT;
  const double block = BT * C * 5 + BT * 3 * C + BT * C + 4 * BT + 2 * BT * F + probs;
  const double stream = (L + 1) * BT * C, head = BT * C + 3 * BT + BT * V;
  const double scratch = 2 * BT * C + BT * 3 * C + BT * C + probs + 2 * BT * F;
  auto floats = [&](Recompute r) {
    const auto a = gpt_activations(m, kB, kT, r);
    const auto s = gpt_grad_scratch(m, kB, kT, r);
    return std::pair<double, double>(double(a.memory.size()), double(s.memory.size()));
  };
  EXPECT_EQ(floats(Recompute::None), std::make_pair(stream + L * block + head, scratch));
  // Selective: each block less its probabilities; one probability buffer in the scratch.
  EXPECT_EQ(floats(Recompute::Selective),
            std::make_pair(stream + L * (block - probs) + head, scratch + probs));
  // Full: only the block boundaries (the residual stream) and the head; one block in the scratch.
  EXPECT_EQ(floats(Recompute::Full), std::make_pair(stream + head, scratch + block));
}

class SpanLog : public OpObserver {
 public:
  struct Entry {
    std::string name;
    int layer;
    double flops;
  };
  void begin(const char* name, int layer, double flops) override {
    log.push_back({name, layer, flops});
  }
  void end() override {}
  std::vector<Entry> log;
};

TEST(Recompute, SpansNamedCountedAndBeforeTheirBlocksBackward) {
  const flops::Dims fd{kB, kT, 32, 64, 1};
  for (Recompute mode : {Recompute::Selective, Recompute::Full}) {
    SpanLog spans;
    run(GptShard{}, mode, &spans);
    const std::string want(mode == Recompute::Full ? names::kBlockRecompute
                                                   : names::kAttentionRecompute);
    const double want_flops = mode == Recompute::Full ? flops::recompute_block_piece(fd, 0, 1)
                                                      : flops::recompute_attention(fd);
    int count = 0;
    for (std::size_t i = 0; i < spans.log.size(); ++i) {
      const auto& e = spans.log[i];
      EXPECT_NE(e.name, std::string(mode == Recompute::Full ? names::kAttentionRecompute
                                                            : names::kBlockRecompute));
      if (e.name != want) continue;
      ++count;
      EXPECT_EQ(e.flops, want_flops);
      ASSERT_LT(i + 1, spans.log.size());
      EXPECT_EQ(spans.log[i + 1].name, std::string(names::kBlockBackward));
      EXPECT_EQ(spans.log[i + 1].layer, e.layer);
    }
    EXPECT_EQ(count, 2 * kCfg.n_layer)
        << recompute_name(mode);  // every block of both micro-batches
  }
  // The closed forms: full = the block's forward less fc2's 2(4C·C + C) per token; selective =
  // the attention core's 2·T·C per token.
  const double tokens = kB * kT, C = 32;
  EXPECT_EQ(flops::recompute_block_piece(fd, 0, 1),
            flops::block_forward(fd) - tokens * 2 * (4 * C * C + C));
  EXPECT_EQ(flops::recompute_attention(fd), tokens * 2 * kT * C);
}

TEST(Recompute, UnboundActivationsAreRefused) {
  Gpt m = gpt_create(kCfg, GptShard{}, 1);
  auto acts = gpt_activations(m, kB, kT, Recompute::Full);
  std::vector<int32_t> tokens(std::size_t(kB) * kT, 1);
  EXPECT_THROW(gpt_forward(m, acts, tokens.data(), tokens.data()), std::logic_error);
}

}  // namespace
}  // namespace orrery::runtime
