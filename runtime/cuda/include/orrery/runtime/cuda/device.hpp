// The CUDA device layer of the GPU backend: finding and selecting a device (with a clear reason when
// there is none, or the driver is too old), checked CUDA calls, and RAII owners of device memory,
// streams and events. Everything else in runtime/cuda/ (kernels, the GPU model and trainer, the
// NCCL communicator, the CUPTI tracer) builds on this header.
//
// Errors: a failing CUDA call throws orrery::InternalError naming the call, the CUDA error name and
// string; for cudaErrorMemoryAllocation the message starts "device memory exhausted:" and gives the
// bytes asked for (when known) and the device's free/total memory. "No device" is the user's
// situation rather than a bug, so select_device() throws orrery::InputError (exit 2) with the reason.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace orrery::runtime::cuda {

// Number of usable CUDA devices; 0 (never throws) when there is no device, no driver, or a driver
// older than this runtime. Clears the sticky CUDA error state it may leave behind.
int device_count();
// Why device_count() is 0, in words, e.g. "no CUDA device: cudaGetDeviceCount returned
// cudaErrorNoDevice (no CUDA-capable device is detected)" or "the NVIDIA driver (CUDA 12.2) is older
// than this CUDA runtime (CUDA 13.0)". "" when a device is present.
std::string no_device_reason();

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  std::size_t total_bytes = 0;     // global memory
  int driver_version = 0;          // cudaDriverGetVersion, e.g. 13000 for CUDA 13.0
  int runtime_version = 0;         // cudaRuntimeGetVersion
};

// The local rank this process has on its node: OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
// SLURM_LOCALID or LOCAL_RANK, in that order; 0 when none is set.
int launcher_local_rank();

// Makes device (local_rank % device_count()) current for the calling thread and describes it.
// Throws InputError with no_device_reason() when there is no device. Several ranks on one node
// share devices round-robin.
DeviceInfo select_device(int local_rank);
// The current device, described.
DeviceInfo describe_device(int index);

// Formats the message cuda_check throws (exposed so the text can be tested without a device).
// `bytes_requested` is 0 when unknown; free/total are the device's memory (0 when unknown).
std::string cuda_error_message(cudaError_t err, const char* what, std::size_t bytes_requested = 0,
                               std::size_t free_bytes = 0, std::size_t total_bytes = 0);
// Throws InternalError(cuda_error_message(...)) when err != cudaSuccess; for
// cudaErrorMemoryAllocation it queries cudaMemGetInfo for the free/total figures.
void cuda_check(cudaError_t err, const char* what, std::size_t bytes_requested = 0);

// RAII device allocation of `count` elements of T, zeroed at allocation.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t count) { resize(count); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~DeviceArray() { release(); }

  // Drops the old contents; the new storage is zero.
  void resize(std::size_t count) {
    release();
    if (count == 0) return;
    const std::size_t bytes = count * sizeof(T);
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes), "cudaMalloc", bytes);
    data_ = static_cast<T*>(p);
    size_ = count;
    zero();
  }
  // Synchronous zeroing (cudaMemset on the legacy stream, then a device sync of that stream).
  void zero() {
    if (data_ == nullptr) return;
    cuda_check(cudaMemset(data_, 0, size_bytes()), "cudaMemset");
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemset");
  }
  // Synchronous copies of the first n elements (n <= size()).
  void copy_from_host(const T* src, std::size_t n) {
    check_n(n);
    if (n == 0) return;
    cuda_check(cudaMemcpy(data_, src, n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy host to device");
  }
  void copy_from_host(const std::vector<T>& src) { copy_from_host(src.data(), src.size()); }
  void copy_to_host(T* dst, std::size_t n) const {
    check_n(n);
    if (n == 0) return;
    cuda_check(cudaMemcpy(dst, data_, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy device to host");
  }
  std::vector<T> to_host() const {
    std::vector<T> out(size_);
    copy_to_host(out.data(), size_);
    return out;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t size_bytes() const { return size_ * sizeof(T); }

 private:
  void check_n(std::size_t n) const;
  void release() noexcept {
    if (data_ != nullptr) cudaFree(data_);  // errors here cannot be reported from a destructor
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// Throws std::out_of_range for a copy past the end (defined out of line to keep <stdexcept> here).
void device_array_range_error(std::size_t n, std::size_t size);
template <class T>
void DeviceArray<T>::check_n(std::size_t n) const {
  if (n > size_) device_array_range_error(n, size_);
}

// A non-blocking CUDA stream (does not synchronise with the legacy default stream).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept;

  cudaStream_t get() const { return s_; }
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

// A CUDA event with timing enabled (for spans) unless `timing` is false (for ordering only).
class Event {
 public:
  explicit Event(bool timing = true);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept;

  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t stream);
  void synchronize() const;
  // Milliseconds from `start` to this event (both recorded and complete).
  float elapsed_ms_since(const Event& start) const;

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace orrery::runtime::cuda

// Checks a CUDA runtime call: ORRERY_CUDA_CHECK(cudaMemcpy(...)) throws with the call's text, file
// and line.
#define ORRERY_CUDA_STR2(x) #x
#define ORRERY_CUDA_STR(x) ORRERY_CUDA_STR2(x)
#define ORRERY_CUDA_CHECK(expr) \
  ::orrery::runtime::cuda::cuda_check((expr), #expr " at " __FILE__ ":" ORRERY_CUDA_STR(__LINE__))
