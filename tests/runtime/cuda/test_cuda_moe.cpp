// Mixture-of-experts blocks on one GPU against the CPU runtime (moe_pieces.hpp over the CUDA
// kernels; the CPU model is the reference), from the same seed and data, in fp32:
//  - top 2 of 4 experts with a shared expert, capacity factor 1.25 (tokens dropped), and the same
//    dropless: the initial parameters are the CPU model's bit for bit, three steps (two
//    micro-batches each) give the CPU losses and aux losses within 1e-4 relative, and the update of
//    the parameters points the CPU run's way (cosine > 0.99, norm ratio 0.5..2), as
//    test_cuda_training.cpp checks the dense model;
//  - a profiled run writes the CPU run's compute spans (the moe.* ones included: names, layers,
//    steps, micro-batches, FLOPs) in its order, and the same moe.tokens / moe.dropped counters
//    (the routing is decided on the host from the router's probabilities, so the same choices);
//  - every dp2 layout (ep 1 or 2, ZeRO 0-3) passes check_supported_cuda up to the device check
//    (no device needed).
// Expert parallelism and ZeRO on the GPU trainer (2 ranks sharing a GPU, staged communicator) are
// checked in test_cuda_parallel.cpp; over NCCL they need two GPUs (NCCL refuses two ranks on one
// device).
// Suites named Gpu* need a device and skip with the reason without one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/runtime/cuda/gpu_run.hpp"
#include "orrery/runtime/cuda/trainer.hpp"
#include "orrery/runtime/launch.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::runtime::cuda {
namespace {

// L 2, C 64, H 4, V 128, T 32; 4 experts of width 96 in both blocks, top 2, one shared expert.
Scenario moe_scenario(double capacity) {
  Scenario s;
  s.name = "cuda-vs-cpu-moe";
  s.model.layers = 2;
  s.model.d_model = 64;
  s.model.heads = 4;
  s.model.vocab = 128;
  s.model.seq = 32;
  s.model.moe.experts = 4;
  s.model.moe.top_k = 2;
  s.model.moe.every = 1;
  s.model.moe.expert_ffn_hidden = 96;
  s.model.moe.shared_experts = 1;
  s.model.moe.capacity_factor = capacity;
  s.model.moe.aux_loss_coef = 0.01;
  s.training.steps = 3;
  s.training.global_batch = 4;
  s.training.micro_batch = 2;
  s.training.lr = 1e-3;
  return s;
}

struct Run {
  std::vector<float> initial, final_params;
  std::vector<double> losses, aux;
};

template <class T>
Run run(T& t, int steps) {
  Run r;
  t.prepare();
  r.initial = t.parameters();
  for (int i = 0; i < steps; ++i) {
    const StepResult s = t.step();
    r.losses.push_back(s.loss);
    r.aux.push_back(s.aux_loss);
  }
  r.final_params = t.parameters();
  return r;
}

void expect_close(const std::vector<double>& gpu, const std::vector<double>& cpu,
                  const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double rel = std::fabs(gpu[i] - cpu[i]) / std::fabs(cpu[i]);
    std::printf("  step %zu %s gpu %.7f cpu %.7f rel %.3g (bound 1e-4)\n", i, what, gpu[i], cpu[i],
                rel);
    EXPECT_GT(std::fabs(cpu[i]), 0.0) << what << " " << i;
    EXPECT_LT(rel, 1e-4) << what << " step " << i;
  }
}

// The update (final - initial) against the CPU run's: cosine and norm ratio.
void check_update(const Run& cpu, const Run& gpu) {
  ASSERT_EQ(gpu.final_params.size(), cpu.initial.size());
  double dot = 0, n_cpu = 0, n_gpu = 0;
  for (std::size_t i = 0; i < cpu.initial.size(); ++i) {
    const double a = double(cpu.final_params[i]) - cpu.initial[i];
    const double b = double(gpu.final_params[i]) - cpu.initial[i];
    dot += a * b;
    n_cpu += a * a;
    n_gpu += b * b;
  }
  ASSERT_GT(n_cpu, 0.0) << "the CPU run did not change its parameters";
  const double cosine = n_gpu > 0 ? dot / std::sqrt(n_cpu * n_gpu) : 0.0;
  const double ratio = std::sqrt(n_gpu / n_cpu);
  std::printf("  update vs cpu: cosine %.6f, norm ratio %.4f\n", cosine, ratio);
  EXPECT_GT(cosine, 0.99);
  EXPECT_GT(ratio, 0.5);
  EXPECT_LT(ratio, 2.0);
}

void check_against_cpu(double capacity) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  const Scenario s = moe_scenario(capacity);
  Run cpu, gpu;
  {
    auto world = make_local_communicator();
    Trainer t(s, *world, nullptr);
    cpu = run(t, s.training.steps);
  }
  Scenario g = s;
  g.runtime.device = "cuda";
  {
    auto world = make_local_communicator();
    GpuTrainer t(g, *world, nullptr);
    gpu = run(t, s.training.steps);
  }
  ASSERT_EQ(gpu.initial.size(), cpu.initial.size());
  EXPECT_EQ(std::memcmp(gpu.initial.data(), cpu.initial.data(), cpu.initial.size() * sizeof(float)),
            0)
      << "initial parameters differ from the CPU model's";
  expect_close(gpu.losses, cpu.losses, "loss");
  expect_close(gpu.aux, cpu.aux, "aux loss");
  check_update(cpu, gpu);
}

TEST(GpuMoe, Top2Of4WithASharedExpertAndDropsMatchesCpu) { check_against_cpu(1.25); }
TEST(GpuMoe, DroplessMatchesCpu) { check_against_cpu(0.0); }

struct Profile {
  std::vector<std::tuple<std::string, int, int, int, double>> compute;  // stream 0, in time order
  std::map<std::string, std::vector<double>> moe_counters;              // per step
};

Profile profile_of(const std::string& path) {
  const traces::Trace t = traces::load_trace(path);
  Profile p;
  for (const auto& sp : t.spans) {
    if (sp.stream != 0 || sp.kind != traces::SpanKind::Compute) continue;
    p.compute.emplace_back(t.name_of(sp), sp.layer, sp.step, sp.micro_batch, sp.flops);
  }
  for (const auto& c : t.counters) {
    const std::string name = t.strings.str(c.name);
    if (name.rfind("moe.", 0) == 0) p.moe_counters[name].push_back(c.value);
  }
  return p;
}

TEST(GpuMoe, ProfiledRunHasTheCpuMoeSpansAndCounters) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("orrery-cuda-moe-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Scenario s = moe_scenario(1.25);
  s.training.steps = 2;
  RankRunOptions opt;
  opt.out = (dir / "cpu.db").string();
  {
    auto world = make_local_communicator();
    run_rank(s, *world, opt);
  }
  Scenario g = s;
  g.runtime.device = "cuda";
  opt.out = (dir / "gpu.db").string();
  {
    auto world = make_local_communicator();
    run_rank_cuda(g, *world, opt);
  }
  const Profile cpu = profile_of((dir / "cpu.db").string());
  const Profile gpu = profile_of((dir / "gpu.db").string());
  int moe_spans = 0;
  for (const auto& sp : gpu.compute) moe_spans += std::get<0>(sp).rfind("moe.", 0) == 0 ? 1 : 0;
  // 2 steps x 2 micro-batches x 2 blocks x (router, experts, gated sum, and their backwards).
  EXPECT_EQ(moe_spans, 2 * 2 * 2 * 6);
  EXPECT_EQ(gpu.compute, cpu.compute);
  // 2 blocks x (4 experts + dropped), sampled each step: the same routing.
  EXPECT_EQ(gpu.moe_counters.size(), 2u * 5u);
  EXPECT_EQ(gpu.moe_counters, cpu.moe_counters);
  std::filesystem::remove_all(dir);
}

// No device needed: MoE with dp 2, ep 1 or 2 and ZeRO 0-3 is accepted by check_supported_cuda up
// to the device check (device cuda no longer refuses model.moe.experts), which names
// runtime.device.
TEST(CudaMoe, EveryLayoutGetsAsFarAsTheDeviceCheck) {
  if (device_count() > 0) GTEST_SKIP() << "a device is present: the no-device path is not taken";
  Scenario s = moe_scenario(1.25);
  s.runtime.device = "cuda";
  s.parallel.dp = 2;
  s.training.global_batch = 8;
  for (const int ep : {1, 2}) {
    for (const int zero : {0, 1, 2, 3}) {
      s.parallel.ep = ep;
      s.parallel.zero = zero;
      SCOPED_TRACE("ep " + std::to_string(ep) + ", zero " + std::to_string(zero));
      try {
        check_supported_cuda(s);
        ADD_FAILURE() << "accepted without a device";
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("key 'runtime.device'"), std::string::npos)
            << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace orrery::runtime::cuda
