// The CUDA device layer and the GPU runtime's refusals, WITHOUT needing a device: device_count and
// the no-device reason, the out-of-memory message of cuda_check, select_device / check_supported_cuda
// / run_rank_cuda failing at once with InputError (exit 2 at the CLI) and the reason, and the
// layouts the CUDA runtime refuses. The few checks that need a device are in suites named Gpu*.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <tuple>

#include "orrery/common/error.hpp"
#include "orrery/runtime/cuda/device.hpp"
#include "orrery/runtime/cuda/gpu_run.hpp"
#include "orrery/runtime/cuda/kernels.hpp"

namespace orrery::runtime::cuda {
namespace {

Scenario tiny_cuda_scenario() {
  Scenario s;
  s.name = "cuda-tiny";
  s.model.layers = 2;
  s.model.d_model = 32;
  s.model.heads = 2;
  s.model.vocab = 64;
  s.model.seq = 16;
  s.training.steps = 2;
  s.training.global_batch = 2;
  s.training.micro_batch = 2;
  s.runtime.device = "cuda";
  return s;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CudaDevice, CountAndReasonAgree) {
  const int n = device_count();  // never throws
  EXPECT_GE(n, 0);
  const std::string reason = no_device_reason();
  if (n == 0) {
    EXPECT_FALSE(reason.empty());
    EXPECT_TRUE(contains(reason, "no CUDA device") || contains(reason, "driver")) << reason;
  } else {
    EXPECT_EQ(reason, "");
  }
  EXPECT_EQ(device_count(), n);  // no sticky error left behind
}

TEST(CudaDevice, OutOfMemoryMessageNamesCallBytesAndFreeMemory) {
  const std::size_t gib = std::size_t{1} << 30;
  const std::string msg =
      cuda_error_message(cudaErrorMemoryAllocation, "cudaMalloc", 3 * gib, gib / 2, 80 * gib);
  EXPECT_EQ(msg.rfind("device memory exhausted: ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "cudaMalloc")) << msg;
  EXPECT_TRUE(contains(msg, "3.00 GiB")) << msg;
  EXPECT_TRUE(contains(msg, std::to_string(3 * gib) + " bytes")) << msg;
  EXPECT_TRUE(contains(msg, "cudaErrorMemoryAllocation")) << msg;
  EXPECT_TRUE(contains(msg, "512.00 MiB free of 80.00 GiB")) << msg;
}

TEST(CudaDevice, CudaCheckThrowsForOutOfMemoryWithoutTouchingADevice) {
  EXPECT_NO_THROW(cuda_check(cudaSuccess, "nothing"));
  try {
    cuda_check(cudaErrorMemoryAllocation, "cudaMalloc of the activations", 1000);
    FAIL() << "cuda_check did not throw";
  } catch (const InternalError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("device memory exhausted: cudaMalloc of the activations", 0), 0u) << msg;
    EXPECT_TRUE(contains(msg, "1000 bytes")) << msg;
  }
}

TEST(CudaDevice, OtherErrorsNameTheCall) {
  const std::string msg = cuda_error_message(cudaErrorInvalidValue, "cudaMemcpy(dst, src, n)");
  EXPECT_EQ(msg.rfind("CUDA error: cudaMemcpy(dst, src, n) failed with cudaErrorInvalidValue", 0),
            0u)
      << msg;
  EXPECT_THROW(ORRERY_CUDA_CHECK(cudaErrorInvalidValue), InternalError);
}

TEST(CudaDevice, CublasErrorsNameTheCall) {
  try {
    cublas_check(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx(...)");
    FAIL() << "cublas_check did not throw";
  } catch (const InternalError& e) {
    EXPECT_TRUE(contains(e.what(), "cublasGemmEx(...)")) << e.what();
    EXPECT_TRUE(contains(e.what(), "CUBLAS_STATUS_INVALID_VALUE")) << e.what();
  }
}

TEST(CudaDevice, ParsesMathModesAndCommBackends) {
  RuntimeConfig r;
  for (const auto& [text, mode] :
       {std::pair{"fp32", MathMode::kFp32}, std::pair{"tf32", MathMode::kTf32},
        std::pair{"bf16", MathMode::kBf16}}) {
    r.precision = text;
    EXPECT_EQ(math_mode_of(precision_of(r)), mode) << text;
  }
  r.precision = "fp8";
  EXPECT_THROW(precision_of(r), InputError);
  EXPECT_THROW(math_mode_of(Precision::FP16), InputError);
  EXPECT_EQ(parse_comm_backend("nccl"), CommBackend::kNccl);
  EXPECT_EQ(parse_comm_backend("mpi"), CommBackend::kStaged);
  EXPECT_THROW(parse_comm_backend("gloo"), InputError);
}

TEST(CudaDevice, LauncherLocalRank) {
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  EXPECT_EQ(launcher_local_rank(), 3);
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
}

// What the GPU trainer cannot run (the interleaved pipeline schedule) is refused naming the key,
// before the device check, so on any machine; tp, pp (gpipe, 1f1b), ZeRO 1/2/3 and checkpoints are
// accepted, alone and combined (here: refused only for want of a device).
TEST(CudaRuntime, RefusesInterleavedAcceptsPipelineTensorParallelAndZero) {
  auto refusal = [](const Scenario& s) -> std::string {
    try {
      check_supported_cuda(s);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  // ZeRO 3 shards over the data-parallel group: refused with dp = 1, as on CPUs.
  Scenario s = tiny_cuda_scenario();
  s.parallel.zero = 3;
  std::string e = refusal(s);
  EXPECT_TRUE(contains(e, "key 'parallel.zero'")) << e;
  EXPECT_TRUE(contains(e, "parallel.dp >= 2")) << e;
  // The interleaved schedule: refused naming the schedule and the device.
  s = tiny_cuda_scenario();
  s.parallel.pp = 2;
  s.parallel.schedule = "interleaved";
  s.training.global_batch = 4;  // 2 micro-batches, a multiple of pp
  e = refusal(s);
  EXPECT_TRUE(contains(e, "key 'parallel.schedule'")) << e;
  EXPECT_TRUE(contains(e, "'interleaved' is not available on device cuda")) << e;
  EXPECT_TRUE(contains(e, "expected gpipe or 1f1b")) << e;
  // Checkpoints go through the training loop every backend shares: accepted (without a device,
  // the device is the only reason given).
  s = tiny_cuda_scenario();
  s.checkpoint.every = 2;
  e = refusal(s);
  EXPECT_FALSE(contains(e, "checkpoint")) << e;
  if (device_count() == 0) {
    EXPECT_TRUE(contains(e, "runtime.device")) << e;
  } else {
    EXPECT_EQ(e, "");
  }
  // Accepted layouts: no complaint about their keys; without a device, the device is the reason.
  struct Case {
    int dp, tp, pp, zero;
    const char* schedule;
  };
  for (const Case& c :
       {Case{1, 2, 1, 0, "1f1b"}, Case{2, 1, 1, 1, "1f1b"}, Case{2, 1, 1, 2, "1f1b"},
        Case{2, 2, 1, 1, "1f1b"}, Case{1, 1, 2, 0, "gpipe"}, Case{1, 1, 2, 0, "1f1b"},
        Case{2, 1, 2, 1, "1f1b"}, Case{2, 1, 2, 2, "gpipe"}, Case{1, 2, 2, 0, "1f1b"},
        Case{2, 2, 2, 2, "1f1b"}, Case{2, 1, 1, 3, "1f1b"}, Case{2, 2, 1, 3, "1f1b"},
        Case{2, 1, 2, 3, "gpipe"}, Case{2, 2, 2, 3, "1f1b"}}) {
    s = tiny_cuda_scenario();
    s.parallel.dp = c.dp;
    s.parallel.tp = c.tp;
    s.parallel.pp = c.pp;
    s.parallel.zero = c.zero;
    s.parallel.schedule = c.schedule;
    s.training.global_batch = 4;
    e = refusal(s);
    EXPECT_FALSE(contains(e, "parallel.")) << "dp " << c.dp << " tp " << c.tp << " pp " << c.pp
                                           << " zero " << c.zero << " " << c.schedule << ": " << e;
    if (device_count() == 0) {
      EXPECT_TRUE(contains(e, "runtime.device")) << e;
    } else {
      EXPECT_EQ(e, "");
    }
  }
}

TEST(CudaRuntime, NoDeviceFailsAtOnceWithTheReason) {
  if (device_count() > 0)
    GTEST_SKIP() << "a CUDA device is present: the no-device path cannot be checked";
  const std::string reason = no_device_reason();
  try {
    select_device(0);
    FAIL() << "select_device did not throw";
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), reason)) << e.what();
  }
  const Scenario s = tiny_cuda_scenario();
  try {
    check_supported_cuda(s);
    FAIL() << "check_supported_cuda did not throw";
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), "runtime.device")) << e.what();
    EXPECT_TRUE(contains(e.what(), reason)) << e.what();
  }
  // The library entry of `orrery run --device cuda`: InputError before any file is written.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("orrery-cuda-nodev-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto world = make_local_communicator();
  RankRunOptions opt;
  opt.out = (dir / "run.db").string();
  try {
    run_rank_cuda(s, *world, opt);
    FAIL() << "run_rank_cuda did not throw";
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), reason)) << e.what();
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "files were left in " << dir;
  std::filesystem::remove_all(dir);
}

// With a device: selection describes it, and a request far beyond its memory fails with the
// "device memory exhausted" message (no crash, the process goes on).
TEST(GpuDevice, SelectsAndReportsOutOfMemory) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  const DeviceInfo d = select_device(0);
  EXPECT_GT(d.total_bytes, 0u);
  EXPECT_FALSE(d.name.empty());
  try {
    DeviceArray<float> huge(d.total_bytes);  // 4x the device's memory
    FAIL() << "allocating 4x the device memory succeeded";
  } catch (const InternalError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("device memory exhausted: ", 0), 0u) << e.what();
    EXPECT_TRUE(contains(e.what(), "free of")) << e.what();
  }
  DeviceArray<int> small(10);
  std::vector<int> host(10, 7);
  small.copy_from_host(host);
  EXPECT_EQ(small.to_host(), host);
}

}  // namespace
}  // namespace orrery::runtime::cuda
