// The trace model shared by everything: spans, counters, communicators, ranks, run metadata.
// Time is int64_t nanoseconds everywhere, real and simulated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace orrery::traces {

enum class SpanKind : int32_t {
  Compute = 0,     // a kernel / a layer's forward or backward work
  Collective = 1,  // all-reduce, reduce-scatter, all-gather, broadcast, all-to-all, barrier
  P2P = 2,         // send / recv
  Memcpy = 3,      // host<->device, device<->device copies, memset
  Phase = 4,       // named ranges: step, forward, backward, optimizer, user ranges
  Data = 5,        // data loading
  Optimizer = 6,   // optimizer update work (counted as compute by the metrics)
  Other = 7,
};
inline constexpr int kSpanKindCount = 8;
std::string_view to_string(SpanKind k);
std::optional<SpanKind> span_kind_from_string(std::string_view s);

// The collective or transfer operation of a Collective/P2P span (None for other kinds).
enum class CollOp : int32_t {
  None = 0,
  AllReduce = 1,
  ReduceScatter = 2,
  AllGather = 3,
  Broadcast = 4,
  Reduce = 5,
  AllToAll = 6,
  Send = 7,
  Recv = 8,
  Barrier = 9,
};
std::string_view to_string(CollOp op);
std::optional<CollOp> coll_op_from_string(std::string_view s);
// nccl-tests bus-bandwidth factor for an op over n ranks: all-reduce 2(n-1)/n; reduce-scatter,
// all-gather, all-to-all (n-1)/n (on the total size); broadcast, reduce, send/recv 1; barrier 0.
double busbw_factor(CollOp op, int n);

using NameId = uint32_t;  // index into the trace's string table

struct Span {
  int32_t rank = 0;
  int32_t stream = 0;  // stream id within the rank (see StreamInfo)
  SpanKind kind = SpanKind::Compute;
  NameId name = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int32_t step = -1;         // training step, -1 when not in a step
  int32_t micro_batch = -1;  // -1 when not applicable
  int32_t layer = -1;        // -1 when not applicable
  int64_t bytes = 0;  // payload bytes (collectives: per-rank buffer size as nccl-tests' size)
  double flops = 0;   // floating-point operations of the work
  int32_t comm = -1;  // communicator id (CommunicatorInfo::id), -1 when none
  int32_t peer = -1;  // peer rank (global) for send/recv, root for broadcast/reduce
  int64_t seq = -1;   // sequence number of the operation within its communicator
  CollOp op = CollOp::None;

  int64_t duration_ns() const { return end_ns - start_ns; }
};

// A time series sample, e.g. memory bytes per category.
struct CounterSample {
  int32_t rank = 0;
  NameId name = 0;  // e.g. "mem.parameters", "mem.activations"
  int64_t ts_ns = 0;
  double value = 0;
};

struct StreamInfo {
  int32_t rank = 0;
  int32_t stream = 0;
  std::string name;  // "compute", "comm", "cuda stream 7", ...
};

struct RankInfo {
  int32_t rank = 0;
  std::string host;
  std::string device;              // "cpu", "cuda:0"
  int32_t dp = 0, tp = 0, pp = 0;  // coordinates in the dp/tp/pp grid
};

enum class CommKind : int32_t { World = 0, DP = 1, TP = 2, PP = 3, Other = 4 };
std::string_view to_string(CommKind k);
std::optional<CommKind> comm_kind_from_string(std::string_view s);

struct CommunicatorInfo {
  int32_t id = 0;
  CommKind kind = CommKind::World;
  std::string name;            // "dp[tp=0,pp=1]"
  std::vector<int32_t> ranks;  // member global ranks, in communicator-rank order
};

enum class TraceSource : int32_t { Real = 0, Sim = 1, Import = 2, Synth = 3 };
std::string_view to_string(TraceSource s);
std::optional<TraceSource> trace_source_from_string(std::string_view s);

// What made the trace, finer than TraceSource (meta key "origin"): a training run, a commbench
// sweep (collectives only, runtime/commbench.hpp), a simulation or replay, a synthetic trace, an
// import. Unknown in traces written before the key existed whose extra_json says nothing of it.
enum class TraceOrigin : int32_t {
  Unknown = 0,
  Run = 1,
  Commbench = 2,
  Sim = 3,
  Replay = 4,
  Synth = 5,
  Import = 6
};
std::string_view to_string(TraceOrigin o);
std::optional<TraceOrigin> trace_origin_from_string(std::string_view s);

// The layout of the run (real: the scenario's; simulated: what was simulated). Empty strings and 0
// when the producer does not know (imports, synthetic traces, older traces).
struct RunLayout {
  int32_t zero = 0;           // ZeRO stage 0..3
  int32_t micro_batches = 0;  // per replica per step; 0 = unknown
  std::string schedule;       // gpipe | 1f1b | interleaved
  std::string placement;      // parallel.placement, fastest-varying first ("tp,dp,pp")
  std::string recompute;      // none | selective | full
  std::string device;         // real: cpu | cuda; simulated: the cluster's device preset
  std::string precision;      // real: fp32 | tf32 | bf16; simulated: fp32 | mixed
  bool operator==(const RunLayout&) const = default;
};
// "zero 1, 1f1b, 8 micro-batches, recompute full, placement tp,dp,pp, cuda bf16": the known
// fields, in that order; "" when none is known.
std::string describe(const RunLayout& l);

// A run that did not finish (the launcher marks the merged remains of a run a rank died in).
struct RunFailure {
  bool failed = false;
  std::vector<int32_t> lost_ranks;  // ranks that died or never reported; empty when unknown
  int32_t step = -1;                // the step in progress, -1 in set-up or when unknown
  std::string message;              // the launcher's account of what happened
  bool operator==(const RunFailure&) const = default;
};

struct RunMeta {
  TraceSource source = TraceSource::Real;
  TraceOrigin origin = TraceOrigin::Unknown;
  std::string scenario_text;  // YAML of the scenario (after overrides)
  std::string scenario_name;
  std::string host;
  int64_t start_time_unix_ns = 0;
  int32_t world_size = 1;
  int32_t dp = 1, tp = 1, pp = 1;
  int64_t tokens_per_step = 0;      // global tokens processed per training step (0 when unknown)
  double model_flops_per_step = 0;  // model FLOPs per step over all ranks (for MFU), 0 when unknown
  double peak_flops_per_rank = 0;   // device peak for MFU, 0 when unknown
  RunLayout layout;
  RunFailure failure;
  std::string extra_json = "{}";  // anything else as a JSON object (built with a JSON library)
};

// A collectives-only trace of `orrery commbench` (runtime/commbench.hpp): origin Commbench, or,
// in a RunMeta built before the origin key was read, extra_json's "kind": "commbench".
bool is_commbench(const RunMeta& m);

}  // namespace orrery::traces
