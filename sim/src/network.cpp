// The analytical and the flow-level (max-min) network models, and collective_time_ns.
#include "orrery/sim/network.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <queue>
#include <tuple>

#include "orrery/common/error.hpp"
#include "orrery/sim/maxmin.hpp"

namespace orrery::sim {

std::string_view to_string(NetworkModel m) { return m == NetworkModel::Flow ? "flow" : "analytical"; }

std::optional<NetworkModel> network_model_from_string(std::string_view s) {
  if (s == "flow" || s == "flow-level" || s == "maxmin") return NetworkModel::Flow;
  if (s == "analytical" || s == "alpha-beta") return NetworkModel::Analytical;
  return std::nullopt;
}

namespace {

// ECMP hash of a flow: its endpoints (the same pair always takes the same path).
uint64_t flow_hash(int32_t src, int32_t dst) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(src)) << 32) ^ static_cast<uint32_t>(dst) ^ 0x5bd1e995ULL;
}

// Latency plus per-byte cost of one algorithm on one member set: time(S) = latency_ns + S * ns_per_byte
// (every flow of a plan scales with S, so the analytical time is affine in S).
struct Affine {
  double latency_ns = 0;
  double ns_per_byte = 0;
  double at(int64_t bytes) const { return latency_ns + ns_per_byte * static_cast<double>(bytes); }
};

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
    const TimeNs path = ph.pipelined && weight > 0 ? static_cast<TimeNs>(std::llround(sum_ns / weight)) : max_ns;
    return path + c.coll.step_latency_ns;
  }
};

Affine analyze(const Cluster& c, CollectiveRequest r) {
  constexpr double kRef = 1 << 30;  // plan at 1 GiB: no flow is dropped as empty
  r.bytes = static_cast<int64_t>(kRef);
  const CollectivePlan plan = plan_collective(c, r);
  const Topology& topo = *c.topology;
  const auto& links = topo.links();
  std::vector<double> load(links.size(), 0.0);
  std::vector<int32_t> touched, path;
  Affine a;
  double data_ns = 0;
  for (const Phase& ph : plan.phases) {
    PhaseLatency lat;
    touched.clear();
    for (const FlowSpec& f : ph.flows) {
      path.clear();
      topo.route(f.src, f.dst, flow_hash(f.src, f.dst), path);
      lat.add(topo.path_latency_ns(path), f.weight);
      for (int32_t l : path) {
        if (load[l] == 0) touched.push_back(l);
        load[l] += f.bytes * f.weight;
      }
    }
    double worst = 0;
    for (int32_t l : touched) {
      worst = std::max(worst, load[l] / links[l].gb_per_s);
      load[l] = 0;
    }
    data_ns += worst;
    a.latency_ns += static_cast<double>(ph.latency_steps) * static_cast<double>(lat.alpha_ns(ph, c));
  }
  a.ns_per_byte = data_ns / kRef;
  return a;
}

class AnalyticalNetwork final : public NetworkSim {
 public:
  AnalyticalNetwork(const Cluster& c, Engine& e) : c_(c), e_(e) {}
  TimeNs next_event(TimeNs) const override { return kNever; }
  void advance(TimeNs) override {}

  void start(const CollectiveRequest& req, std::function<void()> on_done) override {
    ++stats_.collectives;
    double t = 0;
    if (req.op == traces::CollOp::AllToAll || req.op == traces::CollOp::Send || req.op == traces::CollOp::Recv ||
        req.algo != Algorithm::Auto) {
      t = cost(req, req.algo == Algorithm::Auto ? choose_algorithm(c_, req) : req.algo).at(req.bytes);
    } else {
      // Auto: the same choice as choose_algorithm, from cached affine costs.
      CollectiveRequest probe = req;
      const Algorithm a = choose_cached(probe);
      t = cost(req, a).at(req.bytes);
    }
    e_.schedule_at(e_.now() + static_cast<TimeNs>(std::llround(t)), std::move(on_done));
  }
  const NetworkStats& stats() const override { return stats_; }

 private:
  using Key = std::tuple<int, int, int, int32_t, std::vector<int32_t>>;

  Affine cost(const CollectiveRequest& req, Algorithm a) {
    Key k{static_cast<int>(req.op), static_cast<int>(a), effective_channels(c_, req), req.root, req.members};
    auto it = cache_.find(k);
    if (it != cache_.end()) return it->second;
    CollectiveRequest r = req;
    r.algo = a;
    const Affine af = analyze(c_, r);
    stats_.flows += 1;
    cache_.emplace(std::move(k), af);
    return af;
  }
  Algorithm choose_cached(const CollectiveRequest& req) {
    if (req.op != traces::CollOp::AllReduce && req.op != traces::CollOp::Barrier) return choose_algorithm(c_, req);
    bool multi_node = false;
    for (int32_t g : req.members) multi_node = multi_node || c_.node_of(g) != c_.node_of(req.members.front());
    if (!multi_node || req.members.size() < 3) return Algorithm::Ring;
    const double ring = std::llround(cost(req, Algorithm::Ring).at(req.bytes));
    const double tree = std::llround(cost(req, Algorithm::Tree).at(req.bytes));
    return tree < ring ? Algorithm::Tree : Algorithm::Ring;
  }

  const Cluster& c_;
  Engine& e_;
  NetworkStats stats_;
  std::map<Key, Affine> cache_;
};

// Flow-level model. Each running collective executes its plan phase by phase; each phase's flows
// are routed and share link capacity by max-min fairness. When flows start or finish, the rates of
// the flows connected to them through shared links (transitively) are re-solved; others keep theirs.
class FlowNetwork final : public NetworkSim {
 public:
  FlowNetwork(const Cluster& c, Engine& e) : c_(c), e_(e) {
    const auto& links = c.topology->links();
    capacity_.resize(links.size());
    for (size_t i = 0; i < links.size(); ++i) capacity_[i] = links[i].gb_per_s;
    link_flows_.resize(links.size());
    link_mark_.assign(links.size(), 0);
  }

  void start(const CollectiveRequest& req, std::function<void()> on_done) override {
    ++stats_.collectives;
    Coll coll;
    coll.plan = plan_collective(c_, req);
    coll.on_done = std::move(on_done);
    const int32_t id = static_cast<int32_t>(colls_.size());
    colls_.push_back(std::move(coll));
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
    std::vector<int32_t> done;
    while (!heap_.empty()) {
      const HeapEntry h = heap_.top();
      const Flow& f = flows_[h.flow];
      if (!f.active || f.version != h.version) {
        heap_.pop();
        continue;
      }
      if (h.t > now) break;
      heap_.pop();
      done.push_back(h.flow);
    }
    std::vector<int32_t> seed_links;
    std::vector<int32_t> finished_colls;
    for (int32_t fi : done) {
      Flow& f = flows_[fi];
      f.active = false;
      for (int32_t l : f.route) {
        auto& lf = link_flows_[l];
        lf.erase(std::find(lf.begin(), lf.end(), fi));
        seed_links.push_back(l);
      }
      free_.push_back(fi);
      Coll& co = colls_[f.coll];
      if (--co.pending == 0) finished_colls.push_back(f.coll);
    }
    resolve(seed_links, now);
    for (int32_t ci : finished_colls) end_phase(ci, now);
  }

  const NetworkStats& stats() const override { return stats_; }

 private:
  struct Flow {
    int32_t coll = -1;
    double remaining = 0;  // bytes per unit flow still to send
    double weight = 1;
    double rate = 0;       // bytes/ns per unit flow
    TimeNs updated = 0;    // remaining is exact at this time
    uint32_t version = 0;
    bool active = false;
    bool scheduled = false;  // has a valid completion entry in the heap
    std::vector<int32_t> route;
  };
  struct Coll {
    CollectivePlan plan;
    std::function<void()> on_done;
    size_t phase = 0;
    int64_t pending = 0;
    TimeNs alpha_ns = 0;  // current phase's latency per step
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
    if (co.phase >= co.plan.phases.size()) {
      auto cb = std::move(co.on_done);
      co.plan.phases.clear();
      e_.schedule_at(now, std::move(cb));
      return;
    }
    const Phase& ph = co.plan.phases[co.phase];
    const Topology& topo = *c_.topology;
    std::vector<int32_t> seed_links;
    PhaseLatency lat;
    co.pending = 0;
    for (const FlowSpec& fs : ph.flows) {
      int32_t fi;
      if (!free_.empty()) {
        fi = free_.back();
        free_.pop_back();
      } else {
        fi = static_cast<int32_t>(flows_.size());
        flows_.emplace_back();
      }
      Flow& f = flows_[fi];
      f.coll = ci;
      f.remaining = fs.bytes;
      f.weight = fs.weight;
      f.rate = 0;
      f.updated = now;
      f.active = true;
      f.scheduled = false;
      ++f.version;
      f.route.clear();
      topo.route(fs.src, fs.dst, flow_hash(fs.src, fs.dst), f.route);
      lat.add(topo.path_latency_ns(f.route), fs.weight);
      for (int32_t l : f.route) {
        link_flows_[l].push_back(fi);
        seed_links.push_back(l);
      }
      ++co.pending;
      ++stats_.flows;
    }
    co.alpha_ns = lat.alpha_ns(ph, c_);
    if (co.pending == 0) {
      end_phase(ci, now);
      return;
    }
    resolve(seed_links, now);
  }

  void end_phase(int32_t ci, TimeNs now) {
    Coll& co = colls_[ci];
    const TimeNs lat = static_cast<TimeNs>(co.plan.phases[co.phase].latency_steps) * co.alpha_ns;
    ++co.phase;
    e_.schedule_at(now + lat, [this, ci] { start_phase(ci); });
  }

  // Re-rates every active flow connected (through shared links, transitively) to seed_links.
  void resolve(const std::vector<int32_t>& seed_links, TimeNs now) {
    ++mark_epoch_;
    comp_flows_.clear();
    std::vector<int32_t> stack;
    for (int32_t l : seed_links) {
      if (link_mark_[l] != mark_epoch_) {
        link_mark_[l] = mark_epoch_;
        stack.push_back(l);
      }
    }
    if (flow_mark_.size() < flows_.size()) flow_mark_.resize(flows_.size(), 0);
    while (!stack.empty()) {
      const int32_t l = stack.back();
      stack.pop_back();
      for (int32_t fi : link_flows_[l]) {
        if (flow_mark_[fi] == mark_epoch_) continue;
        flow_mark_[fi] = mark_epoch_;
        comp_flows_.push_back(fi);
        for (int32_t l2 : flows_[fi].route) {
          if (link_mark_[l2] != mark_epoch_) {
            link_mark_[l2] = mark_epoch_;
            stack.push_back(l2);
          }
        }
      }
    }
    if (comp_flows_.empty()) return;
    std::sort(comp_flows_.begin(), comp_flows_.end());  // solve order independent of discovery order
    mm_flows_.resize(comp_flows_.size());
    for (size_t i = 0; i < comp_flows_.size(); ++i) {
      Flow& f = flows_[comp_flows_[i]];
      // Bring progress up to now at the old rate.
      if (now > f.updated) {
        f.remaining = std::max(0.0, f.remaining - f.rate * static_cast<double>(now - f.updated));
        f.updated = now;
      }
      mm_flows_[i] = MaxMinFlow{f.route.data(), static_cast<int32_t>(f.route.size()), f.weight};
    }
    solver_.solve(capacity_, mm_flows_, rates_);
    ++stats_.solves;
    stats_.solved_flows += comp_flows_.size();
    for (size_t i = 0; i < comp_flows_.size(); ++i) {
      const int32_t fi = comp_flows_[i];
      Flow& f = flows_[fi];
      const double r = rates_[i];
      const double old_rate = f.rate;
      f.rate = r;
      // An unchanged rate keeps its completion time (avoids re-rounding flows the change missed).
      if (f.scheduled && old_rate == r) continue;
      f.scheduled = true;
      ++f.version;
      const double dt = (r > 0 && std::isfinite(r)) ? std::ceil(f.remaining / r) : (r > 0 ? 0.0 : 1e18);
      heap_.push(HeapEntry{now + static_cast<TimeNs>(dt), fi, f.version});
    }
  }

  const Cluster& c_;
  Engine& e_;
  NetworkStats stats_;
  std::vector<double> capacity_;
  std::vector<std::vector<int32_t>> link_flows_;
  std::vector<Flow> flows_;
  std::vector<int32_t> free_;
  std::vector<Coll> colls_;
  mutable std::priority_queue<HeapEntry, std::vector<HeapEntry>, Later> heap_;
  std::vector<uint32_t> link_mark_, flow_mark_;
  uint32_t mark_epoch_ = 0;
  std::vector<int32_t> comp_flows_;
  std::vector<MaxMinFlow> mm_flows_;
  std::vector<double> rates_;
  MaxMinSolver solver_;
};

}  // namespace

std::unique_ptr<NetworkSim> make_network(NetworkModel model, const Cluster& cluster, Engine& engine) {
  if (!cluster.topology) throw InternalError("cluster topology not built (call build_topology)");
  std::unique_ptr<NetworkSim> n;
  if (model == NetworkModel::Flow) n = std::make_unique<FlowNetwork>(cluster, engine);
  else n = std::make_unique<AnalyticalNetwork>(cluster, engine);
  engine.add_model(n.get());
  return n;
}

int64_t collective_time_ns(const Cluster& cluster, const CollectiveRequest& req, NetworkModel model) {
  if (model == NetworkModel::Analytical) {
    CollectiveRequest r = req;
    if (r.algo == Algorithm::Auto) r.algo = choose_algorithm(cluster, r);
    return std::llround(analyze(cluster, r).at(req.bytes));
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
