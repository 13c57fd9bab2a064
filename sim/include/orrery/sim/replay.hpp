// Trace replay (the approach of Daydream and Lumos): rebuild the dependency graph of a recorded run
// from its trace, then re-simulate it with other timings — another device, another network, or the
// same machine (identity).
//
// The graph. Nodes are the trace's work spans (every kind but Phase). Edges:
//   - stream order: each (rank, stream) runs its spans in recorded order;
//   - cross-stream waits: a span whose recorded start came after the end of its stream predecessor
//     waited for something; it depends on the latest span of another stream of the same rank that
//     ended after that predecessor and at or before its start (a bucket all-reduce waits for the
//     backward op that made its gradients; the optimizer for the last all-reduce; a compute piece
//     for the tensor-parallel all-reduce before it). A span that started right after its own stream
//     predecessor gets no such edge, so ops that merely happened to follow others stay free;
//   - collectives: spans of one communicator with one sequence number are one collective; it starts
//     when its last member arrives;
//   - point-to-point: the k-th send of rank a to b and the k-th recv of b from a are one transfer.
// Each span keeps its recorded launch gap (start minus the end of whatever it waited for), the host
// time between ops, so replaying with recorded durations gives back the recorded timeline exactly.
//
// Timing in the replay:
//   compute, optimizer, data, memcpy: recorded duration × compute_scale (the device ratio: source
//     peak / target peak for spans with FLOPs, source / target memory bandwidth for the others), or
//     the identity;
//   collectives and transfers: the recorded transfer time (after the last member arrived) for the
//     identity, else the target cluster's network model (analytical or flow-level, with the
//     profile's collective overrides), on the same ranks (rank r on GPU r).
// What it leaves out: a change of scale (more data-parallel ranks) needs a new graph; `orrery sim`
// builds that from the scenario.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "orrery/sim/cluster.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/sim/network.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::sim {

struct ReplayOptions {
  bool identity = false;          // recorded durations and transfer times (the graph check)
  double compute_flops_scale = 1; // duration multiplier of spans with FLOPs
  double compute_bytes_scale = 1; // duration multiplier of other compute-like spans
  NetworkModel network = NetworkModel::Flow;
  const HardwareProfile* profile = nullptr;  // collective overrides (applied before the network)
};

struct ReplayStep {
  int32_t step = 0;
  int64_t recorded_ns = 0;  // max end − min start over ranks of the step's spans
  int64_t replayed_ns = 0;
};

struct ReplayResult {
  traces::Trace trace;              // the replayed trace (source = sim), same spans, new times
  std::vector<ReplayStep> steps;
  int64_t recorded_step_ns = 0;     // median over the steps after the first (all steps if only one)
  int64_t replayed_step_ns = 0;
  int64_t recorded_makespan_ns = 0;
  int64_t replayed_makespan_ns = 0;
  size_t nodes = 0;                 // spans in the graph
  size_t edges = 0;                 // dependency edges (stream order and cross-stream)
  size_t collectives = 0;           // matched collectives
  size_t transfers = 0;             // matched send/recv pairs
  size_t unmatched = 0;             // communication spans without all their partners (timed alone)
};

// Replays `t` on `cluster` (which needs at least as many GPUs as the trace has ranks; ignored with
// identity timing). Throws InputError for an empty trace or a cluster too small.
ReplayResult replay(const traces::Trace& t, const Cluster& cluster, const ReplayOptions& opt);

// The device ratio of `from` to `to` (peak FLOP/s and memory bandwidth, in the profile's precision):
// sets compute_flops_scale = from_peak / to_peak and compute_bytes_scale = from_bw / to_bw.
void set_device_ratio(ReplayOptions& opt, double from_peak_flops, double from_bandwidth, double to_peak_flops,
                      double to_bandwidth);

}  // namespace orrery::sim
