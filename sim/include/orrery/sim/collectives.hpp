// Collective algorithms, described as what they put on the network: a sequence of phases, each a set
// of concurrent steady flows (source GPU, destination GPU, bytes) plus a number of latency steps. Both
// network models (analytical and flow-level) execute these plans. What each level captures is in
// sim/README.md; e.g. a ring all-reduce is one phase of flows of 2(n-1)/n * S/c bytes on every ring
// edge of each of c channels, with 2(n-1) latency steps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "orrery/sim/cluster.hpp"
#include "orrery/traces/span.hpp"

namespace orrery::sim {

enum class Algorithm {
  Auto,  // chosen per op, size and topology like NCCL's tuner (see choose_algorithm)
  Ring,
  Tree,  // NCCL's double binary tree (all-reduce); a pipelined binary tree (broadcast, reduce)
  HalvingDoubling,  // recursive halving (reduce-scatter) + recursive doubling (all-gather); 2^k ranks
  Direct,           // every pair exchanges directly (all-to-all; also all-gather/reduce-scatter)
  Hierarchical,     // intra-node reduce-scatter, inter-node all-reduce, intra-node all-gather
  Nvls,             // NVLink SHARP all-reduce: the NVSwitch reduces and multicasts (one node)
  NvlsTree,  // NVLS inside each node, a double binary tree of each GPU's 1/g share between nodes
};
std::string_view to_string(Algorithm a);
std::optional<Algorithm> algorithm_from_string(
    std::string_view s);  // auto, ring, tree, hd, direct, hier...

// One collective (or a point-to-point transfer) on a set of GPUs.
struct CollectiveRequest {
  traces::CollOp op = traces::CollOp::AllReduce;
  std::vector<int32_t> members;  // global GPU ids in communicator-rank order; Send/Recv: {src, dst}
  int64_t bytes = 0;             // nccl-tests' size: all-reduce/broadcast/reduce/send the buffer;
                                 // all-gather/reduce-scatter the full (n-chunk) buffer; all-to-all
                                 // each rank's whole send buffer (n chunks of bytes/n)
  Algorithm algo = Algorithm::Auto;
  int channels = 0;                    // 0: the cluster's default (see effective_channels)
  int32_t root = 0;                    // broadcast/reduce root, index into members
  Protocol protocol = Protocol::Auto;  // NCCL protocol (only with the cluster's nccl model)
};

struct FlowSpec {
  int32_t src = 0;  // global GPU id
  int32_t dst = 0;
  double bytes = 0;     // bytes each unit flow carries
  double weight = 1.0;  // identical unit flows aggregated (same route, same bytes): channels
};

struct Phase {
  std::vector<FlowSpec> flows;  // start together; the phase ends when all are done
  int32_t latency_steps = 0;  // the phase also costs latency_steps * alpha, alpha = a path latency
                              // of its flows + cluster.coll.step_latency_ns: the longest path, or
  bool pipelined = false;     // when pipelined (rings, chains, trees: data passes every edge in
                              // turn), the mean over its flows (weighted), which on a ring makes
                              // steps * alpha the sum of the edge latencies each byte meets
};

struct CollectivePlan {
  Algorithm algo = Algorithm::Ring;      // resolved (never Auto)
  Protocol protocol = Protocol::Simple;  // resolved (never Auto); Simple without the nccl model
  int channels = 1;
  std::vector<Phase> phases;  // run one after another
};

// Channels used for a request: req.channels, else cluster.coll.channels, else gpus_per_node when the
// members span several nodes and 1 otherwise... (see README); clamped to >= 1.
int effective_channels(const Cluster& c, const CollectiveRequest& req);

// The channels NCCL runs a collective on (enqueue.cc): from the cluster's channel count it drops
// channels while bytes < channels * threads * threshold (thresholds per thread: LL 8 B times the
// ranks for rings, LL128 8 B, Simple 64 B; threads LL 512, LL128 640, Simple 512); NVLS and the NVLS
// tree use NCCL's 16 NVLS channels. Without the nccl model: effective_channels.
int nccl_channels(const Cluster& c, const CollectiveRequest& req, Algorithm algo, Protocol proto);

// The protocols Auto chooses among: LL, LL128 and Simple with the nccl model (Simple only for NVLS
// and halving-doubling, direct and hierarchical), else Simple.
std::vector<Protocol> candidate_protocols(const Cluster& c, Algorithm algo);

// The algorithms Auto chooses among, best guess first: ring and tree for an all-reduce whose members
// span several nodes (NCCL uses trees only between nodes), ring for other all-reduces, all-gather,
// reduce-scatter, broadcast and reduce, direct for all-to-all and send/recv; NVLS first for an
// all-reduce inside one node when the nccl model enables it.
std::vector<Algorithm> candidate_algorithms(const Cluster& c, const CollectiveRequest& req);

// The algorithm Auto resolves to: like NCCL's tuner, the candidate with the lowest analytical
// estimate at this size (ties to the first candidate).
Algorithm choose_algorithm(const Cluster& c, const CollectiveRequest& req);

// Throws InputError for an algorithm the op does not support, members out of range or repeated, a
// non-power-of-two halving-doubling, an empty group.
CollectivePlan plan_collective(const Cluster& c, const CollectiveRequest& req);

}  // namespace orrery::sim
