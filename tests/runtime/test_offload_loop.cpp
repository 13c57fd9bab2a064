// The training loop's part of ZeRO-Offload on a device (zero.offload_optimizer host and nvme on a
// backend whose memory is not the host's), run on the CPU through host_device_backend.hpp: the
// loop's device path (the master weights read from the parameters, AdamW per chunk on the host
// through offload_pipeline.hpp, the parameters written back, checkpoint state staged and the
// moments saved from the host) with memcpy for the device's copies. The host step is the CPU's
// adamw_update, so here (unlike on a GPU, whose AdamW kernel is another compiler's) the runs equal
// the CPU trainer's without offload bit for bit:
//  - host and nvme: the losses and final parameters of the CPU run, every step through the
//    pipeline (one range a step);
//  - memory in closed form (n elements, chunk c = 2621): mem.optimizer 0, mem.offload_host
//    12n + 8c (host) or 4n + 8c + 24c (nvme, with mem.offload_nvme 8n);
//  - a checkpoint written with host offload resumes bit for bit with it, and on the CPU trainer
//    without offload (the same state in the same format);
//  - device cuda is refused neither offload_optimizer nor offload_params (this binary has no CUDA
//    runner: the CPU runtime's device check refuses it, naming runtime.device).
// dp2 ZeRO 1/2/3: tests/runtime/mpi/test_offload_mpi.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "host_device_backend.hpp"
#include "orrery/common/error.hpp"
#include "orrery/runtime/checkpoint.hpp"
#include "orrery/runtime/launch.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/runtime/training_loop_impl.hpp"

namespace orrery::runtime {
template class TrainingLoop<testing::HostDeviceBackend>;

namespace {
namespace fs = std::filesystem;
using testing::HostDeviceLoop;

constexpr std::size_t kChunk = 2621;  // zero.offload_chunk_mb 0.01

fs::path temp_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("orrery_offload_loop_" + std::to_string(::getpid()) + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

Scenario tiny(int steps, const std::string& offload, const fs::path& dir) {
  Scenario s;
  s.name = "offload-loop";
  s.model.layers = 2;
  s.model.d_model = 32;
  s.model.heads = 2;
  s.model.vocab = 64;
  s.model.seq = 16;
  s.training.steps = steps;
  s.training.global_batch = 4;
  s.training.micro_batch = 2;
  s.training.seed = 11;
  s.training.lr = 1e-3;
  s.zero.offload_optimizer = offload;
  s.zero.offload_chunk_mb = 0.01;
  if (offload == "nvme") s.zero.nvme_path = dir.string();
  return s;
}

struct Out {
  std::vector<float> losses, params;
  MemoryBytes memory;
  std::size_t n = 0;
  int ranges = 0;
};

template <class Loop>
Out run(const Scenario& s, const std::string& resume = "") {
  auto world = make_local_communicator();
  Loop t(s, *world, nullptr);
  CheckpointSession ck(s, t, *world, nullptr, s.checkpoint.dir);
  if (!resume.empty()) restore_trainer(t, s, resume, verify_checkpoint(resume));
  t.prepare();
  Out o;
  while (t.steps_done() < s.training.steps) {
    o.losses.push_back(t.step().loss);
    ck.after_step();
  }
  ck.finish();
  o.params = t.parameters();
  o.memory = t.memory();
  o.n = t.flat_elems();
  if constexpr (std::is_same_v<Loop, HostDeviceLoop>) o.ranges = t.backend().host_offload()->ranges;
  return o;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(LoopOffload, HostAndNvmeAreTheCpuRunBitForBit) {
  const fs::path dir = temp_dir("same");
  const Out cpu = run<Trainer>(tiny(3, "none", dir));
  const Out host = run<HostDeviceLoop>(tiny(3, "host", dir));
  const Out nvme = run<HostDeviceLoop>(tiny(3, "nvme", dir));
  for (const Out* o : {&host, &nvme}) {
    EXPECT_EQ(o->losses, cpu.losses);
    EXPECT_TRUE(same_bits(o->params, cpu.params));
    EXPECT_EQ(o->ranges, 3);  // one range a step (ZeRO 0: the whole array)
  }
  EXPECT_FALSE(same_bits(cpu.params, run<Trainer>(tiny(1, "none", dir)).params));  // they moved
  const double n = double(cpu.n), c = double(std::min(kChunk, cpu.n));
  EXPECT_EQ(cpu.memory.optimizer, 8 * n);
  EXPECT_EQ(host.memory.optimizer, 0.0);
  EXPECT_EQ(host.memory.offload_host, 12 * n + 8 * c);
  EXPECT_EQ(nvme.memory.optimizer, 0.0);
  EXPECT_EQ(nvme.memory.offload_nvme, 8 * n);
  EXPECT_EQ(nvme.memory.offload_host, 4 * n + 8 * c + 24 * c);
  EXPECT_EQ(host.memory.parameters, cpu.memory.parameters);
  fs::remove_all(dir);
}

TEST(LoopOffload, CheckpointsResumeBitForBitWithAndWithoutOffload) {
  const fs::path root = temp_dir("resume");
  for (const char* mode : {"host", "nvme"}) {
    Scenario a = tiny(4, mode, root);
    a.checkpoint.every = 2;
    a.checkpoint.dir = (root / mode / "a").string();
    const Out full = run<HostDeviceLoop>(a);
    const std::string step2 = (root / mode / "a" / "step-2").string();
    Scenario b = a;
    b.checkpoint.dir = (root / mode / "b").string();
    const Out resumed = run<HostDeviceLoop>(b, step2);
    ASSERT_EQ(resumed.losses.size(), 2u) << mode;
    EXPECT_EQ(resumed.losses[0], full.losses[2]) << mode;
    EXPECT_EQ(resumed.losses[1], full.losses[3]) << mode;
    EXPECT_TRUE(same_bits(resumed.params, full.params)) << mode;
    // The same checkpoint on the CPU trainer without offload.
    Scenario c = tiny(4, "none", root);
    c.checkpoint.every = 0;
    const Out on_cpu = run<Trainer>(c, step2);
    EXPECT_EQ(on_cpu.losses, resumed.losses) << mode;
    EXPECT_TRUE(same_bits(on_cpu.params, full.params)) << mode;
  }
  fs::remove_all(root);
}

std::string device_error(const Scenario& s) {
  try {
    check_supported_on_device(s);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

TEST(LoopOffload, DeviceCudaTakesTheOptimizersAndTheParametersOffload) {
  Scenario s = tiny(1, "host", "");
  s.runtime.device = "cuda";
  s.parallel.dp = 2;
  s.parallel.zero = 3;
  // This binary has no CUDA runner: what refuses the scenario is the CPU runtime's device check.
  EXPECT_NE(device_error(s).find("key 'runtime.device'"), std::string::npos) << device_error(s);
  s.zero.offload_optimizer = "nvme";
  s.zero.offload_params = "nvme";
  s.zero.nvme_path = fs::temp_directory_path().string();
  EXPECT_NE(device_error(s).find("key 'runtime.device'"), std::string::npos) << device_error(s);
  EXPECT_EQ(device_error(s).find("zero.offload_params"), std::string::npos) << device_error(s);
}

}  // namespace
}  // namespace orrery::runtime
