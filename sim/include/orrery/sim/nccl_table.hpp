// The predicted nccl-tests table: for each size from min to max (times factor), the size, element
// count, time, algorithm bandwidth and bus bandwidth, computed as nccl-tests computes them
// (NVIDIA/nccl-tests doc/PERFORMANCE.md): algbw = size / time, busbw = algbw * busbw_factor(op, n).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orrery/sim/cluster.hpp"
#include "orrery/sim/collectives.hpp"
#include "orrery/sim/network.hpp"

namespace orrery::sim {

struct NcclRow {
  int64_t bytes =
      0;  // nccl-tests' size (rounded down to whole elements, per rank for all-gather etc.)
  int64_t count = 0;  // elements of 4-byte floats, as nccl-tests' count column
  int64_t time_ns = 0;
  double algbw_gb_per_s = 0;
  double busbw_gb_per_s = 0;
  Algorithm algo = Algorithm::Ring;      // the algorithm used (resolved when auto)
  Protocol protocol = Protocol::Simple;  // the protocol used (resolved when auto)
  int channels = 1;                      // the channels NCCL would use (nccl_channels)
};

struct NcclSweep {
  traces::CollOp op = traces::CollOp::AllReduce;
  int ranks = 8;  // the first `ranks` GPUs of the cluster
  int64_t min_bytes = 8;
  int64_t max_bytes = 1 << 20;
  int64_t factor = 2;  // multiplicative step (nccl-tests -f)
  Algorithm algo = Algorithm::Auto;
  Protocol protocol = Protocol::Auto;
  int channels = 0;
  NetworkModel model = NetworkModel::Flow;
};

// Throws InputError for ranks outside the cluster, factor < 2, min > max.
std::vector<NcclRow> predict_nccl_table(const Cluster& cluster, const NcclSweep& sweep);

// The text table as nccl-tests prints it (header lines start with '#').
std::string format_nccl_table(const Cluster& cluster, const NcclSweep& sweep,
                              const std::vector<NcclRow>& rows);

}  // namespace orrery::sim
