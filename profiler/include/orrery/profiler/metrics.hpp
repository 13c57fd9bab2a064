// The metrics a performance engineer asks for first, computed from any trace (real or simulated).
//
// Classes: compute = Compute + Optimizer spans; communication = Collective + P2P spans; memory =
// Memcpy; Phase and Data spans are not work. Per rank, intervals of each class are merged first
// (Holistic Trace Analysis' definition), then:
//   overlap %            = |compute ∩ comm| / |comm|
//   exposed comm         = |comm \ compute|
//   idle                 = window length - |compute ∪ comm ∪ memcpy|
//   comm/comp ratio      = |comm| / |compute|
//
// Time window (MetricsOptions::window_*, the GUI's range selection): spans are clipped to the
// window before merging. A rank's window is the window ∩ [its first span start, its last span end].
// Collective statistics count every collective overlapping the window at its whole duration and
// bytes (clipping would distort bandwidth); FLOPs of a clipped span are pro-rated by the kept time.
//
// Steps: when the trace has Phase spans named "step", step s on a rank is that rank's "step" span
// (its `step` field, or its ordinal on the rank when -1); otherwise it is the extent of the rank's
// spans tagged with `step` = s. StepStats is the union over ranks: [earliest start, latest end].
// Only steps lying wholly inside the window are reported; the first `skip_steps` steps of the
// trace (by step id) are flagged warm-up and left out of the step statistics, tokens/s, FLOP/s,
// MFU and bubble. Per-rank by_step breakdowns use the global step window, so time a rank spends
// waiting for the slowest rank shows as idle. Percentiles interpolate linearly between order
// statistics (numpy's default): p_q = x[floor(q(n-1))] + frac * (x[...+1] - x[...]).
//
// Throughput: achieved FLOP/s = FLOPs of compute spans inside the counted steps, all ranks, ÷ the
// summed duration of those steps (without steps: ÷ the analysed extent). MFU uses model FLOPs
// when the trace gives them (meta.model_flops_per_step ÷ mean step time, recomputation excluded,
// as in Narayanan et al.), else the span FLOPs; divided by peak per rank × ranks.
//
// Pipeline bubble (traces with pp > 1 in meta or in the ranks' coordinates): per rank and counted
// step, bubble = |step window \ (compute ∪ collectives)|. Point-to-point transfers count as bubble:
// on a blocking transport a recv span covers the wait for the neighbouring stage, which is the
// bubble itself. Collectives (dp/tp all-reduce) count as busy. On an ideal GPipe or 1F1B schedule
// with p equal stages and m micro-batches (forward f, backward b per micro-batch and stage) every
// stage is busy m(f+b) of a step of (m+p-1)(f+b), so bubble = (p-1)/(m+p-1) of the step, i.e.
// (p-1)/m of the ideal time. bubble_pct = mean over ranks of 100 · Σ bubble ÷ Σ step time.
//
// Stragglers: collectives (kind Collective, seq >= 0) are grouped by (comm, seq) across ranks; a
// rank's lateness in one is its start minus the median start of the group (mean of the two middle
// values for an even count). A rank is a straggler when it is late by more than
// straggler_threshold_ns in more than straggler_late_fraction of the grouped collectives it took
// part in and its mean signed lateness (late_ns_mean) is positive: a rank late by a little in most
// collectives but early by more in the rest does not hold the others back.
//
// Memory: counters named "mem.<category>"; peak per counter name, and the peak over time of the
// sum of the categories' latest values (samples with equal timestamps applied together; ZeRO
// offload's "mem.offload_*", the state moved to a file or to host memory, left out of it), or the
// peak of "mem.total" when the trace has that counter.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "orrery/traces/store.hpp"
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

// One rank's account of one step window [ws, we): the one definition `orrery report` (through
// compute_metrics) and the simulator's step breakdown (sim/sweep.hpp) share, so `orrery sim` and
// `orrery report` of the trace it writes agree. Inputs are the rank's merged interval lists
// (merge_intervals), from span start to span end, clipped to the window here:
//   compute    = |C|                       C: Compute and Optimizer spans
//   exposed_tp = |TP \ C|                  TP: collectives on tp communicators
//   exposed_dp = |DP \ (C ∪ TP)|           DP: the other collectives (dp, world, tied embedding)
//   p2p        = |PP \ (C ∪ TP ∪ DP)|      PP: point-to-point transfers
//   rest       = window - |C ∪ TP ∪ DP|    the pipeline bubble when pp > 1, else idle
// so compute + exposed_tp + exposed_dp + rest = window, and p2p is part of rest: on a blocking
// transport a receive covers the wait for the neighbouring stage, which is the bubble itself.
// A collective's span covers its wait for the last member, as a blocking call's does: that wait
// is exposed communication.
struct StepAccount {
  int64_t window_ns = 0;
  int64_t compute_ns = 0;
  int64_t exposed_tp_ns = 0;
  int64_t exposed_dp_ns = 0;
  int64_t p2p_ns = 0;
  int64_t rest_ns = 0;
  StepAccount& operator+=(const StepAccount& o);
};
struct StepIntervals {
  const std::vector<Interval>& compute;
  const std::vector<Interval>& tp;
  const std::vector<Interval>& dp;
  const std::vector<Interval>& p2p;
};
StepAccount account_step(const StepIntervals& merged, int64_t ws, int64_t we);

struct TimeBreakdown {
  int64_t window_ns = 0;
  int64_t compute_ns = 0;       // merged compute time
  int64_t comm_ns = 0;          // merged communication time
  int64_t memcpy_ns = 0;        // merged memcpy time
  int64_t overlap_ns = 0;       // compute ∩ comm
  int64_t exposed_comm_ns = 0;  // comm not covered by compute
  int64_t idle_ns = 0;          // no compute, comm or memcpy
  double comm_comp_ratio() const { return compute_ns ? double(comm_ns) / compute_ns : 0.0; }
  double overlap_pct() const { return comm_ns ? 100.0 * overlap_ns / comm_ns : 0.0; }
};

struct CollectiveStats {
  std::string op;  // "all_reduce", ...
  int32_t comm = -1;
  std::string comm_name;
  int32_t comm_size = 1;
  int64_t count = 0;
  int64_t bytes = 0;      // summed over calls (per-rank buffer size)
  int64_t time_ns = 0;    // summed durations
  double algbw_gbps = 0;  // bytes / time, GB/s (decimal)
  double busbw_gbps = 0;  // algbw * nccl-tests factor
  int64_t ops = 0;  // distinct operations: (comm, seq) pairs, or count / comm_size without seq
};

struct StepStats {
  int32_t step = 0;
  int64_t start_ns = 0;  // earliest start over ranks
  int64_t end_ns = 0;    // latest end over ranks
  bool warmup = false;   // among the first skip_steps steps: not in the statistics
  int64_t duration_ns() const { return end_ns - start_ns; }
};

struct RankMetrics {
  int32_t rank = 0;
  TimeBreakdown total;                       // over the whole window of the rank
  std::map<int32_t, TimeBreakdown> by_step;  // per training step
  int64_t bubble_ns = 0;                     // pipeline bubble (idle inside steps on a pp>1 rank)
  double late_ns_mean = 0;  // mean signed lateness at collective entry vs. the median rank
  std::map<std::string, double> peak_memory_bytes;  // counter name -> peak
  double peak_memory_total_bytes = 0;  // peak of the sum over "mem.*" categories (or "mem.total")
  int64_t collectives_checked = 0;     // grouped (comm, seq) collectives this rank took part in
  int64_t collectives_late = 0;        // ... of which it was late by more than the threshold
  int64_t counted_step_ns = 0;         // summed duration of the counted steps (bubble denominator)
  StepAccount counted;  // account_step summed over the counted steps (bubble_ns = its rest_ns
                        // on a pipeline trace)
};

struct Metrics {
  std::vector<RankMetrics> ranks;
  TimeBreakdown total;  // summed over ranks
  std::vector<StepStats> steps;
  double step_mean_ns = 0, step_p50_ns = 0, step_p90_ns = 0;
  double tokens_per_s = 0;    // 0 when tokens per step are unknown
  double achieved_flops = 0;  // FLOP/s over all ranks, from span flops
  double mfu =
      0;  // model FLOP/s / (peak * meta.world_size), else achieved / (peak * ranks recorded)
  double bubble_pct = 0;  // mean over ranks, pipeline traces only
  std::vector<CollectiveStats> collectives;
  std::vector<int32_t> stragglers;   // ranks consistently late
  int64_t span_count = 0;            // spans overlapping the window
  int32_t counted_steps = 0;         // steps in the statistics (not warm-up, inside the window)
  double model_flops_per_s = 0;      // meta.model_flops_per_step / mean step time, 0 when unknown
  double peak_flops_per_rank = 0;    // the peak used for MFU (option, else the trace's)
  bool pipeline = false;             // pp > 1: bubble computed
  int64_t start_ns = 0, end_ns = 0;  // analysed extent: earliest / latest span time in the window
};

struct MetricsOptions {
  int64_t window_start_ns = INT64_MIN;  // restrict to a time window (GUI range selection)
  int64_t window_end_ns = INT64_MAX;
  int skip_steps = 0;                        // warm-up steps excluded from step statistics
  double peak_flops_per_rank = 0;            // overrides the trace's value when > 0
  int64_t straggler_threshold_ns = 100'000;  // lateness that counts as late
  double straggler_late_fraction = 0.5;      // late in more than this fraction -> straggler
  int threads =
      0;  // worker threads over ranks; 0: hardware concurrency (results do not depend on it)
};

// Percentile q in [0, 1] of the values, linear interpolation (see above); 0 for an empty input.
double percentile(std::vector<double> values, double q);

Metrics compute_metrics(const traces::Trace& t, const MetricsOptions& opt = {});

// The same figures, identical field for field, from a trace file read in two streaming passes:
// the first (TraceReader::for_each_block_by_time, the blocks in time order) finds the ranks and
// the steps and groups the collective instances for the lateness, settling each once its members
// are in; the second (for_each_span_run) processes one rank at a time. The memory counters are
// streamed rank by rank (for_each_counter_run). Memory: the header (strings, communicators, the
// counters it holds), one rank's interval lists, the collective instances in flight and a block
// per stream or counter name read, not the spans or samples. (A (comm, seq) that repeats after
// its instance was settled falls back to a 24-byte record per grouped collective span, grouped at
// the end.) `header` is reader.load_header(), with or without the "mem.*" counters. `also`, when
// set, sees every span run of the second pass (the caller's own accumulators share the read,
// e.g. CompressionAccumulator).
Metrics compute_metrics_streamed(const traces::TraceReader& reader, const traces::Trace& header,
                                 const MetricsOptions& opt = {},
                                 const traces::TraceReader::SpanRunVisitor& also = {});

}  // namespace orrery::profiler
