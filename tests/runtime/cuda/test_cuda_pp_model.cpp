// The GPU model's pipeline stages (cuda/model.hpp) without MPI: the two stages of a pp2 split of a
// 4-layer model on one device and one stream, the stage boundary crossed by device copies (what
// the trainer's pp.send/recv do), against the whole model on the same micro-batch:
//  - each stage's initial device parameters are the CPU stage's (gpt_create of
//    GptShard::pipeline_stage), bit for bit; stage 0 holds layers 0-1 and the embedding, stage 1
//    layers 2-3, the final LayerNorm and its own copy of the tied wte (no wpe);
//  - the last stage's loss equals the whole model's bit for bit (the same kernels on the same data
//    in the same order), and stage 0's gpu_forward returns 0;
//  - every gradient of a stage equals the whole model's gradient of the same tensor, except wte:
//    the sum of the two stages' wte gradients (what pp.embed_all_reduce computes) equals the whole
//    model's, max|Δ| / max|g| < 1e-6 (fp32: the same two contributions added in another order);
//  - on_grads_ready fires L, ..., layer_begin, then -1 on both stages (the head-only stage for its
//    wte copy), and each stage records only its own pieces' spans.
// Suite Gpu*: skips with the reason without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "orrery/runtime/cuda/kernels.hpp"
#include "orrery/runtime/cuda/model.hpp"

#include "model_test_fixtures.hpp"

namespace orrery::runtime::cuda {
namespace {

using namespace model_test_fixtures;  // kB, kT, tokens, small_gpt_config

GptConfig pp_config() { return small_gpt_config(4); }
constexpr uint64_t kSeed = 11;

// Records "name:layer" of every span begin.
class ListObserver final : public OpObserver {
 public:
  void begin(const char* name, int layer, double) override {
    spans.push_back(std::string(name) + ":" + std::to_string(layer));
  }
  void end() override {}
  std::vector<std::string> spans;
};

TEST(GpuPipelineModel, TwoStagesOnOneDeviceMatchTheWholeModel) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  const GptConfig cfg = pp_config();
  const std::vector<int32_t> in = tokens(5, 1, cfg.vocab), tg = tokens(13, 2, cfg.vocab);
  ORRERY_CUDA_CHECK(cudaSetDevice(0));
  Stream st;
  Context ctx(st.get(), MathMode::kFp32);

  // The whole model.
  GpuGpt full = gpu_gpt_create(gpt_create(cfg, GptShard{}, kSeed));
  GpuActivations full_acts = gpu_activations(full, kB, kT);
  GpuGradScratch full_s = gpu_grad_scratch(full, kB, kT);
  gpu_zero_grad(ctx, full);
  const float full_loss = gpu_forward(ctx, full, full_acts, in.data(), tg.data());
  gpu_backward(ctx, full, full_acts, full_s, 1.0f);
  st.synchronize();
  const std::vector<float> full_grads = full.grads.to_host();

  // The two stages.
  GpuGpt stage[2] = {gpu_gpt_create(gpt_create(cfg, GptShard::pipeline_stage(cfg, 0, 2), kSeed)),
                     gpu_gpt_create(gpt_create(cfg, GptShard::pipeline_stage(cfg, 1, 2), kSeed))};
  for (int r = 0; r < 2; ++r) {
    const Gpt cpu_stage = gpt_create(cfg, GptShard::pipeline_stage(cfg, r, 2), kSeed);
    const std::vector<float> initial = stage[r].params.to_host();
    ASSERT_EQ(initial.size(), cpu_stage.params.size()) << "stage " << r;
    EXPECT_EQ(std::memcmp(initial.data(), cpu_stage.params.data(), initial.size() * sizeof(float)),
              0)
        << "stage " << r << ": initial parameters differ from the CPU stage's";
    EXPECT_EQ(stage[r].host.num_blocks(), 2) << "stage " << r;
  }
  EXPECT_TRUE(stage[0].host.shard.has_embed && !stage[0].host.shard.has_head);
  EXPECT_TRUE(!stage[1].host.shard.has_embed && stage[1].host.shard.has_head);
  EXPECT_NE(stage[1].embed.wte, nullptr);  // the head's copy of the tied wte
  EXPECT_EQ(stage[1].embed.wpe, nullptr);

  GpuActivations acts[2] = {gpu_activations(stage[0], kB, kT), gpu_activations(stage[1], kB, kT)};
  GpuGradScratch scratch[2] = {gpu_grad_scratch(stage[0], kB, kT),
                               gpu_grad_scratch(stage[1], kB, kT)};
  ListObserver obs[2];
  std::vector<int> ready[2];
  GptHooks hooks[2];
  for (int r = 0; r < 2; ++r) {
    hooks[r].observer = &obs[r];
    hooks[r].on_grads_ready = [&ready, r](int segment) { ready[r].push_back(segment); };
    gpu_zero_grad(ctx, stage[r]);
  }
  const std::size_t n = acts[0].boundary_elems;
  const float loss0 = gpu_forward(ctx, stage[0], acts[0], in.data(), tg.data(), hooks[0]);
  ORRERY_CUDA_CHECK(cudaMemcpyAsync(acts[1].stage_input(), acts[0].stage_output(),
                                    n * sizeof(float), cudaMemcpyDeviceToDevice,
                                    st.get()));  // pp.send/recv_act
  const float loss1 = gpu_forward(ctx, stage[1], acts[1], nullptr, tg.data(), hooks[1]);
  gpu_backward(ctx, stage[1], acts[1], scratch[1], 1.0f, hooks[1]);
  ORRERY_CUDA_CHECK(cudaMemcpyAsync(scratch[0].dres, scratch[1].dres, n * sizeof(float),
                                    cudaMemcpyDeviceToDevice, st.get()));  // pp.send/recv_grad
  gpu_backward(ctx, stage[0], acts[0], scratch[0], 1.0f, hooks[0]);
  st.synchronize();
  EXPECT_EQ(loss0, 0.0f);
  EXPECT_EQ(loss1, full_loss) << "the last stage's loss differs from the whole model's";

  const std::vector<float> g0 = stage[0].grads.to_host(), g1 = stage[1].grads.to_host();
  double gmax = 0;
  for (float g : full_grads) gmax = std::max(gmax, static_cast<double>(std::fabs(g)));
  ASSERT_GT(gmax, 0.0);
  double d = 0;
  std::size_t compared = 0;
  for (int r = 0; r < 2; ++r) {
    const std::vector<float>& g = r == 0 ? g0 : g1;
    for (const ParamTensor& t : stage[r].host.tensors) {
      const ParamTensor& f = full.host.tensor(t.name);
      ASSERT_EQ(f.count, t.count) << t.name;
      const ParamTensor* other = nullptr;
      if (t.name == "wte") other = &stage[1 - r].host.tensor("wte");
      for (std::size_t i = 0; i < t.count; ++i) {
        double got = g[t.offset + i];
        if (other != nullptr)
          got += (r == 0 ? g1 : g0)[other->offset + i];  // the embedding group's sum
        d = std::max(d, std::fabs(got - static_cast<double>(full_grads[f.offset + i])));
      }
      compared += t.count;
    }
  }
  std::printf(
      "  pp2 stages vs whole model: loss %.7f vs %.7f, grads max|d|/max|g| %.3g (bound 1e-6)\n",
      loss1, full_loss, d / gmax);
  EXPECT_LT(d / gmax, 1e-6);
  // Every tensor of the whole model was compared once (wte twice: once per stage).
  EXPECT_EQ(compared, full.host.num_params() + full.host.tensor("wte").count);

  EXPECT_EQ(ready[0], (std::vector<int>{1, 0, -1}));
  EXPECT_EQ(ready[1], (std::vector<int>{4, 3, 2, -1}));
  EXPECT_EQ(obs[0].spans, (std::vector<std::string>{"fwd.embed:-1", "fwd.block:0", "fwd.block:1",
                                                    "bwd.block:1", "bwd.block:0", "bwd.embed:-1"}));
  EXPECT_EQ(obs[1].spans, (std::vector<std::string>{"fwd.block:2", "fwd.block:3", "fwd.head:4",
                                                    "bwd.head:4", "bwd.block:3", "bwd.block:2"}));
  // A piece of a layer the stage does not hold is refused.
  EXPECT_THROW(gpu_block_forward(ctx, stage[0], acts[0], 2), std::out_of_range);
  EXPECT_THROW(gpu_head_forward(ctx, stage[0], acts[0], tg.data()), std::logic_error);
  EXPECT_THROW(gpu_embed_forward(ctx, stage[1], acts[1], in.data()), std::logic_error);
}

}  // namespace
}  // namespace orrery::runtime::cuda
