// Trace replay: the dependency graph of a recorded run and its re-simulation (see replay.hpp).
//
// The steps, each a function below: build_graph (nodes and their stream-order and cross-stream
// edges), group_communication (collectives and transfers), Replayer::run (the re-simulation on the
// event engine and network model the executor uses), retimed_trace (the replayed trace) and
// step_times (recorded against replayed step times).
//
// Why replay keeps its own loop beside sim::Executor (executor.cpp): the executor runs a workload's
// stage programs, and a recorded graph is not one. An op there starts as soon as its stream is free
// and its deps are done; a replayed span starts its recorded launch gap after its last dependency,
// its stream is not a serial resource (a span may start while a posted transfer before it on its
// stream is in flight), its collectives are the trace's (communicator, sequence) groups rather than
// a layout's groups, and with identity timing each member of a collective ends at its own recorded
// time. Both run on the same engine and network models and apply the profile's overrides alike.
#include "orrery/sim/replay.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <tuple>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/common/stats.hpp"
#include "orrery/sim/engine.hpp"
#include "orrery/traces/chakra.hpp"
#include "orrery/traces/collective_instances.hpp"

namespace orrery::sim {

void set_device_ratio(ReplayOptions& opt, double from_peak_flops, double from_bandwidth,
                      double to_peak_flops, double to_bandwidth) {
  if (!(from_peak_flops > 0) || !(to_peak_flops > 0) || !(from_bandwidth > 0) ||
      !(to_bandwidth > 0))
    throw InputError("replay: device peaks and bandwidths must be > 0 to scale compute");
  opt.compute_flops_scale = from_peak_flops / to_peak_flops;
  opt.compute_bytes_scale = from_bandwidth / to_bandwidth;
}

namespace {

constexpr int32_t kNone = -1;

struct Node {
  int32_t span = 0;       // index into the trace's spans
  int32_t pred = kNone;   // stream predecessor
  int32_t cross = kNone;  // cross-stream dependency
  int64_t gap_ns = 0;     // recorded start − recorded ready time
  int32_t group = kNone;  // collective / transfer group
  int32_t deps = 0;       // dependencies (pred and cross)
  std::vector<int32_t> dependents;
};

// The dependency graph of a trace.
struct Graph {
  std::vector<Node> nodes;     // every non-phase span, in span order
  std::vector<int32_t> order;  // node ids by (rank, stream, start, end, span index): recorded order
  int32_t world = 0;           // ranks (1 + the highest rank of a node)
  int64_t t0 = 0;              // earliest recorded start: the replay's time origin
  size_t edges = 0;            // stream-order and cross-stream edges
};

struct Group {
  std::vector<int32_t> members;  // node ids
  traces::CollOp op = traces::CollOp::None;
  int64_t bytes = 0;
  std::vector<int32_t> ranks;     // GPU ids in communicator order (network timing)
  int64_t max_start = INT64_MIN;  // recorded: the last member's arrival
};

// Collectives and transfers matched across ranks; the spans of the others are timed alone.
struct Grouping {
  std::vector<Group> groups;  // a group that lost its members (unmatched) keeps no members
  size_t collectives = 0;
  size_t transfers = 0;
  size_t unmatched = 0;
};

bool is_comm(const traces::Span& s) {
  return s.kind == traces::SpanKind::Collective || s.kind == traces::SpanKind::P2P;
}

// A collective span that names its communicator and sequence number: grouped by both.
bool is_sequenced_collective(const traces::Span& s) {
  return s.kind == traces::SpanKind::Collective && s.comm >= 0 && s.seq >= 0;
}

// Stream order (Graph::order, world) and each node's edges: its predecessor on its (rank, stream)
// and the span of another stream it waited for, by traces::span_dependencies (the rules are
// written there once, for the Chakra export too: posted transfers, nesting, no cycles).
void link_dependencies(const traces::Trace& t, Graph& g) {
  const auto& S = t.spans;
  auto span = [&](int32_t n) -> const traces::Span& { return S[g.nodes[n].span]; };
  g.order.resize(g.nodes.size());
  std::iota(g.order.begin(), g.order.end(), 0);
  std::sort(g.order.begin(), g.order.end(), [&](int32_t a, int32_t b) {
    const auto &x = span(a), &y = span(b);
    return std::tie(x.rank, x.stream, x.start_ns, x.end_ns, g.nodes[a].span) <
           std::tie(y.rank, y.stream, y.start_ns, y.end_ns, g.nodes[b].span);
  });
  for (const auto& nd : g.nodes) g.world = std::max(g.world, S[nd.span].rank + 1);
  std::vector<int32_t> node_of(S.size(), kNone);
  for (int32_t n = 0; n < int32_t(g.nodes.size()); ++n) node_of[size_t(g.nodes[n].span)] = n;
  const std::vector<traces::SpanDependencies> deps = traces::span_dependencies(t);
  for (auto& nd : g.nodes) {
    const traces::SpanDependencies& d = deps[size_t(nd.span)];
    nd.pred = d.pred < 0 ? kNone : node_of[size_t(d.pred)];
    nd.cross = d.cross < 0 ? kNone : node_of[size_t(d.cross)];
  }
}

// The graph of every non-phase span: stream order, cross-stream waits, each node's launch gap.
Graph build_graph(const traces::Trace& t) {
  Graph g;
  for (size_t i = 0; i < t.spans.size(); ++i)
    if (t.spans[i].kind != traces::SpanKind::Phase) {
      g.nodes.emplace_back();
      g.nodes.back().span = static_cast<int32_t>(i);
    }
  if (g.nodes.empty())
    throw InputError((t.path.empty() ? std::string("trace") : t.path) + ": no spans to replay");
  link_dependencies(t, g);
  const auto& S = t.spans;
  g.t0 = INT64_MAX;
  for (const auto& n : g.nodes) g.t0 = std::min(g.t0, S[n.span].start_ns);
  for (int32_t n = 0; n < int32_t(g.nodes.size()); ++n) {
    Node& nd = g.nodes[n];
    int64_t ready = g.t0;
    for (const int32_t dep : {nd.pred, nd.cross}) {
      if (dep == kNone) continue;
      ready = std::max(ready, S[g.nodes[dep].span].end_ns);
      nd.deps++;
      g.nodes[dep].dependents.push_back(n);
    }
    nd.gap_ns = std::max<int64_t>(0, S[nd.span].start_ns - ready);
    g.edges += (nd.pred != kNone) + (nd.cross != kNone);
  }
  return g;
}

// Collectives by (communicator, sequence); transfers by (source, destination, communicator) and
// k-th send = k-th receive in each rank's recorded order (traces/collective_instances.hpp). Sets
// Node::group of every matched member.
Grouping group_communication(const traces::Trace& t, Graph& graph) {
  auto& nodes = graph.nodes;
  auto span = [&](int32_t n) -> const traces::Span& { return t.spans[nodes[n].span]; };
  std::vector<int32_t> node_of(t.spans.size(), kNone);  // by span index (phases have none)
  for (int32_t n = 0; n < int32_t(nodes.size()); ++n) node_of[nodes[n].span] = n;
  std::vector<size_t> position(nodes.size());  // in the recorded order (Graph::order)
  for (size_t k = 0; k < graph.order.size(); ++k) position[graph.order[k]] = k;
  Grouping res;
  auto& groups = res.groups;
  for (const auto& ci : traces::collective_instances(t.spans)) {
    Group g;
    for (const uint32_t i : ci.members) g.members.push_back(node_of[i]);
    // Members in the recorded order (rank, stream, start, end): a group's completions, and so the
    // order its members' dependents are queued in, follow it; op and size are its first member's.
    std::sort(g.members.begin(), g.members.end(),
              [&](int32_t a, int32_t b) { return position[a] < position[b]; });
    g.op = span(g.members.front()).op;
    g.bytes = span(g.members.front()).bytes;
    if (const auto* c = t.comm(ci.comm)) g.ranks = c->ranks;
    for (const int32_t k : g.members) nodes[k].group = int32_t(groups.size());
    groups.push_back(std::move(g));
  }
  traces::P2pOptions p2p;
  p2p.require_comm = false;  // a transfer without a communicator matches as communicator -1
  p2p.order = traces::P2pOrder::Stream;
  for (const auto& m : traces::match_p2p(t.spans, p2p)) {
    const auto& send = t.spans[m.send];
    Group g;
    g.op = traces::CollOp::Send;
    g.bytes = send.bytes;
    g.ranks = {send.rank, send.peer};
    g.members = {node_of[m.send], node_of[m.recv]};
    nodes[g.members[0]].group = nodes[g.members[1]].group = int32_t(groups.size());
    groups.push_back(std::move(g));
    res.transfers++;
  }
  // A collective with members missing from the trace is timed member by member (unmatched).
  for (auto& g : groups) {
    const size_t expected =
        g.op == traces::CollOp::Send ? 2 : (g.ranks.empty() ? g.members.size() : g.ranks.size());
    if (g.members.size() != expected) {
      for (int32_t k : g.members) nodes[k].group = kNone;
      res.unmatched += g.members.size();
      g.members.clear();
      continue;
    }
    if (g.op != traces::CollOp::Send) res.collectives++;
    for (int32_t k : g.members) g.max_start = std::max(g.max_start, span(k).start_ns);
  }
  for (int32_t n = 0; n < int32_t(nodes.size()); ++n)
    if (is_comm(span(n)) && nodes[n].group == kNone && !is_sequenced_collective(span(n)))
      res.unmatched++;
  return res;
}

// A node's replayed extent, in replay time (0 = the recording's t0).
struct Timing {
  int64_t start_ns = -1, end_ns = -1;
};

// The re-simulation: each node starts its recorded gap after its last dependency finished; a group
// member arrives, and the group is timed once all have (the network, a profile override or, with
// identity timing, each member's recorded tail after the last arrival); other nodes take their
// (scaled) recorded duration.
class Replayer {
 public:
  Replayer(const traces::Trace& t, const Cluster& cluster, const ReplayOptions& opt, const Graph& g,
           const std::vector<Group>& groups)
      : t_(t),
        cluster_(cluster),
        opt_(opt),
        graph_(g),
        groups_(groups),
        timing_(g.nodes.size()),
        pending_(g.nodes.size()),
        ready_ns_(g.nodes.size(), 0),
        arrived_(groups.size(), 0) {
    if (!opt.identity) net_ = make_network(opt.network, cluster, engine_);
    for (size_t n = 0; n < g.nodes.size(); ++n) pending_[n] = g.nodes[n].deps;
  }

  // Every node's replayed extent, indexed like Graph::nodes.
  std::vector<Timing> run() {
    const auto& nodes = graph_.nodes;
    for (int32_t n = 0; n < int32_t(nodes.size()); ++n)
      if (pending_[n] == 0) engine_.schedule_at(nodes[n].gap_ns, [this, n] { start_node(n); });
    engine_.run();
    for (size_t n = 0; n < nodes.size(); ++n)
      if (timing_[n].end_ns < 0) {
        const auto& s = t_.spans[nodes[n].span];
        throw InternalError(
            "replay: the dependency graph of the trace deadlocked (a span never ran: rank " +
            std::to_string(s.rank) + ", '" + t_.name_of(s) + "')");
      }
    return std::move(timing_);
  }

 private:
  const traces::Span& span(int32_t n) const { return t_.spans[graph_.nodes[n].span]; }

  int64_t duration_of(int32_t n) const {
    const auto& s = span(n);
    if (opt_.identity) return s.duration_ns();
    const double scale = s.flops > 0 ? opt_.compute_flops_scale : opt_.compute_bytes_scale;
    return static_cast<int64_t>(std::llround(double(s.duration_ns()) * scale));
  }

  void launch_group(int32_t gi) {
    const Group& g = groups_[gi];
    const int64_t now = engine_.now();
    if (opt_.identity) {
      // Each member ends as recorded after the last arrival.
      for (int32_t k : g.members) {
        const int64_t tail = std::max<int64_t>(0, span(k).end_ns - g.max_start);
        engine_.schedule_at(now + tail, [this, k] { finish(k); });
      }
      return;
    }
    auto done = [this, gi] {
      for (int32_t k : groups_[gi].members) finish(k);
    };
    CollectiveRequest req;
    req.op = g.op;
    req.members = g.ranks;
    req.bytes = g.bytes;
    bool intra = true;
    for (int32_t r : g.ranks)
      intra = intra && cluster_.node_of(r) == cluster_.node_of(g.ranks.front());
    if (opt_.profile) {
      if (const auto* o =
              opt_.profile->find_override(g.op, intra, static_cast<int>(g.ranks.size()))) {
        engine_.schedule_at(now + o->time_ns(g.bytes, static_cast<int>(g.ranks.size())), done);
        return;
      }
    }
    net_->start(req, done);
  }

  void start_node(int32_t n) {
    const Node& nd = graph_.nodes[n];
    timing_[n].start_ns = engine_.now();
    if (nd.group != kNone) {
      if (++arrived_[nd.group] == int(groups_[nd.group].members.size())) launch_group(nd.group);
      return;
    }
    engine_.schedule_at(engine_.now() + duration_of(n), [this, n] { finish(n); });
  }

  void finish(int32_t n) {
    timing_[n].end_ns = engine_.now();
    for (int32_t d : graph_.nodes[n].dependents) {
      ready_ns_[d] = std::max(ready_ns_[d], timing_[n].end_ns);
      if (--pending_[d] == 0)
        engine_.schedule_at(ready_ns_[d] + graph_.nodes[d].gap_ns, [this, d] { start_node(d); });
    }
  }

  const traces::Trace& t_;
  const Cluster& cluster_;
  const ReplayOptions& opt_;
  const Graph& graph_;
  const std::vector<Group>& groups_;
  Engine engine_;
  std::unique_ptr<NetworkSim> net_;
  std::vector<Timing> timing_;
  std::vector<int32_t> pending_;   // dependencies not yet done, per node
  std::vector<int64_t> ready_ns_;  // when the last finished dependency finished, per node
  std::vector<int> arrived_;       // members arrived, per group
};

// The replayed trace: work spans retimed (back at the recorded origin), phases re-fitted.
traces::Trace retimed_trace(const traces::Trace& t, const Graph& g,
                            const std::vector<Timing>& timing) {
  const auto& S = t.spans;
  const int64_t t0 = g.t0;
  auto span = [&](int32_t n) -> const traces::Span& { return S[g.nodes[n].span]; };
  traces::Trace out_trace = t;
  out_trace.meta.source = traces::TraceSource::Sim;
  out_trace.meta.origin = traces::TraceOrigin::Replay;  // the recorded layout, re-timed
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    auto& sp = out_trace.spans[g.nodes[n].span];
    sp.start_ns = timing[n].start_ns + t0;
    sp.end_ns = timing[n].end_ns + t0;
  }
  // Phase spans cover the work spans of their rank that they covered in the recording.
  std::map<int32_t, std::vector<int32_t>> rank_nodes;  // by recorded start
  for (int32_t n = 0; n < int32_t(g.nodes.size()); ++n) rank_nodes[span(n).rank].push_back(n);
  for (auto& [r, v] : rank_nodes)
    std::sort(v.begin(), v.end(),
              [&](int32_t a, int32_t b) { return span(a).start_ns < span(b).start_ns; });
  for (size_t i = 0; i < S.size(); ++i) {
    if (S[i].kind != traces::SpanKind::Phase) continue;
    const auto& ph = S[i];
    auto& out = out_trace.spans[i];
    const auto& v = rank_nodes[ph.rank];
    auto it = std::lower_bound(v.begin(), v.end(), ph.start_ns,
                               [&](int32_t m, int64_t tv) { return span(m).start_ns < tv; });
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (auto j = it; j != v.end() && span(*j).start_ns < ph.end_ns; ++j) {
      if (span(*j).end_ns > ph.end_ns) continue;
      lo = std::min(lo, timing[*j].start_ns + t0 - (span(*j).start_ns - ph.start_ns));
      hi = std::max(hi, timing[*j].end_ns + t0 + (ph.end_ns - span(*j).end_ns));
    }
    if (lo <= hi) {
      // The recorded margins of the phase around its first and last span are kept.
      out.start_ns = lo;
      out.end_ns = hi;
    } else if (it != v.begin()) {
      const int32_t p = *(it - 1);  // shift with the span before it
      const int64_t shift = timing[p].end_ns + t0 - span(p).end_ns;
      out.start_ns += shift;
      out.end_ns += shift;
    }
  }
  out_trace.sort_spans();
  return out_trace;
}

// Recorded and replayed step times and makespans.
struct StepTimes {
  std::vector<ReplayStep> steps;
  int64_t recorded_step_ns = 0, replayed_step_ns = 0;
  int64_t recorded_makespan_ns = 0, replayed_makespan_ns = 0;
};

// Step times: max end − min start over ranks of the step's work spans.
StepTimes step_times(const traces::Trace& t, const Graph& g, const std::vector<Timing>& timing) {
  StepTimes res;
  std::map<int32_t, std::pair<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>>> st;
  int64_t rec_lo = INT64_MAX, rec_hi = INT64_MIN, rep_lo = INT64_MAX, rep_hi = INT64_MIN;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const auto& s = t.spans[g.nodes[n].span];
    const Timing& tm = timing[n];
    rec_lo = std::min(rec_lo, s.start_ns), rec_hi = std::max(rec_hi, s.end_ns);
    rep_lo = std::min(rep_lo, tm.start_ns), rep_hi = std::max(rep_hi, tm.end_ns);
    if (s.step < 0) continue;
    auto it = st.try_emplace(s.step, std::make_pair(std::make_pair(INT64_MAX, INT64_MIN),
                                                    std::make_pair(INT64_MAX, INT64_MIN)))
                  .first;
    auto& [rec, rep] = it->second;
    rec.first = std::min(rec.first, s.start_ns), rec.second = std::max(rec.second, s.end_ns);
    rep.first = std::min(rep.first, tm.start_ns), rep.second = std::max(rep.second, tm.end_ns);
  }
  res.recorded_makespan_ns = rec_hi - rec_lo;
  res.replayed_makespan_ns = rep_hi - rep_lo;
  std::vector<int64_t> rec_steps, rep_steps;
  for (const auto& [step, v] : st) {
    res.steps.push_back({step, v.first.second - v.first.first, v.second.second - v.second.first});
    if (st.size() == 1 || step != st.begin()->first) {
      rec_steps.push_back(res.steps.back().recorded_ns);
      rep_steps.push_back(res.steps.back().replayed_ns);
    }
  }
  res.recorded_step_ns = median(rec_steps);
  res.replayed_step_ns = median(rep_steps);
  if (st.empty())
    res.recorded_step_ns = res.recorded_makespan_ns,
    res.replayed_step_ns = res.replayed_makespan_ns;
  return res;
}

}  // namespace

ReplayResult replay(const traces::Trace& t, const Cluster& cluster, const ReplayOptions& opt) {
  Graph graph = build_graph(t);
  if (!opt.identity && graph.world > cluster.num_gpus())
    throw InputError("replay: the trace has " + std::to_string(graph.world) +
                     " ranks but cluster '" + cluster.name + "' has " +
                     std::to_string(cluster.num_gpus()) + " GPUs");
  const Grouping grouping = group_communication(t, graph);
  const std::vector<Timing> timing = Replayer(t, cluster, opt, graph, grouping.groups).run();

  ReplayResult res;
  res.nodes = graph.nodes.size();
  res.edges = graph.edges;
  res.collectives = grouping.collectives;
  res.transfers = grouping.transfers;
  res.unmatched = grouping.unmatched;
  res.trace = retimed_trace(t, graph, timing);
  StepTimes st = step_times(t, graph, timing);
  res.steps = std::move(st.steps);
  res.recorded_step_ns = st.recorded_step_ns;
  res.replayed_step_ns = st.replayed_step_ns;
  res.recorded_makespan_ns = st.recorded_makespan_ns;
  res.replayed_makespan_ns = st.replayed_makespan_ns;
  return res;
}

}  // namespace orrery::sim
