// A plausible synthetic trace of data-parallel (DDP-style) training, deterministic from a seed,
// whose totals are known in closed form: for tests of the metrics, benchmarks and GUI demos.
//
// Per rank and step (all times in ns, relative to the step's start):
//   stream 0 "compute": Data "data_load" (data_ns, plus a uniform [0, jitter_ns] draw per rank and
//     step from the seed), then L Compute spans "layers.<i>.forward" (forward_ns, forward_flops
//     each), then L Compute spans "layers.<i>.backward" in reverse layer order (backward_ns,
//     backward_flops each), then one Optimizer span "optimizer" (optimizer_ns, no FLOPs);
//   stream 1 "comm": gradient buckets of k = layers_per_bucket layers, nb = L / k of them, in
//     backward order; bucket j is ready when the backward of its last layer ends and runs as one
//     Collective all_reduce "all_reduce" on communicator 0 ("world", all ranks) with
//     bytes = k·grad_bytes_per_layer, seq = step·nb + j. The all-reduce is synchronous: it starts
//     on each rank when the bucket is ready there and the previous bucket is done, and it ends on
//     every rank c = k·comm_ns_per_layer after the last rank started it. The optimizer starts after
//     the last bucket. The next step starts when the optimizer ends;
//   stream 2 "phases": Phase spans "step", "forward", "backward" (first backward start to last
//     backward end) and "optimizer";
//   counters per rank: "mem.parameters" = L·grad_bytes_per_layer and "mem.optimizer" = twice that
//     (Adam moments), sampled at each step start; "mem.activations" = L·activation_bytes_per_layer
//     at forward end and 0 at backward end; "mem.gradients" = L·grad_bytes_per_layer at backward
//     end and 0 at optimizer end (zero_grad), 0 at step start.
//
// Closed forms with jitter_ns = 0 and straggler_delay_ns = 0 (f = forward_ns, b = backward_ns,
// o = optimizer_ns, d = data_ns, c = k·comm_ns_per_layer, nb = L/k, R ranks, S steps):
//   compute per step and rank   = L·(f + b) + o
//   comm per step and rank      = nb·c
//   exposed comm per step, rank = c + (nb−1)·max(0, c − k·b)   (only the last bucket when c <= k·b)
//   overlap per step and rank   = nb·c − exposed
//   step time                   = d + L·(f + b) + exposed + o   (every step, on every rank)
//   idle per step and rank      = d
//   all-reduce bytes per step   = L·grad_bytes_per_layer per rank; nb calls per rank and step
//   algbw = grad_bytes_per_layer / comm_ns_per_layer GB/s; busbw = algbw · 2(R−1)/R
//   FLOPs per step              = R·L·(forward_flops + backward_flops) (=
//   meta.model_flops_per_step) peak memory per rank        = 3·P +
//   L·max(activation_bytes_per_layer, grad_bytes_per_layer),
//                                 P = L·grad_bytes_per_layer
//   spans                       = R·S·(2L + nb + 6); counters = R·S·7
// A straggler rank (straggler_rank >= 0) loads its data straggler_delay_ns longer every step, so
// it arrives late at every all-reduce and the other ranks wait inside theirs.
//
// Pipeline mode (pp > 1; GPipe): rank r is stage i = r % pp of pipeline d = r / pp (dp = R / pp
// pipelines), holding Ls = L / pp layers; m = micro_batches. Per stage and micro-batch the forward
// takes F = Ls·f and the backward B = Ls·b (one span per layer, `micro_batch` set). After data
// loading (d, every rank) stage i runs forward j at d + (i+j)·F, and backward j at
// T + (pp−1−i+j)·B, T = d + (m+pp−1)·F. Activations and gradients pass between stages as
// zero-length P2P send/recv spans (an ideal link) on stream 1, on communicator "pp[dp=d]". After
// its last backward, at E_i = T + (pp−1−i+m)·B, a stage all-reduces its gradients over its dp group
// "dp[pp=i]" in Ls/k back-to-back buckets of c each (none when dp = 1), then runs the optimizer.
// All ranks start the next step together when stage 0's optimizer ends. Jitter and stragglers
// are not supported in this mode. Closed forms per rank and step (C = (Ls/k)·c, 0 when dp = 1):
//   step time = d + (m+pp−1)·(F+B) + C + o        compute = m·(F+B) + o
//   comm = exposed comm = C (overlap 0)           idle = bubble = d + (pp−1)·(F+B)
//   so with d = C = o = 0 the bubble is (pp−1)/(m+pp−1) of the step (GPipe's closed form);
//   FLOPs per step = dp·m·L·(forward_flops + backward_flops)
//   peak memory per rank = 3·Ls·g + max(m·Ls·activation_bytes_per_layer, Ls·g), g = grad bytes
//   spans per step = R·(2·m·Ls + 6 + [dp>1]·Ls/k) + dp·4·m·(pp−1)
#pragma once

#include <cstdint>

#include "orrery/traces/trace.hpp"

namespace orrery::traces {

struct SynthOptions {
  int32_t ranks = 4;
  int32_t steps = 10;
  int32_t layers = 12;
  int32_t layers_per_bucket = 2;  // must divide layers
  uint64_t seed = 1;
  int64_t data_ns = 200'000;
  int64_t forward_ns = 1'000'000;   // per layer
  int64_t backward_ns = 2'000'000;  // per layer
  int64_t optimizer_ns = 500'000;
  int64_t comm_ns_per_layer = 1'500'000;  // all-reduce time per layer's gradients
  int64_t grad_bytes_per_layer = 12LL << 20;
  int64_t activation_bytes_per_layer = 32LL << 20;
  double forward_flops = 2.0e9;    // per layer
  double backward_flops = 4.0e9;   // per layer
  int64_t tokens_per_step = 0;     // meta.tokens_per_step; 0 -> ranks * 8 * 1024
  double peak_flops_per_rank = 0;  // meta.peak_flops_per_rank
  int64_t jitter_ns = 0;           // uniform extra data-loading time per rank and step
  int32_t straggler_rank = -1;     // a rank that is consistently late, -1 for none
  int64_t straggler_delay_ns = 0;
  int32_t pp = 1;             // pipeline stages (must divide ranks and layers)
  int32_t micro_batches = 4;  // per step, in pipeline mode
};

// The closed forms above, per rank and step (exact when jitter_ns = 0 and there is no straggler).
struct SynthTotals {
  int64_t compute_ns = 0;
  int64_t comm_ns = 0;
  int64_t exposed_comm_ns = 0;
  int64_t overlap_ns = 0;
  int64_t idle_ns = 0;
  int64_t step_ns = 0;
  int64_t allreduce_bytes = 0;   // per rank and step
  int64_t allreduce_calls = 0;   // per rank and step
  double flops = 0;              // per step, all ranks
  double peak_memory_bytes = 0;  // per rank, sum of the categories
  int64_t bubble_ns = 0;         // per rank and step, pipeline mode (0 when pp = 1)
};
SynthTotals synth_totals(const SynthOptions& o);

// Spans the options produce: ranks · steps · (2·layers + layers/layers_per_bucket + 6) when
// pp = 1; see the pipeline formula above otherwise.
int64_t synth_span_count(const SynthOptions& o);
// The number of steps that reaches at least `target_spans` with the other options unchanged.
int32_t synth_steps_for_spans(const SynthOptions& o, int64_t target_spans);

// Estimated bytes the generator allocates for the options (spans, counters, interned layer names,
// ranks and streams, the schedule), in double (absurd options overflow int64).
double synth_memory_bytes(const SynthOptions& o);
// Throws InputError, naming --ranks, --steps and --layers (and --pp, --micro-batches), when
// synth_memory_bytes(o) exceeds `memory_bytes`, 0 meaning this machine's physical memory
// (sysconf): a request for 2^31 layers fails here at once instead of after gigabytes of
// allocations. synthesize() checks it first.
void check_synth_size(const SynthOptions& o, int64_t memory_bytes = 0);

// Throws InputError for impossible options (non-positive counts, layers % layers_per_bucket != 0,
// negative durations, straggler_rank out of range, pp not dividing ranks and layers) and for a trace larger than physical memory
// (check_synth_size). Spans come
// sorted by (rank, stream, start).
Trace synthesize(const SynthOptions& o);

}  // namespace orrery::traces
