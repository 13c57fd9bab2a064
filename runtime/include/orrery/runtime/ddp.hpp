// Data parallelism (DDP): gradient buckets all-reduced (averaged) over the data-parallel group as
// soon as all their gradients exist, overlapping the rest of the backward pass.
//
// Buckets are runs of consecutive model segments in gradient-ready order (the head's LayerNorm,
// block L-1, ..., block 0, the embedding: "last layers first", as PyTorch's DDP). Because the model
// lays segments out in memory in the reverse of that order, every bucket is one contiguous range of
// the flat gradient array and is all-reduced in place: no copy into bucket buffers. A bucket is
// closed before the segment that would take it past `bucket_mb` (a segment is never split; a
// segment larger than the cap is a bucket of its own).
//
// Gradient accumulation: the model accumulates (+=) over micro-batches; only the last micro-batch of
// a step is synchronised (`sync` = true), as PyTorch's no_sync() on the others. With overlap off,
// the same buckets are all-reduced one after another once the backward pass is over.
//
// Trace: each bucket's all-reduce is a Collective span named "ddp.all_reduce" on the comm stream,
// with step, micro_batch, layer = the lowest layer in the bucket (-1 for the embedding), and the
// bucket's bytes; buckets go out in index order 0, 1, ... every step.
//
// ZeRO 1/2 with zero.overlap_grad_reduce (make_zero_buckets, DdpOptions::reduce_scatter): the same
// machinery issues each bucket's reduce-scatter into its part of the rank's shard array.
//
// Gradient compression (parallel.grad_compression, ddp_compression.hpp): enable_compression()
// installs a CompressionHook; from compression.start_step on, a bucket's all-reduce is the hook's
// collectives instead (int8 / top-k all-gathers started as the bucket completes and decompressed in
// finish_backward; PowerSGD's all-reduces run when the bucket completes). On a device the hook
// works on a host copy of the gradients over the dp group's host communicator (GradStaging).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/ddp_compression.hpp"
#include "orrery/runtime/model.hpp"

namespace orrery::runtime {

struct DdpOptions {
  double bucket_mb = 25.0;  // MiB; parallel.bucket_mb
  bool overlap = true;      // parallel.overlap
  // parallel.grad_dtype: F32, or BF16 / F16: each bucket is rounded into a 16-bit wire buffer
  // (half.hpp) and all-reduced as 16-bit patterns (half the bytes; each reduction adds in fp32
  // and rounds to the format), then widened back into the fp32 gradients and divided by the group
  // size in fp32. Host arrays only; not with compression (the scenario refuses both).
  DType wire = DType::F32;
  // The buckets' span name (null: "ddp.all_reduce"); the experts' buckets are "edp.all_reduce".
  const char* span_name = nullptr;
  // ZeRO 1/2 with zero.overlap_grad_reduce (make_zero_buckets): each bucket is reduce-scattered
  // (averaged) into its part of the rank's shard array (set_scatter_target) instead of all-reduced.
  bool reduce_scatter = false;
  // The bucket holding this segment (and so every later one) is issued by finish_backward only:
  // the tied wte's gradient is summed over the first and last stage before it is scattered, and
  // that sum waits for the pipeline's send (kEmbedSegment; kNoSegment: none held back).
  int hold_segment = kNoSegment;
  static constexpr int kNoSegment = -1000;
};

struct DdpBucket {
  int index = 0;
  ParamRange range;           // in the flat gradient array
  std::vector<int> segments;  // in ready order
  int lowest_layer = 0;       // smallest segment id (kEmbedSegment = -1 for the embedding)
  // ZeRO buckets (make_zero_buckets): this rank's part of the bucket is range.offset + rank·shard,
  // kept at shard_offset of the shard array; range.count = dp·shard.
  std::size_t shard = 0, shard_offset = 0;
  size_t bytes() const { return range.count * sizeof(float); }
};

// Splits the model's segments into buckets (pure function; used by DataParallel and the tests).
std::vector<DdpBucket> make_ddp_buckets(const Gpt& model, double bucket_mb);
// The routed experts' buckets (model/moe.hpp): the MoE blocks' expert ranges (Gpt::expert_range)
// in ready order (the last block first), cut by the same rule; a bucket's segments are its blocks,
// so DataParallel::on_grads_ready(l) of an MoE block completes them. Reduced over the edp group.
std::vector<DdpBucket> make_expert_buckets(const Gpt& model, double bucket_mb);
// ZeRO 1/2 with zero.overlap_grad_reduce: the same buckets with every boundary moved up to a
// multiple of `dp_size` elements (model/buckets.hpp zero_buckets), bucket 0 reaching the top of
// the array padded to dp·ceil(n / dp) (gpt_pad_storage), so each divides over the dp group.
std::vector<DdpBucket> make_zero_buckets(const Gpt& model, double bucket_mb, int dp_size);

class DataParallel {
 public:
  // The buckets over a flat gradient array `grads` (and `params` of `n_params` elements, the
  // broadcast's), in any memory the communicator `dp` takes: host arrays with a host communicator,
  // device arrays with a device one (cuda/backend.hpp). `dp` null or of size 1: nothing is sent.
  // `n_layer` bounds the segment ids (kEmbedSegment .. n_layer). The arrays must outlive this.
  DataParallel(std::vector<DdpBucket> buckets, int n_layer, float* grads, float* params,
               std::size_t n_params, Communicator* dp, const DdpOptions& opt);
  // A CPU model's buckets (make_ddp_buckets) over its own arrays.
  DataParallel(Gpt& model, Communicator& dp, const DdpOptions& opt);
  ~DataParallel();

  // Compresses the buckets' reduction from opt.start_step on (a no-op for scheme none or a dp
  // group of one). `matrices`: the gradients PowerSGD may compress (grad_matrices). `rec` may be
  // null. Host arrays: `staging` null, the hook's collectives over `dp`. Device arrays: `staging`
  // copies each bucket to and from the hook's host copy, and `host_dp` (the dp group's host
  // communicator, of dp's ranks) carries its collectives.
  void enable_compression(const CompressionOptions& opt, const std::vector<GradMatrix>& matrices,
                          profiler::Recorder* rec, const GradStaging* staging = nullptr,
                          Communicator* host_dp = nullptr);
  // The hook (null without compression) and whether step `step`'s reduction is compressed.
  const CompressionHook* compression() const { return hook_.get(); }
  CompressionHook* compression() { return hook_.get(); }
  bool compresses(int32_t step) const { return hook_ != nullptr && hook_->active(step); }

  const std::vector<DdpBucket>& buckets() const { return buckets_; }
  // opt.reduce_scatter: the rank's shard array the buckets are scattered into (device memory
  // with a device communicator), sum of the buckets' shards long.
  void set_scatter_target(float* shards) { scatter_into_ = shards; }
  const DdpOptions& options() const { return opt_; }

  // Starts the backward pass of one micro-batch. With `sync` (the step's last micro-batch) buckets
  // will be all-reduced as they complete (overlap) or after finish_backward() is called.
  void begin_backward(bool sync, int32_t step, int32_t micro_batch);
  // The GptHooks::on_grads_ready callback for the current backward pass.
  void on_grads_ready(int segment);
  // Issues the buckets still due (all of them without overlap) and waits for every all-reduce of
  // this backward pass (Handle::wait: on a device communicator the compute stream waits). After it,
  // gradients are averaged over the group (when `sync` was set).
  void finish_backward();

  // Makes every replica's parameters equal to rank 0's (a broadcast; replicas initialised from the
  // same seed are equal already, this makes it a guarantee rather than an assumption), and waits
  // for the communicator.
  void broadcast_parameters();

  // Bytes of communication buffers DDP holds beyond the gradients (0: buckets are views).
  // (0 uncompressed: buckets are views; with compression the hook's residuals and wire buffers,
  // which on a device are host memory and so not counted here: the arrays here are the device's).
  size_t comm_buffer_bytes() const {
    return (hook_ && !hook_->staged() ? hook_->buffer_bytes() : 0) +
           wire16_.size() * sizeof(uint16_t);
  }

 private:
  void issue(DdpBucket& b);
  void widen_wire();  // wire16_ back into the fp32 gradients, averaged

  std::vector<DdpBucket> buckets_;
  float* grads_;
  float* params_;
  std::size_t n_params_;
  Communicator* dp_;
  DdpOptions opt_;
  std::vector<int> bucket_of_segment_;  // index segment + 1 (the embedding is -1)
  std::vector<int> pending_;            // segments still to come, per bucket
  std::vector<Handle> handles_;
  std::unique_ptr<CompressionHook> hook_;
  std::vector<uint16_t> wire16_;   // (n grads) opt.wire BF16 / F16: the buckets as sent
  float* scatter_into_ = nullptr;  // opt.reduce_scatter: the shard array
  bool compressing_ = false;       // this backward pass's reduction goes through hook_
  int next_to_issue_ = 0;  // buckets go out in index order, so every rank issues the same sequence
  bool sync_ = false;
  int32_t step_ = -1;
  int32_t micro_batch_ = -1;
};

}  // namespace orrery::runtime
