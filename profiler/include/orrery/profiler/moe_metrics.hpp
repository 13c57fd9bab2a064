// Mixture of experts in a trace (issue 19, model/moe.hpp): the all-to-alls over the ep group and
// how evenly the router spread the tokens.
//
// All-to-alls: Collective spans with op all_to_all (moe.dispatch, moe.combine and their .bwd),
// bytes = the rank's send buffer. Per name: calls, bytes and time summed over ranks; algbw =
// bytes / time, busbw = algbw · (n − 1) / n (nccl-tests' all-to-all factor, n the group's size);
// exposed = the part of each span no compute span of its rank covers (on CPUs every all-to-all is
// waited on by the compute thread, so nearly all of it).
// Load: the counters moe.tokens[l=L,e=E] (assignments routed to expert E of block L in a step on a
// rank, before the capacity drop) and moe.dropped[l=L], summed over ranks and steps: per block the
// tokens per expert, max / mean (1 = even), the dropped fraction of its assignments. With tp > 1
// every tp rank counts the same tokens: the ratios are unchanged.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "orrery/profiler/metrics.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::profiler {

struct AllToAllStats {
  std::string name;     // "moe.dispatch", ...
  int64_t calls = 0;    // spans over all ranks
  int64_t bytes = 0;    // summed over the calls
  int64_t time_ns = 0;  // summed over the calls
  int64_t exposed_ns = 0;
  int group_size = 1;  // ranks of its communicator (the largest seen)
  double algbw_gbps() const { return time_ns > 0 ? double(bytes) / double(time_ns) : 0; }
  double busbw_gbps() const {
    return group_size > 1 ? algbw_gbps() * double(group_size - 1) / group_size : 0;
  }
};

struct MoeBlockLoad {
  int layer = 0;
  std::vector<double> tokens;  // per expert, summed over ranks and steps
  double dropped = 0;
  double total() const;
  double imbalance() const;         // max / mean over the experts (0 without tokens)
  double dropped_fraction() const;  // dropped / total
};

struct MoeMetrics {
  std::vector<AllToAllStats> all_to_alls;  // by name
  std::vector<MoeBlockLoad> blocks;        // by layer
  int64_t all_to_all_ns = 0;               // every all-to-all's time, summed over ranks
  int64_t exposed_ns = 0;                  // of which not covered by compute on its rank
  bool empty() const { return all_to_alls.empty() && blocks.empty(); }
};

MoeMetrics moe_metrics(const traces::Trace& t);

// One span at a time (the streaming `orrery report`): add() every span, then result(). The load
// comes from the header's counters; `header` must outlive this.
class MoeAccumulator {
 public:
  explicit MoeAccumulator(const traces::Trace& header);
  void add(const traces::Span& s);
  MoeMetrics result() const;

 private:
  const traces::Trace& t_;
  bool moe_ = false;  // the header has MoE counters: only then are compute intervals kept
  std::map<std::string, AllToAllStats> by_name_;
  std::map<int32_t, std::vector<Interval>> compute_;  // per rank
  struct Call {
    std::string name;
    Interval iv;
  };
  std::map<int32_t, std::vector<Call>> calls_;  // per rank
};

}  // namespace orrery::profiler
