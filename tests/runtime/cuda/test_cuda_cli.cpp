// `orrery run --device cuda` on a machine without a usable CUDA device: a clear message naming the
// cause on stderr, exit status 2 (bad input for this machine), no crash, no hang (a 120 s timeout
// around the command), and no trace file left behind. Skips where a device is present. A pipeline
// run on cuda is refused only for that cause; the interleaved schedule on any machine. ZeRO 3 with
// zero.offload_params on cuda likewise only for want of a device; offload_params without ZeRO 3 or
// without offload_optimizer nvme on any machine, naming the key.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "orrery/runtime/cuda/device.hpp"

namespace orrery::runtime::cuda {
namespace {

struct CommandResult {
  int status = -1;
  std::string output;
};

CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) r.output += buf;
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  return r;
}

TEST(CudaCli, RunOnDeviceCudaWithoutADeviceExitsTwoWithTheReason) {
  if (device_count() > 0)
    GTEST_SKIP() << "a CUDA device is present: the no-device path cannot be checked";
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("orrery-cuda-cli-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path scenario = dir / "tiny.yaml";
  std::ofstream(scenario) << "name: tiny\n"
                             "model: {layers: 2, d_model: 32, heads: 2, vocab: 64, seq: 16}\n"
                             "training: {steps: 2, global_batch: 2, micro_batch: 2}\n"
                             "parallel: {dp: 1}\n"
                             "runtime: {device: cuda}\n";
  const std::string out = (dir / "run.db").string();
  for (const std::string extra : {"", " --device cuda"}) {
    const CommandResult r = run_command("timeout 120 " + std::string(ORRERY_BIN) + " run " +
                                        scenario.string() + extra + " --nproc 1 --out " + out);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("cuda"), std::string::npos) << r.output;
    // `run` hands device cuda to the CUDA runtime (check_supported_cuda), which names the cause.
    EXPECT_NE(r.output.find(no_device_reason()), std::string::npos) << r.output;
    std::printf("  orrery run%s -> exit %d: %s", extra.c_str(), r.status, r.output.c_str());
  }
  std::filesystem::remove(scenario);
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "files were left in " << dir;
  std::filesystem::remove_all(dir);
}

// Pipeline parallelism on device cuda: a pp2 run is refused only for want of a device (not for
// parallel.pp); the interleaved schedule is refused on any machine naming parallel.schedule. Both
// exit 2 before mpirun starts and leave nothing behind.
TEST(CudaCli, PipelineOnDeviceCudaIsRefusedOnlyForTheDeviceOrTheInterleavedSchedule) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("orrery-cuda-cli-pp-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path scenario = dir / "pp2.yaml";
  std::ofstream(scenario) << "name: pp2\n"
                             "model: {layers: 2, d_model: 32, heads: 2, vocab: 64, seq: 16}\n"
                             "training: {steps: 2, global_batch: 4, micro_batch: 2}\n"
                             "parallel: {dp: 1, pp: 2, schedule: 1f1b}\n"
                             "runtime: {device: cuda}\n";
  const std::string run = "timeout 120 " + std::string(ORRERY_BIN) + " run " + scenario.string() +
                          " --nproc 2 --out " + (dir / "run.db").string();
  if (device_count() == 0) {
    const CommandResult r = run_command(run);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_EQ(r.output.find("parallel.pp"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(no_device_reason()), std::string::npos) << r.output;
  }
  const CommandResult r = run_command(run + " --set parallel.schedule=interleaved");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("key 'parallel.schedule': 'interleaved' is not available on device cuda"),
            std::string::npos)
      << r.output;
  std::filesystem::remove(scenario);
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "files were left in " << dir;
  std::filesystem::remove_all(dir);
}

// ZeRO 3 with the parameter shards in the NVMe file on device cuda: refused only for want of a
// device (not for zero.offload_params); what the key still refuses, on any machine and before
// mpirun starts (exit 2, naming the key): offload_params without ZeRO 3, or without
// offload_optimizer nvme.
TEST(CudaCli, OffloadParamsOnDeviceCudaIsRefusedOnlyForTheDeviceOrWithoutZeroThree) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("orrery-cuda-cli-offload-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "nvme");
  const std::filesystem::path scenario = dir / "z3.yaml";
  std::ofstream(scenario) << "name: z3\n"
                             "model: {layers: 2, d_model: 32, heads: 2, vocab: 64, seq: 16}\n"
                             "training: {steps: 2, global_batch: 4, micro_batch: 2}\n"
                             "parallel: {dp: 2, zero: 3}\n"
                             "zero: {offload_optimizer: nvme, offload_params: nvme, nvme_path: " +
                                 (dir / "nvme").string() +
                                 "}\n"
                                 "runtime: {device: cuda}\n";
  const std::string run = "timeout 120 " + std::string(ORRERY_BIN) + " run " + scenario.string() +
                          " --nproc 2 --out " + (dir / "run.db").string();
  if (device_count() == 0) {
    const CommandResult r = run_command(run);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_EQ(r.output.find("zero.offload_params"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(no_device_reason()), std::string::npos) << r.output;
  }
  const CommandResult z2 = run_command(run + " --set parallel.zero=2");
  EXPECT_EQ(z2.status, 2) << z2.output;
  EXPECT_NE(z2.output.find("key 'zero.offload_params': 'nvme' offloads ZeRO 3's parameter shards: "
                           "needs parallel.zero 3 (got 2)"),
            std::string::npos)
      << z2.output;
  const CommandResult host = run_command(run + " --set zero.offload_optimizer=host");
  EXPECT_EQ(host.status, 2) << host.output;
  EXPECT_NE(host.output.find("key 'zero.offload_params': 'nvme' keeps the parameter shards with "
                             "the optimizer state: needs zero.offload_optimizer nvme (got 'host')"),
            std::string::npos)
      << host.output;
  std::filesystem::remove(scenario);
  EXPECT_TRUE(std::filesystem::is_empty(dir / "nvme")) << "files were left in " << dir;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace orrery::runtime::cuda
