// ZeRO 1/2 and tensor parallelism on the GPU trainer, under mpirun with 2 ranks sharing one GPU
// over the host-staged MPI communicator (NCCL refuses two ranks on one device; on a machine with
// two GPUs the ranks take one each and still use the staged communicator, CudaRunOptions::comm):
//  - dp2 ZeRO 1 and ZeRO 2 end with the parameters of dp2 without ZeRO (DDP) after 3 steps, and the
//    same loss curve;
//  - tp2 (dp1) gives tp1's loss curve, its initial shard parameters are bit-identical to the CPU
//    shard's (gpt_create), and its final shard parameters are the matching slice of the tp1 run's
//    (tp_slice_of_full);
//  - the same dp2 ZeRO 2 and tp2 scenarios on the CPU trainer (same ranks, MPI) give the GPU's
//    losses;
//  - a profiled GPU run records the CPU run's compute and collective spans (names, layers, steps,
//    micro-batches), in order, on rank 0.
// Main: tests/runtime/mpi/mpi_main.cpp (the world communicator, one report). Without a device
// every test skips with the reason; run_mpi_gpu_tests.sh turns "0 tests passed" into ctest's skip.
//
// Tolerances (fp32 matrix products, fp32 master weights). Parallel runs sum in another order: the
// reduce-scatter/all-gather of ZeRO average per shard (ZeRO 2 per micro-batch, then accumulated),
// tp splits every matmul reduction of a block in two and sums the halves in the all-reduce, and
// cuBLAS picks its own kernels for the halved shapes. That is a few fp32 ulps per operation, as on
// CPUs (tests/runtime/mpi/test_parallel.cpp: loss relative 1e-5, parameters after 3 AdamW steps
// max|Δ|/max|p| < 1e-4, observed up to 2.9e-5). AdamW amplifies a gradient difference δg on
// elements whose gradient is near zero (update ≈ lr·δg/|g|), so parameters get the CPU test's bound
// and losses 1e-5 relative for ZeRO (the forward is the same computation on the same parameters
// until the first update) and 1e-4 for tp and for CPU vs GPU (the existing single-GPU test's fp32
// bound: different kernels on both sides).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "mpi_env.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/cuda/gpu_run.hpp"
#include "orrery/runtime/cuda/trainer.hpp"
#include "orrery/runtime/launch.hpp"
#include "orrery/runtime/tensor_parallel.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::runtime::cuda {
namespace {

using orrery::runtime::testing::world;

Scenario tiny(int dp, int tp, int zero) {
  Scenario s;
  s.name = "cuda-parallel";
  s.model.layers = 2;
  s.model.d_model = 64;
  s.model.heads = 4;
  s.model.vocab = 128;
  s.model.seq = 32;
  s.training.steps = 3;
  s.training.global_batch = 8;
  s.training.micro_batch = 2;  // dp2: 2 micro-batches per step (ZeRO 2 differs from ZeRO 1); tp2: 4
  s.training.seed = 42;
  s.training.lr = 1e-3;
  s.parallel.dp = dp;
  s.parallel.tp = tp;
  s.parallel.zero = zero;
  s.parallel.bucket_mb = 0.01;  // several DDP buckets
  s.runtime.threads = 1;
  s.runtime.device = "cuda";
  return s;
}

CudaRunOptions staged() {
  CudaRunOptions o;
  o.math = MathMode::kFp32;
  o.comm = CommBackend::kStaged;
  return o;
}

struct GpuRun {
  std::vector<float> losses;
  std::vector<float> initial, final_params;  // this rank's flat array, unpadded
  std::size_t zero_shard = 0;
  Trainer::MemoryBytes memory;
};

GpuRun run_gpu(const Scenario& s, Communicator& comm) {
  GpuRun r;
  GpuTrainer t(s, comm, nullptr, staged());
  t.prepare();
  r.initial = t.parameters();
  for (int i = 0; i < s.training.steps; ++i) r.losses.push_back(t.step().loss);
  r.final_params = t.parameters();
  r.zero_shard = t.zero().shard;
  r.memory = t.memory();
  t.finish();
  return r;
}

std::vector<float> run_cpu_losses(Scenario s, Communicator& comm) {
  s.runtime.device = "cpu";
  Trainer t(s, comm, nullptr);
  t.prepare();
  std::vector<float> out;
  for (int i = 0; i < s.training.steps; ++i) out.push_back(t.step().loss);
  return out;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// max|a - b| / max|b|
double param_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  }
  return d / std::max(max_abs(b), 1e-30);
}

void expect_losses_near(const std::vector<float>& got, const std::vector<float>& want,
                        double rel_bound, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double rel =
        std::fabs(static_cast<double>(got[i]) - want[i]) / std::fabs(static_cast<double>(want[i]));
    if (world().rank() == 0) {
      std::printf("  %s step %zu: loss %.7f vs %.7f, rel %.3g (bound %.0e)\n", what, i, got[i],
                  want[i], rel, rel_bound);
    }
    EXPECT_TRUE(std::isfinite(got[i])) << what << " step " << i;
    EXPECT_LT(rel, rel_bound) << what << " step " << i;
  }
}

#define SKIP_WITHOUT_GPU()                                                            \
  do {                                                                                \
    if (device_count() == 0) GTEST_SKIP() << no_device_reason();                      \
    if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks, got " << world().size(); \
  } while (0)

TEST(GpuZero, Zero1And2EndWithTheDdpParameters) {
  SKIP_WITHOUT_GPU();
  const GpuRun ddp = run_gpu(tiny(2, 1, 0), world());
  for (int stage : {1, 2}) {
    const GpuRun z = run_gpu(tiny(2, 1, stage), world());
    const std::string what = "dp2 zero" + std::to_string(stage) + " vs ddp";
    // Before the first update ZeRO changes nothing: rank 0's broadcast parameters, unpadded.
    ASSERT_EQ(z.initial.size(), ddp.initial.size());
    EXPECT_EQ(std::memcmp(z.initial.data(), ddp.initial.data(), ddp.initial.size() * sizeof(float)),
              0)
        << what;
    EXPECT_EQ(z.zero_shard, (ddp.initial.size() + 1) / 2) << what;
    expect_losses_near(z.losses, ddp.losses, 1e-5, what.c_str());
    ASSERT_EQ(z.final_params.size(), ddp.final_params.size());
    const double rel = param_rel_diff(z.final_params, ddp.final_params);
    if (world().rank() == 0)
      std::printf("  %s: parameters max|d|/max|p| = %.3g (bound 1e-4)\n", what.c_str(), rel);
    EXPECT_LT(rel, 1e-4) << what;
    // The parameters moved (the comparison is not between two untouched arrays).
    EXPECT_GT(param_rel_diff(z.final_params, z.initial), 1e-5) << what;
    // Memory counters as the CPU trainer's: AdamW moments of the shard only; ZeRO 2 keeps the shard
    // gradient as state and stages the full array (plus the receive shard) as comm buffers.
    const double k = static_cast<double>(z.zero_shard) * sizeof(float);
    EXPECT_EQ(z.memory.optimizer, 2 * k) << what;
    EXPECT_EQ(z.memory.parameters, 2 * k) << what;  // padded to N*k
    if (stage == 1) {
      EXPECT_EQ(z.memory.gradients, 2 * k) << what;
      EXPECT_EQ(z.memory.comm_buffers, k) << what;
    } else {
      EXPECT_EQ(z.memory.gradients, k) << what;
      EXPECT_EQ(z.memory.comm_buffers, 2 * k + k) << what;
    }
  }
}

TEST(GpuZero, Zero2LossesMatchTheCpuTrainer) {
  SKIP_WITHOUT_GPU();
  const Scenario s = tiny(2, 1, 2);
  const std::vector<float> cpu = run_cpu_losses(s, world());
  const GpuRun gpu = run_gpu(s, world());
  expect_losses_near(gpu.losses, cpu, 1e-4, "dp2 zero2 gpu vs cpu");
}

TEST(GpuTensorParallel, Tp2MatchesTp1) {
  SKIP_WITHOUT_GPU();
  const Scenario s2 = tiny(1, 2, 0);
  const int tp_rank = world().rank();  // dp = pp = 1: the tp rank is the world rank
  // The same global batch on one GPU, whole model, every rank on its own (local communicator).
  Gpt full_final =
      gpt_create(gpt_config(s2.model), GptShard{}, s2.training.seed);  // the tp1 layout
  GpuRun serial;
  {
    auto local = make_local_communicator();
    GpuTrainer t(tiny(1, 1, 0), *local, nullptr, staged());
    t.prepare();
    serial.initial = t.parameters();
    for (int i = 0; i < s2.training.steps; ++i) serial.losses.push_back(t.step().loss);
    serial.final_params = t.parameters();
    ASSERT_EQ(serial.final_params.size(), full_final.params.size());
    std::copy(serial.final_params.begin(), serial.final_params.end(), full_final.params.begin());
    t.finish();
  }
  const GpuRun tp = run_gpu(s2, world());
  // Initial shard parameters: the CPU model's tp shard, bit for bit.
  GptShard shard;
  shard.tp_rank = tp_rank;
  shard.tp_size = 2;
  const Gpt cpu_shard = gpt_create(gpt_config(s2.model), shard, s2.training.seed);
  ASSERT_EQ(tp.initial.size(), cpu_shard.num_params());
  EXPECT_EQ(
      std::memcmp(tp.initial.data(), cpu_shard.params.data(), tp.initial.size() * sizeof(float)), 0)
      << "tp rank " << tp_rank << ": initial parameters differ from the CPU shard's";
  EXPECT_LT(tp.initial.size(), serial.initial.size());
  expect_losses_near(tp.losses, serial.losses, 1e-4, "tp2 vs tp1");
  // Final parameters: each tensor of the shard against its slice of the tp1 run's.
  std::vector<float> want(tp.final_params.size());
  for (const ParamTensor& t : cpu_shard.tensors) {
    const std::vector<float> slice = tp_slice_of_full(full_final, t, tp_rank, 2);
    ASSERT_EQ(slice.size(), t.count) << t.name;
    std::copy(slice.begin(), slice.end(), want.begin() + static_cast<std::ptrdiff_t>(t.offset));
  }
  const double rel = param_rel_diff(tp.final_params, want);
  std::printf("  [rank %d] tp2 vs tp1: parameters max|d|/max|p| = %.3g (bound 1e-4)\n", tp_rank,
              rel);
  EXPECT_LT(rel, 1e-4);
  EXPECT_GT(param_rel_diff(tp.final_params, tp.initial), 1e-5);
}

TEST(GpuTensorParallel, Tp2LossesMatchTheCpuTrainer) {
  SKIP_WITHOUT_GPU();
  const Scenario s = tiny(1, 2, 0);
  const std::vector<float> cpu = run_cpu_losses(s, world());
  const GpuRun gpu = run_gpu(s, world());
  expect_losses_near(gpu.losses, cpu, 1e-4, "tp2 gpu vs cpu");
}

// (kind, name, layer, step, micro_batch) of rank 0's op spans on the compute stream and collective
// spans on the comm stream (the staged communicator's host MPI operations, as the CPU run's), in
// time order per stream; set-up and report collectives (step -1) and the CUPTI tracer's kernel
// spans (on their own CUDA streams) left out.
using SpanKey = std::tuple<int, std::string, int, int, int>;
std::vector<SpanKey> step_spans(const std::string& path) {
  const traces::Trace t = traces::load_trace(path);
  std::vector<SpanKey> compute, coll;
  for (const auto& sp : t.spans) {  // sorted by (rank, stream, start)
    if (sp.rank != 0 || sp.step < 0) continue;
    if (sp.kind == traces::SpanKind::Compute && sp.stream == profiler::kComputeStream) {
      compute.emplace_back(static_cast<int>(sp.kind), t.name_of(sp), sp.layer, sp.step,
                           sp.micro_batch);
    } else if (sp.kind == traces::SpanKind::Collective && sp.stream == profiler::kCommStream) {
      coll.emplace_back(static_cast<int>(sp.kind), t.name_of(sp), sp.layer, sp.step,
                        sp.micro_batch);
    }
  }
  compute.insert(compute.end(), coll.begin(), coll.end());
  return compute;
}

std::size_t count_named(const std::vector<SpanKey>& spans, const std::string& name) {
  return static_cast<std::size_t>(std::count_if(
      spans.begin(), spans.end(), [&](const SpanKey& k) { return std::get<1>(k) == name; }));
}

TEST(GpuParallelSpans, ProfiledRunsRecordTheCpuSpans) {
  SKIP_WITHOUT_GPU();
  // Every rank agrees on the directory (rank 0's pid).
  int32_t pid = static_cast<int32_t>(::getpid());
  world().broadcast(&pid, 1, DType::I32, 0).wait();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("orrery-cuda-parallel-" + std::to_string(pid));
  if (world().rank() == 0) std::filesystem::create_directories(dir);
  world().barrier().wait();
  for (const auto& [dp, tp, zero] :
       {std::tuple{2, 1, 1}, std::tuple{2, 1, 2}, std::tuple{1, 2, 0}}) {
    Scenario s = tiny(dp, tp, zero);
    s.training.steps = 2;
    const std::string tag =
        "dp" + std::to_string(dp) + "-tp" + std::to_string(tp) + "-zero" + std::to_string(zero);
    RankRunOptions opt;
    Scenario c = s;
    c.runtime.device = "cpu";
    opt.out = (dir / (tag + "-cpu.db")).string();
    run_rank(c, world(), opt);
    opt.out = (dir / (tag + "-gpu.db")).string();
    const RankRunResult r = run_rank_cuda(s, world(), opt, staged());
    EXPECT_EQ(r.steps.size(), 2u) << tag;
    world().barrier().wait();  // rank 0 merged both traces
    if (world().rank() != 0) continue;
    const auto cpu = step_spans((dir / (tag + "-cpu.db")).string());
    const auto gpu = step_spans((dir / (tag + "-gpu.db")).string());
    EXPECT_FALSE(cpu.empty()) << tag;
    EXPECT_EQ(gpu, cpu) << tag;
    if (zero > 0) {
      // Per step: one reduce-scatter (ZeRO 1) or one per micro-batch (ZeRO 2), one all-gather.
      const std::size_t mbs = static_cast<std::size_t>(s.micro_batches_per_step());
      EXPECT_EQ(count_named(gpu, kZeroReduceScatterName), 2 * (zero == 1 ? 1 : mbs)) << tag;
      EXPECT_EQ(count_named(gpu, kZeroAllGatherName), 2u) << tag;
      EXPECT_EQ(count_named(gpu, "ddp.all_reduce"), 0u) << tag;
    } else {
      // Four sums per block and micro-batch.
      const std::size_t mbs = static_cast<std::size_t>(s.micro_batches_per_step());
      EXPECT_EQ(count_named(gpu, kTpAllReduceName),
                2 * mbs * 4 * static_cast<std::size_t>(s.model.layers))
          << tag;
    }
  }
  world().barrier().wait();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace orrery::runtime::cuda
