// `orrery commbench`: a collective sweep on the runtime's real communicator (nccl-tests-like),
// recorded by the real profiler as a trace that calibration reads like a training run's.
//
// The sweep (run_commbench_sweep), on every rank of the world (N ranks):
//  - For each group size g of the options (in the order given), the world is split into N/g
//    groups of consecutive ranks (Communicator::split, kind CommKind::TP, named
//    "bench.g<g>[<first>-<last>]", one new communicator per g, so the communicator id tells the
//    group size apart), and every group runs the same sweep at the same time (each rank is in
//    exactly one group, as tp groups in training).
//  - For each op, in the order given but send_recv always last (an odd group's last rank sits it
//    out, and the communicator's sequence numbers count point-to-point operations, so a
//    collective after it would not line up across the members), and each size
//    S = min_bytes * 2^k <= max_bytes: `warmup` warm-up and `iters` timed iterations, each one op
//    on float32 data issued and waited for before the next (blocking, like nccl-tests).
//  - Before each op, once its data is prepared, a world barrier (not recorded) lines every rank
//    up, so a group's members and all the groups issue it together (data preparation and the time
//    slicing of oversubscribed cores would otherwise stagger them). align_each_op = false keeps
//    only the barrier before each size's first operation.
//  - S is nccl-tests' size and the span's bytes: the buffer for all_reduce and broadcast (root:
//    the group's rank 0); the total (gathered / reduced-from) buffer for all_gather and
//    reduce_scatter (S / (4 g) floats per rank, rounded down: the recorded bytes are
//    4 g floor(S / 4 g), equal to S when g is a power of two); the message for send_recv.
//  - send_recv: within each group ranks are paired (0<->1, 2<->3, ...); each posts a send of S
//    bytes to its partner, then a receive of S bytes from it, and waits for both. The
//    communicator records them as two P2P spans (op send, op recv). An odd group's last rank sits
//    send_recv out.
//  - Data is checked on every rank in closed form (group rank r, element i, p(i) = i mod 13):
//    all_reduce of (r+1)+p(i) gives g(g+1)/2 + g p(i); reduce_scatter likewise on the rank's
//    block; all_gather's block b holds (b+1)+p(i); broadcast delivers the root's 7+p(i);
//    send_recv delivers the partner's (partner+1)+p(i). Every element is checked after the last
//    iteration of each (g, op, size), the first, middle and last after every other iteration; a
//    mismatch throws InternalError naming the op, group, size, iteration, element, value and
//    expected value.
//
// The trace (run_commbench_rank; per-rank files merged by rank 0 exactly as `orrery run` does):
//  - Every Collective/P2P span is recorded by the communicator itself (comm id, seq, bytes, op,
//    peer) on the comm stream (1); nothing else is recorded (no phases, no barrier spans).
//  - Timed iterations: name "bench.<op>" (bench.all_reduce, bench.reduce_scatter,
//    bench.all_gather, bench.broadcast; bench.send_recv for both the send and the recv span),
//    step = the timed iteration's index 0..iters-1.
//  - Warm-up iterations: name "bench.warmup", step -1 (a fit that counts steps >= 0, or skips the
//    name, leaves them out; calibrate's skip_steps should be 0 for these traces).
//  - Per rank and group size: ops x sizes x (iters + warmup) spans, send_recv counting 2.
//  - Run metadata: source real, scenario_name "commbench", meta.extra_json
//    {"kind": "commbench", "commbench": {options, sizes, span names, ...}}: the marker that tells
//    a bench trace from a training run. tokens_per_step and model_flops_per_step are 0.
//    scenario_text is a valid scenario (commbench_scenario: name commbench, dp = N,
//    runtime.threads 1, training.steps = iters) headed by a comment saying it is a commbench, so
//    tools that parse the scenario (calibrate: ranks on the node, threads per rank) work; its
//    model and batch keys mean nothing here. Rank coordinates: dp = global rank, tp = pp = 0.
//
// The table (commbench_table), computed from a trace, i.e. what calibration sees: one row per
// (op, g, bytes) over the timed spans (step >= 0, names "bench.<op>"):
//  - collectives: an instance is a (comm, seq) with all g members; its time is
//    min(end) - max(start) over the members (the transfer time calibrate fits training runs' collectives
//    with; its commbench tables take max(end) - max(start): sim/calibrate.hpp); the row's time is the
//    median over the instances (every group, every timed iteration) with a positive time. Those
//    with min(end) <= max(start) (e.g. a broadcast root done before the last member arrived) are
//    counted in `skipped`, as calibration drops them too.
//  - send_recv: an instance is one message A->B: B's recv.end - max(A's send.start,
//    B's recv.start) (the k-th send from A to B on a communicator matched with B's k-th recv
//    from A).
//  - span_median_ns: the median duration of the row's spans on every rank (the per-rank view).
//  - algbw = bytes / time; busbw = algbw * busbw_factor(op, g) (all_reduce 2(g-1)/g,
//    reduce_scatter and all_gather (g-1)/g, broadcast and send_recv 1).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::profiler {
class Recorder;
}

namespace orrery::runtime {

enum class BenchOp : int32_t {
  AllReduce = 0,
  ReduceScatter = 1,
  AllGather = 2,
  Broadcast = 3,
  SendRecv = 4
};
// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv".
std::string_view to_string(BenchOp op);
// The names above; also "allreduce", "all-reduce", "sendrecv", "send-recv" and the like.
std::optional<BenchOp> bench_op_from_string(std::string_view s);
// The span name of a timed iteration: "bench.all_reduce", ...
std::string bench_span_name(BenchOp op);
inline constexpr std::string_view kBenchWarmupName = "bench.warmup";
inline constexpr int32_t kBenchWarmupStep = -1;

struct CommBenchOptions {
  int64_t min_bytes = 4 * 1024;
  int64_t max_bytes = 16 * 1024 * 1024;
  int iters = 5;
  int warmup = 1;
  std::vector<BenchOp> ops = {BenchOp::AllReduce, BenchOp::ReduceScatter, BenchOp::AllGather,
                              BenchOp::Broadcast, BenchOp::SendRecv};
  // Group sizes; empty = the default for the world size (default_bench_groups).
  std::vector<int> groups;
  // A world barrier before every operation (true), or only before the first of each (group size,
  // op, size) point (false: `orrery commbench --no-align`; the groups then drift apart within a
  // point).
  bool align_each_op = true;
  double watchdog_s = 120;  // an operation not complete after this long ends the job
  // Test only (the CLI reads ORRERY_COMMBENCH_CORRUPT_RANK): this global rank adds 1 to the last
  // element of its all_reduce input in the checked iteration, so its group's data check must fail.
  int corrupt_rank = -1;
};

// The largest buffer the sweep accepts (per rank, per buffer).
inline constexpr int64_t kBenchMaxBytes = int64_t{1} << 30;

// 2, 4 and 8 where they divide `nproc`, then `nproc` itself when not among them.
std::vector<int> default_bench_groups(int nproc);

// Checks the options for a world of `nproc` ranks, fills in the default groups and moves send_recv
// to the end of the ops; InputError naming the option and what was expected: nproc < 2, a group
// size < 2, larger than nproc or not dividing it, a repeated group size, min_bytes > max_bytes,
// min_bytes not a multiple of 4 (float32) or smaller than 4 x the largest group, max_bytes over
// kBenchMaxBytes, iters < 1, warmup < 0, no ops, a repeated op.
CommBenchOptions checked_bench_options(CommBenchOptions opt, int nproc);

// min_bytes, 2 min_bytes, 4 min_bytes, ... up to max_bytes.
std::vector<int64_t> bench_sizes(const CommBenchOptions& opt);

// The scenario stored in a commbench trace (see the header comment).
Scenario commbench_scenario(int nproc, const CommBenchOptions& opt);
// meta.extra_json of a commbench trace: {"kind": "commbench", "commbench": {...}}.
std::string commbench_extra_json(int nproc, const CommBenchOptions& opt);
// Whether a trace is a commbench (meta.extra_json kind "commbench").
bool is_commbench_trace(const traces::Trace& t);

// The sweep on this rank (see the header comment). `world` is the job's world communicator with
// `rec` attached (world.set_recorder(rec)), or rec = nullptr for no trace; the options are checked
// against world.size() again (InputError). Throws InternalError on wrong data.
struct CommBenchSweepStats {
  int64_t ops_issued = 0;  // operations issued (warm-up and timed; send and recv counted apart)
  int64_t elements_checked = 0;
};
CommBenchSweepStats run_commbench_sweep(Communicator& world, const CommBenchOptions& opt,
                                        profiler::Recorder* rec);

// This rank's whole bench: per-rank trace of `out` (launch.hpp's open_rank_trace), recorder,
// metadata, the sweep, then the merge on rank 0 (merge_rank_traces). `out` "" = rank 0's
// default_trace_path("commbench"). Returns the merged trace's path (on every rank).
struct CommBenchRankResult {
  std::string trace_path;
  CommBenchSweepStats stats;
  int64_t sweep_ns = 0;  // this rank's wall time of the sweep
};
CommBenchRankResult run_commbench_rank(Communicator& world, const CommBenchOptions& opt,
                                       const std::string& out);

struct CommBenchRow {
  BenchOp op = BenchOp::AllReduce;
  int group_size = 0;
  int groups = 0;      // communicators of this group size with spans in the row
  int64_t bytes = 0;   // the spans' bytes (nccl-tests' size)
  int64_t count = 0;   // float32 elements: bytes / 4
  int instances = 0;   // collectives (or messages) with a positive time
  int skipped = 0;     // with min(end) <= max(start)
  int64_t spans = 0;   // spans of the row, all ranks
  double time_ns = 0;  // median instance time (0 when instances == 0)
  double span_median_ns = 0;
  double algbw_gb_per_s = 0;  // decimal GB/s
  double busbw_gb_per_s = 0;
};
// The rows of a trace's timed bench spans, ordered by op (enum order), group size, bytes.
std::vector<CommBenchRow> commbench_table(const traces::Trace& t);

}  // namespace orrery::runtime
