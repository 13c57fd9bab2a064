// The training loop of one rank on one CUDA device: data parallelism (DDP or ZeRO 1/2/3), tensor
// and pipeline parallelism, the same spans in the same order as the CPU trainer
// (runtime/trainer.hpp):
//
//   compute stream (0)                                   comm / nccl stream
//   Phase "step"
//     Compute "zero_grad" (the gradients, and ZeRO's shard accumulator, set to 0)
//     for mb: Data "data" (host loader), Phase "forward" (fwd.embed, fwd.block 0..L-1, fwd.head),
//             Phase "backward" (bwd.head, bwd.block L-1..0, bwd.embed)   "ddp.all_reduce" buckets
//             (pp > 1: the passes in pipeline_order)                      "pp.*" P2P
//     Phase "optimizer" > Optimizer "adamw"                               "pp.embed_all_reduce",
//                                                                          "pp.loss" (pp > 1)
//
// Times on the compute stream are the GPU's: each span's begin and end are CUDA events recorded on
// the compute stream when the host reaches them, resolved after the step (when the stream is done)
// onto the recorder's steady clock through a reference event recorded at the start of each step on
// the idle stream (offset measured once per step, so clock drift never accumulates). Only "data"
// is a host span (the loader runs on the CPU). Kernel-level spans come from the CUPTI tracer.
//
// Gradients: DDP buckets are the CPU trainer's (make_ddp_buckets on the same layout), all-reduced
// (Avg) in place in the flat device gradient array as their last segment completes, over a device
// communicator: NCCL (one GPU per rank) or host-staged MPI (several ranks per GPU, or no NCCL).
//
// ZeRO 1/2 (runtime/zero.hpp, the CPU trainer's scheme on device buffers): the same ZeroPartition
// of the flat array over the dp group (padded to N*k, gpt_pad_storage before the model moves to
// the device); no "ddp.all_reduce"; instead, inside Phase "backward" after the backward pass,
// "zero.reduce_scatter" (Avg) of the whole gradient array into the owned shard: once per step
// (after the last micro-batch) for zero 1, after every micro-batch for zero 2 (into a shard-sized
// receive buffer, added to the shard gradient, the full array then zeroed for the next backward).
// Phase "optimizer": Optimizer "adamw" on the owned shard only (moments of k elements), then
// "zero.all_gather" (in place) of the parameters. Memory counters as the CPU trainer's.
//
// Tensor parallelism (runtime/tensor_parallel.hpp, cuda/model.hpp): each rank holds the CPU
// model's tp shard (same host layout, so the same initial values); the model's four sums per block
// are "tp.all_reduce" (Sum, layer l, the micro-batch) on a device communicator of the tp group
// (NCCL or staged, chosen as for dp), between the three pieces of each block's span. The groups
// are split from the world in the CPU trainer's order (dp, tp, pp, then the embedding group), so a
// rank's groups and the trace's communicators are the CPU run's.
//
// Pipeline parallelism (runtime/pipeline.hpp, the CPU trainer's scheme): each rank holds the CPU
// trainer's stage shard (GptShard::pipeline_stage with its tp slice; same host layout, so the same
// initial values) and runs the step's forward and backward passes in pipeline_order(schedule)
// (gpipe or 1f1b) order, with one GpuActivations per micro-batch in flight (pipeline_in_flight).
// A stage without the embedding receives "pp.recv_act" into stage_input() before its forward (the
// compute stream waits for it), one without the head sends stage_output() ("pp.send_act") after it;
// backward "pp.recv_grad" into the scratch's dres before, "pp.send_grad" after (from a per-slot
// device buffer, so the next backward may reuse the scratch); P2P, layer -1, on a device
// communicator of the pp group. With NCCL under 1F1B the pp and embedding groups are host-staged
// over MPI (comm_backend() "nccl+staged-pp"): NCCL runs a process's operations in order on one
// stream and 1F1B's crossing sends and receives would wait for each other there (trainer.cpp
// says how); GPipe's do not cross and stay on NCCL. A slot's previous send is waited for before
// its buffer is written.
// Only the first and last stage load data. The tied wte gradient is summed over the first and
// last stage ("pp.embed_all_reduce", Sum, a device communicator of the embedding group) after the
// DDP all-reduce, or under ZeRO before each reduce-scatter. At the end of the step (after the
// optimizer phase) the last stage broadcasts the step's loss over the host pp group ("pp.loss",
// 4 bytes), so every rank reports it. Memory counters add every activation set and the gradient
// send buffers (comm_buffers), as the CPU trainer's.
//
// ZeRO 3 (runtime/zero.hpp's scheme, cuda/zero3.hpp's device storage), alone or with tp and pp: a
// rank holds only its shard of each segment's parameters, gradients and AdamW moments on the
// device. As on the CPU: the embedding and final LayerNorm are gathered once per step
// ("zero.fetch_layer", layer -1 and L, micro-batch -1); a block is gathered before its forward and
// again before its backward, the next block's gather issued before this one's kernels (its buffer's
// previous kernels are already queued, and the communicator's stream waits for them); each
// segment's gradient is reduce-scattered (Avg) from its working buffer as soon as its backward is
// queued, every micro-batch, into a shard-sized receive buffer added to the shard gradients after
// the backward (after the pipeline send); the tied wte's gradient is summed over the embedding
// group before the embedding's reduce-scatter. No "ddp.all_reduce", no parameter broadcast (every
// rank makes the same model from the seed and keeps its shard), no "zero.all_gather": AdamW updates
// each segment's shard in place. Memory counters as the CPU trainer's. ZeRO 3 needs dp >= 2
// (runtime::check_supported, as on CPUs).
//
// Not on GPUs in this version: the interleaved pipeline schedule (refused on CPUs too).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/cuda/device.hpp"
#include "orrery/runtime/cuda/kernels.hpp"
#include "orrery/runtime/cuda/model.hpp"
#include "orrery/runtime/cuda/zero3.hpp"
#include "orrery/runtime/ddp.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/runtime/zero.hpp"
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
CommBackend parse_comm_backend(const std::string& text, const std::string& key = "parallel.comm_backend");

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

class GpuTrainer {
 public:
  // Selects this process's device (launcher local rank), then builds everything on it. `world`
  // must have s.world_size() ranks; `rec` may be nullptr. Throws InputError for unsupported input.
  GpuTrainer(const Scenario& s, Communicator& world, profiler::Recorder* rec, const CudaRunOptions& opt = {});
  ~GpuTrainer();
  GpuTrainer(const GpuTrainer&) = delete;
  GpuTrainer& operator=(const GpuTrainer&) = delete;

  // Broadcasts rank 0's parameters over the dp group (device) and lines the ranks up (host barrier).
  void prepare();
  StepResult step();
  int32_t steps_done() const { return step_; }
  // Waits for the device and the device communicator and detaches the recorder from the latter, so
  // every span is in the recorder before the trace is closed. Training may not continue after it.
  void finish();

  const Layout& layout() const { return layout_; }
  const DeviceInfo& device() const { return device_; }
  const CudaRunOptions& options() const { return opt_; }
  // "nccl", "nccl+staged-pp" (NCCL, the pipeline's groups staged: 1F1B), "staged" or "none"
  // (dp = tp = pp = 1: no device communicator).
  const std::string& comm_backend() const { return comm_name_; }
  GpuGpt& model() { return *model_; }
  Communicator& dp_group() { return *dp_; }  // host communicator of the dp group
  Communicator& tp_group() { return *tp_; }  // host communicator of the tp group
  Communicator& pp_group() { return *pp_; }  // host communicator of the pp group
  // The ZeRO partition of the flat array over dp (ranks 1 without ZeRO), as the CPU trainer's.
  const ZeroPartition& zero() const { return zero_; }
  // ZeRO 3's device storage (null unless parallel.zero = 3).
  GpuZero3Storage* zero3() { return z3_.get(); }
  // Elements of this rank's flat array (its (tp, pp) shard of the model), without ZeRO padding.
  std::size_t flat_elems() const;
  const std::vector<DdpBucket>& buckets() const { return buckets_; }
  int micro_batches() const { return micro_batches_; }
  cudaStream_t compute_stream() const { return stream_->get(); }
  Trainer::MemoryBytes memory() const;
  // The device parameters in the model's flat layout, without ZeRO padding (synchronous copy).
  // Under ZeRO 3 a collective of the dp group (each segment all-gathered): every dp rank calls it.
  std::vector<float> parameters();

 private:
  class Ddp;
  class Observer;
  void record_memory();
  std::unique_ptr<Communicator> make_device_comm(Communicator& host, CommBackend backend);
  void reduce_gradients_zero(int32_t step, int32_t mb);
  void embed_all_reduce();
  std::size_t begin_pass(int mb);
  void forward_pass(int mb, const GptHooks& hooks, double& loss_sum);
  void backward_pass(int mb, const GptHooks& hooks, float loss_scale);
  // ZeRO 1/2 over dp > 1 (ZeRO 3 has its own path).
  bool zero12() const { return !z3_ && zero_.ranks > 1; }
  // ZeRO 3 (cuda/zero3.hpp), the CPU trainer's z3_* on device buffers.
  void z3_gather(int segment, int slot, int mb);
  void z3_bind_block(int layer, int next_layer, int mb);
  void z3_reduce_scatter(int segment, int slot, int mb);
  float z3_forward(GpuActivations& acts, const GptHooks& hooks);
  void z3_backward(GpuActivations& acts, int mb, const GptHooks& hooks, float loss_scale);
  void z3_finish_backward(int mb);

  Scenario s_;
  Communicator& world_;
  profiler::Recorder* rec_;
  CudaRunOptions opt_;
  Layout layout_;
  DeviceInfo device_;
  // Declared before everything that queues work on it: destroyed last.
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<Communicator> dp_;      // host
  std::unique_ptr<Communicator> dp_dev_;  // device buffers; null when dp = 1
  std::unique_ptr<Communicator> tp_;      // host
  std::unique_ptr<Communicator> tp_dev_;  // device buffers; null when tp = 1
  std::unique_ptr<Communicator> pp_;      // host (the loss broadcast)
  std::unique_ptr<Communicator> pp_dev_;  // device buffers (activations); null when pp = 1
  std::unique_ptr<Communicator> embed_;        // host: first and last stage (pp > 1)
  std::unique_ptr<Communicator> embed_dev_;  // device buffers; null unless first or last of pp > 1
  std::string comm_name_ = "none";
  bool pipeline_staged_ = false;  // NCCL, but the pp and embedding groups staged (1F1B)
  std::unique_ptr<GpuGpt> model_;
  std::vector<DdpBucket> buckets_;
  std::unique_ptr<Ddp> ddp_;
  std::unique_ptr<TokenSource> source_;
  std::unique_ptr<DataLoader> loader_;
  std::vector<std::unique_ptr<GpuActivations>> acts_;  // one per micro-batch in flight (mb % size)
  std::vector<DeviceArray<float>> grad_send_;          // pipeline: gradient sent back, one per slot
  std::vector<Handle> act_send_h_, grad_send_h_;
  std::unique_ptr<GpuGradScratch> scratch_;
  DeviceArray<float> adam_m_, adam_v_;  // (num_params), (k) the owned shard under ZeRO 1/2, the
                                        // shard arrays' size under ZeRO 3
  ZeroPartition zero_;
  DeviceArray<float> zero_grads_;  // (k) ZeRO: the owned shard of the averaged gradients
  DeviceArray<float> zero_recv_;   // (k) ZeRO 2: one micro-batch's scattered shard
  std::unique_ptr<GpuZero3Storage> z3_;  // ZeRO 3 only
  DeviceArray<float> z3_recv_;           // ZeRO 3: one micro-batch's scattered shards
  Handle z3_gather_h_[4], z3_rs_h_[4];   // by working buffer
  int z3_gathered_[4] = {-99, -99, -99, -99};  // the segment each parameter buffer holds
  std::vector<ParamRange> decay_;
  AdamWConfig adamw_;
  int64_t adam_steps_ = 0;
  std::unique_ptr<EventSpans> spans_;
  std::unique_ptr<Observer> observer_;
  Batch batch_;
  int micro_batches_ = 1;
  int32_t step_ = 0;
  int32_t cur_mb_ = -1;  // the micro-batch in flight (tp.all_reduce labels)
};

}  // namespace orrery::runtime::cuda
