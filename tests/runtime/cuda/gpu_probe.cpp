// gpu_probe: what scripts/gpu-check's probe stage asks of a GPU machine before it spends its time
// there (not a test). Prints one `key: value` line per finding, in this order: the driver's and the
// runtime's CUDA versions, the devices (name, compute capability, memory, compute mode), the
// versions of cuBLAS, NCCL and CUPTI, the files of the CUDA libraries this process loaded (read
// from /proc/self/maps), a cuBLAS handle, and whether CUPTI activity tracing starts and records a
// kernel launched under it (through the project's own tracer). The last line is `probe: ok` or
// `probe: FAILED - <reason>`.
// Exit status: 0 all found; 3 no usable device (the reason printed); 4 a device, but cuBLAS or
// CUPTI tracing failed; 5 the device's compute mode keeps ranks from sharing it (one-process
// checks can still run).
//   usage: gpu_probe
#include <cublas_v2.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#if defined(ORRERY_HAVE_NCCL)
#include <nccl.h>
#endif
#if defined(ORRERY_HAVE_CUPTI_TRACER)
#include <cupti.h>

#include "orrery/profiler/cupti_tracer.hpp"
#include "orrery/traces/store.hpp"
#endif

#include "comm_test_kernels.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/cuda/device.hpp"

using namespace orrery;
using namespace orrery::runtime::cuda;

namespace {

std::string cuda_version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

const char* compute_mode_name(int mode) {
  switch (mode) {
    case cudaComputeModeDefault:
      return "Default";
    case cudaComputeModeExclusive:
      return "Exclusive_Thread";
    case cudaComputeModeProhibited:
      return "Prohibited";
    case cudaComputeModeExclusiveProcess:
      return "Exclusive_Process";
    default:
      return "unknown";
  }
}

// The files of the loaded libraries whose names start with one of `prefixes`.
void print_loaded_libraries() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> seen;
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string base = path.substr(path.rfind('/') + 1);
    for (const char* p :
         {"libcuda.so", "libcudart", "libcublas", "libcublasLt", "libnccl", "libcupti"}) {
      if (base.rfind(p, 0) == 0 && seen.insert(path).second) {
        std::printf("loaded: %s\n", path.c_str());
        break;
      }
    }
  }
}

int fail(int code, const std::string& why) {
  std::printf("probe: FAILED - %s\n", why.c_str());
  std::fflush(stdout);
  return code;
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaGetLastError();
  std::printf("cuda driver: %s (%d)\n", driver > 0 ? cuda_version_text(driver).c_str() : "none",
              driver);
  std::printf("cuda runtime: %s (%d)\n", cuda_version_text(runtime).c_str(), runtime);
  int cublas_version = 0;
  if (cublasGetProperty(MAJOR_VERSION, &cublas_version) == CUBLAS_STATUS_SUCCESS) {
    int minor = 0, patch = 0;
    (void)cublasGetProperty(MINOR_VERSION, &minor);
    (void)cublasGetProperty(PATCH_LEVEL, &patch);
    std::printf("cublas: %d.%d.%d\n", cublas_version, minor, patch);
  }
#if defined(ORRERY_HAVE_NCCL)
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess)
    std::printf("nccl: %d (%s)\n", nccl, ncclGetErrorString(ncclSuccess));
#else
  std::printf("nccl: not built in\n");
#endif
#if defined(ORRERY_HAVE_CUPTI_TRACER)
  uint32_t cupti_api = 0;
  if (cuptiGetVersion(&cupti_api) == CUPTI_SUCCESS) std::printf("cupti api: %u\n", cupti_api);
#else
  std::printf("cupti: not built in\n");
#endif
  print_loaded_libraries();

  const int n = device_count();
  std::printf("devices: %d\n", n);
  if (n == 0) return fail(3, "no GPU: " + no_device_reason());
  bool shared_ok = true;
  for (int i = 0; i < n; ++i) {
    int mode = -1;
    (void)cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, i);
    (void)cudaGetLastError();
    const DeviceInfo d = describe_device(i);
    std::printf("device %d: %s, compute capability %d.%d, %.1f GiB, compute mode %s\n", i,
                d.name.c_str(), d.cc_major, d.cc_minor,
                static_cast<double>(d.total_bytes) / (1024.0 * 1024.0 * 1024.0),
                compute_mode_name(mode));
    if (mode == cudaComputeModeProhibited)
      return fail(3, "no GPU: device " + std::to_string(i) + " is in Prohibited compute mode");
    if (mode != cudaComputeModeDefault) shared_ok = false;
  }

  try {
    select_device(0);
    cublasHandle_t h = nullptr;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
      return fail(4, "cublasCreate failed on device 0");
    cublasDestroy(h);
    std::printf("cublas handle: ok\n");
#if defined(ORRERY_HAVE_CUPTI_TRACER)
    const std::string path = "/tmp/orrery_gpu_probe_" + std::to_string(::getpid()) + ".db";
    int64_t spans = 0;
    {
      traces::TraceWriter writer(path);
      profiler::Recorder rec(&writer, 0);
      DeviceArray<float> dev(256);
      Stream stream;
      {
        auto tracer = profiler::CuptiTracer::start(rec);
        for (int i = 0; i < 4; ++i) test::launch_scale(dev.data(), dev.size(), 1.0f, stream.get());
        stream.synchronize();
        tracer->flush();
        spans = tracer->spans_recorded();
        std::printf("cupti clock offset uncertainty: %lld ns\n",
                    static_cast<long long>(tracer->clock_offset_uncertainty_ns()));
      }
      rec.flush();
      writer.close();
    }
    std::remove(path.c_str());
    std::printf("cupti tracing: started, %lld spans from 4 kernels\n",
                static_cast<long long>(spans));
    if (spans < 4)
      return fail(4,
                  "CUPTI tracing started but recorded " + std::to_string(spans) + " of 4 kernels");
#endif
  } catch (const std::exception& e) {
    return fail(4, e.what());
  }
  if (!shared_ok)
    return fail(
        5,
        "the compute mode is not Default: ranks sharing a GPU cannot run (one-process checks can)");
  std::printf("probe: ok\n");
  return 0;
}
