// The GPU model's tensor-parallel block (cuda/model.hpp) without MPI: two tp shards of the same
// model on one device, each driven by its own host thread, stream and cuBLAS context; the tp sum
// (GptHooks::tp_all_reduce) is done by the two threads meeting at a barrier, each adding the
// other's partial sum into its own (a + b on rank 0, b + a on rank 1: the same fp32 bits). Against
// the whole model on the same micro-batch:
//  - each shard's initial device parameters are the CPU shard's (gpt_create), bit for bit;
//  - the loss of both shards equals the whole model's within 1e-5 relative (the shards split each
//    matmul reduction of a block in two and add the halves);
//  - each shard's gradients are the slices (tp_slice_of_full) of the whole model's gradients,
//    max|Δ| / max|g| < 1e-4 (fp32, the same argument, summed in another order);
//  - the hook is called 4 times per block, and each block span comes in the CPU model's three
//    pieces per direction (model.hpp).
// Suite Gpu*: skips with the reason without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "orrery/runtime/cuda/kernels.hpp"
#include "orrery/runtime/cuda/model.hpp"
#include "orrery/runtime/tensor_parallel.hpp"

#include "model_test_fixtures.hpp"

namespace orrery::runtime::cuda {
namespace {

using namespace model_test_fixtures;  // kB, kT, tokens, small_gpt_config

GptConfig tp_config() { return small_gpt_config(2); }
constexpr uint64_t kSeed = 7;

// Counts the begins of each span name.
class CountingObserver final : public OpObserver {
 public:
  void begin(const char* name, int, double) override {
    if (std::strcmp(name, "fwd.block") == 0) ++fwd_block;
    if (std::strcmp(name, "bwd.block") == 0) ++bwd_block;
  }
  void end() override {}
  int fwd_block = 0, bwd_block = 0;
};

struct ShardResult {
  float loss = 0;
  std::vector<float> initial, grads;
  int tp_calls = 0;
  int fwd_block = 0, bwd_block = 0;
};

TEST(GpuTensorParallelModel, TwoShardsOnOneDeviceMatchTheWholeModel) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  const GptConfig cfg = tp_config();
  const std::vector<int32_t> in = tokens(7, 3, cfg.vocab), tg = tokens(11, 5, cfg.vocab);

  // The whole model.
  float full_loss = 0;
  std::vector<float> full_grads;
  {
    ORRERY_CUDA_CHECK(cudaSetDevice(0));
    Stream st;
    Context ctx(st.get(), MathMode::kFp32);
    GpuGpt m = gpu_gpt_create(gpt_create(cfg, GptShard{}, kSeed));
    GpuActivations acts = gpu_activations(m, kB, kT);
    GpuGradScratch s = gpu_grad_scratch(m, kB, kT);
    gpu_zero_grad(ctx, m);
    full_loss = gpu_forward(ctx, m, acts, in.data(), tg.data());
    gpu_backward(ctx, m, acts, s, 1.0f);
    st.synchronize();
    full_grads = m.grads.to_host();
  }

  // Two tp shards, one thread each.
  constexpr int kTp = 2;
  std::barrier<> bar(kTp);
  float* partial[kTp] = {nullptr, nullptr};
  ShardResult res[kTp];
  std::exception_ptr err[kTp];
  auto shard_run = [&](int r) {
    try {
      ORRERY_CUDA_CHECK(cudaSetDevice(0));
      Stream st;
      Context ctx(st.get(), MathMode::kFp32);
      GptShard sh;
      sh.tp_rank = r;
      sh.tp_size = kTp;
      GpuGpt m = gpu_gpt_create(gpt_create(cfg, sh, kSeed));
      res[r].initial = m.params.to_host();
      GpuActivations acts = gpu_activations(m, kB, kT);
      GpuGradScratch s = gpu_grad_scratch(m, kB, kT);
      DeviceArray<float> other(acts.boundary_elems);
      CountingObserver obs;
      GptHooks hooks;
      hooks.observer = &obs;
      hooks.tp_all_reduce = [&](TpPoint, int, float* data, std::size_t n) {
        ++res[r].tp_calls;
        st.synchronize();  // this shard's partial sum is complete
        partial[r] = data;
        bar.arrive_and_wait();
        ORRERY_CUDA_CHECK(cudaMemcpyAsync(other.data(), partial[1 - r], n * sizeof(float),
                                          cudaMemcpyDeviceToDevice, st.get()));
        st.synchronize();
        bar.arrive_and_wait();  // both copies taken: the in-place sums may start
        residual_forward(ctx, data, data, other.data(), n);
      };
      gpu_zero_grad(ctx, m);
      res[r].loss = gpu_forward(ctx, m, acts, in.data(), tg.data(), hooks);
      gpu_backward(ctx, m, acts, s, 1.0f, hooks);
      st.synchronize();
      res[r].grads = m.grads.to_host();
      res[r].fwd_block = obs.fwd_block;
      res[r].bwd_block = obs.bwd_block;
    } catch (...) {
      err[r] = std::current_exception();
      bar.arrive_and_drop();  // the other thread does not wait for this one any more
    }
  };
  std::thread t0(shard_run, 0), t1(shard_run, 1);
  t0.join();
  t1.join();
  for (int r = 0; r < kTp; ++r) {
    if (err[r]) std::rethrow_exception(err[r]);
  }

  Gpt full_grad_model =
      gpt_create(cfg, GptShard{}, kSeed);  // the whole layout, grads put in params
  ASSERT_EQ(full_grad_model.params.size(), full_grads.size());
  std::copy(full_grads.begin(), full_grads.end(), full_grad_model.params.begin());
  double gmax = 0;
  for (float g : full_grads) gmax = std::max(gmax, static_cast<double>(std::fabs(g)));
  ASSERT_GT(gmax, 0.0);

  for (int r = 0; r < kTp; ++r) {
    GptShard sh;
    sh.tp_rank = r;
    sh.tp_size = kTp;
    const Gpt cpu_shard = gpt_create(cfg, sh, kSeed);
    ASSERT_EQ(res[r].initial.size(), cpu_shard.params.size());
    EXPECT_EQ(std::memcmp(res[r].initial.data(), cpu_shard.params.data(),
                          res[r].initial.size() * sizeof(float)),
              0)
        << "tp rank " << r;
    const double lrel =
        std::fabs(static_cast<double>(res[r].loss) - full_loss) / std::fabs(full_loss);
    double d = 0;
    for (const ParamTensor& t : cpu_shard.tensors) {
      const std::vector<float> want = tp_slice_of_full(full_grad_model, t, r, kTp);
      ASSERT_EQ(want.size(), t.count) << t.name;
      for (std::size_t i = 0; i < t.count; ++i) {
        d = std::max(d, std::fabs(static_cast<double>(res[r].grads[t.offset + i]) - want[i]));
      }
    }
    std::printf(
        "  tp rank %d: loss %.7f vs %.7f (rel %.3g, bound 1e-5), grads max|d|/max|g| %.3g (bound "
        "1e-4)\n",
        r, res[r].loss, full_loss, lrel, d / gmax);
    EXPECT_LT(lrel, 1e-5) << "tp rank " << r;
    EXPECT_LT(d / gmax, 1e-4) << "tp rank " << r;
    EXPECT_EQ(res[r].tp_calls, 4 * cfg.n_layer) << "tp rank " << r;
    EXPECT_EQ(res[r].fwd_block, 3 * cfg.n_layer) << "tp rank " << r;
    EXPECT_EQ(res[r].bwd_block, 3 * cfg.n_layer) << "tp rank " << r;
  }
}

}  // namespace
}  // namespace orrery::runtime::cuda
