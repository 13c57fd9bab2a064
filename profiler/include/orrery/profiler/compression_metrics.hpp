// Gradient compression in a trace (issue 18 item 1): what the compressed DDP collectives put on the
// wire against the fp32 all-reduce of the buckets they replaced, and the time spent compressing.
//
// Read from the runtime's spans (runtime/ddp_compression.hpp): Collective spans named
// "ddp.int8_all_gather", "ddp.topk_all_gather", "ddp.powersgd_p", "ddp.powersgd_q",
// "ddp.powersgd_vectors"; Compute spans "ddp.compress" (bytes: the bucket's fp32 bytes, on the
// bucket's first compress span) and "ddp.decompress". A rank's contribution to a collective (its
// wire bytes) is the span's bytes for an all-reduce and bytes / group size for an all-gather (whose
// span holds the group's total, as nccl-tests' size). A bucket is (rank, step, layer): its fp32
// bytes are "ddp.compress"'s, its wire bytes the sum of its collectives'.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "orrery/traces/trace.hpp"

namespace orrery::profiler {

struct CompressedCollective {
  std::string name;        // "ddp.int8_all_gather", ...
  int64_t calls = 0;       // spans over all ranks
  int64_t wire_bytes = 0;  // per-rank contributions summed over the calls
  int64_t raw_bytes = 0;   // fp32 bytes of the buckets it alone carried (int8, top-k); else 0
  int64_t saved_bytes() const { return raw_bytes > 0 ? raw_bytes - wire_bytes : 0; }
};

struct CompressionMetrics {
  std::vector<CompressedCollective> collectives;  // by name
  int64_t buckets = 0;        // compressed bucket reductions (rank, step, layer) over all ranks
  int64_t raw_bytes = 0;      // their fp32 bytes
  int64_t wire_bytes = 0;     // what their collectives carried
  int64_t compress_ns = 0;    // "ddp.compress" time summed over ranks
  int64_t decompress_ns = 0;  // "ddp.decompress" time summed over ranks
  int32_t ranks = 0;          // ranks with compressed collectives
  int32_t steps = 0;          // distinct steps with compressed collectives
  bool empty() const { return collectives.empty(); }
  int64_t saved_bytes() const { return raw_bytes - wire_bytes; }
  double ratio() const { return wire_bytes > 0 ? double(raw_bytes) / double(wire_bytes) : 0; }
};

CompressionMetrics compression_metrics(const traces::Trace& t);

// The same, one span at a time (the streaming `orrery report`): add() every span of the trace,
// in any order, then result(). `header` gives the names and communicators and must outlive it.
class CompressionAccumulator {
 public:
  explicit CompressionAccumulator(const traces::Trace& header);
  void add(const traces::Span& s);
  CompressionMetrics result() const;

 private:
  using BucketKey = std::tuple<int32_t, int32_t, int32_t>;  // rank, step, layer
  const traces::Trace& t_;
  CompressionMetrics m_;  // the time sums
  std::map<std::string, CompressedCollective> by_name_;
  std::map<BucketKey, int64_t> raw_, wire_;
  std::map<BucketKey, std::set<std::string>> names_of_;
  std::set<int32_t> ranks_, steps_;
};

}  // namespace orrery::profiler
