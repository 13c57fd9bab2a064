// The training loop of one rank, written once for every backend: data, forward, backward with
// DDP's overlapped gradient all-reduce or ZeRO 1/2/3, tensor and pipeline parallelism, AdamW,
// every piece recorded as spans and memory as counters, checkpoint state and resume.
// TrainingLoop<CpuBackend> is the CPU Trainer (trainer.hpp), TrainingLoop<cuda::CudaBackend> the
// GpuTrainer (cuda/trainer.hpp); the definitions are in training_loop_impl.hpp, instantiated by
// each backend's trainer.cpp.
//
// What one step records (the simulator reproduces these names in this order; M = micro-batches per
// step = global_batch / (dp * micro_batch), L = model.layers, K = DDP buckets):
//
//   compute stream (0)                                   comm stream (1)
//   Phase "step"                       step s
//     Compute "zero_grad"                (the gradients, and ZeRO's shard accumulators, set to 0)
//     for mb in 0..M-1:
//       Data "data"                    mb                (the loader filling the micro-batch; a
//                                                         host span on every device)
//       Phase "forward"                mb
//         Compute "fwd.embed"  layer -1
//         Compute "fwd.block"  layer 0 .. L-1
//         Compute "fwd.head"   layer L
//       Phase "backward"               mb
//         Compute "bwd.head"   layer L
//         Compute "bwd.block"  layer L-1 .. 0             Collective "ddp.all_reduce" bucket 0..K-1
//         Compute "bwd.embed"  layer -1                     (mb = M-1 only, when dp > 1; layer = the
//                                                            bucket's lowest layer; issued as each
//                                                            bucket's last segment is done, or all
//                                                            after "bwd.embed" with overlap off)
//         (the backward phase ends when the last all-reduce is complete)
//     Phase "optimizer"
//       Optimizer "adamw"
//
// With parallel.grad_compression (ddp_compression.hpp), from compression.start_step on, each
// bucket's "ddp.all_reduce" is replaced by the scheme's collectives ("ddp.int8_all_gather",
// "ddp.topk_all_gather", or "ddp.powersgd_p" / "ddp.powersgd_q" per matrix and
// "ddp.powersgd_vectors"), with Compute spans "ddp.compress" on the compute stream after the
// bucket's last segment and "ddp.decompress" (int8 / top-k: after "bwd.embed"); under ZeRO 1 they
// replace the step's "zero.reduce_scatter". On a device (not kHostMemory) the hook runs on a host
// copy of each bucket (the backend's download / upload, inside those spans) and its collectives go
// over the dp group's host communicator: the same spans, bytes and arithmetic as on the CPU.
//
// Compute spans carry the model FLOPs of model/flops.hpp, step, micro-batch and layer. Before step 0 the
// comm stream holds "ddp.broadcast_parameters" (broadcast) and "barrier". Counters, sampled at
// the end of every step (bytes): mem.parameters, mem.gradients, mem.optimizer (AdamW moments),
// mem.activations (the saved activations of every micro-batch in flight plus the backward scratch
// and a device's kernel scratch; with MoE blocks their routing state, moe_state_bytes), mem.comm_buffers (pipeline gradient send buffers, ZeRO's
// reduce-scatter output; under ZeRO 2 also the full-size array the model writes one backward's
// gradients into before they are scattered).
//
// How a span is timed is the backend's (steady clock on CPUs, CUDA events on the compute stream);
// communication goes over the backend's device communicators of the host groups (the host groups
// themselves on CPUs; NCCL or host-staged MPI on GPUs), whose Handle::wait orders the compute stream
// after the operation.
//
// Parallel strategies (names from model/include/orrery/model/names.hpp, as the simulator's):
//  - tp > 1 (tensor_parallel.hpp): each block's three compute pieces are separated by the model's
//    tp sums, Collective "tp.all_reduce" on the tp group (layer l; two in forward, two in backward).
//  - pp > 1 (pipeline.hpp): passes in pipeline_order(schedule) instead of forward-then-backward per
//    micro-batch; a stage without the embedding receives "pp.recv_act" before its forward, one
//    without the head sends "pp.send_act" after it; backward "pp.recv_grad" / "pp.send_grad" (P2P,
//    layer -1; the gradient sent from a per-slot buffer, so the next backward may reuse the
//    scratch). Only the first and last stages load data. After the step's gradient reduction the
//    first and last stage sum the tied wte gradient: "pp.embed_all_reduce" (Collective, Sum, on the
//    embedding group; under ZeRO it comes before each reduce-scatter instead). At the end of the
//    step the last stage broadcasts the step's loss over the host pp group ("pp.loss", 4 bytes) so
//    every rank reports it.
//  - zero 1/2 (zero.hpp): "zero.reduce_scatter" instead of "ddp.all_reduce" (one per step for
//    zero 1, one per micro-batch for zero 2, after the backward pass), AdamW on the owned shard,
//    then "zero.all_gather" of the parameters (Phase "optimizer"). With zero.overlap_grad_reduce
//    one "zero.reduce_scatter" per bucket during the backward (as "ddp.all_reduce"; the bucket of
//    the tied wte after "pp.embed_all_reduce") and one "zero.all_gather" per bucket, the
//    embedding's first (zero.hpp).
//  - zero 3 (zero.hpp, the backend's Zero3 storage): "zero.fetch_layer" all-gathers (a block before
//    its forward and before its backward, the next one prefetched; the embedding and final
//    LayerNorm once per step), "zero.reduce_scatter" per segment as its backward completes, every
//    micro-batch; AdamW per segment shard; no parameter broadcast (every rank makes the same model
//    from the seed and keeps its shard) and no all-gather after the optimizer.
//  - zero.offload_optimizer: nvme streams the moments through the rank's file inside "adamw"
//    ("offload.read" / "offload.write", Memcpy on the stream "offload"; offload.hpp); on a device
//    (host, or nvme) AdamW steps on the host's master weights chunk by chunk inside "adamw"
//    ("offload.d2h" and "offload.h2d" on "offload", "offload.adamw" on the compute stream;
//    offload_pipeline.hpp), with the counter "mem.offload_host" (pinned host bytes).
//    zero.offload_params (ZeRO 3): the parameter shards in the file too, each read ("offload.read")
//    before its "zero.fetch_layer" (the one after the next read ahead), on a device uploaded
//    through the backend's ShardStaging ("offload.h2d", layer = the segment) into the gather's
//    send buffer; AdamW streams them with the moments (on a device no master weights in pinned
//    memory and no upload after the step: the device holds no shard).
//  - runtime.precision fp16 (host memory only; loss_scaler.hpp): the backward's loss gradient is
//    multiplied by the loss scale; after the gradient reductions the gradients this rank updates
//    are checked for inf / NaN, the flag max-all-reduced over dp, tp and pp
//    ("loss_scale.overflow", 4 bytes each), and unscaled; an overflowed step keeps its optimizer
//    spans but updates nothing (nor ZeRO 1/2's all-gather). Counters "loss_scale" and
//    "skipped_steps" at the end of the step.
//
// A Backend B (CpuBackend in cpu_backend.hpp, cuda::CudaBackend in cuda/backend.hpp) provides:
//   types    Options, Array (float storage: resize, size, size_bytes, data; constructible from a
//            count), Model, Activations, Scratch, Zero3 (a BasicZero3Storage<Array>);
//            kHostMemory (whether Array is host memory: checkpoint state needs no staging)
//   setup    static check_supported(s); B(s, rec, options); connect(host groups, layout) -> the
//            device communicators; make_model(host Gpt, device storage?); make_zero3(model, r, n, ep);
//            activations(model, B, T, recompute); scratch(model, B, T, recompute)
//   ops      kernels() (gpt_pieces.hpp's Kernels); zero, add (acc += in), scale (p *= s), copy, adamw
//            (optimizer.hpp's maths), download / upload (host <-> Array memory, synchronous),
//            synchronize (every queued operation done), scratch_bytes()
//   spans    begin_step() / end_step() around a step (end_step: everything the step queued is done
//            and its spans are in the recorder); open(proto, annotation) -> handle, close(handle)
//   the run  finish(); drain() (finish's waits, never throwing: the destructor's); device_description(); peak_flops_per_rank(); meta_fields();
//            start_device_tracing(rec) / stop_device_tracing()
//   offload  (not kHostMemory) make_host_offload(elems, moments, chunk, master) / host_offload()
//            (an OffloadTransfers with master(), m(), v(), chunk(), pinned_bytes(), begin, end);
//            make_shard_staging(slots, elems) / shard_staging() (a ShardStaging;
//            offload_pipeline.hpp)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/data.hpp"
#include "orrery/runtime/ddp.hpp"
#include "orrery/runtime/groups.hpp"
#include "orrery/runtime/loss_scaler.hpp"
#include "orrery/runtime/model.hpp"
#include "orrery/runtime/offload.hpp"
#include "orrery/runtime/optimizer.hpp"
#include "orrery/runtime/rank_trainer.hpp"
#include "orrery/runtime/zero.hpp"

namespace orrery::runtime {

template <class B>
class TrainingLoop : public RankTrainer {
 public:
  using Backend = B;
  using Array = typename B::Array;
  using Model = typename B::Model;

  // `world` must have exactly s.world_size() ranks. `rec` may be nullptr (no profiling). Throws
  // InputError for what the backend cannot run (B::check_supported) or a batch that does not split.
  TrainingLoop(const Scenario& s, Communicator& world, profiler::Recorder* rec,
               const typename B::Options& opt = {});
  ~TrainingLoop() override;
  TrainingLoop(const TrainingLoop&) = delete;
  TrainingLoop& operator=(const TrainingLoop&) = delete;

  void prepare() override;
  StepResult step() override;
  void finish() override;
  int32_t steps_done() const override { return step_; }

  const Layout& layout() const override { return layout_; }
  int micro_batches() const override { return micro_batches_; }
  Communicator& dp_group() override { return *groups_.dp; }
  Communicator& tp_group() { return *groups_.tp; }
  Communicator& pp_group() { return *groups_.pp; }
  const std::vector<DdpBucket>& buckets() const override { return ddp_->buckets(); }
  std::size_t flat_elems() const override;
  MemoryBytes memory() const override;
  std::vector<float> parameters() override;

  std::vector<StateRange> state_to_save() override;
  std::vector<StateRange> state_to_load() override;
  void commit_loaded_state() override;
  std::vector<FlatRun> checkpoint_runs() const override {
    return global_flat_runs(layout_of(*model_));
  }
  std::size_t checkpoint_elems() const override { return global_flat_elems(layout_of(*model_)); }
  int64_t adamw_steps() const override { return adam_steps_; }
  const DataLoader& loader() const override { return *loader_; }
  void restore_counters(int32_t steps_done, int64_t adamw_steps, int64_t data_calls) override;
  std::optional<CompressionState> compression_state() const override;
  std::optional<LossScalerState> loss_scaler_state() const override {
    return scaler_ ? std::optional<LossScalerState>(scaler_->state()) : std::nullopt;
  }
  void restore_compression_state(const CompressionState& st) override;
  void restore_loss_scaler(const LossScalerState& st) override {
    if (scaler_) scaler_->restore(st);
  }

  std::string device_description() const override { return backend_.device_description(); }
  double peak_flops_per_rank() const override { return backend_.peak_flops_per_rank(); }
  nlohmann::json meta_fields() const override { return backend_.meta_fields(); }
  void start_device_tracing(profiler::Recorder& rec) override {
    backend_.start_device_tracing(rec);
  }
  void stop_device_tracing() override { backend_.stop_device_tracing(); }

  B& backend() { return backend_; }
  const B& backend() const { return backend_; }
  Model& model() { return *model_; }
  // The ZeRO partition of this rank's flat array over dp (ranks 1 without ZeRO).
  const ZeroPartition& zero() const { return zero_; }
  // ZeRO 3's storage (null unless parallel.zero = 3).
  typename B::Zero3* zero3() { return z3_.get(); }
  // The NVMe offload file's store (null unless zero.offload_optimizer is nvme).
  const OffloadStore* offload() const { return offload_.get(); }
  DataParallel& ddp() { return *ddp_; }
  const TokenSource& source() const { return *source_; }

 private:
  class Observer;
  struct Staged;
  bool zero12() const { return !z3_ && zero_.ranks > 1; }
  void record_memory();
  int open(traces::SpanKind kind, const char* name, int32_t micro_batch);
  void close(int handle) { backend_.close(handle); }
  std::size_t begin_pass(int mb);
  void forward_pass(int mb, const GptHooks& hooks, double& loss_sum);
  void backward_pass(int mb, const GptHooks& hooks, float loss_scale);
  void run_passes(const GptHooks& hooks, double& loss_sum);
  void optimizer_phase(bool apply);
  // AdamW on `count` elements (flat offset `flat_offset`) whose moments start at element
  // `moment_begin` of the moment arrays, streamed through the offload file when there is one
  // (params then null under zero.offload_params: plane 2 of the file).
  void adamw_range(float* params, const float* grads, std::size_t moment_begin,
                   std::size_t flat_offset, std::size_t count);
  // NVMe offload: the set-up (planes: 2 moments, 3 with ZeRO 3's parameters) and the checkpoint
  // copies of the file's planes.
  void make_optimizer_state(std::size_t moments, bool zero);
  void enable_compression();  // parallel.grad_compression: DDP's hook (host copy on a device)
  void make_offload(std::size_t moments);
  void offload_shards(std::size_t shard_elems);  // zero.offload_params: the shards to the file
  void read_offload_state();
  // ZeRO-Offload on a device (offload_pipeline.hpp; zero.offload_optimizer host, or nvme on a
  // device): the backend's pinned master weights (and moments), AdamW on the host through them,
  // the memory they move, whether the moments are host memory (no checkpoint staging), and moment
  // plane j (0: m, 1: v) as the checkpoint sees it.
  void make_host_offload(std::size_t moments, bool pinned_moments);
  void offloaded_adamw(float* params, const float* grads, std::size_t moment_begin,
                       std::size_t flat_offset, std::size_t count);
  void count_host_offload(MemoryBytes& m) const;
  bool host_moments() const;
  float* stage_moments(float* data, std::size_t n, bool upload);
  float* moment_plane(int j);
  // ZeRO 3 with zero.offload_params: the shard of `segment` as the gather's send buffer (working
  // buffer `slot`'s staging; on a device uploaded from the host staging), read from the file
  // unless read ahead; prefetch_shard starts such a read. expert_shard: an MoE block's experts'
  // shard, read when gathered. stage_host: where the file's read of a staging slot lands;
  // release_staging: slot's gather is waited for (a device may refill its staging after it).
  const float* z3_shard(int segment, int slot);
  void z3_prefetch_shard(int segment, int slot);
  const float* z3_expert_shard(const Zero3Segment& e, int slot);
  float* z3_stage_host(int slot);
  void z3_release_staging(int slot);
  float* stage_params(float* data, std::size_t n, bool upload);  // checkpoint: params' staging
  // fp16: true when any rank's gradients (the part this rank updates) hold an inf or NaN; else
  // they are divided by the loss scale. The same answer on every rank.
  bool unscale_and_check_overflow();
  void reduce_gradients_zero(int mb);
  void reduce_expert_gradients_zero(int mb);  // MoE, ep > 1
  void gather_zero_shards_ep();               // MoE, ep > 1
  // zero.overlap_grad_reduce (ZeRO 1/2 per bucket): the plan, the all-gathers after the optimizer,
  // and the waits for them (a segment's buckets, or all).
  void use_zero_buckets(std::vector<DdpBucket>& buckets, std::vector<DdpBucket> zbuckets,
                        DdpOptions& dopt);
  void plan_zero_buckets(const std::vector<DdpBucket>& buckets);
  void gather_zero_buckets();
  void wait_zero_gathers(int segment);
  void wait_zero_gathers();
  void embed_all_reduce();
  void kv_grad_all_reduce(int layer, int mb);
  void kv_grad_all_reduce_blocks(int mb);
  // MoE: the ep all-to-all, routing and expert-gradient hooks of a step; its counters.
  void moe_hooks(GptHooks& hooks);
  void record_moe_counters(StepResult& result);
  float* stage(float* data, std::size_t n, bool upload);
  // ZeRO 3
  void z3_gather(int segment, int slot, int mb);
  void z3_gather_step_segments();
  void z3_bind_block(int layer, int next_layer, int mb);
  void z3_reduce_scatter(int segment, int slot, int mb);
  float z3_forward(typename B::Activations& acts, int mb, const GptHooks& hooks);
  void z3_backward(typename B::Activations& acts, int mb, const GptHooks& hooks, float loss_scale);
  void z3_finish_backward(int mb);
  // MoE under ZeRO 3: the experts' segments over their edp group (edp of one: a copy).
  Communicator* z3_group(const Zero3Segment& sg) const;
  Handle z3_all_gather(const Zero3Segment& sg, const float* send, float* recv, const OpLabel& l);
  Handle z3_scatter_avg(const Zero3Segment& sg, const float* send, float* recv, const OpLabel& l);

  Scenario s_;
  Communicator& world_;
  profiler::Recorder* rec_;
  Layout layout_;
  int micro_batches_ = 1;
  RankGroups groups_;  // host; outlive the backend's device communicators over them
  // Declared before everything that holds its memory or queues work on it: destroyed last.
  B backend_;
  DeviceGroups dev_;  // the backend's communicators of the groups (null: a group of one)
  std::unique_ptr<Model> model_;
  std::unique_ptr<DataParallel> ddp_;
  // MoE: the routed experts' gradient buckets over the edp group (null without MoE), the blocks
  // that have some (index segment), and the step's routing tallies: assignments per (held block,
  // expert) before the drop, drops per held block, the aux losses' sum.
  std::unique_ptr<DataParallel> edp_;
  std::vector<uint8_t> expert_segment_;
  std::vector<double> moe_tokens_, moe_dropped_;
  double moe_aux_ = 0;
  std::unique_ptr<TokenSource> source_;
  std::unique_ptr<DataLoader> loader_;
  std::vector<std::unique_ptr<typename B::Activations>> acts_;  // one per micro-batch in flight
  std::vector<Array> grad_send_;  // pipeline: the gradient sent back, one per slot
  std::vector<Handle> act_send_h_, grad_send_h_;
  std::unique_ptr<typename B::Scratch> scratch_;
  ZeroPartition zero_;
  Array zero_grads_;  // (k) ZeRO 1/2: the owned shard of the averaged gradients
  Array zero_recv_;   // (k) ZeRO 2: one micro-batch's scattered shard
  // MoE with ep > 1 under ZeRO 1/2: the experts' partition over edp (ranks 0: none), where they
  // start in the flat array, their shard's gradients, ZeRO 2's scattered shard (its AdamW moments
  // at [k, k + its shard) of the moment planes, k = zero_.shard), and the dense all-gather's
  // staging buffer.
  ZeroPartition ezero_{};
  std::size_t expert_offset_ = 0;
  std::size_t dense_elems_ = 0;  // where the routed experts start in the flat array (model.hpp)
  Array ezero_grads_, ezero_recv_, zero_stage_;  // (their moments: adam_m_ / adam_v_ after k)
  std::unique_ptr<typename B::Zero3> z3_;
  Array z3_recv_;                              // ZeRO 3: one micro-batch's scattered shards
  Handle z3_gather_h_[4], z3_rs_h_[4];         // by working buffer (zero3_slot)
  Handle z3_egather_h_[2], z3_ers_h_[2];       // MoE: the experts' of block buffers 0/1
  int z3_gathered_[4] = {-99, -99, -99, -99};  // the segment each parameter buffer holds
  // Key/value heads replicated over tp (fewer kv heads than tp ranks): the ranks sharing one
  // (kv_replicas_ > 1 of them) sum its gradient through kv_buf_, one slot per kv head.
  int kv_replicas_ = 1;
  Array kv_buf_;
  Array adam_m_, adam_v_;  // AdamW moments of the range this rank updates (shard layout)
  // zero.offload_optimizer nvme: the moments (and zero.offload_params: ZeRO 3's parameter shards,
  // plane 2) in this rank's file instead; adam_m_ / adam_v_ stay empty.
  std::unique_ptr<OffloadStore> offload_;
  bool offload_params_ = false;
  std::vector<float> off_ckpt_[3];  // checkpoint copies of the planes (state_to_save / _load)
  bool off_upload_ = false;         // commit_loaded_state writes off_ckpt_ back
  bool master_stale_ = false;  // a device's offload: the master weights to read from the device
  // offload_params on host memory: a segment's shard by working buffer, and an MoE block's
  // experts' shard (a device's staging is its backend's: shard_staging()).
  FloatArray z3_stage_[4];
  FloatArray z3_estage_[2];
  int z3_staged_[4] = {-99, -99, -99, -99};
  uint64_t z3_stage_ticket_[4] = {0, 0, 0, 0};
  std::size_t opt_offset_ = 0, opt_count_ = 0;  // that range in the flat array (not ZeRO 3)
  // zero.overlap_grad_reduce: ddp_'s buckets are ZeRO's (make_zero_buckets); this rank's part of
  // each (flat offset, offset in the shard and moment arrays, real elements), the buckets each
  // segment's forward waits for (index segment + 1), and the buckets' all-gathers in flight.
  struct OptRange {
    std::size_t flat = 0, moment = 0, count = 0;
  };
  bool zbuckets_ = false;
  std::vector<OptRange> opt_ranges_;
  std::vector<std::vector<int>> zero_gather_waits_;
  std::vector<Handle> zero_ag_h_;
  std::vector<ParamRange> decay_;
  AdamWConfig adamw_;
  int64_t adam_steps_ = 0;
  std::vector<Staged> staged_;  // checkpoint state copied to the host (device backends)
  std::unique_ptr<Observer> observer_;
  Batch batch_;
  int32_t step_ = 0;
  int32_t cur_mb_ = -1;               // the micro-batch in flight (tp.all_reduce labels)
  std::optional<LossScaler> scaler_;  // runtime.precision fp16 only
};

}  // namespace orrery::runtime
