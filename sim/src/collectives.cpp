// Collective algorithms as phases of steady flows (see collectives.hpp and sim/README.md).
#include "orrery/sim/collectives.hpp"

#include <algorithm>
#include <cctype>
#include <unordered_map>
#include <unordered_set>

#include "orrery/common/error.hpp"
#include "orrery/sim/network.hpp"

namespace orrery::sim {

using traces::CollOp;

std::string_view to_string(Algorithm a) {
  switch (a) {
    case Algorithm::Auto:
      return "auto";
    case Algorithm::Ring:
      return "ring";
    case Algorithm::Tree:
      return "tree";
    case Algorithm::HalvingDoubling:
      return "halving-doubling";
    case Algorithm::Direct:
      return "direct";
    case Algorithm::Hierarchical:
      return "hierarchical";
    case Algorithm::Nvls:
      return "nvls";
    case Algorithm::NvlsTree:
      return "nvls-tree";
  }
  return "?";
}

std::optional<Algorithm> algorithm_from_string(std::string_view s) {
  std::string l(s);
  for (char& ch : l) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (l == "auto") return Algorithm::Auto;
  if (l == "ring") return Algorithm::Ring;
  if (l == "tree" || l == "dbtree" || l == "double-binary-tree") return Algorithm::Tree;
  if (l == "hd" || l == "halving-doubling" || l == "rhd" || l == "recursive-halving-doubling")
    return Algorithm::HalvingDoubling;
  if (l == "direct") return Algorithm::Direct;
  if (l == "hier" || l == "hierarchical") return Algorithm::Hierarchical;
  if (l == "nvls" || l == "nvlink-sharp") return Algorithm::Nvls;
  if (l == "nvls-tree" || l == "nvlstree") return Algorithm::NvlsTree;
  return std::nullopt;
}

namespace {

// Accumulates flows of one phase, aggregating identical (src, dst, bytes) entries into weights.
class PhaseBuilder {
 public:
  void add(int32_t src, int32_t dst, double bytes, double weight = 1.0) {
    if (src == dst || bytes <= 0) return;
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(src)) << 32) | static_cast<uint32_t>(dst);
    auto [it, inserted] = index_.try_emplace(key, phase_.flows.size());
    if (inserted) {
      phase_.flows.push_back(FlowSpec{src, dst, bytes, weight});
    } else {
      FlowSpec& f = phase_.flows[it->second];
      if (f.bytes == bytes) {
        f.weight += weight;
      } else {  // same pair, different size (never in the built-in algorithms): keep both
        phase_.flows.push_back(FlowSpec{src, dst, bytes, weight});
      }
    }
  }
  Phase take(int32_t steps, bool pipelined = false) {
    phase_.latency_steps = steps;
    phase_.pipelined = pipelined;
    index_.clear();
    return std::move(phase_);
  }

 private:
  Phase phase_;
  std::unordered_map<uint64_t, size_t> index_;
};

// Members grouped by node, in order of first appearance; members keep their order within a node.
std::vector<std::vector<int32_t>> by_node(const Cluster& c, const std::vector<int32_t>& m) {
  std::vector<std::vector<int32_t>> groups;
  std::unordered_map<int, size_t> idx;
  for (int32_t g : m) {
    auto [it, ins] = idx.try_emplace(c.node_of(g), groups.size());
    if (ins) groups.emplace_back();
    groups[it->second].push_back(g);
  }
  return groups;
}

// Ring order of channel ch: nodes in order, each node's GPUs rotated by ch, so that channel ch
// crosses between nodes on a different GPU (and NIC) of each node, as NCCL's rings do.
std::vector<int32_t> ring_order(const std::vector<std::vector<int32_t>>& groups, int ch) {
  std::vector<int32_t> o;
  for (const auto& g : groups) {
    const size_t r = static_cast<size_t>(ch) % g.size();
    for (size_t i = 0; i < g.size(); ++i) o.push_back(g[(i + r) % g.size()]);
  }
  return o;
}

bool is_pow2(size_t n) { return n && !(n & (n - 1)); }

// NCCL's in-order binary tree over n positions (ncclGetBtree): parent of position r, -1 for the
// root.
int btree_parent(int n, int r) {
  if (r == 0) return -1;
  int bit = 1;
  while (bit < n && !(bit & r)) bit <<= 1;
  int up = (r ^ bit) | (bit << 1);
  if (up >= n) up = r ^ bit;
  return up;
}

// Double binary tree: tree 1 is tree 0 mirrored (even n) or shifted by one (odd n), so that most
// ranks are interior in at most one tree.
int dtree_parent(int n, int r, int tree) {
  if (tree == 0) return btree_parent(n, r);
  if (n % 2 == 0) {
    const int p = btree_parent(n, n - 1 - r);
    return p < 0 ? -1 : n - 1 - p;
  }
  const int p = btree_parent(n, (r - 1 + n) % n);
  return p < 0 ? -1 : (p + 1) % n;
}

int tree_depth(int n, int tree) {
  int depth = 0;
  for (int r = 0; r < n; ++r) {
    int d = 0;
    for (int p = dtree_parent(n, r, tree); p >= 0; p = dtree_parent(n, p, tree)) ++d;
    depth = std::max(depth, d);
  }
  return depth;
}

void add_ring(PhaseBuilder& b, const std::vector<int32_t>& o, double bytes, double weight = 1.0) {
  const size_t n = o.size();
  if (n < 2) return;
  for (size_t i = 0; i < n; ++i) b.add(o[i], o[(i + 1) % n], bytes, weight);
}

void validate(const Cluster& c, const CollectiveRequest& r) {
  if (r.members.empty()) throw InputError("collective with no members");
  if (r.bytes < 0) throw InputError("collective size must be >= 0 bytes");
  std::unordered_set<int32_t> seen;
  for (int32_t g : r.members) {
    if (g < 0 || g >= c.num_gpus()) {
      throw InputError("collective member GPU " + std::to_string(g) + " is outside the cluster (" +
                       std::to_string(c.num_gpus()) + " GPUs)");
    }
    if (!seen.insert(g).second)
      throw InputError("collective member GPU " + std::to_string(g) + " appears twice");
  }
  if ((r.op == CollOp::Send || r.op == CollOp::Recv) && r.members.size() != 2) {
    throw InputError("send/recv needs exactly two members {source, destination}");
  }
  if ((r.op == CollOp::Broadcast || r.op == CollOp::Reduce) &&
      (r.root < 0 || r.root >= static_cast<int32_t>(r.members.size()))) {
    throw InputError("broadcast/reduce root " + std::to_string(r.root) + " is not a member index");
  }
}

[[noreturn]] void unsupported(CollOp op, Algorithm a) {
  throw InputError("algorithm '" + std::string(to_string(a)) + "' does not implement " +
                   std::string(traces::to_string(op)));
}

}  // namespace

int effective_channels(const Cluster& c, const CollectiveRequest& req) {
  if (req.channels > 0) return req.channels;
  if (c.coll.channels > 0) return c.coll.channels;
  bool multi_node = false;
  for (int32_t g : req.members)
    multi_node = multi_node || c.node_of(g) != c.node_of(req.members.front());
  return multi_node ? c.gpus_per_node : 1;
}

namespace {

// What every algorithm's planner reads: the request and the quantities derived from it once.
struct PlanInput {
  const CollectiveRequest& req;
  CollOp op;                                // req.op, a barrier planned as an all-reduce
  int channels;                             // C, effective_channels
  int n;                                    // members
  double bytes;                             // S
  std::vector<std::vector<int32_t>> nodes;  // members grouped by node (by_node)
};

// Members rotated so the root comes first (broadcast, reduce).
std::vector<int32_t> rooted(const PlanInput& in, const std::vector<int32_t>& o) {
  std::vector<int32_t> r = o;
  auto it = std::find(r.begin(), r.end(), in.req.members[in.req.root]);
  std::rotate(r.begin(), it, r.end());
  return r;
}

// One pipelined phase over every channel's ring: the ring all-reduce, reduce-scatter and
// all-gather, a chain from or towards the root for broadcast and reduce.
std::vector<Phase> plan_ring(const PlanInput& in) {
  const int C = in.channels, n = in.n;
  const double Sc = in.bytes / C;
  const CollOp op = in.op;
  PhaseBuilder b;
  int steps = 0;
  for (int ch = 0; ch < C; ++ch) {
    const auto o = ring_order(in.nodes, ch);
    switch (op) {
      case CollOp::AllReduce:
        add_ring(b, o, 2.0 * (n - 1) / n * Sc);
        steps = 2 * (n - 1);
        break;
      case CollOp::ReduceScatter:
      case CollOp::AllGather:
        add_ring(b, o, 1.0 * (n - 1) / n * Sc);
        steps = n - 1;
        break;
      case CollOp::Broadcast:
      case CollOp::Reduce: {
        // A pipelined chain from the root (broadcast) or towards it (reduce).
        const auto r = rooted(in, o);
        for (int i = 0; i + 1 < n; ++i) {
          if (op == CollOp::Broadcast)
            b.add(r[i], r[i + 1], Sc);
          else
            b.add(r[i + 1], r[i], Sc);
        }
        steps = n - 1;
        break;
      }
      default:
        unsupported(in.req.op, Algorithm::Ring);
    }
  }
  return {b.take(steps, true)};
}

// One pipelined phase over every channel's trees: NCCL's double binary tree for all-reduce (between
// nodes and chained inside them when every node holds the same number of members), a binary tree
// from or towards the root for broadcast and reduce.
std::vector<Phase> plan_tree(const PlanInput& in) {
  const int C = in.channels, n = in.n;
  const double Sc = in.bytes / C;
  const CollOp op = in.op;
  const auto& groups = in.nodes;
  PhaseBuilder b;
  int steps = 0;
  for (int ch = 0; ch < C; ++ch) {
    const auto o = ring_order(groups, ch);
    const int g = static_cast<int>(groups.front().size());
    bool uniform = groups.size() > 1 && g > 1;
    for (const auto& grp : groups) uniform = uniform && static_cast<int>(grp.size()) == g;
    if (op == CollOp::AllReduce && uniform) {
      // NCCL's multi-node tree: a double binary tree between nodes, joined at each node's head
      // GPU (the channel's first, so each channel uses its own NIC), and a chain through the
      // node's GPUs below the head. Every link carries half the data per tree, up and down.
      const int nodes = static_cast<int>(groups.size());
      for (int t = 0; t < 2; ++t)
        for (int k = 0; k < nodes; ++k) {
          const int p = dtree_parent(nodes, k, t);
          if (p < 0) continue;
          b.add(o[k * g], o[p * g], Sc / 2);
          b.add(o[p * g], o[k * g], Sc / 2);
        }
      for (int k = 0; k < nodes; ++k)
        for (int i = 0; i + 1 < g; ++i) {
          b.add(o[k * g + i + 1], o[k * g + i], Sc);  // both trees' halves, reduce
          b.add(o[k * g + i], o[k * g + i + 1], Sc);  // and broadcast
        }
      steps = 2 * (std::max(tree_depth(nodes, 0), tree_depth(nodes, 1)) + g - 1);
    } else if (op == CollOp::AllReduce) {
      // Each tree reduces then broadcasts half the data, pipelined: both directions at once.
      for (int t = 0; t < 2; ++t)
        for (int r = 0; r < n; ++r) {
          const int p = dtree_parent(n, r, t);
          if (p < 0) continue;
          b.add(o[r], o[p], Sc / 2);
          b.add(o[p], o[r], Sc / 2);
        }
      steps = 2 * std::max(tree_depth(n, 0), tree_depth(n, 1));
    } else if (op == CollOp::Broadcast || op == CollOp::Reduce) {
      const auto ro = rooted(in, o);
      for (int r = 1; r < n; ++r) {
        const int p = btree_parent(n, r);
        if (op == CollOp::Broadcast)
          b.add(ro[p], ro[r], Sc);
        else
          b.add(ro[r], ro[p], Sc);
      }
      steps = tree_depth(n, 0);
    } else {
      unsupported(in.req.op, Algorithm::Tree);
    }
  }
  return {b.take(steps, true)};
}

// Recursive halving (reduce-scatter), then the same steps reversed (all-gather by recursive
// doubling): one phase per step.
std::vector<Phase> plan_halving_doubling(const PlanInput& in) {
  const int C = in.channels, n = in.n;
  const double S = in.bytes;
  const CollOp op = in.op;
  const auto& m = in.req.members;
  if (!is_pow2(static_cast<size_t>(n))) {
    throw InputError("halving-doubling needs a power-of-two number of ranks; got " +
                     std::to_string(n));
  }
  if (op != CollOp::AllReduce && op != CollOp::ReduceScatter && op != CollOp::AllGather)
    unsupported(in.req.op, Algorithm::HalvingDoubling);
  // Reduce-scatter by recursive halving: step k exchanges S/2^(k+1) with the rank n/2^(k+1) away.
  std::vector<Phase> rs;
  for (int d = n / 2; d >= 1; d /= 2) {
    PhaseBuilder b;
    const double bytes = S * d / n;  // S/2, S/4, ..., S/n
    for (int r = 0; r < n; ++r) b.add(m[r], m[r ^ d], bytes / C, C);
    rs.push_back(b.take(1));
  }
  std::vector<Phase> phases;
  if (op != CollOp::AllGather)
    for (auto& p : rs) phases.push_back(p);
  if (op != CollOp::ReduceScatter)  // all-gather by recursive doubling: the same steps reversed
    for (auto it = rs.rbegin(); it != rs.rend(); ++it) phases.push_back(*it);
  return phases;
}

// Every pair exchanges directly, in one phase (two for all-reduce: reduce-scatter, all-gather); the
// root sends to or receives from every other member for broadcast and reduce.
std::vector<Phase> plan_direct(const PlanInput& in) {
  const int n = in.n;
  const double S = in.bytes;
  const CollOp op = in.op;
  const auto& req = in.req;
  const auto& m = req.members;
  auto exchange = [&](double bytes) {
    PhaseBuilder b;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) b.add(m[i], m[j], bytes);
    return b.take(1);
  };
  std::vector<Phase> phases;
  switch (op) {
    case CollOp::AllToAll:
    case CollOp::AllGather:
    case CollOp::ReduceScatter:
      phases.push_back(exchange(S / n));
      break;
    case CollOp::AllReduce:
      phases.push_back(exchange(S / n));
      phases.push_back(exchange(S / n));
      break;
    case CollOp::Broadcast:
    case CollOp::Reduce: {
      PhaseBuilder b;
      for (int i = 0; i < n; ++i) {
        if (i == req.root) continue;
        if (op == CollOp::Broadcast)
          b.add(m[req.root], m[i], S);
        else
          b.add(m[i], m[req.root], S);
      }
      phases.push_back(b.take(1));
      break;
    }
    default:
      unsupported(req.op, Algorithm::Direct);
  }
  return phases;
}

// All-to-all as NCCL's PXN routes it across rail-optimized nodes (g members on each of N nodes,
// n = g·N, a chunk S/n for every destination): inside each node, member i hands member j the
// chunks of every destination with local index j (N chunks, its own node's j among them), and
// member j sends each other node's member j the g chunks gathered for it over its own rail. NCCL
// pipelines the two hops (its proxy forwards as chunks arrive), so they are one phase of two
// pipelined steps: per member (g-1)/g·S over NVLink while (N-1)/N·S crosses its NIC; the time is
// the slower of the two plus the latency, with g·(g-1)·N + N·(N-1)·g flows instead of the direct
// exchange's n·(n-1) (which the flow model would share out at every event).
std::vector<Phase> plan_hierarchical_all_to_all(const PlanInput& in) {
  const auto& groups = in.nodes;
  const int g = static_cast<int>(groups.front().size());
  const int nodes = static_cast<int>(groups.size());
  const double chunk = in.bytes / in.n;
  PhaseBuilder b;
  for (const auto& grp : groups)
    for (int i = 0; i < g; ++i)
      for (int j = 0; j < g; ++j) b.add(grp[i], grp[j], chunk * nodes);
  for (int a = 0; a < nodes; ++a)
    for (int c = 0; c < nodes; ++c)
      for (int j = 0; j < g; ++j) b.add(groups[a][j], groups[c][j], chunk * g);
  return {b.take((g > 1 ? 1 : 0) + (nodes > 1 ? 1 : 0), true)};
}

// Rings inside every node (reduce-scatter, all-gather) around a ring per local index across nodes;
// all-to-all: plan_hierarchical_all_to_all.
std::vector<Phase> plan_hierarchical(const PlanInput& in) {
  const int C = in.channels;
  const double S = in.bytes;
  const CollOp op = in.op;
  const auto& groups = in.nodes;
  if (op != CollOp::AllReduce && op != CollOp::ReduceScatter && op != CollOp::AllGather &&
      op != CollOp::AllToAll)
    unsupported(in.req.op, Algorithm::Hierarchical);
  const int g = static_cast<int>(groups.front().size());
  const int nodes = static_cast<int>(groups.size());
  for (const auto& grp : groups)
    if (static_cast<int>(grp.size()) != g) {
      throw InputError("hierarchical collectives need the same number of members on every node");
    }
  if (op == CollOp::AllToAll) return plan_hierarchical_all_to_all(in);
  auto intra = [&](double factor_bytes) {  // a ring inside every node, all channels
    PhaseBuilder b;
    for (int ch = 0; ch < C; ++ch)
      for (const auto& grp : groups) add_ring(b, ring_order({grp}, ch), factor_bytes / C);
    return b.take(g - 1, true);
  };
  auto inter = [&](double bytes, int steps_per_hop) {  // a ring per local index across nodes
    PhaseBuilder b;
    for (int j = 0; j < g; ++j) {
      std::vector<int32_t> o;
      for (const auto& grp : groups) o.push_back(grp[j]);
      add_ring(b, o, bytes / C, C);
    }
    return b.take(steps_per_hop * (nodes - 1), true);
  };
  const double gd = g, nd = nodes;
  const double inter_part = S / gd;  // what each GPU owns after the intra-node reduce-scatter
  std::vector<Phase> phases;
  if (op == CollOp::AllReduce) {
    if (g > 1) phases.push_back(intra((gd - 1) / gd * S));
    if (nodes > 1) phases.push_back(inter(2 * (nd - 1) / nd * inter_part, 2));
    if (g > 1) phases.push_back(intra((gd - 1) / gd * S));
  } else if (op == CollOp::ReduceScatter) {
    if (g > 1) phases.push_back(intra((gd - 1) / gd * S));
    if (nodes > 1) phases.push_back(inter((nd - 1) / nd * inter_part, 1));
  } else {
    if (nodes > 1) phases.push_back(inter((nd - 1) / nd * inter_part, 1));
    if (g > 1) phases.push_back(intra((gd - 1) / gd * S));
  }
  return phases;
}

// NVLink SHARP all-reduce: every GPU reduces its 1/n of the buffer in the switch (multimem loads
// from all n GPUs) and multicasts the result (multimem stores), so each GPU link carries (n-1)/n of
// the buffer each way (the load of a direct exchange of S/n between every pair). One node only.
// Planned as n flows of (n-1)/n * S round the node's GPUs, which load every GPU<->NVSwitch link
// exactly as the n(n-1) pair flows would, with n flows for the flow model to share instead.
std::vector<Phase> plan_nvls(const PlanInput& in, const Cluster& c) {
  if (in.op != CollOp::AllReduce) unsupported(in.req.op, Algorithm::Nvls);
  if (in.nodes.size() != 1 || !c.nccl.nvls) {
    throw InputError("NVLS needs the cluster's nccl model with nvls: true and members on one node");
  }
  PhaseBuilder b;
  add_ring(b, in.req.members, (in.n - 1.0) / in.n * in.bytes);
  return {b.take(1)};
}

// NCCL's NVLSTree all-reduce: NVLS inside every node (each GPU's link carries (g-1)/g of the buffer
// each way) while, concurrently (pipelined), each GPU's 1/g share is all-reduced between the nodes
// over its own rail by a double binary tree (reduce up and broadcast down, half per tree).
std::vector<Phase> plan_nvls_tree(const PlanInput& in, const Cluster& c) {
  if (in.op != CollOp::AllReduce) unsupported(in.req.op, Algorithm::NvlsTree);
  const auto& groups = in.nodes;
  const int g = static_cast<int>(groups.front().size());
  for (const auto& grp : groups)
    if (static_cast<int>(grp.size()) != g || !c.nccl.nvls || groups.size() < 2) {
      throw InputError(
          "NVLS tree needs the nccl model with nvls: true, several nodes and the same number of "
          "members on each");
    }
  PhaseBuilder b;
  const double share = in.bytes / g;
  for (const auto& grp : groups) add_ring(b, grp, (g - 1.0) / g * in.bytes);  // NVLS (as plan_nvls)
  const int nodes = static_cast<int>(groups.size());
  for (int j = 0; j < g; ++j)
    for (int t = 0; t < 2; ++t)
      for (int k = 0; k < nodes; ++k) {
        const int p = dtree_parent(nodes, k, t);
        if (p < 0) continue;
        b.add(groups[k][j], groups[p][j], share / 2);
        b.add(groups[p][j], groups[k][j], share / 2);
      }
  return {b.take(1, true)};
}

}  // namespace

CollectivePlan plan_collective(const Cluster& c, const CollectiveRequest& req) {
  validate(c, req);
  CollectivePlan plan;
  plan.algo = req.algo == Algorithm::Auto ? choose_algorithm(c, req) : req.algo;
  plan.channels = effective_channels(c, req);
  plan.protocol = req.protocol == Protocol::Auto ? Protocol::Simple : req.protocol;
  const PlanInput in{req,
                     req.op == CollOp::Barrier ? CollOp::AllReduce : req.op,
                     plan.channels,
                     static_cast<int>(req.members.size()),
                     static_cast<double>(req.bytes),
                     by_node(c, req.members)};
  if (in.op == CollOp::Send || in.op == CollOp::Recv) {
    // One direct transfer, split over the channels.
    PhaseBuilder b;
    b.add(req.members[0], req.members[1], in.bytes / in.channels, in.channels);
    plan.algo = Algorithm::Direct;
    plan.phases.push_back(b.take(1));
    return plan;
  }
  if (in.n < 2) return plan;  // a collective of one rank moves nothing
  switch (plan.algo) {
    case Algorithm::Ring:
      plan.phases = plan_ring(in);
      return plan;
    case Algorithm::Tree:
      plan.phases = plan_tree(in);
      return plan;
    case Algorithm::HalvingDoubling:
      plan.phases = plan_halving_doubling(in);
      return plan;
    case Algorithm::Direct:
      plan.phases = plan_direct(in);
      return plan;
    case Algorithm::Hierarchical:
      plan.phases = plan_hierarchical(in);
      return plan;
    case Algorithm::Nvls:
      plan.phases = plan_nvls(in, c);
      return plan;
    case Algorithm::NvlsTree:
      plan.phases = plan_nvls_tree(in, c);
      return plan;
    case Algorithm::Auto:
      break;
  }
  throw InternalError("unresolved collective algorithm");
}

std::vector<Algorithm> candidate_algorithms(const Cluster& c, const CollectiveRequest& req) {
  switch (req.op) {
    case CollOp::AllToAll: {
      // Across rail-optimized nodes with the same number of members on each, NCCL's PXN (on by
      // default since NCCL 2.12) sends through the node's NVLink to the GPU on the destination's
      // rail: plan_hierarchical_all_to_all. Inside a node, or on other fabrics: direct.
      std::unordered_map<int, int> per_node;
      for (int32_t g : req.members) ++per_node[c.node_of(g)];
      bool uniform =
          per_node.size() > 1 && c.topo.kind == TopologyKind::FatTree && c.topo.rail_optimized;
      for (const auto& [node, k] : per_node) uniform = uniform && k == per_node.begin()->second;
      if (uniform) return {Algorithm::Hierarchical};
      return {Algorithm::Direct};
    }
    case CollOp::Send:
    case CollOp::Recv:
      return {Algorithm::Direct};
    case CollOp::AllReduce:
    case CollOp::Barrier: {
      bool multi_node = false;
      for (int32_t g : req.members)
        multi_node = multi_node || c.node_of(g) != c.node_of(req.members.front());
      if (!multi_node && c.nccl.enabled && c.nccl.nvls && req.members.size() >= 2)
        return {Algorithm::Ring, Algorithm::Nvls};
      if (!multi_node || req.members.size() < 3) return {Algorithm::Ring};
      if (c.nccl.enabled && c.nccl.nvls) {
        // NVLS tree needs the same number (>= 2) of members on every node.
        std::unordered_map<int, int> per_node;
        for (int32_t g : req.members) ++per_node[c.node_of(g)];
        bool uniform = true;
        const int first = per_node.begin()->second;
        for (const auto& [node, k] : per_node) uniform = uniform && k == first;
        if (uniform && first >= 2) return {Algorithm::Ring, Algorithm::Tree, Algorithm::NvlsTree};
      }
      return {Algorithm::Ring, Algorithm::Tree};
    }
    default:
      return {Algorithm::Ring};
  }
}

int nccl_channels(const Cluster& c, const CollectiveRequest& req, Algorithm algo, Protocol proto) {
  if (req.channels > 0 || !c.nccl.enabled) return effective_channels(c, req);
  int nc = c.nccl.max_channels > 0 ? c.nccl.max_channels : effective_channels(c, req);
  // NVLS runs on NCCL's NVLS channels (NCCL_NVLS_NCHANNELS, 16 on Hopper), not the ring channels.
  if (algo == Algorithm::Nvls || algo == Algorithm::NvlsTree) return 16;
  if (algo != Algorithm::Ring && algo != Algorithm::Tree) return nc;
  // NCCL's per-thread work thresholds and thread counts (comm.h, device.h).
  int64_t threads = 512, threshold = 64;
  if (proto == Protocol::LL) {
    threshold = 8 * (algo == Algorithm::Ring ? static_cast<int64_t>(req.members.size()) : 1);
  } else if (proto == Protocol::LL128) {
    threads = 640;
    threshold = 8;
  }
  while (nc > 1 && req.bytes < nc * threads * threshold) --nc;
  return nc;
}

std::vector<Protocol> candidate_protocols(const Cluster& c, Algorithm algo) {
  if (!c.nccl.enabled || (algo != Algorithm::Ring && algo != Algorithm::Tree))
    return {Protocol::Simple};
  return {Protocol::LL, Protocol::LL128, Protocol::Simple};
}

Algorithm choose_algorithm(const Cluster& c, const CollectiveRequest& req) {
  const auto cands = candidate_algorithms(c, req);
  Algorithm best = cands.front();
  int64_t best_t = -1;
  for (Algorithm a : cands) {
    if (cands.size() == 1) break;
    CollectiveRequest r = req;
    r.algo = a;
    const int64_t t = collective_time_ns(c, r, NetworkModel::Analytical);
    if (best_t < 0 || t < best_t) {
      best = a;
      best_t = t;
    }
  }
  return best;
}

}  // namespace orrery::sim
