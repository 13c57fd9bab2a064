// The analytical and the flow-level (max-min) network models, and collective_time_ns. Both models
// share a cache of routed plan templates: a workload repeats the same collectives on the same
// communicators thousands of times, and every flow of a plan scales linearly with the size.
#include "orrery/sim/network.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <queue>
#include <tuple>
#include <unordered_map>

#include "orrery/common/error.hpp"
#include "orrery/sim/maxmin.hpp"
#include "orrery/traces/span.hpp"

namespace orrery::sim {

std::string_view to_string(NetworkModel m) {
  return m == NetworkModel::Flow ? "flow" : "analytical";
}

std::optional<NetworkModel> network_model_from_string(std::string_view s) {
  if (s == "flow" || s == "flow-level" || s == "maxmin") return NetworkModel::Flow;
  if (s == "analytical" || s == "alpha-beta") return NetworkModel::Analytical;
  return std::nullopt;
}

namespace {

// ECMP hash of a flow: its endpoints as the topology keys them (Topology::ecmp_endpoints; the same
// pair always takes the same path).
uint64_t flow_hash(const Topology& topo, int32_t src, int32_t dst) {
  const auto [a, b] = topo.ecmp_endpoints(src, dst);
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) ^ static_cast<uint32_t>(b) ^
         0x5bd1e995ULL;
}

// A phase's alpha: the longest path latency of its flows, or for pipelined phases the weighted mean,
// plus the per-step overhead (see Phase).
struct PhaseLatency {
  int64_t max_ns = 0;
  double sum_ns = 0;
  double weight = 0;
  void add(int64_t path_ns, double w) {
    max_ns = std::max(max_ns, path_ns);
    sum_ns += static_cast<double>(path_ns) * w;
    weight += w;
  }
  TimeNs alpha_ns(const Phase& ph, const Cluster& c) const {
    const TimeNs path =
        ph.pipelined && weight > 0 ? static_cast<TimeNs>(std::llround(sum_ns / weight)) : max_ns;
    return path + c.coll.step_latency_ns;
  }
};

// time(S) = latency_ns + S * ns_per_byte (the analytical time is affine in S for a fixed plan).
struct Affine {
  double latency_ns = 0;
  double ns_per_byte = 0;
};

// A plan routed once, with bytes per byte of request size.
struct FlowTemplate {
  std::vector<int32_t> route;
  double bytes_per_byte = 0;
  double weight = 1;
};
struct PhaseTemplate {
  std::vector<FlowTemplate> flows;
  TimeNs latency_ns = 0;        // latency_steps * alpha
  std::vector<int32_t> links;   // every link its flows cross, once
  bool all_flows_carry = true;  // every flow carries bytes (> 0 per byte of request)
  // The flow model's rates for this phase alone on idle links (max-min does not depend on the
  // bytes): computed once, on the first start that finds all `links` idle.
  mutable std::vector<double> solo_rates;
};
// NCCL's tuner lowers a tree all-reduce's bandwidth at medium sizes by a measured factor (tuning.cc
// treeCorrectionFactor, by protocol, for sizes 64 B << i, i = 0..23); the model moves bytes / factor.
double tree_correction(Protocol proto, int64_t bytes) {
  static constexpr double kLL[24] = {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5,
                                     .4,  .4,  .5,  .6,  .7, .8, .9, 1., 1., 1., 1., 1.};
  static constexpr double kLL128[24] = {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6,
                                        .6,  .6,  .6,  .6,  .8,  .9, .9, .9, .9, 1., 1., 1.};
  static constexpr double kSimple[24] = {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5,
                                         .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9};
  int log_size = -1;
  for (int64_t v = bytes >> 6; v > 0; v >>= 1) ++log_size;
  if (log_size < 0 || log_size >= 23) return 1.0;
  const double* t = proto == Protocol::LL ? kLL : proto == Protocol::LL128 ? kLL128 : kSimple;
  return t[log_size];
}

struct PlanTemplate {
  Algorithm algo = Algorithm::Ring;
  Protocol protocol = Protocol::Simple;
  bool tree_corrected = false;  // an NCCL tree all-reduce: bytes scaled by 1 / tree_correction
  std::vector<PhaseTemplate> phases;
  Affine cost;  // analytical: latency + most loaded link's bytes / bandwidth, per phase
  // The bytes the plan's flows move per request of `bytes` (its flows scale linearly).
  double moved(int64_t bytes) const {
    const double b = static_cast<double>(bytes);
    return tree_corrected ? b / tree_correction(protocol, bytes) : b;
  }
  int64_t time_at(int64_t bytes) const {
    return std::llround(cost.latency_ns + cost.ns_per_byte * moved(bytes));
  }
};

// With the cluster's nccl model: the protocol's efficiency on top of the links' effective capacity,
// and NCCL's latency (the structure of tuning.cc) instead of steps * (path latency + step latency).
double protocol_efficiency(const Cluster& c, Algorithm algo, Protocol proto) {
  if (algo == Algorithm::Nvls || algo == Algorithm::NvlsTree) return c.nccl.nvls_efficiency;
  switch (proto) {
    case Protocol::LL:
      return c.nccl.ll.efficiency;
    case Protocol::LL128:
      return c.nccl.ll128.efficiency;
    default:
      return c.nccl.simple.efficiency;
  }
}

// Between nodes the network carries each protocol's wire format at the NIC's rate (nic_efficiency):
// LL's 8-byte lines are half flags, LL128's 128-byte lines carry 8 bytes of flags (NCCL's 120/128),
// Simple (and an NVLS tree's rail trees) moves the data alone. The fitted `efficiency` values are of
// NVLink copies.
double wire_efficiency(Algorithm algo, Protocol proto) {
  if (algo == Algorithm::NvlsTree) return 1.0;
  return proto == Protocol::LL ? 0.5 : proto == Protocol::LL128 ? 120.0 / 128.0 : 1.0;
}

int node_count(const Cluster& c, const std::vector<int32_t>& members) {
  std::vector<int> nodes;
  for (int32_t g : members) nodes.push_back(c.node_of(g));
  std::sort(nodes.begin(), nodes.end());
  return static_cast<int>(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
}

double nccl_latency_us(const Cluster& c, const CollectiveRequest& req, Algorithm algo,
                       Protocol proto, int plan_steps) {
  const NcclModel& m = c.nccl;
  if (algo == Algorithm::Nvls) return m.nvls_latency_us;
  const NcclProtocolParams& p = proto == Protocol::LL      ? m.ll
                                : proto == Protocol::LL128 ? m.ll128
                                                           : m.simple;
  const int n_nodes = node_count(c, req.members);
  const bool all_reduce = req.op == traces::CollOp::AllReduce || req.op == traces::CollOp::Barrier;
  int lg_nodes = 0;
  while ((1 << (lg_nodes + 1)) <= n_nodes) ++lg_nodes;
  if (algo == Algorithm::NvlsTree)
    return m.nvls_tree_latency_us + 2.0 * lg_nodes * m.nvls_tree_net_step_latency_us;
  if (algo == Algorithm::Tree && all_reduce && n_nodes > 1) {
    // Up and down the chain inside a node and the double binary tree between nodes, at the tree's
    // own latency constants.
    const int ppn = static_cast<int>(req.members.size()) / n_nodes;
    return p.tree_base_latency_us + 2.0 * ((ppn - 1) * p.tree_nvlink_step_latency_us +
                                           lg_nodes * p.tree_net_step_latency_us);
  }
  const int inter = n_nodes <= 1 ? 0 : std::min(plan_steps, (all_reduce ? 2 : 1) * (n_nodes - 1));
  // Across nodes every step pays at least NCCL's network overhead (3x for Simple).
  const double intra = n_nodes <= 1
                           ? p.nvlink_step_latency_us
                           : std::max(p.nvlink_step_latency_us,
                                      m.net_overhead_us * (proto == Protocol::Simple ? 3.0 : 1.0));
  return p.base_latency_us + (plan_steps - inter) * intra + inter * p.net_step_latency_us;
}

class PlanCache {
 public:
  explicit PlanCache(const Cluster& c) : c_(c) {}

  // The plan a request runs, its (algorithm, protocol, channels) resolved at its size: cached per
  // request (op, algorithm, protocol, channels, root, bytes, members), so a repeated collective
  // costs one hash of its members and no allocation.
  const PlanTemplate& plan_for(const CollectiveRequest& req) {
    auto& bucket = by_request_[request_hash(req)];
    for (const RequestEntry& e : bucket) {
      if (e.op == req.op && e.algo == req.algo && e.protocol == req.protocol &&
          e.channels == req.channels && e.root == req.root && e.bytes == req.bytes &&
          e.members == req.members)
        return *e.plan;
    }
    const PlanTemplate& t = get(req, resolve(req));
    bucket.push_back(RequestEntry{req.op, req.algo, req.protocol, req.channels, req.root, req.bytes,
                                  req.members, &t});
    return t;
  }

  const PlanTemplate& get(const CollectiveRequest& req, const CollectiveChoice& ch) {
    if (req.bytes < 0) throw InputError("collective size must be >= 0 bytes");
    Key k{static_cast<int>(req.op == traces::CollOp::Recv ? traces::CollOp::Send : req.op),
          static_cast<int>(ch.algo),
          static_cast<int>(ch.protocol),
          ch.channels,
          req.root,
          req.members};
    auto it = cache_.find(k);
    if (it != cache_.end()) return it->second;
    return cache_.emplace(std::move(k), build(req, ch)).first->second;
  }

  // Auto (algorithm, protocol) resolved like NCCL's tuner: the lowest estimate at this size (ties
  // to the first candidate); the channels NCCL would run it on.
  CollectiveChoice resolve(const CollectiveRequest& req) {
    std::vector<Algorithm> algos = req.algo != Algorithm::Auto ? std::vector<Algorithm>{req.algo}
                                                               : candidate_algorithms(c_, req);
    CollectiveChoice best;
    int64_t best_t = -1;
    for (Algorithm a : algos) {
      const std::vector<Protocol> protos = req.protocol != Protocol::Auto
                                               ? std::vector<Protocol>{req.protocol}
                                               : candidate_protocols(c_, a);
      for (Protocol p : protos) {
        CollectiveChoice ch{a, p, nccl_channels(c_, req, a, p)};
        if (algos.size() == 1 && protos.size() == 1) return ch;
        const int64_t t = get(req, ch).time_at(req.bytes);
        if (best_t < 0 || t < best_t) {
          best = ch;
          best_t = t;
        }
      }
    }
    return best;
  }

  size_t size() const { return cache_.size(); }

 private:
  using Key = std::tuple<int, int, int, int, int32_t, std::vector<int32_t>>;
  struct RequestEntry {
    traces::CollOp op;
    Algorithm algo;
    Protocol protocol;
    int channels;
    int32_t root;
    int64_t bytes;
    std::vector<int32_t> members;
    const PlanTemplate* plan;  // a node of cache_ (stable)
  };
  static uint64_t request_hash(const CollectiveRequest& r) {
    uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the fields and members
    const auto add = [&h](uint64_t v) { h = (h ^ v) * 0x100000001b3ULL; };
    add(static_cast<uint64_t>(r.op));
    add(static_cast<uint64_t>(r.algo));
    add(static_cast<uint64_t>(r.protocol));
    add(static_cast<uint64_t>(r.channels));
    add(static_cast<uint64_t>(r.root));
    add(static_cast<uint64_t>(r.bytes));
    for (int32_t m : r.members) add(static_cast<uint32_t>(m));
    return h;
  }

  PlanTemplate build(CollectiveRequest r, const CollectiveChoice& ch) {
    constexpr double kRef = 1 << 30;  // plan at 1 GiB: no flow is dropped as empty
    r.bytes = static_cast<int64_t>(kRef);
    r.algo = ch.algo;
    r.protocol = ch.protocol;
    r.channels = ch.channels;
    const CollectivePlan plan = plan_collective(c_, r);
    const Topology& topo = *c_.topology;
    const auto& links = topo.links();
    // Scratch reused across builds: a build touches only its own flows' links.
    std::vector<double>& load = load_;
    if (load.size() < links.size()) load.assign(links.size(), 0.0);
    std::vector<int32_t>& touched = touched_;
    PlanTemplate t;
    t.algo = plan.algo;
    // With the nccl model each byte moves at the protocol's efficiency: a flow carries bytes /
    // efficiency (an NVLS tree's flows between nodes are Simple copies, its NVLS ones at NVLS's).
    const bool nccl = c_.nccl.enabled;
    const double eff = nccl ? protocol_efficiency(c_, plan.algo, plan.protocol) : 1.0;
    const double net_eff = nccl ? wire_efficiency(plan.algo, plan.protocol) : 1.0;
    double data_ns = 0;
    int steps = 0;
    for (const Phase& ph : plan.phases) {
      PhaseTemplate pt;
      PhaseLatency lat;
      touched.clear();
      pt.flows.reserve(ph.flows.size());
      for (const FlowSpec& f : ph.flows) {
        FlowTemplate ft;
        topo.route(f.src, f.dst, flow_hash(topo, f.src, f.dst), ft.route);
        const double e = c_.node_of(f.src) == c_.node_of(f.dst) ? eff : net_eff;
        const double bytes = f.bytes / e;
        ft.bytes_per_byte = bytes / kRef;
        ft.weight = f.weight;
        lat.add(topo.path_latency_ns(ft.route), f.weight);
        for (int32_t l : ft.route) {
          if (load[l] == 0) touched.push_back(l);
          load[l] += bytes * f.weight;
        }
        pt.flows.push_back(std::move(ft));
      }
      double worst = 0;
      for (int32_t l : touched) {
        worst = std::max(worst, load[l] / links[l].gb_per_s);
        load[l] = 0;
      }
      // Each link once (a link with zero load, e.g. a flow of zero bytes, is added apart).
      for (const FlowTemplate& ft : pt.flows) {
        pt.all_flows_carry = pt.all_flows_carry && ft.bytes_per_byte > 0;
        for (int32_t l : ft.route) pt.links.push_back(l);
      }
      std::sort(pt.links.begin(), pt.links.end());
      pt.links.erase(std::unique(pt.links.begin(), pt.links.end()), pt.links.end());
      data_ns += worst;
      steps += ph.latency_steps;
      pt.latency_ns = nccl ? 0 : static_cast<TimeNs>(ph.latency_steps) * lat.alpha_ns(ph, c_);
      t.cost.latency_ns += static_cast<double>(pt.latency_ns);
      t.phases.push_back(std::move(pt));
    }
    if (nccl && !t.phases.empty()) {
      // NCCL's latency, paid once after the last phase.
      const TimeNs lat_ns = static_cast<TimeNs>(
          std::llround(1000.0 * nccl_latency_us(c_, r, plan.algo, plan.protocol, steps)));
      t.phases.back().latency_ns = lat_ns;
      t.cost.latency_ns = static_cast<double>(lat_ns);
    }
    if (nccl) {
      t.protocol = plan.protocol;
      t.tree_corrected = plan.algo == Algorithm::Tree &&
                         (r.op == traces::CollOp::AllReduce || r.op == traces::CollOp::Barrier);
      // LL between nodes runs no faster than NCCL's llMaxBws ceiling: every flow slows alike.
      const double floor_ns = ll_floor_ns(r, plan.algo, plan.protocol, kRef);
      if (data_ns > 0 && floor_ns > data_ns) {
        for (PhaseTemplate& pt : t.phases)
          for (FlowTemplate& ft : pt.flows) ft.bytes_per_byte *= floor_ns / data_ns;
        data_ns = floor_ns;
      }
    }
    t.cost.ns_per_byte = data_ns / kRef;
    return t;
  }

  // The least time NCCL's LL protocol takes for `bytes` between nodes (0 inside one node or without a
  // ceiling): the llMaxBws busbw ceiling as algorithm bandwidth (ring: busbw / busbw_factor; tree:
  // NCCL's ratio 1/2).
  double ll_floor_ns(const CollectiveRequest& r, Algorithm algo, Protocol proto,
                     double bytes) const {
    if (proto != Protocol::LL || (algo != Algorithm::Ring && algo != Algorithm::Tree)) return 0;
    const int nodes = node_count(c_, r.members);
    if (nodes < 2) return 0;
    const double cap =
        nodes == 2 ? c_.nccl.ll_max_busbw_2_nodes_gb_per_s : c_.nccl.ll_max_busbw_gb_per_s;
    if (cap <= 0) return 0;
    const int n = static_cast<int>(r.members.size());
    const double algbw = algo == Algorithm::Tree ? cap * 0.5 : cap / traces::busbw_factor(r.op, n);
    return bytes / algbw;  // GB/s = bytes per ns
  }

  const Cluster& c_;
  std::map<Key, PlanTemplate> cache_;
  std::unordered_map<uint64_t, std::vector<RequestEntry>> by_request_;  // lookup only
  std::vector<double> load_;
  std::vector<int32_t> touched_;
};

class AnalyticalNetwork final : public NetworkSim {
 public:
  AnalyticalNetwork(const Cluster& c, Engine& e) : c_(c), e_(e), cache_(c) {}
  TimeNs next_event(TimeNs) const override { return kNever; }
  void advance(TimeNs) override {}

  void start(const CollectiveRequest& req, std::function<void()> on_done) override {
    ++stats_.collectives;
    const PlanTemplate& t = cache_.plan_for(req);
    e_.schedule_at(e_.now() + t.time_at(req.bytes), std::move(on_done));
  }
  const NetworkStats& stats() const override { return stats_; }

 private:
  const Cluster& c_;
  Engine& e_;
  NetworkStats stats_;
  PlanCache cache_;
};

// Flow-level model. Each running collective executes its plan phase by phase; each phase's flows
// share link capacity by max-min fairness. When flows start or finish, the rates of the flows
// connected to them through shared links (transitively) are re-solved; the others keep theirs.
class FlowNetwork final : public NetworkSim {
 public:
  FlowNetwork(const Cluster& c, Engine& e, bool whole_components)
      : c_(c), e_(e), cache_(c), whole_components_(whole_components) {
    const auto& links = c.topology->links();
    capacity_.resize(links.size());
    for (size_t i = 0; i < links.size(); ++i) capacity_[i] = links[i].gb_per_s;
    link_flows_.resize(links.size());
    link_mark_.assign(links.size(), 0);
    residual_ = capacity_;
  }

  void start(const CollectiveRequest& req, std::function<void()> on_done) override {
    ++stats_.collectives;
    const PlanTemplate& t = cache_.plan_for(req);
    int32_t id;
    if (!free_colls_.empty()) {
      id = free_colls_.back();
      free_colls_.pop_back();
    } else {
      id = static_cast<int32_t>(colls_.size());
      colls_.emplace_back();
    }
    Coll& co = colls_[id];
    co.plan = &t;
    co.bytes = t.moved(req.bytes);
    co.on_done = std::move(on_done);
    co.phase = 0;
    start_phase(id);
  }

  TimeNs next_event(TimeNs) const override {
    while (!heap_.empty()) {
      const HeapEntry& h = heap_.top();
      const Flow& f = flows_[h.flow];
      if (f.active && f.version == h.version) return h.t;
      heap_.pop();  // stale
    }
    return kNever;
  }

  void advance(TimeNs now) override {
    // Every flow due now finishes together; then one re-solve for all of them.
    done_.clear();
    while (!heap_.empty()) {
      const HeapEntry h = heap_.top();
      const Flow& f = flows_[h.flow];
      if (!f.active || f.version != h.version) {
        heap_.pop();
        continue;
      }
      if (h.t > now) break;
      heap_.pop();
      done_.push_back(h.flow);
    }
    seed_links_.clear();
    std::vector<int32_t>& finished_colls = finished_colls_;
    finished_colls.clear();
    for (int32_t fi : done_) {
      Flow& f = flows_[fi];
      f.active = false;
      for (int32_t l : *f.route) {
        auto& lf = link_flows_[l];
        auto pos = std::find(lf.begin(), lf.end(), fi);
        *pos = lf.back();
        lf.pop_back();
        seed_links_.push_back(l);
      }
      free_.push_back(fi);
      Coll& co = colls_[f.coll];
      if (--co.pending == 0) finished_colls.push_back(f.coll);
    }
    resolve(seed_links_, now);
    std::sort(finished_colls.begin(), finished_colls.end());  // deterministic callback order
    for (int32_t ci : finished_colls) end_phase(ci, now);
  }

  const NetworkStats& stats() const override { return stats_; }

 private:
  struct Flow {
    int32_t coll = -1;
    double remaining = 0;  // bytes per unit flow still to send
    double weight = 1;
    double rate = 0;     // bytes/ns per unit flow
    TimeNs updated = 0;  // remaining is exact at this time
    uint32_t version = 0;
    bool active = false;
    bool scheduled = false;                       // has a valid completion entry in the heap
    const std::vector<int32_t>* route = nullptr;  // owned by the plan cache
  };
  struct Coll {
    const PlanTemplate* plan = nullptr;
    double bytes = 0;
    std::function<void()> on_done;
    size_t phase = 0;
    int64_t pending = 0;
  };
  struct HeapEntry {
    TimeNs t;
    int32_t flow;
    uint32_t version;
  };
  struct Later {
    bool operator()(const HeapEntry& a, const HeapEntry& b) const {
      return a.t != b.t ? a.t > b.t : a.flow > b.flow;
    }
  };

  void start_phase(int32_t ci) {
    Coll& co = colls_[ci];
    const TimeNs now = e_.now();
    if (co.phase >= co.plan->phases.size()) {
      auto cb = std::move(co.on_done);
      co.on_done = nullptr;
      free_colls_.push_back(ci);
      e_.schedule_at(now, std::move(cb));
      return;
    }
    const PhaseTemplate& ph = co.plan->phases[co.phase];
    seed_links_.clear();
    co.pending = 0;
    // Flow slots in increasing index order along the template (the solve's order, see resolve).
    new_flows_.clear();
    for (const FlowTemplate& ft : ph.flows) {
      if (ft.bytes_per_byte * co.bytes <= 0) continue;
      if (!free_.empty()) {
        new_flows_.push_back(free_.back());
        free_.pop_back();
      } else {
        new_flows_.push_back(static_cast<int32_t>(flows_.size()));
        flows_.emplace_back();
      }
    }
    if (new_flows_.empty()) {
      end_phase(ci, now);
      return;
    }
    std::sort(new_flows_.begin(), new_flows_.end());
    // Alone on idle links, the phase's rates are its cached solo rates: the same solve on the same
    // flows in the same order (see resolve), done once per phase template.
    bool solo = ph.all_flows_carry;
    for (size_t i = 0; solo && i < ph.links.size(); ++i) solo = link_flows_[ph.links[i]].empty();
    size_t k = 0;
    for (const FlowTemplate& ft : ph.flows) {
      const double bytes = ft.bytes_per_byte * co.bytes;
      if (bytes <= 0) continue;
      const int32_t fi = new_flows_[k++];
      Flow& f = flows_[fi];
      f.coll = ci;
      f.remaining = bytes;
      f.weight = ft.weight;
      f.rate = 0;
      f.updated = now;
      f.active = true;
      f.scheduled = false;
      ++f.version;
      f.route = &ft.route;
      for (int32_t l : ft.route) {
        link_flows_[l].push_back(fi);
        if (!solo) seed_links_.push_back(l);
      }
      ++co.pending;
      ++stats_.flows;
    }
    if (!solo) {
      resolve(seed_links_, now);
      return;
    }
    if (ph.solo_rates.empty()) {
      mm_flows_.resize(ph.flows.size());
      for (size_t i = 0; i < ph.flows.size(); ++i) {
        const FlowTemplate& ft = ph.flows[i];
        mm_flows_[i] =
            MaxMinFlow{ft.route.data(), static_cast<int32_t>(ft.route.size()), ft.weight};
      }
      solver_.solve(capacity_, mm_flows_, ph.solo_rates);
      ++stats_.solves;
      stats_.solved_flows += ph.flows.size();
    } else {
      ++stats_.cached_solves;
    }
    for (size_t i = 0; i < new_flows_.size(); ++i) rate_flow(new_flows_[i], ph.solo_rates[i], now);
  }

  void end_phase(int32_t ci, TimeNs now) {
    Coll& co = colls_[ci];
    const TimeNs lat = co.plan->phases[co.phase].latency_ns;
    ++co.phase;
    e_.schedule_at(now + lat, [this, ci] { start_phase(ci); });
  }

  // Re-rates the flows a change at seed_links (flows started or finished there) can affect.
  //
  // Reference (whole_components_): every active flow connected to seed_links through shared links,
  // transitively. Default: the sub-problem S reached from seed_links through links that are
  // saturated in the current allocation (a link with slack constrains nobody, so it does not
  // couple the flows that cross it). S is solved with the capacity its links have left by the flows
  // outside S, which keep their rates. If that solution saturates a link shared with an outside
  // flow, the link joins S (with its flows) and S is solved again. On return S's flows and the
  // others together form the max-min allocation of the whole network: every outside flow keeps a
  // saturated bottleneck that no flow of S crosses, and every flow of S has one inside S (the
  // maths is in maxmin.hpp). The two differ only by floating-point rounding.
  void resolve(const std::vector<int32_t>& seed_links, TimeNs now) {
    ++mark_epoch_;
    comp_flows_.clear();
    boundary_.clear();
    stack_.clear();
    if (flow_mark_.size() < flows_.size()) flow_mark_.resize(flows_.size(), 0);
    for (int32_t l : seed_links) join_link(l);
    expand();
    if (comp_flows_.empty()) return;
    for (;;) {
      std::sort(comp_flows_.begin(), comp_flows_.end());  // independent of discovery order
      mm_flows_.resize(comp_flows_.size());
      for (size_t i = 0; i < comp_flows_.size(); ++i) {
        Flow& f = flows_[comp_flows_[i]];
        // Bring progress up to now at the old rate.
        if (now > f.updated) {
          f.remaining = std::max(0.0, f.remaining - f.rate * static_cast<double>(now - f.updated));
          f.updated = now;
        }
        mm_flows_[i] = MaxMinFlow{f.route->data(), static_cast<int32_t>(f.route->size()), f.weight};
      }
      // Boundary links: the capacity the flows outside S leave. One whose flows have all joined S
      // since is interior.
      for (size_t b = 0; b < boundary_.size();) {
        const int32_t l = boundary_[b];
        double outside = 0;
        bool any = false;
        for (int32_t fi : link_flows_[l]) {
          if (flow_mark_[fi] == mark_epoch_) continue;
          outside += flows_[fi].weight * flows_[fi].rate;
          any = true;
        }
        if (any) {
          residual_[l] = capacity_[l] - outside;
          ++b;
        } else {
          residual_[l] = capacity_[l];
          boundary_[b] = boundary_.back();
          boundary_.pop_back();
        }
      }
      solver_.solve(residual_, mm_flows_, rates_);
      ++stats_.solves;
      stats_.solved_flows += comp_flows_.size();
      if (!join_saturated_boundary()) break;
      expand();
    }
    for (int32_t l : boundary_) residual_[l] = capacity_[l];
    for (size_t i = 0; i < comp_flows_.size(); ++i) rate_flow(comp_flows_[i], rates_[i], now);
  }

  // S's flows use a boundary link to within kSaturated of what the outside flows leave: it joins
  // S (and with it the links its flows reach). False when none did.
  bool join_saturated_boundary() {
    bool joined = false;
    for (size_t b = 0; b < boundary_.size();) {
      const int32_t l = boundary_[b];
      double inside = 0;  // S's flows on l at their new rates (S is sorted)
      for (int32_t fi : link_flows_[l]) {
        if (flow_mark_[fi] != mark_epoch_) continue;
        const size_t i = size_t(std::lower_bound(comp_flows_.begin(), comp_flows_.end(), fi) -
                                comp_flows_.begin());
        inside += flows_[fi].weight * rates_[i];
      }
      if (inside >= residual_[l] * (1.0 - kSaturated)) {
        residual_[l] = capacity_[l];
        boundary_[b] = boundary_.back();
        boundary_.pop_back();
        stack_.push_back(l);
        joined = true;
      } else {
        ++b;
      }
    }
    return joined;
  }

  // Adds to S every flow of the interior links on stack_ and, through their routes, the links they
  // reach: saturated ones (or all, with whole_components_) become interior, the others boundary.
  void expand() {
    while (!stack_.empty()) {
      const int32_t l = stack_.back();
      stack_.pop_back();
      for (int32_t fi : link_flows_[l]) {
        if (flow_mark_[fi] == mark_epoch_) continue;
        flow_mark_[fi] = mark_epoch_;
        comp_flows_.push_back(fi);
        for (int32_t l2 : *flows_[fi].route) {
          if (link_mark_[l2] == mark_epoch_) continue;
          if (whole_components_ || saturated(l2)) {
            join_link(l2);
          } else {
            link_mark_[l2] = mark_epoch_;
            boundary_.push_back(l2);
          }
        }
      }
    }
  }
  void join_link(int32_t l) {
    if (link_mark_[l] == mark_epoch_) return;
    link_mark_[l] = mark_epoch_;
    stack_.push_back(l);
  }
  // The link's capacity is used to within kSaturated by the current rates.
  bool saturated(int32_t l) const {
    double used = 0;
    for (int32_t fi : link_flows_[l]) used += flows_[fi].weight * flows_[fi].rate;
    return used >= capacity_[l] * (1.0 - kSaturated);
  }
  static constexpr double kSaturated = 1e-9;

  // Sets a flow's rate (its progress is up to date at `now`) and schedules its completion.
  void rate_flow(int32_t fi, double r, TimeNs now) {
    Flow& f = flows_[fi];
    const double old_rate = f.rate;
    f.rate = r;
    // An unchanged rate keeps its completion time (no re-rounding of flows the change missed).
    if (f.scheduled && old_rate == r) return;
    f.scheduled = true;
    ++f.version;
    const double dt =
        (r > 0 && std::isfinite(r)) ? std::ceil(f.remaining / r) : (r > 0 ? 0.0 : 1e18);
    heap_.push(HeapEntry{now + static_cast<TimeNs>(dt), fi, f.version});
  }

  const Cluster& c_;
  Engine& e_;
  NetworkStats stats_;
  PlanCache cache_;
  bool whole_components_;  // the reference resolve (resolve())
  std::vector<double> capacity_;
  std::vector<std::vector<int32_t>> link_flows_;
  std::vector<Flow> flows_;
  std::vector<int32_t> free_;
  std::vector<Coll> colls_;
  std::vector<int32_t> free_colls_;
  mutable std::priority_queue<HeapEntry, std::vector<HeapEntry>, Later> heap_;
  std::vector<uint32_t> link_mark_, flow_mark_;
  uint32_t mark_epoch_ = 0;
  std::vector<int32_t> comp_flows_, stack_, seed_links_, done_, new_flows_, finished_colls_;
  std::vector<int32_t> boundary_;  // links of S's flows that outside flows share (resolve)
  std::vector<double> residual_;   // capacity_, with what outside flows leave on boundary_
  std::vector<MaxMinFlow> mm_flows_;
  std::vector<double> rates_;
  MaxMinSolver solver_;
};

}  // namespace

std::unique_ptr<NetworkSim> make_network(NetworkModel model, const Cluster& cluster, Engine& engine,
                                         bool whole_components) {
  if (!cluster.topology) throw InternalError("cluster topology not built (call build_topology)");
  std::unique_ptr<NetworkSim> n;
  if (model == NetworkModel::Flow)
    n = std::make_unique<FlowNetwork>(cluster, engine, whole_components);
  else
    n = std::make_unique<AnalyticalNetwork>(cluster, engine);
  engine.add_model(n.get());
  return n;
}

CollectiveChoice resolve_collective(const Cluster& cluster, const CollectiveRequest& req) {
  PlanCache cache(cluster);
  return cache.resolve(req);
}

int64_t collective_time_ns(const Cluster& cluster, const CollectiveRequest& req,
                           NetworkModel model) {
  if (model == NetworkModel::Analytical) {
    PlanCache cache(cluster);
    return cache.get(req, cache.resolve(req)).time_at(req.bytes);
  }
  Engine e;
  auto net = make_network(model, cluster, e);
  bool done = false;
  net->start(req, [&] { done = true; });
  e.run();
  if (!done) throw InternalError("collective did not complete");
  return e.now();
}

}  // namespace orrery::sim
