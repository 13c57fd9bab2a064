// Device discovery and selection, checked CUDA calls and the RAII wrappers of device.hpp.
#include "orrery/runtime/cuda/device.hpp"

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/common/format.hpp"

namespace orrery::runtime::cuda {
namespace {

std::string version_text(int v) {
  // CUDA encodes 13.0 as 13000, 12.2 as 12020.
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string error_text(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
}

}  // namespace

int device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // leave no error behind for the next call to pick up
    return 0;
  }
  return n;
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  if (err == cudaSuccess && n > 0) return "";
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaGetLastError();
  if (err == cudaSuccess) return "no CUDA device: cudaGetDeviceCount found 0 devices";
  if (driver == 0)
    return "no CUDA device: no NVIDIA driver is installed (libcuda.so not found); cudaGetDeviceCount "
           "returned " + error_text(err);
  if (err == cudaErrorInsufficientDriver || driver < runtime)
    return "the NVIDIA driver (CUDA " + version_text(driver) + ") is older than this CUDA runtime (CUDA " +
           version_text(runtime) + "): update the driver; cudaGetDeviceCount returned " + error_text(err);
  return "no CUDA device: cudaGetDeviceCount returned " + error_text(err);
}

int launcher_local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (end != v && *end == '\0' && r >= 0) return static_cast<int>(r);
    }
  }
  return 0;
}

DeviceInfo describe_device(int index) {
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
  DeviceInfo d;
  d.index = index;
  d.name = prop.name;
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  d.total_bytes = prop.totalGlobalMem;
  cuda_check(cudaDriverGetVersion(&d.driver_version), "cudaDriverGetVersion");
  cuda_check(cudaRuntimeGetVersion(&d.runtime_version), "cudaRuntimeGetVersion");
  return d;
}

DeviceInfo select_device(int local_rank) {
  const int n = device_count();
  if (n == 0) throw InputError("device cuda: " + no_device_reason());
  if (local_rank < 0) local_rank = 0;
  const int index = local_rank % n;
  cuda_check(cudaSetDevice(index), "cudaSetDevice");
  DeviceInfo d = describe_device(index);
  // The kernels are compiled for sm_80 and sm_90 (and PTX of the newest); older parts cannot run them.
  if (d.cc_major < 8)
    throw InputError("device cuda: " + d.name + " has compute capability " + std::to_string(d.cc_major) + "." +
                     std::to_string(d.cc_minor) + "; the CUDA backend needs 8.0 or newer (Ampere, Hopper)");
  return d;
}

std::string cuda_error_message(cudaError_t err, const char* what, std::size_t bytes_requested,
                               std::size_t free_bytes, std::size_t total_bytes) {
  std::string msg;
  if (err == cudaErrorMemoryAllocation) {
    msg = "device memory exhausted: ";
    msg += what;
    if (bytes_requested > 0)
      msg += " asked for " + format_bytes(static_cast<double>(bytes_requested)) + " (" +
             std::to_string(bytes_requested) + " bytes)";
    msg += " failed with " + error_text(err);
    if (total_bytes > 0)
      msg += "; the device has " + format_bytes(static_cast<double>(free_bytes)) + " free of " +
             format_bytes(static_cast<double>(total_bytes));
    msg += "; use a smaller model, micro_batch or seq_len";
    return msg;
  }
  msg = "CUDA error: ";
  msg += what;
  msg += " failed with " + error_text(err);
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) msg += " (" + no_device_reason() + ")";
  return msg;
}

void cuda_check(cudaError_t err, const char* what, std::size_t bytes_requested) {
  if (err == cudaSuccess) return;
  std::size_t free_b = 0, total_b = 0;
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // an allocation failure is not sticky; clear it before asking
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      free_b = total_b = 0;
      (void)cudaGetLastError();
    }
  }
  throw InternalError(cuda_error_message(err, what, bytes_requested, free_b, total_b));
}

void device_array_range_error(std::size_t n, std::size_t size) {
  throw std::out_of_range("DeviceArray copy of " + std::to_string(n) + " elements, the array holds " +
                          std::to_string(size));
}

// --- Stream

Stream::Stream() { cuda_check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
Stream::~Stream() {
  if (s_ != nullptr) cudaStreamDestroy(s_);
}
Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_ != nullptr) cudaStreamDestroy(s_);
    s_ = std::exchange(o.s_, nullptr);
  }
  return *this;
}
void Stream::synchronize() const { cuda_check(cudaStreamSynchronize(s_), "cudaStreamSynchronize"); }

// --- Event

Event::Event(bool timing) {
  cuda_check(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming),
             "cudaEventCreateWithFlags");
}
Event::~Event() {
  if (e_ != nullptr) cudaEventDestroy(e_);
}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_ != nullptr) cudaEventDestroy(e_);
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}
void Event::record(cudaStream_t stream) { cuda_check(cudaEventRecord(e_, stream), "cudaEventRecord"); }
void Event::synchronize() const { cuda_check(cudaEventSynchronize(e_), "cudaEventSynchronize"); }
float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  cuda_check(cudaEventElapsedTime(&ms, start.e_, e_), "cudaEventElapsedTime");
  return ms;
}

}  // namespace orrery::runtime::cuda
