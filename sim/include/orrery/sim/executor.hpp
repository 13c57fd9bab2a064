// The executor: runs the workload's op programs of a set of simulated ranks on the event engine.
//
// Each stream of a rank runs its ops in program order; an op starts when its stream is free and its
// deps (same rank) are done. Compute ops take the cost model's time. A collective starts on the
// network model once every simulated member of its group has reached it; members that are not
// simulated are, by the symmetry argument of workload.hpp, identical to a simulated representative
// and arrive at the same time, so they never hold a collective back. The network times the
// collective over the FULL group (all its GPUs on the cluster's topology). A send and its matching
// receive (k-th send of a rank to a peer = k-th receive of the peer from it) transfer once both are
// posted; with an unsimulated peer, when this side posts.
//
// By default the simulated ranks are one representative per pipeline stage (dp = 0, tp = 0): every
// other rank runs the same program with the same timing. What this leaves out: contention between
// the collectives of symmetric groups on shared links (on a rail-optimized fat-tree whose rails
// each fit one leaf these use disjoint NICs and rails; elsewhere run with all_ranks to see it, which
// `orrery sim` does by default where replica_contention_matters, sim_target.hpp).
//
// Rail symmetry (all_ranks, exact). When each tp group is one node's GPUs (tp = gpus per node, tp
// rank = local index) on a fabric whose rails are exact copies (Topology::rails_are_copies: a
// rail-optimized fat-tree), tp rank t of every group talks to the other nodes only over rail t: its
// dp, pp, embedding, ep and edp groups hold the GPUs of local index t. Rail t's traffic then shares
// no link with rail 0's and meets exactly the contention rail 0's meets, so every tp rank of a
// group reaches every op at the same nanosecond, and the tp collectives, the only traffic between
// rails, start when tp rank 0 arrives as they would when the last of them does. "Every rank" then
// simulates the ranks of tp rank 0 (1/tp of them) and their traffic on rail 0; the others'
// timelines are copies (ExecResult::copies). Not with the ranks' or the ops' spread (rank_jitter,
// op_jitter, which tell the tp ranks apart) or core sharing. tests/sim/test_executor.cpp checks
// every op's times against the literal simulation (rail_symmetry = false).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "orrery/sim/cluster.hpp"
#include "orrery/sim/collectives.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/sim/network.hpp"
#include "orrery/sim/workload.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::sim {

struct ExecutorOptions {
  NetworkModel network = NetworkModel::Flow;
  bool all_ranks = false;      // simulate every rank (contention between symmetric groups)
  std::vector<int32_t> ranks;  // explicit simulated ranks (overrides the default and all_ranks)
  // Collective alpha-beta overrides (HardwareProfile::collectives), applied before the network.
  const HardwareProfile* profile = nullptr;
  // Replaces the network entirely (tests): the duration of each collective or transfer.
  std::function<int64_t(const CollectiveRequest&)> comm_time;
  // Ranks of a node sharing its cores (calibrated CPU profiles, core_sharing.hpp): the node's cores are
  // a processor-sharing server. A compute op's duration is then its time on a lone rank; while n ranks
  // of the node compute at once, each progresses at 1 / compute_slowdown(sharing, n), re-rated
  // whenever one starts or finishes. Ranks waiting for a transfer or collective do not count, which
  // is what makes a pipeline's idle stages free their cores. Every rank is simulated (the count of
  // busy ranks needs them all). Null or cores == 0: fixed durations.
  const CoreSharing* core_sharing = nullptr;
  // HardwareProfile::rank_jitter: rank r's compute in step s runs (1 + rank_jitter · q) times its
  // time, q = expected_normal_order_statistics(simulated ranks)[(r + s) mod ranks]. Applied only
  // when every rank is simulated (all_ranks or core sharing); 0 = none.
  double rank_jitter = 0;
  // HardwareProfile::op_jitter: a collective starts σ · E[max of its n members' normals] after the
  // last member arrived, σ² = the members' mean variance Σ (op_jitter · d)² over the compute ops
  // (times d) each ran since its previous collective. Only when every rank is simulated; 0 = none.
  double op_jitter = 0;
  // HardwareProfile::comm_compute_share: the share of a GPU's compute that its own NCCL kernels take
  // while they run (NCCL runs one CTA per channel on an SM of its own). While a rank has a
  // collective or transfer in flight (from its start on the network to its end), the rank's compute
  // ops progress at (1 - comm_compute_share) of their rate, re-rated whenever one starts or ends;
  // communication itself is not slowed. 0 = none. Not with core sharing (CPU profiles).
  double comm_compute_share = 0;
  // Flow network: re-rate whole connected components on every change (make_network's reference,
  // for tests) instead of the flows connected to it through saturated links.
  bool flow_whole_components = false;
  // With all_ranks: simulate tp rank 0 of each group and copy its timeline to its tp peers where
  // that is exact (rail_symmetry_applies, above); false simulates every rank literally.
  bool rail_symmetry = true;
};

// E[Z_(i)], i = 1..n, of n independent standard normals, ascending (numerical integration of the
// order statistics' densities, within 1e-6 of the tabulated values); {0} for n = 1.
std::vector<double> expected_normal_order_statistics(int n);

struct OpTiming {
  int64_t start_ns = -1;  // the rank reached the op (stream free, deps done)
  int64_t active_ns =
      -1;  // communication: every member arrived and the transfer began; compute: start
  int64_t end_ns = -1;
};

struct RankRun {
  int32_t rank = 0;
  Layout::Coord coord{};
  const StageProgram* program = nullptr;
  std::vector<OpTiming> ops;  // indexed like program->ops
};

struct ExecResult {
  std::vector<RankRun> ranks;  // in rank order
  // With the rail symmetry: every rank not simulated, whose timeline is an exact copy of a simulated
  // rank's (its tp rank 0), as (rank, index into `ranks`), in rank order. Empty otherwise.
  std::vector<std::pair<int32_t, int32_t>> copies;
  int64_t makespan_ns = 0;
  uint64_t events = 0;  // engine events processed
  NetworkStats network;
};

// The ranks simulated by default: one per pipeline stage (dp = 0, tp = 0), or all.
std::vector<int32_t> representative_ranks(const Layout& l, bool all_ranks);

// Whether the layout on this cluster has the rail symmetry (above): tp > 1 equals the GPUs per node,
// every tp group is one node with tp rank = local index, and the fabric's rails are exact copies.
bool rail_symmetry_applies(const Layout& l, const Cluster& c);

// Whether execute() with `opt` simulates tp rank 0 of each group for its tp peers (the rail symmetry
// above): every rank asked for (all_ranks, no explicit ranks), rail_symmetry on, no core sharing,
// no jitter, and rail_symmetry_applies. check_simulation_size (sweep.hpp) sizes the run by it.
bool rail_copies_apply(const Layout& l, const Cluster& c, const ExecutorOptions& opt);

// The pipeline stage that a point-to-point op of `role` (PPNext, PPPrev) on `stage` talks to, modulo
// pp (the interleaved schedule's last stage sends to stage 0 and back).
int pp_peer(const Layout& l, int stage, GroupRole role);

// The global ranks (= GPU ids) of the group `role` of `rank`, in communicator-rank order. `ep`
// (parallel.ep) defines the EP and EDP groups (model/moe.hpp): the ep consecutive dp ranks from
// d - d % ep, and the dp ranks d % ep, d % ep + ep, ...
std::vector<int32_t> group_members(const Layout& l, int rank, GroupRole role, int ep = 1);

// Runs the workload. The cluster needs at least layout.world() GPUs; rank r runs on GPU r. Throws
// InternalError if the programs deadlock (a bug), InputError if the cluster is too small.
ExecResult execute(const Workload& w, const Cluster& cluster, const ExecutorOptions& opt = {});

// The simulated trace (source = sim): one span per op of each simulated rank, phase spans ("step",
// "forward" and "backward" per micro-batch, "optimizer"), the communicators of the simulated ranks,
// rank coordinates, streams, and run metadata (tokens, model FLOPs, device peak).
traces::Trace make_trace(const Workload& w, const ExecResult& r, const Cluster& cluster,
                         double peak_flops_per_rank);

}  // namespace orrery::sim
