// ZeRO-Offload on one GPU (zero.offload_optimizer host and nvme on device cuda; runtime
// offload_pipeline.hpp, cuda/host_offload.hpp), a tiny GPT of ~110k parameters in chunks of
// 0.01 MB (2621 floats, so ~43 chunks and the pipeline's steady state):
//  - host and nvme give the same losses and final parameters bit for bit (the same host AdamW on
//    the same gradients; only where the moments live differs);
//  - against the run without offload (AdamW in the GPU kernel): step 0's loss bit for bit (no
//    update yet), the later losses within 1e-5 relative and the final parameters within
//    max|d|/max|p| < 1e-4. The CPU's adamw_update and the GPU's adamw_kernel compute the same
//    expression with the same scalars (optimizer.hpp: adamw_scalars), but the CPU's is compiled
//    with -ffp-contract=fast -march=native and nvcc contracts with --fmad=true, and the two may
//    fuse different products into FMAs: a last-bit difference per element per step, which AdamW
//    can amplify where a gradient is near zero (the bounds are test_cuda_parallel.cpp's); the
//    figures are printed, and whether the runs came out bit-identical;
//  - checkpoint and resume with offload (the moments saved from pinned memory or the file, the
//    master weights re-read from the loaded parameters): the resumed run's last two losses and
//    final parameters are the uninterrupted run's bit for bit;
//  - memory counters in closed form (n parameters, chunk c): without offload mem.optimizer 8n; host
//    mem.optimizer 0, mem.offload_host 12n + 8c (master, m, v, two staging buffers); nvme
//    mem.optimizer 0, mem.offload_nvme 8n, mem.offload_host 4n + 8c + 24c (the store's three chunk
//    buffers of two planes);
//  - a profiled host-offload run records per step one "offload.d2h" and one "offload.h2d" (Memcpy,
//    stream "offload") and one "offload.adamw" (Optimizer, compute stream) per chunk, each
//    carrying 4 bytes per element: 4n bytes each per step.
// Suites are named Gpu*: they need a device and skip with the reason without one. ZeRO 3 with
// zero.offload_params needs dp >= 2: its GPU tests are test_cuda_parallel.cpp's GpuZero.OffloadParams*;
// here (no device needed, suite CudaOffload) every such layout, dense and MoE, gets as far as the
// device check of `orrery run`'s path (check_supported_on_device: no longer refused for the key).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/model/names.hpp"
#include "orrery/runtime/checkpoint.hpp"
#include "orrery/runtime/cuda/gpu_run.hpp"
#include "orrery/runtime/cuda/trainer.hpp"
#include "orrery/runtime/launch.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::runtime::cuda {
namespace {
namespace fs = std::filesystem;
namespace names = model::names;

constexpr std::size_t kChunk = 2621;  // 0.01 MB of floats

fs::path temp_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("orrery-cuda-offload-" + std::to_string(::getpid()) + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// offload: "none", "host" or "nvme" (the file under `dir`).
Scenario tiny(const std::string& offload, const fs::path& dir, int steps = 3) {
  Scenario s;
  s.name = "cuda-offload";
  s.model.layers = 2;
  s.model.d_model = 64;
  s.model.heads = 4;
  s.model.vocab = 128;
  s.model.seq = 32;
  s.training.steps = steps;
  s.training.global_batch = 4;
  s.training.micro_batch = 2;
  s.training.lr = 1e-3;
  s.runtime.device = "cuda";
  s.zero.offload_optimizer = offload;
  s.zero.offload_chunk_mb = 0.01;
  if (offload == "nvme") s.zero.nvme_path = dir.string();
  return s;
}

struct Out {
  std::vector<float> losses, params, initial;
  MemoryBytes memory;
  std::size_t n = 0;
};

Out run(const Scenario& s) {
  auto world = make_local_communicator();
  GpuTrainer t(s, *world, nullptr);
  t.prepare();
  Out o;
  o.initial = t.parameters();
  for (int i = 0; i < s.training.steps; ++i) o.losses.push_back(t.step().loss);
  o.params = t.parameters();
  o.memory = t.memory();
  o.n = t.flat_elems();
  t.finish();
  return o;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
    m = std::max(m, std::fabs(double(b[i])));
  }
  return d / std::max(m, 1e-30);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(GpuOffload, HostAndNvmeMatchTheRunWithoutOffload) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  const fs::path dir = temp_dir("-match");
  const Out none = run(tiny("none", dir));
  const Out host = run(tiny("host", dir));
  const Out nvme = run(tiny("nvme", dir));
  EXPECT_EQ(host.losses, nvme.losses);
  EXPECT_TRUE(same_bits(host.params, nvme.params)) << "host and nvme offload differ";
  ASSERT_EQ(host.losses.size(), 3u);
  EXPECT_EQ(host.losses[0], none.losses[0]);
  for (std::size_t i = 1; i < 3; ++i) {
    const double rel = std::fabs(double(host.losses[i]) - none.losses[i]) / none.losses[i];
    std::printf("  step %zu loss host offload %.7f, on the GPU %.7f, rel %.3g (bound 1e-5)\n", i,
                host.losses[i], none.losses[i], rel);
    EXPECT_LT(rel, 1e-5) << i;
  }
  const double rel = max_rel_diff(host.params, none.params);
  std::printf("  parameters host offload vs on the GPU: max|d|/max|p| %.3g (bound 1e-4), %s\n", rel,
              same_bits(host.params, none.params) ? "bit-identical" : "not bit-identical");
  EXPECT_LT(rel, 1e-4);
  EXPECT_GT(max_rel_diff(host.params, host.initial), 1e-5) << "the parameters did not move";
  fs::remove_all(dir);
}

TEST(GpuOffload, MemoryCountersShowTheSaving) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  const fs::path dir = temp_dir("-memory");
  const Out none = run(tiny("none", dir, 1));
  const Out host = run(tiny("host", dir, 1));
  const Out nvme = run(tiny("nvme", dir, 1));
  const double n = double(none.n), c = double(std::min(kChunk, none.n));
  EXPECT_EQ(none.memory.optimizer, 8 * n);
  EXPECT_EQ(none.memory.offload_host, 0.0);
  EXPECT_EQ(host.memory.optimizer, 0.0);
  EXPECT_EQ(host.memory.offload_host, 12 * n + 8 * c);
  EXPECT_EQ(host.memory.offload_nvme, 0.0);
  EXPECT_EQ(nvme.memory.optimizer, 0.0);
  EXPECT_EQ(nvme.memory.offload_nvme, 8 * n);
  EXPECT_EQ(nvme.memory.offload_host, 4 * n + 8 * c + 24 * c);
  for (const Out* o : {&host, &nvme}) {
    EXPECT_EQ(o->memory.parameters, none.memory.parameters);
    EXPECT_EQ(o->memory.gradients, none.memory.gradients);
    EXPECT_EQ(o->memory.comm_buffers, none.memory.comm_buffers);
  }
  fs::remove_all(dir);
}

struct Resumed {
  std::vector<float> losses, params;
};

Resumed run_with_checkpoints(const Scenario& s, const std::string& resume) {
  auto world = make_local_communicator();
  GpuTrainer t(s, *world, nullptr);
  CheckpointSession ckpt(s, t, *world, nullptr, s.checkpoint.dir);
  if (!resume.empty()) restore_trainer(t, s, resume, verify_checkpoint(resume));
  t.prepare();
  Resumed o;
  while (t.steps_done() < s.training.steps) {
    o.losses.push_back(t.step().loss);
    ckpt.after_step();
  }
  ckpt.finish();
  o.params = t.parameters();
  t.finish();
  return o;
}

TEST(GpuOffload, CheckpointResumeIsBitIdentical) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  for (const char* mode : {"host", "nvme"}) {
    const fs::path dir = temp_dir(std::string("-ckpt-") + mode);
    Scenario g = tiny(mode, dir, 4);
    g.checkpoint.every = 2;
    g.checkpoint.dir = (dir / "a").string();
    const Resumed full = run_with_checkpoints(g, "");
    ASSERT_EQ(full.losses.size(), 4u) << mode;
    Scenario again = g;
    again.checkpoint.dir = (dir / "b").string();
    const Resumed resumed = run_with_checkpoints(again, (dir / "a" / "step-2").string());
    ASSERT_EQ(resumed.losses.size(), 2u) << mode;
    EXPECT_EQ(resumed.losses[0], full.losses[2]) << mode;
    EXPECT_EQ(resumed.losses[1], full.losses[3]) << mode;
    EXPECT_TRUE(same_bits(resumed.params, full.params)) << mode;
    fs::remove_all(dir);
  }
}

TEST(GpuOffload, ProfiledRunRecordsTheChunksCopiesAndHostSteps) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  const fs::path dir = temp_dir("-trace");
  const Scenario g = tiny("host", dir, 2);
  RankRunOptions opt;
  opt.out = (dir / "gpu.db").string();
  {
    auto world = make_local_communicator();
    EXPECT_EQ(run_rank_cuda(g, *world, opt).steps.size(), 2u);
  }
  const traces::Trace t = traces::load_trace(opt.out);
  std::map<std::string, std::map<int, std::pair<int64_t, int64_t>>> seen;  // name: step: n, bytes
  for (const auto& sp : t.spans) {
    const std::string& name = t.name_of(sp);
    if (name.rfind("offload.", 0) != 0) continue;
    const bool copy = name != names::kOffloadAdamW;
    EXPECT_EQ(sp.stream, copy ? names::kStreamOffload : 0) << name;
    EXPECT_EQ(sp.kind, copy ? traces::SpanKind::Memcpy : traces::SpanKind::Optimizer) << name;
    EXPECT_LE(sp.start_ns, sp.end_ns) << name;
    auto& [count, bytes] = seen[name][sp.step];
    ++count;
    bytes += sp.bytes;
  }
  const Out none = run(tiny("none", dir, 1));
  const auto n = int64_t(none.n);
  const int64_t chunks = (n + int64_t(kChunk) - 1) / int64_t(kChunk);
  for (auto name : {names::kOffloadD2H, names::kOffloadH2D, names::kOffloadAdamW}) {
    for (int step = 0; step < 2; ++step) {
      const auto& [count, bytes] = seen[std::string(name)][step];
      EXPECT_EQ(count, chunks) << name << " step " << step;
      EXPECT_EQ(bytes, 4 * n) << name << " step " << step;
    }
  }
  double offload_host = -1, optimizer = -1;
  for (const auto& c : t.counters) {
    if (t.strings.str(c.name) == names::kMemOffloadHost) offload_host = c.value;
    if (t.strings.str(c.name) == names::kMemOptimizer) optimizer = c.value;
  }
  EXPECT_EQ(offload_host, 12.0 * double(n) + 8.0 * double(std::min<int64_t>(int64_t(kChunk), n)));
  EXPECT_EQ(optimizer, 0.0);
  fs::remove_all(dir);
}

// No device needed: dp2 (and dp4) ZeRO 3 with the optimizer state and the parameter shards in the
// NVMe file, dense and MoE (ep 1, 2), is accepted on device cuda up to the device check, whose
// message names runtime.device, not zero.offload_params.
TEST(CudaOffload, ZeroThreeParamsLayoutsGetAsFarAsTheDeviceCheck) {
  if (device_count() > 0) GTEST_SKIP() << "a device is present: the no-device path is not taken";
  const fs::path dir = temp_dir("-layouts");
  for (const int dp : {2, 4}) {
    for (const int experts : {0, 4}) {
      for (const int ep : {1, 2}) {
        if (experts == 0 && ep > 1) continue;
        Scenario s = tiny("nvme", dir);
        s.parallel.dp = dp;
        s.parallel.zero = 3;
        s.parallel.ep = ep;
        s.training.global_batch = 2 * dp;
        s.model.moe.experts = experts;
        s.model.moe.expert_ffn_hidden = experts > 0 ? 96 : 0;
        s.zero.offload_params = "nvme";
        SCOPED_TRACE("dp " + std::to_string(dp) + ", experts " + std::to_string(experts) + ", ep " +
                     std::to_string(ep));
        try {
          check_supported_on_device(s);
          ADD_FAILURE() << "accepted without a device";
        } catch (const InputError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("key 'runtime.device'"), std::string::npos) << what;
          EXPECT_EQ(what.find("zero.offload_params"), std::string::npos) << what;
        }
      }
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace orrery::runtime::cuda
