// Training a tiny GPT on one GPU against the CPU runtime, from the same seed and data:
//  - the initial parameters on the device are bit-identical to the CPU model's;
//  - three steps (two micro-batches each, so gradient accumulation is in play) give the CPU losses
//    within 1e-4 relative in fp32, 2e-2 with TF32 or bf16 matrix products (fp32 master weights),
//    and their parameter updates point the CPU run's way (cosine > 0.99 in fp32, > 0.5 reduced)
//    with its size (norm ratio 0.5..2): the losses of three steps alone cannot tell a broken
//    reduced-precision backward pass from a working one;
//  - a profiled run_rank_cuda writes the CPU run's compute spans (names, layers, steps,
//    micro-batches, FLOPs) in the CPU run's order;
//  - checkpoints and --resume (the training loop every backend shares): a run of 4 steps with a
//    checkpoint every 2, resumed from step 2, gives the uninterrupted run's last two losses and
//    final parameters bit for bit (fp32: the same kernels in the same order), and the checkpoint
//    written on the GPU resumes on the CPU with losses within 1e-4 relative.
// Suites are named Gpu*: they need a device and skip with the reason without one. Without one,
// CudaCompression checks that dp2 gradient compression gets as far as the device check (and that
// tp, pp and MoE blocks with it are refused on a device).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/runtime/checkpoint.hpp"
#include "orrery/runtime/cuda/gpu_run.hpp"
#include "orrery/runtime/cuda/trainer.hpp"
#include "orrery/runtime/launch.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::runtime::cuda {
namespace {

Scenario tiny_scenario() {
  Scenario s;
  s.name = "cuda-vs-cpu";
  s.model.layers = 2;
  s.model.d_model = 64;
  s.model.heads = 4;
  s.model.vocab = 128;
  s.model.seq = 32;
  s.training.steps = 3;
  s.training.global_batch = 4;
  s.training.micro_batch = 2;
  s.training.lr = 1e-3;
  return s;
}

std::vector<float> cpu_losses(const Scenario& s, std::vector<float>* initial_params,
                              std::vector<float>* final_params = nullptr) {
  auto world = make_local_communicator();
  Trainer t(s, *world, nullptr);
  t.prepare();
  if (initial_params != nullptr) *initial_params = t.parameters();
  std::vector<float> out;
  for (int i = 0; i < s.training.steps; ++i) out.push_back(t.step().loss);
  if (final_params != nullptr) *final_params = t.parameters();
  return out;
}

// The update a run made to the parameters (final - initial) against the CPU run's: the cosine of
// the two and the ratio of their norms. At this learning rate the losses of three steps move by
// less than the reduced-precision bound, so a path whose backward pass or optimizer step is
// broken (no update, garbage gradients) would still pass the loss check; it cannot give the CPU
// run's update direction and size.
void check_update(const std::vector<float>& p0, const std::vector<float>& p_cpu,
                  const std::vector<float>& p_gpu, double min_cosine, const char* mode) {
  ASSERT_EQ(p_gpu.size(), p0.size());
  ASSERT_EQ(p_cpu.size(), p0.size());
  double dot = 0, n_cpu = 0, n_gpu = 0;
  for (size_t i = 0; i < p0.size(); ++i) {
    const double a = static_cast<double>(p_cpu[i]) - p0[i];
    const double b = static_cast<double>(p_gpu[i]) - p0[i];
    dot += a * b;
    n_cpu += a * a;
    n_gpu += b * b;
  }
  ASSERT_GT(n_cpu, 0.0) << "the CPU run did not change its parameters";
  const double cosine = n_gpu > 0 ? dot / std::sqrt(n_cpu * n_gpu) : 0.0;
  const double ratio = std::sqrt(n_gpu / n_cpu);
  std::printf(
      "  %s update vs cpu: cosine %.6f, norm ratio %.4f (bounds: cosine > %.2f, ratio "
      "0.5..2)\n",
      mode, cosine, ratio, min_cosine);
  EXPECT_GT(cosine, min_cosine);
  EXPECT_GT(ratio, 0.5);
  EXPECT_LT(ratio, 2.0);
}

// The same with Llama-style blocks: 2 kv heads, SwiGLU, RMSNorm, RoPE, untied head, no biases.
Scenario tiny_llama_scenario() {
  Scenario s = tiny_scenario();
  s.name = "cuda-vs-cpu-llama";
  s.model.kv_heads = 2;
  s.model.ffn_hidden = 176;
  s.model.activation = "swiglu";
  s.model.norm = "rmsnorm";
  s.model.position = "rope";
  s.model.tied_embeddings = false;
  s.model.bias = false;
  return s;
}

void check_against_cpu(MathMode math, double rel_bound, bool llama = false) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  const Scenario s = llama ? tiny_llama_scenario() : tiny_scenario();
  std::vector<float> p_cpu, p_cpu_final;
  const std::vector<float> l_cpu = cpu_losses(s, &p_cpu, &p_cpu_final);

  Scenario g = s;
  g.runtime.device = "cuda";
  auto world = make_local_communicator();
  CudaRunOptions opt;
  opt.math = math;
  GpuTrainer t(g, *world, nullptr, opt);
  t.prepare();
  const std::vector<float> p_gpu = t.parameters();
  ASSERT_EQ(p_gpu.size(), p_cpu.size());
  EXPECT_EQ(std::memcmp(p_gpu.data(), p_cpu.data(), p_cpu.size() * sizeof(float)), 0)
      << "initial parameters differ from the CPU model's";
  for (int i = 0; i < s.training.steps; ++i) {
    const float l = t.step().loss;
    const double rel =
        std::fabs(l - l_cpu[static_cast<size_t>(i)]) / std::fabs(l_cpu[static_cast<size_t>(i)]);
    std::printf("  step %d %s loss gpu %.7f cpu %.7f rel %.3g (bound %.0e)\n", i,
                math_mode_name(math), l, l_cpu[static_cast<size_t>(i)], rel, rel_bound);
    EXPECT_LT(rel, rel_bound) << "step " << i;
    EXPECT_TRUE(std::isfinite(l));
  }
  // fp32 runs the CPU's arithmetic up to summation order; TF32 and bf16 round the matrix products'
  // inputs (10 and 7 mantissa bits), which turns AdamW's nearly-sign updates of the smallest
  // gradients either way, so their bound is looser.
  check_update(p_cpu, p_cpu_final, t.parameters(), math == MathMode::kFp32 ? 0.99 : 0.5,
               math_mode_name(math));
}

TEST(GpuTraining, Fp32LossesMatchCpu) { check_against_cpu(MathMode::kFp32, 1e-4); }
TEST(GpuTraining, Tf32LossesTrackCpu) { check_against_cpu(MathMode::kTf32, 2e-2); }
TEST(GpuTraining, Bf16MixedPrecisionLossesTrackCpu) { check_against_cpu(MathMode::kBf16, 2e-2); }
TEST(GpuTraining, LlamaFp32LossesMatchCpu) { check_against_cpu(MathMode::kFp32, 1e-4, true); }
TEST(GpuTraining, LlamaBf16LossesTrackCpu) { check_against_cpu(MathMode::kBf16, 2e-2, true); }

// (name, layer, step, micro_batch, flops) of the compute spans of stream 0, in time order.
std::vector<std::tuple<std::string, int, int, int, double>> compute_spans(const std::string& path) {
  const traces::Trace t = traces::load_trace(path);
  std::vector<std::tuple<std::string, int, int, int, double>> out;
  for (const auto& sp : t.spans) {  // sorted by (rank, stream, start)
    if (sp.stream != 0 || sp.kind != traces::SpanKind::Compute) continue;
    out.emplace_back(t.name_of(sp), sp.layer, sp.step, sp.micro_batch, sp.flops);
  }
  return out;
}

TEST(GpuTraining, ProfiledRunHasTheCpuComputeSpans) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("orrery-cuda-trace-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Scenario s = tiny_scenario();
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
    const RankRunResult r = run_rank_cuda(g, *world, opt);
    EXPECT_EQ(r.steps.size(), 2u);
    EXPECT_EQ(r.trace_path, opt.out);
  }
  const auto cpu = compute_spans((dir / "cpu.db").string());
  const auto gpu = compute_spans((dir / "gpu.db").string());
  EXPECT_FALSE(cpu.empty());
  EXPECT_EQ(gpu, cpu);
  const traces::Trace t = traces::load_trace((dir / "gpu.db").string());
  ASSERT_EQ(t.ranks.size(), 1u);
  EXPECT_EQ(t.ranks[0].device.rfind("cuda:", 0), 0u) << t.ranks[0].device;
  for (const auto& sp : t.spans) EXPECT_LE(sp.start_ns, sp.end_ns);
  std::filesystem::remove_all(dir);
}

// Activation recomputation on the GPU (the shared training loop and gpt_pieces.hpp): the same
// kernels on the same inputs, so selective and full give the losses and parameters of none bit
// for bit (as checkpoint/resume below relies on the kernels being deterministic), with less
// activation memory.
TEST(GpuTraining, RecomputationIsBitIdentical) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  struct Out {
    std::vector<float> losses, params;
    double activations = 0;
  };
  auto run = [](Recompute mode) {
    Scenario s = tiny_scenario();
    s.runtime.device = "cuda";
    s.training.steps = 3;
    s.training.recompute = recompute_name(mode);
    auto world = make_local_communicator();
    GpuTrainer t(s, *world, nullptr);
    t.prepare();
    Out o;
    for (int i = 0; i < s.training.steps; ++i) o.losses.push_back(t.step().loss);
    o.params = t.parameters();
    o.activations = t.memory().activations;
    t.finish();
    return o;
  };
  const Out none = run(Recompute::None);
  for (Recompute mode : {Recompute::Selective, Recompute::Full}) {
    const Out o = run(mode);
    EXPECT_EQ(o.losses, none.losses) << recompute_name(mode);
    ASSERT_EQ(o.params.size(), none.params.size());
    EXPECT_EQ(std::memcmp(o.params.data(), none.params.data(), o.params.size() * sizeof(float)), 0)
        << recompute_name(mode);
    EXPECT_LT(o.activations, none.activations) << recompute_name(mode);
  }
}

// Checkpoints on the GPU: saved from device memory, resumed into it.
TEST(GpuTraining, CheckpointResumeIsBitIdentical) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("orrery-cuda-ckpt-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  Scenario g = tiny_scenario();
  g.runtime.device = "cuda";
  g.training.steps = 4;
  g.checkpoint.every = 2;
  g.checkpoint.dir = (dir / "a").string();
  struct Out {
    std::vector<float> losses, params;
  };
  auto run = [](const Scenario& s, const std::string& resume) {
    auto world = make_local_communicator();
    Out o;
    if (s.runtime.device == "cuda") {
      GpuTrainer t(s, *world, nullptr);
      CheckpointSession ckpt(s, t, *world, nullptr, s.checkpoint.dir);
      if (!resume.empty()) restore_trainer(t, s, resume, verify_checkpoint(resume));
      t.prepare();
      while (t.steps_done() < s.training.steps) {
        o.losses.push_back(t.step().loss);
        ckpt.after_step();
      }
      ckpt.finish();
      o.params = t.parameters();
      t.finish();
    } else {
      Trainer t(s, *world, nullptr);
      if (!resume.empty()) restore_trainer(t, s, resume, verify_checkpoint(resume));
      t.prepare();
      while (t.steps_done() < s.training.steps) o.losses.push_back(t.step().loss);
      o.params = t.parameters();
    }
    return o;
  };
  const Out full = run(g, "");
  ASSERT_EQ(full.losses.size(), 4u);
  const std::string step2 = (dir / "a" / "step-2").string();
  ASSERT_TRUE(std::filesystem::exists(std::filesystem::path(step2) / "manifest.json"));
  Scenario again = g;
  again.checkpoint.dir = (dir / "b").string();
  const Out resumed = run(again, step2);
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.losses[0], full.losses[2]);
  EXPECT_EQ(resumed.losses[1], full.losses[3]);
  ASSERT_EQ(resumed.params.size(), full.params.size());
  EXPECT_EQ(0, std::memcmp(resumed.params.data(), full.params.data(),
                           full.params.size() * sizeof(float)));
  // The GPU's checkpoint on the CPU: the same state, the CPU's kernels.
  Scenario c = g;
  c.runtime.device = "cpu";
  c.checkpoint.every = 0;
  const Out on_cpu = run(c, step2);
  ASSERT_EQ(on_cpu.losses.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(on_cpu.losses[i], full.losses[2 + i], 1e-4 * std::abs(full.losses[2 + i])) << i;
  }
  std::filesystem::remove_all(dir);
}

// `orrery run --resume` on the GPU: run_rank_cuda continues from the checkpoint to the last step.
TEST(GpuTraining, RunRankResumes) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("orrery-cuda-resume-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  Scenario g = tiny_scenario();
  g.runtime.device = "cuda";
  g.training.steps = 4;
  g.checkpoint.every = 2;
  g.checkpoint.dir = (dir / "ckpt").string();
  RankRunOptions opt;
  opt.profile = false;
  std::vector<float> full;
  {
    auto world = make_local_communicator();
    for (const auto& r : run_rank_cuda(g, *world, opt).steps) full.push_back(r.loss);
  }
  ASSERT_EQ(full.size(), 4u);
  opt.resume = (dir / "ckpt" / "step-2").string();
  auto world = make_local_communicator();
  const RankRunResult r = run_rank_cuda(g, *world, opt);
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(r.steps[0].step, 2);
  EXPECT_EQ(r.steps[0].loss, full[2]);
  EXPECT_EQ(r.steps[1].loss, full[3]);
  std::filesystem::remove_all(dir);
}

// No device needed: dp2 with each compression scheme, ZeRO 0 and 1, is accepted on device cuda up to
// the device check (launch.cpp no longer refuses parallel.grad_compression there), whose message
// names runtime.device; with tp 2, pp 2 or MoE blocks the compression key is refused first (on a
// device the hook runs with data parallelism only).
TEST(CudaCompression, EverySchemeGetsAsFarAsTheDeviceCheck) {
  if (device_count() > 0) GTEST_SKIP() << "a device is present: the no-device path is not taken";
  Scenario s = tiny_scenario();
  s.runtime.device = "cuda";
  s.parallel.dp = 2;
  for (const char* scheme : {"int8", "topk", "powersgd"}) {
    for (const int zero : {0, 1}) {
      s.parallel.grad_compression = scheme;
      s.parallel.zero = zero;
      SCOPED_TRACE(std::string(scheme) + ", zero " + std::to_string(zero));
      try {
        check_supported_on_device(s);
        ADD_FAILURE() << "accepted without a device";
      } catch (const InputError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("key 'runtime.device'"), std::string::npos) << what;
        EXPECT_EQ(what.find("grad_compression"), std::string::npos) << what;
      }
    }
  }
  s.parallel.zero = 0;
  for (const char* layout : {"tp", "pp", "moe"}) {
    Scenario t = s;
    if (std::string(layout) == "tp") t.parallel.tp = 2;
    if (std::string(layout) == "pp") t.parallel.pp = 2;
    if (std::string(layout) == "moe") {
      t.model.moe.experts = 4;
      t.model.moe.expert_ffn_hidden = 96;
    }
    try {
      check_supported_on_device(t);
      ADD_FAILURE() << layout << " with compression accepted on device cuda";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("key 'parallel.grad_compression'"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace orrery::runtime::cuda
