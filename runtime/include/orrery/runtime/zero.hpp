// ZeRO (Rajbhandari et al., SC20) over the data-parallel group, stages 1 and 2.
//
// Partition: the rank's flat parameter array (n elements, model.hpp) is padded to N*k elements,
// k = ceil(n / N), and data-parallel rank r owns elements [r*k, r*k + k) (the last owner's tail is
// padding). The whole array is one bucket: one reduce-scatter of the gradients into the owned
// shard ("zero.reduce_scatter", ReduceOp::Avg), AdamW on the shard only, one in-place all-gather of
// the updated parameters ("zero.all_gather"). Names from model/names.hpp (kDpReduceScatter,
// kDpAllGather); the simulator issues the same single reduce-scatter and all-gather of the padded
// array whatever parallel.bucket_mb (tests/model/reference_spans.sh checks ZeRO 1 and 2 op by op).
//   stage 1: gradients accumulate over the step's micro-batches in the full array; reduce-scatter
//            once, after the last backward. Optimizer state 8Ψ/N.
//   stage 2: reduce-scatter after every micro-batch's backward, accumulated into a shard gradient
//            buffer of k elements; the full array only holds one backward's gradients.
// Padding: at most N-1 elements per array (parameters and gradients are reallocated to N*k).
// zero.overlap_grad_reduce (Megatron-LM's distributed optimizer; model/buckets.hpp zero_buckets):
//   the same padded array cut into DDP's buckets with every boundary moved up to a multiple of N;
//   rank r owns part r of each bucket (its AdamW state in bucket order). DataParallel issues each
//   bucket's reduce-scatter as its gradients are ready (ZeRO 2: every micro-batch), into the part's
//   place in the shard array; after AdamW each bucket is all-gathered in place, in forward order,
//   waited for there or (zero.overlap_param_gather) before the next step's first forward reading it
//   (GptHooks::before_forward). Span layer = the bucket's lowest segment, as DDP's.
//
// Stage 3 (Zero3Storage): every segment of the flat array (the embedding, each block, the final
// LayerNorm; model.hpp) is partitioned on its own, k_g = ceil(c_g / N), and a rank keeps only its
// k_g elements of parameters, gradients and Adam moments: 16 Ψ/N bytes plus padding below N
// elements per segment. The model's own flat arrays are freed; its named pointers are bound to
// gather buffers: two for blocks (the one in use and the prefetched next), one for the embedding
// and one for the final LayerNorm. The trainer all-gathers a block ("zero.fetch_layer", layer l)
// before its forward and again before its backward, prefetching the next block's gather while the
// current one computes; the embedding and final LayerNorm are gathered once per step (layer -1 and
// L: both ends of every micro-batch use them, the tied wte included) and dropped after the last
// backward. Each segment's gradient is written into a gather-sized buffer and reduce-scattered
// ("zero.reduce_scatter", layer = segment) as soon as its backward is done, every micro-batch.
// Mixture of experts (model/moe.hpp): a block's router and shared experts are in its segment; its
// routed experts (this ep rank's, after every dense tensor) are a segment of their own, partitioned
// over the expert-data-parallel group (the dp ranks of the same ep rank: N / ep of them, edp rank
// dp_rank / ep), gathered with the block into their own working buffers (by layer parity) and
// reduce-scattered over edp after its backward, both named as the block's (layer = the block).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "orrery/model/names.hpp"
#include "orrery/model/zero_partition.hpp"
#include "orrery/runtime/model.hpp"

namespace orrery::runtime {

inline constexpr const char* kZeroReduceScatterName = model::names::kDpReduceScatter.data();
inline constexpr const char* kZeroAllGatherName = model::names::kDpAllGather.data();

// The partition of an array over the dp group (model/zero_partition.hpp).
using model::zero_partition;
using model::ZeroPartition;

// Reallocates the model's params and grads to `padded` elements (>= num_params()), zero-filled
// beyond the end, keeping values and re-pointing every named pointer.
void gpt_pad_storage(Gpt& model, std::size_t padded);

inline constexpr const char* kZeroFetchLayerName = model::names::kZeroAllGather.data();

// The pointer structs of a model laid out as Gpt (model.hpp): the CPU model's own, or a device copy
// of it with the same layout (runtime/cuda/model.hpp's GpuGpt). ZeRO 3 rebinds these pointers.
struct GptPointers {
  EmbedParams& embed;
  EmbedParams& dembed;
  std::vector<BlockParams>& blocks;
  std::vector<BlockParams>& dblocks;
  HeadParams& head;
  HeadParams& dhead;
  // MoE blocks' pointers (index layer - layer_begin); null: the model has none bound here.
  std::vector<MoeParams>* moe = nullptr;
  std::vector<MoeParams>* dmoe = nullptr;
};

struct Zero3Segment {
  int id = 0;                    // kEmbedSegment, a layer, or n_layer
  bool expert = false;           // block `id`'s routed experts (MoE), partitioned over edp
  ParamRange range;              // in the original flat array
  ZeroPartition part;            // of range.count over the dp group (experts: the edp group)
  std::size_t shard_offset = 0;  // of this rank's k elements in the shard arrays
  // The bound pointers of this segment and their offsets from range.offset.
  std::vector<float**> param_ptrs, grad_ptrs;
  std::vector<std::size_t> rel;
  // Points the bound parameter and gradient pointers at full-size buffers (part.padded() elements).
  void bind(float* params, float* grads) const;
};

// ZeRO 3's segment table of `layout` (its params still allocated: the offsets are read from its
// pointers) over dp_size ranks, segments in memory order with their shard offsets, the pointers of
// `bound` (null fields skipped, e.g. wpe on a head-only stage). `bound` may be `layout`'s own
// pointers or those of a device copy with the same layout. MoE: the experts' segments follow the
// dense ones, over the edp group of ep (dividing dp_size); `bound` must carry moe and dmoe.
std::vector<Zero3Segment> zero3_segments(const Gpt& layout, int dp_rank, int dp_size,
                                         GptPointers bound, int ep = 1);
// The (dense) segment `id` of a table (std::out_of_range when it holds none).
Zero3Segment& zero3_segment(std::vector<Zero3Segment>& segments, int id);
// Block `layer`'s experts' segment; null when it has none (a dense block, or no MoE).
Zero3Segment* zero3_expert_segment(std::vector<Zero3Segment>& segments, int layer);
// The largest (dense) block segment's padded size, the size of a block working buffer.
std::size_t zero3_max_block(const std::vector<Zero3Segment>& segments, int n_layer);
// The largest experts' segment's padded size (0 without MoE), the size of an expert buffer.
std::size_t zero3_max_experts(const std::vector<Zero3Segment>& segments);
// Working buffer of a segment: 0/1 the blocks (alternating by layer parity from layer_begin), 2 the
// embedding, 3 the final LayerNorm.
inline int zero3_slot(int segment, int n_layer, int layer_begin) {
  return segment == kEmbedSegment ? 2 : segment == n_layer ? 3 : (segment - layer_begin) & 1;
}

// ZeRO 3's storage of one rank over any array type (FloatArray here, DeviceArray<float> for the
// CUDA model's GpuZero3Storage): the segment table, the owned shards of parameters and gradients
// (segments in memory order, padding zero) and the four working buffers (zero3_slot: 0/1 the blocks,
// 2 the embedding, 3 the final LayerNorm). The derived class fills the shards.
template <class Array>
class BasicZero3Storage {
 public:
  using Segment = Zero3Segment;
  std::vector<Segment>& segments() { return segments_; }
  Segment& segment(int id) { return zero3_segment(segments_, id); }
  Segment* expert_segment(int layer) { return zero3_expert_segment(segments_, layer); }
  float* params() { return params_.data(); }  // the owned shards, segments in memory order
  float* grads() { return grads_.data(); }
  std::size_t shard_elems() const { return grads_.size(); }
  // NVMe offload of the parameter shards (offload.hpp): the trainer keeps them in its file and
  // frees this array; params() is null after it.
  void release_params() { params_ = Array(); }
  float* param_buffer(int slot) { return pbuf_[static_cast<std::size_t>(slot)].data(); }
  float* grad_buffer(int slot) { return gbuf_[static_cast<std::size_t>(slot)].data(); }
  // MoE: the experts' working buffers of the block working buffer `slot` (0/1).
  float* expert_param_buffer(int slot) { return epbuf_[static_cast<std::size_t>(slot)].data(); }
  float* expert_grad_buffer(int slot) { return egbuf_[static_cast<std::size_t>(slot)].data(); }
  std::size_t buffer_bytes() const {
    std::size_t b = 0;
    for (int i = 0; i < 4; ++i) b += pbuf_[i].size_bytes() + gbuf_[i].size_bytes();
    for (int i = 0; i < 2; ++i) b += epbuf_[i].size_bytes() + egbuf_[i].size_bytes();
    return b;
  }

 protected:
  // Takes the table and sizes the shards (zero-filled) and the working buffers: the blocks' two
  // at the largest block's padded size, the embedding's and the final LayerNorm's at theirs.
  void allocate(std::vector<Segment> segments, int n_layer) {
    segments_ = std::move(segments);
    std::size_t total_shard = 0;
    for (const auto& sg : segments_) total_shard += sg.part.shard;
    params_.resize(total_shard);
    grads_.resize(total_shard);
    const std::size_t max_block = zero3_max_block(segments_, n_layer);
    const std::size_t max_experts = zero3_max_experts(segments_);
    for (int slot = 0; slot < 2; ++slot) {
      pbuf_[slot].resize(max_block);
      gbuf_[slot].resize(max_block);
      epbuf_[slot].resize(max_experts);
      egbuf_[slot].resize(max_experts);
    }
    for (const auto& sg : segments_) {
      if (sg.expert || (sg.id != kEmbedSegment && sg.id != n_layer)) continue;
      const int slot = sg.id == kEmbedSegment ? 2 : 3;
      pbuf_[slot].resize(sg.part.padded());
      gbuf_[slot].resize(sg.part.padded());
    }
  }

  std::vector<Segment> segments_;
  Array params_, grads_;
  Array pbuf_[4], gbuf_[4];
  Array epbuf_[2], egbuf_[2];
};

class Zero3Storage : public BasicZero3Storage<FloatArray> {
 public:
  // Takes the shards of the model's current values and frees the model's flat arrays (MoE: the
  // experts' over the edp group of `ep`).
  Zero3Storage(Gpt& model, int dp_rank, int dp_size, int ep = 1);
};

}  // namespace orrery::runtime
