// The DDP bucket rule, shared by the runtime's DataParallel (ddp.hpp) and the simulator's workload.
//
// Buckets are runs of whole segments in gradient-ready order (the final LayerNorm, block L-1, ...,
// block 0, the embedding: last layers first, as PyTorch's DDP). A bucket is closed before the
// segment that would take it past the cap; a segment is never split, so one larger than the cap
// is a bucket of its own. Segments with no elements are skipped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace orrery::model {

struct BucketSegment {
  int segment = 0;       // kEmbedSegment, a layer, or L
  int64_t elements = 0;  // gradient elements of the segment on this rank
};

struct BucketPlan {
  std::size_t begin = 0, end = 0;  // the bucket's segments: ready_order[begin, end)
  int64_t elements = 0;
  int lowest_segment = 0;  // the span's layer
};

// `cap_bytes` = parallel.bucket_mb MiB; `bytes_per_element` of the gradients that travel.
std::vector<BucketPlan> ddp_buckets(std::span<const BucketSegment> ready_order, double cap_bytes,
                                    int bytes_per_element);

// ZeRO 1/2 with zero.overlap_grad_reduce (Megatron-LM's distributed optimizer with
// --overlap-grad-reduce): the same buckets, each reduce-scattered over the dp group as soon as its
// gradients are ready and all-gathered after the optimizer. Each bucket must divide by the dp size
// so that its reduce-scatter hands every rank an equal, contiguous part; Megatron pads each bucket.
// Here the flat array keeps its layout (the model's tensors stay where they are) and instead every
// bucket boundary is moved up to the next multiple of `ranks` elements: a bucket gives the < ranks
// elements at its bottom (the low end of its last-ready segment) to the next bucket in ready order,
// whose segments are ready later, so no bucket waits longer than before. Only the top of the array
// is padded, as model/zero_partition.hpp pads it: the buckets tile [0, ranks·ceil(n / ranks)), the
// same padded total and wire bytes as the single reduce-scatter. A bucket left empty by the move
// (fewer than `ranks` elements) joins the next one. Memory: bucket b = [offset, offset + elements),
// rank r's part [offset + r·shard, offset + (r+1)·shard); the rank keeps its parts in bucket order,
// part b at shard_offset (sum of the earlier buckets' shards).
struct ZeroBucketPlan {
  std::size_t begin = 0, end = 0;  // the bucket's segments: ready_order[begin, end)
  int lowest_segment = 0;          // the span's layer
  int64_t offset = 0;              // first element in the flat array
  int64_t elements = 0;            // a multiple of ranks (bucket 0 includes the array's padding)
  int64_t shard = 0;               // elements / ranks
  int64_t shard_offset = 0;        // of this bucket's part in a rank's shard array
};

// `ready_order` as for ddp_buckets: the segments in gradient-ready order, which is the reverse of
// their order in memory (the first is at the top of the flat array).
std::vector<ZeroBucketPlan> zero_buckets(std::span<const BucketSegment> ready_order,
                                         double cap_bytes, int bytes_per_element, int ranks);
// The buckets whose elements overlap [begin, begin + count) of the flat array, in index order: a
// segment's parameters lie in its bucket and, when the bucket below took its bottom elements,
// that one too (zero.overlap_param_gather waits for both before the segment's forward).
std::vector<int> zero_buckets_overlapping(std::span<const ZeroBucketPlan> buckets, int64_t begin,
                                          int64_t count);

}  // namespace orrery::model
