// The CUDA backend of the training loop (runtime/training_loop.hpp says what a backend provides):
// one device per process (the launcher's local rank), device arrays, the CUDA kernels queued on
// one compute stream, device communicators of the host groups (NCCL or host-staged MPI) and spans
// timed by CUDA events on the compute stream.
//
// Span times: each span's begin and end are CUDA events recorded on the compute stream when the
// host reaches them, resolved after the step (when the stream is done) onto the recorder's steady
// clock through a reference event recorded at the start of each step on the idle stream (offset
// measured once per step, so clock drift never accumulates). Only "data" is a host span (the
// loader runs on the CPU). Kernel-level spans come from the CUPTI tracer
// (start_device_tracing). Each span opened here also opens an NVTX range named after it.
//
// Communicators: NCCL when the build has it and this node has a GPU per local rank (NCCL refuses
// two ranks on one device), else staged through host memory over the host group. With NCCL under
// 1F1B the pp and embedding groups are host-staged (comm_backend() "nccl+staged-pp"; backend.cpp
// says why); GPipe's stay on NCCL. The groups' device communicators are created in the same order
// on every rank (NCCL's bootstrap is a collective of each group).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/cuda/device.hpp"
#include "orrery/runtime/cuda/host_offload.hpp"
#include "orrery/runtime/cuda/kernels.hpp"
#include "orrery/runtime/cuda/model.hpp"
#include "orrery/runtime/cuda/zero3.hpp"
#include "orrery/runtime/groups.hpp"
#include "orrery/runtime/optimizer.hpp"
#include "orrery/traces/span.hpp"

namespace orrery::profiler {
class Recorder;
}

namespace orrery::runtime::cuda {

enum class CommBackend {
  kAuto,    // NCCL when built with it and this node has a GPU per local rank, else staged
  kNccl,    // make_nccl_communicator (InputError when the build has no NCCL)
  kStaged,  // make_staged_communicator over the host (MPI) communicator
};
// "auto" | "nccl" | "mpi" (staged through host memory); InputError naming `key` otherwise.
CommBackend parse_comm_backend(const std::string& text,
                               const std::string& key = "parallel.comm_backend");

struct CudaRunOptions {
  MathMode math = MathMode::kFp32;  // matrix products: fp32 | tf32 | bf16 (fp32 master weights)
  CommBackend comm = CommBackend::kAuto;
};

// Throws InputError, before any rank starts work, for what the CUDA runtime cannot run: a pipeline
// schedule other than gpipe and 1f1b (message names parallel.schedule and device cuda), everything
// runtime::check_supported refuses, and last no usable device (the message names runtime.device and
// carries no_device_reason()). So a scenario the GPU cannot run is refused for that reason on any
// machine, with or without a device.
void check_supported_cuda(const Scenario& s);

// Spans timed by CUDA events on one stream (see the top of this file).
class EventSpans {
 public:
  EventSpans(profiler::Recorder* rec, cudaStream_t stream, int32_t trace_stream);
  ~EventSpans();
  EventSpans(const EventSpans&) = delete;
  EventSpans& operator=(const EventSpans&) = delete;

  // Waits for the stream, records the reference event and reads the steady clock around it.
  void anchor();
  // Records the begin event of a span with `proto`'s kind, name and attributes; returns its handle.
  // `annotation` (a name, or null) also opens an NVTX range and the profiler's range hooks
  // (range_hooks.hpp: the CUPTI tracer tags the kernels launched inside with step and micro-batch);
  // spans opened with one must be closed in reverse order.
  int open(const traces::Span& proto, const char* annotation = nullptr);
  // Records the end event of span `handle`.
  void close(int handle);
  // Waits for the stream, hands every span to the recorder in host-clock ns, forgets them.
  void resolve();

 private:
  cudaEvent_t next_event();
  struct Pending {
    traces::Span span;
    cudaEvent_t begin = nullptr, end = nullptr;
    bool annotated = false;
  };
  profiler::Recorder* rec_;
  cudaStream_t stream_;
  int32_t trace_stream_;
  std::vector<cudaEvent_t> pool_;
  std::size_t used_ = 0;
  std::vector<Pending> pending_;
  cudaEvent_t ref_ = nullptr;
  int64_t ref_host_ns_ = 0;
};

class CudaBackend {
 public:
  using Options = CudaRunOptions;
  using Array = DeviceArray<float>;
  using Model = GpuGpt;
  using Activations = GpuActivations;
  using Scratch = GpuGradScratch;
  using Zero3 = GpuZero3Storage;
  static constexpr bool kHostMemory = false;

  static void check_supported(const Scenario& s) { check_supported_cuda(s); }
  // Selects this process's device (launcher local rank) and makes the compute stream on it.
  CudaBackend(const Scenario& s, profiler::Recorder* rec, const Options& opt);
  ~CudaBackend();
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  DeviceGroups connect(const RankGroups& groups, const Layout& layout);
  // The model (and ZeRO 3's shards) on the device, their uploads complete.
  Model make_model(Gpt host, bool storage);
  std::unique_ptr<Zero3> make_zero3(Model& m, int dp_rank, int dp_size, int ep);
  Activations activations(const Model& m, int B, int T, Recompute rc) {
    return gpu_activations(m, B, T, rc);
  }
  Scratch scratch(const Model& m, int B, int T, Recompute rc) {
    return gpu_grad_scratch(m, B, T, rc);
  }

  const CudaKernels& kernels() const { return kernels_; }
  void zero(float* p, std::size_t n) { kernels_.zero(p, n); }
  void add(float* acc, const float* in, std::size_t n);
  void scale(float* p, float s, std::size_t n);
  void copy(float* dst, const float* src, std::size_t n);
  void adamw(float* params, const float* grads, float* m, float* v, std::size_t offset,
             std::size_t n, std::span<const ParamRange> decay, int64_t step,
             const AdamWConfig& cfg);
  // Synchronous copies between the host and device memory, after everything queued before them.
  void download(float* host, const float* src, std::size_t n);
  void upload(float* dst, const float* host, std::size_t n);
  // Waits for everything queued on the compute stream (and so for every communicator operation a
  // Handle::wait ordered it after).
  void synchronize();
  double scratch_bytes() const { return static_cast<double>(ctx_->scratch_bytes()); }
  // ZeRO-Offload (zero.offload_optimizer host or nvme): made once by the training loop for its
  // optimizer range (host_offload.hpp's arguments); null until then.
  HostOffload* make_host_offload(std::size_t elems, bool moments, std::size_t chunk, bool master) {
    offload_ = std::make_unique<HostOffload>(elems, moments, chunk, master, stream_->get(), rec_);
    return offload_.get();
  }
  HostOffload* host_offload() const { return offload_.get(); }
  // ZeRO 3 with zero.offload_params: the shards' staging for their gathers (host_offload.hpp),
  // made once by the training loop; null until then.
  CudaShardStaging* make_shard_staging(int slots, std::size_t elems) {
    shards_ = std::make_unique<CudaShardStaging>(slots, elems, stream_->get(), rec_);
    return shards_.get();
  }
  CudaShardStaging* shard_staging() const { return shards_.get(); }

  void begin_step() {
    spans_->anchor();
    if (shards_) shards_->anchor();
  }
  int open(const traces::Span& proto, const char* annotation) {
    return spans_->open(proto, annotation);
  }
  void close(int handle) { spans_->close(handle); }
  // Resolves the step's spans (waits for the stream) and surfaces any asynchronous CUDA error.
  void end_step();

  // Waits for the device and the device communicators and detaches the recorder from the latter.
  void finish();
  // The same without throwing (the training loop's destructor, before its buffers go).
  void drain() noexcept;
  std::string device_description() const;
  double peak_flops_per_rank() const;
  nlohmann::json meta_fields() const;
  // CUPTI kernel tracing (gpu_run.cpp); a CUPTI that refuses costs the kernel spans only: the run
  // goes on and says why on stderr.
  void start_device_tracing(profiler::Recorder& rec);
  void stop_device_tracing();

  const DeviceInfo& device() const { return device_; }
  const Options& options() const { return opt_; }
  // "nccl", "nccl+staged-pp" (NCCL, the pipeline's groups staged: 1F1B), "staged" or "none"
  // (dp = tp = pp = 1: no device communicator).
  const std::string& comm_backend() const { return comm_name_; }
  cudaStream_t stream() const { return stream_->get(); }

 private:
  struct Tracer;
  std::unique_ptr<Communicator> make_device_comm(Communicator& host, CommBackend backend);

  Options opt_;
  profiler::Recorder* rec_;
  double watchdog_s_ = 300.0;
  Schedule schedule_ = Schedule::GPipe;
  std::string origin_;
  DeviceInfo device_;
  // Declared before everything that queues work on it: destroyed last.
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Context> ctx_;
  CudaKernels kernels_;
  std::unique_ptr<EventSpans> spans_;
  std::unique_ptr<HostOffload> offload_;      // before the stream goes: its copies wait on it
  std::unique_ptr<CudaShardStaging> shards_;  // as offload_
  // Device buffers; null when not needed. ep_ and edp_: expert parallelism (MoE, parallel.ep > 1).
  std::unique_ptr<Communicator> dp_, tp_, pp_, embed_, ep_, edp_;
  std::string comm_name_ = "none";
  std::unique_ptr<Tracer> tracer_;
};

}  // namespace orrery::runtime::cuda
