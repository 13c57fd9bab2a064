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

}  // namespace orrery::model
