// The metrics a performance engineer asks for first, computed from any trace (real or simulated).
//
// Classes: compute = Compute + Optimizer spans; communication = Collective + P2P spans; memory =
// Memcpy; Phase and Data spans are not work. Per rank, intervals of each class are merged first
// (Holistic Trace Analysis' definition), then:
//   overlap %            = |compute ∩ comm| / |comm|
//   exposed comm         = |comm \ compute|
//   idle                 = window length - |compute ∪ comm ∪ memcpy|
//   comm/comp ratio      = |comm| / |compute|
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "orrery/traces/trace.hpp"

namespace orrery::profiler {

struct Interval {
  int64_t start_ns;
  int64_t end_ns;
};
// Sorts and merges overlapping/touching intervals.
std::vector<Interval> merge_intervals(std::vector<Interval> v);
int64_t total_length(const std::vector<Interval>& merged);
// Length of the intersection of two merged interval lists.
int64_t intersection_length(const std::vector<Interval>& a, const std::vector<Interval>& b);

struct TimeBreakdown {
  int64_t window_ns = 0;
  int64_t compute_ns = 0;        // merged compute time
  int64_t comm_ns = 0;           // merged communication time
  int64_t memcpy_ns = 0;         // merged memcpy time
  int64_t overlap_ns = 0;        // compute ∩ comm
  int64_t exposed_comm_ns = 0;   // comm not covered by compute
  int64_t idle_ns = 0;           // no compute, comm or memcpy
  double comm_comp_ratio() const { return compute_ns ? double(comm_ns) / compute_ns : 0.0; }
  double overlap_pct() const { return comm_ns ? 100.0 * overlap_ns / comm_ns : 0.0; }
};

struct CollectiveStats {
  std::string op;    // "all_reduce", ...
  int32_t comm = -1;
  std::string comm_name;
  int32_t comm_size = 1;
  int64_t count = 0;
  int64_t bytes = 0;       // summed over calls (per-rank buffer size)
  int64_t time_ns = 0;     // summed durations
  double algbw_gbps = 0;   // bytes / time, GB/s (decimal)
  double busbw_gbps = 0;   // algbw * nccl-tests factor
};

struct StepStats {
  int32_t step = 0;
  int64_t start_ns = 0;  // earliest start over ranks
  int64_t end_ns = 0;    // latest end over ranks
  int64_t duration_ns() const { return end_ns - start_ns; }
};

struct RankMetrics {
  int32_t rank = 0;
  TimeBreakdown total;                       // over the whole window of the rank
  std::map<int32_t, TimeBreakdown> by_step;  // per training step
  int64_t bubble_ns = 0;       // pipeline bubble (idle inside steps on a pp>1 rank)
  double late_ns_mean = 0;     // mean lateness at step start / collective entry vs. the median rank
  std::map<std::string, double> peak_memory_bytes;  // counter name -> peak
};

struct Metrics {
  std::vector<RankMetrics> ranks;
  TimeBreakdown total;  // summed over ranks
  std::vector<StepStats> steps;
  double step_mean_ns = 0, step_p50_ns = 0, step_p90_ns = 0;
  double tokens_per_s = 0;       // 0 when tokens per step are unknown
  double achieved_flops = 0;     // FLOP/s over all ranks, from span flops
  double mfu = 0;                // achieved / (peak * ranks), 0 when peak unknown
  double bubble_pct = 0;         // mean over pp ranks
  std::vector<CollectiveStats> collectives;
  std::vector<int32_t> stragglers;  // ranks consistently late
  int64_t span_count = 0;
};

struct MetricsOptions {
  int64_t window_start_ns = INT64_MIN;  // restrict to a time window (GUI range selection)
  int64_t window_end_ns = INT64_MAX;
  int skip_steps = 0;                    // warm-up steps excluded from step statistics
  double peak_flops_per_rank = 0;        // overrides the trace's value when > 0
};

Metrics compute_metrics(const traces::Trace& t, const MetricsOptions& opt = {});

}  // namespace orrery::profiler
