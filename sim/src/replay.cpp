// Trace replay: the dependency graph of a recorded run and its re-simulation (see replay.hpp).
#include "orrery/sim/replay.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <tuple>
#include <map>
#include <numeric>
#include <unordered_map>

#include "orrery/common/error.hpp"
#include "orrery/sim/engine.hpp"

namespace orrery::sim {

void set_device_ratio(ReplayOptions& opt, double from_peak_flops, double from_bandwidth, double to_peak_flops,
                      double to_bandwidth) {
  if (!(from_peak_flops > 0) || !(to_peak_flops > 0) || !(from_bandwidth > 0) || !(to_bandwidth > 0))
    throw InputError("replay: device peaks and bandwidths must be > 0 to scale compute");
  opt.compute_flops_scale = from_peak_flops / to_peak_flops;
  opt.compute_bytes_scale = from_bandwidth / to_bandwidth;
}

namespace {

constexpr int32_t kNone = -1;

struct Node {
  int32_t span = 0;            // index into the trace's spans
  int32_t pred = kNone;        // stream predecessor
  int32_t cross = kNone;       // cross-stream dependency
  int64_t gap_ns = 0;          // recorded start − recorded ready time
  int32_t group = kNone;       // collective / transfer group
  int32_t pending = 0;         // deps not yet done
  int64_t ready_ns = 0;        // replay time the last dep finished
  int64_t start_ns = -1, end_ns = -1;
  std::vector<int32_t> dependents;
};

struct Group {
  std::vector<int32_t> members;  // node ids
  traces::CollOp op = traces::CollOp::None;
  int64_t bytes = 0;
  std::vector<int32_t> ranks;    // GPU ids in communicator order (network timing)
  int64_t max_start = INT64_MIN, min_end = INT64_MAX;  // recorded
  int arrived = 0;
  int64_t active_ns = 0;
};

bool is_comm(const traces::Span& s) {
  return s.kind == traces::SpanKind::Collective || s.kind == traces::SpanKind::P2P;
}

int64_t median_of(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

ReplayResult replay(const traces::Trace& t, const Cluster& cluster, const ReplayOptions& opt) {
  ReplayResult res;
  // ---- nodes: every non-phase span, per (rank, stream) in recorded order
  std::vector<Node> nodes;
  for (size_t i = 0; i < t.spans.size(); ++i)
    if (t.spans[i].kind != traces::SpanKind::Phase) {
      nodes.emplace_back();
      nodes.back().span = static_cast<int32_t>(i);
    }
  if (nodes.empty()) throw InputError((t.path.empty() ? std::string("trace") : t.path) + ": no spans to replay");
  const auto& S = t.spans;
  auto span = [&](int32_t n) -> const traces::Span& { return S[nodes[n].span]; };
  std::vector<int32_t> order(nodes.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const auto &x = span(a), &y = span(b);
    return std::tie(x.rank, x.stream, x.start_ns, x.end_ns, nodes[a].span) <
           std::tie(y.rank, y.stream, y.start_ns, y.end_ns, nodes[b].span);
  });
  int32_t world = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const int32_t n = order[k];
    world = std::max(world, span(n).rank + 1);
    if (k > 0) {
      const int32_t p = order[k - 1];
      if (span(p).rank == span(n).rank && span(p).stream == span(n).stream) nodes[n].pred = p;
    }
  }
  // Posted transfers run concurrently with what the stream issues after them (the runtime posts a
  // pipeline send and moves on; under 1F1B the next receive starts while it is in flight): a span
  // that started before a P2P predecessor ended follows the latest span of its stream that had ended
  // by then, not the transfer (which may itself wait on the peer: ordering behind it deadlocks).
  for (int32_t n = 0; n < int32_t(nodes.size()); ++n) {
    int32_t p = nodes[n].pred;
    if (p == kNone || span(p).kind != traces::SpanKind::P2P || span(n).start_ns >= span(p).end_ns) continue;
    while (p != kNone && span(p).end_ns > span(n).start_ns) p = nodes[p].pred;
    nodes[n].pred = p;
  }
  if (!opt.identity && world > cluster.num_gpus())
    throw InputError("replay: the trace has " + std::to_string(world) + " ranks but cluster '" + cluster.name +
                     "' has " + std::to_string(cluster.num_gpus()) + " GPUs");

  // ---- cross-stream waits: per rank, spans by end time
  {
    std::map<int32_t, std::vector<int32_t>> by_rank_end;
    for (int32_t n = 0; n < int32_t(nodes.size()); ++n) by_rank_end[span(n).rank].push_back(n);
    for (auto& [r, v] : by_rank_end)
      std::sort(v.begin(), v.end(), [&](int32_t a, int32_t b) {
        return std::tie(span(a).end_ns, nodes[a].span) < std::tie(span(b).end_ns, nodes[b].span);
      });
    for (int32_t n = 0; n < int32_t(nodes.size()); ++n) {
      const auto& s = span(n);
      // Communication is launched by the host after the work that produced its data: it depends on
      // the latest span of another stream that ended before it started. Other spans depend on one
      // only when they waited past their stream predecessor for it.
      const int64_t pred_end = nodes[n].pred == kNone ? INT64_MIN : span(nodes[n].pred).end_ns;
      const int64_t after = is_comm(s) ? INT64_MIN : pred_end;
      if (s.start_ns < pred_end) continue;  // overlaps its predecessor (nested spans): stream order only
      const auto& v = by_rank_end[s.rank];
      // Latest span of another stream with after < end <= start.
      auto it = std::upper_bound(v.begin(), v.end(), s.start_ns,
                                 [&](int64_t tval, int32_t m) { return tval < span(m).end_ns; });
      // Only spans ordered before this one by (start, end, index), the key of the stream order: every
      // edge then goes forward in that order and the graph cannot cycle (two zero-length spans at the
      // same instant on two streams would otherwise each wait for the other).
      auto before = [&](int32_t c, int32_t m) {
        const auto &x = span(c), &y = span(m);
        return std::tie(x.start_ns, x.end_ns, nodes[c].span) < std::tie(y.start_ns, y.end_ns, nodes[m].span);
      };
      while (it != v.begin()) {
        --it;
        const auto& c = span(*it);
        if (c.end_ns <= after) break;
        if (c.stream != s.stream && before(*it, n)) {
          nodes[n].cross = *it;
          break;
        }
      }
    }
  }
  int64_t t0 = INT64_MAX;
  for (const auto& n : nodes) t0 = std::min(t0, S[n.span].start_ns);
  for (int32_t n = 0; n < int32_t(nodes.size()); ++n) {
    Node& nd = nodes[n];
    int64_t ready = t0;
    if (nd.pred != kNone) ready = std::max(ready, span(nd.pred).end_ns), nd.pending++, nodes[nd.pred].dependents.push_back(n);
    if (nd.cross != kNone) ready = std::max(ready, span(nd.cross).end_ns), nd.pending++, nodes[nd.cross].dependents.push_back(n);
    nd.gap_ns = std::max<int64_t>(0, span(n).start_ns - ready);
    res.edges += (nd.pred != kNone) + (nd.cross != kNone);
  }
  res.nodes = nodes.size();

  // ---- collectives by (comm, seq); transfers by (src, dst, k-th)
  std::vector<Group> groups;
  {
    std::map<std::pair<int32_t, int64_t>, int32_t> coll;
    std::map<std::tuple<int32_t, int32_t, int32_t>, std::vector<int32_t>> sends, recvs;  // (src, dst, comm)
    for (int32_t k : order) {  // recorded order per rank and stream
      const auto& s = span(k);
      if (!is_comm(s)) continue;
      if (s.kind == traces::SpanKind::Collective && s.comm >= 0 && s.seq >= 0) {
        const auto [it, fresh] = coll.try_emplace({s.comm, s.seq}, int32_t(groups.size()));
        if (fresh) {
          Group g;
          g.op = s.op;
          g.bytes = s.bytes;
          if (const auto* c = t.comm(s.comm)) g.ranks = c->ranks;
          groups.push_back(std::move(g));
        }
        groups[it->second].members.push_back(k);
        nodes[k].group = it->second;
      } else if (s.kind == traces::SpanKind::P2P && s.peer >= 0 &&
                 (s.op == traces::CollOp::Send || s.op == traces::CollOp::Recv)) {
        if (s.op == traces::CollOp::Send) sends[{s.rank, s.peer, s.comm}].push_back(k);
        else recvs[{s.peer, s.rank, s.comm}].push_back(k);
      }
    }
    for (auto& [key, sv] : sends) {
      const auto r = recvs.find(key);
      if (r == recvs.end()) continue;
      const size_t m = std::min(sv.size(), r->second.size());
      for (size_t i = 0; i < m; ++i) {
        Group g;
        g.op = traces::CollOp::Send;
        g.bytes = span(sv[i]).bytes;
        g.ranks = {std::get<0>(key), std::get<1>(key)};
        g.members = {sv[i], r->second[i]};
        nodes[sv[i]].group = nodes[r->second[i]].group = int32_t(groups.size());
        groups.push_back(std::move(g));
        res.transfers++;
      }
    }
    // A collective with members missing from the trace is timed member by member (unmatched).
    for (auto& g : groups) {
      const size_t expected = g.op == traces::CollOp::Send ? 2 : (g.ranks.empty() ? g.members.size() : g.ranks.size());
      if (g.members.size() != expected) {
        for (int32_t k : g.members) nodes[k].group = kNone;
        res.unmatched += g.members.size();
        g.members.clear();
        continue;
      }
      if (g.op != traces::CollOp::Send) res.collectives++;
      for (int32_t k : g.members) {
        g.max_start = std::max(g.max_start, span(k).start_ns);
        g.min_end = std::min(g.min_end, span(k).end_ns);
      }
    }
    for (int32_t n = 0; n < int32_t(nodes.size()); ++n)
      if (is_comm(span(n)) && nodes[n].group == kNone && !(span(n).kind == traces::SpanKind::Collective &&
                                                           span(n).comm >= 0 && span(n).seq >= 0))
        res.unmatched++;
  }

  // ---- the replay on the event engine
  Engine engine;
  std::unique_ptr<NetworkSim> net;
  if (!opt.identity) net = make_network(opt.network, cluster, engine);
  std::function<void(int32_t)> finish;
  auto duration_of = [&](int32_t n) -> int64_t {
    const auto& s = span(n);
    if (opt.identity) return s.duration_ns();
    const double scale = s.flops > 0 ? opt.compute_flops_scale : opt.compute_bytes_scale;
    return static_cast<int64_t>(std::llround(double(s.duration_ns()) * scale));
  };
  auto launch_group = [&](int32_t gi) {
    Group& g = groups[gi];
    const int64_t now = engine.now();
    g.active_ns = now;
    if (opt.identity) {
      // Each member ends as recorded after the last arrival.
      for (int32_t k : g.members) {
        const int64_t tail = std::max<int64_t>(0, span(k).end_ns - g.max_start);
        engine.schedule_at(now + tail, [&, k] { finish(k); });
      }
      return;
    }
    auto done = [&, gi] {
      for (int32_t k : groups[gi].members) finish(k);
    };
    CollectiveRequest req;
    req.op = g.op;
    req.members = g.ranks;
    req.bytes = g.bytes;
    bool intra = true;
    for (int32_t r : g.ranks) intra = intra && cluster.node_of(r) == cluster.node_of(g.ranks.front());
    if (opt.profile) {
      if (const auto* o = opt.profile->find_override(g.op, intra, static_cast<int>(g.ranks.size()))) {
        engine.schedule_at(now + o->time_ns(g.bytes, static_cast<int>(g.ranks.size())), done);
        return;
      }
    }
    net->start(req, done);
  };
  auto start_node = [&](int32_t n) {
    Node& nd = nodes[n];
    nd.start_ns = engine.now();
    if (nd.group != kNone) {
      Group& g = groups[nd.group];
      if (++g.arrived == int(g.members.size())) launch_group(nd.group);
      return;
    }
    engine.schedule_at(engine.now() + duration_of(n), [&, n] { finish(n); });
  };
  finish = [&](int32_t n) {
    Node& nd = nodes[n];
    nd.end_ns = engine.now();
    for (int32_t d : nd.dependents) {
      Node& dn = nodes[d];
      dn.ready_ns = std::max(dn.ready_ns, nd.end_ns);
      if (--dn.pending == 0) engine.schedule_at(dn.ready_ns + dn.gap_ns, [&, d] { start_node(d); });
    }
  };
  for (int32_t n = 0; n < int32_t(nodes.size()); ++n)
    if (nodes[n].pending == 0) engine.schedule_at(nodes[n].gap_ns, [&, n] { start_node(n); });
  engine.run();
  for (const auto& nd : nodes)
    if (nd.end_ns < 0)
      throw InternalError("replay: the dependency graph of the trace deadlocked (a span never ran: rank " +
                          std::to_string(S[nd.span].rank) + ", '" + t.name_of(S[nd.span]) + "')");

  // ---- the replayed trace: work spans retimed (back at the recorded origin), phases re-fitted
  res.trace = t;
  res.trace.meta.source = traces::TraceSource::Sim;
  for (const auto& nd : nodes) {
    auto& sp = res.trace.spans[nd.span];
    sp.start_ns = nd.start_ns + t0;
    sp.end_ns = nd.end_ns + t0;
  }
  {
    // Phase spans cover the work spans of their rank that they covered in the recording.
    std::map<int32_t, std::vector<int32_t>> rank_nodes;  // by recorded start
    for (int32_t n = 0; n < int32_t(nodes.size()); ++n) rank_nodes[span(n).rank].push_back(n);
    for (auto& [r, v] : rank_nodes)
      std::sort(v.begin(), v.end(), [&](int32_t a, int32_t b) { return span(a).start_ns < span(b).start_ns; });
    for (size_t i = 0; i < S.size(); ++i) {
      if (S[i].kind != traces::SpanKind::Phase) continue;
      const auto& ph = S[i];
      auto& out = res.trace.spans[i];
      const auto& v = rank_nodes[ph.rank];
      auto it = std::lower_bound(v.begin(), v.end(), ph.start_ns,
                                 [&](int32_t m, int64_t tv) { return span(m).start_ns < tv; });
      int64_t lo = INT64_MAX, hi = INT64_MIN;
      for (auto j = it; j != v.end() && span(*j).start_ns < ph.end_ns; ++j) {
        if (span(*j).end_ns > ph.end_ns) continue;
        lo = std::min(lo, nodes[*j].start_ns + t0 - (span(*j).start_ns - ph.start_ns));
        hi = std::max(hi, nodes[*j].end_ns + t0 + (ph.end_ns - span(*j).end_ns));
      }
      if (lo <= hi) {
        // The recorded margins of the phase around its first and last span are kept.
        out.start_ns = lo;
        out.end_ns = hi;
      } else if (it != v.begin()) {
        const int32_t p = *(it - 1);  // shift with the span before it
        const int64_t shift = nodes[p].end_ns + t0 - span(p).end_ns;
        out.start_ns += shift;
        out.end_ns += shift;
      }
    }
  }
  res.trace.sort_spans();

  // ---- step times: max end − min start over ranks of the step's work spans
  std::map<int32_t, std::pair<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>>> st;
  int64_t rec_lo = INT64_MAX, rec_hi = INT64_MIN, rep_lo = INT64_MAX, rep_hi = INT64_MIN;
  for (const auto& nd : nodes) {
    const auto& s = S[nd.span];
    rec_lo = std::min(rec_lo, s.start_ns), rec_hi = std::max(rec_hi, s.end_ns);
    rep_lo = std::min(rep_lo, nd.start_ns), rep_hi = std::max(rep_hi, nd.end_ns);
    if (s.step < 0) continue;
    auto it = st.try_emplace(s.step, std::make_pair(std::make_pair(INT64_MAX, INT64_MIN),
                                                    std::make_pair(INT64_MAX, INT64_MIN)))
                  .first;
    auto& [rec, rep] = it->second;
    rec.first = std::min(rec.first, s.start_ns), rec.second = std::max(rec.second, s.end_ns);
    rep.first = std::min(rep.first, nd.start_ns), rep.second = std::max(rep.second, nd.end_ns);
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
  res.recorded_step_ns = median_of(rec_steps);
  res.replayed_step_ns = median_of(rep_steps);
  if (st.empty()) res.recorded_step_ns = res.recorded_makespan_ns, res.replayed_step_ns = res.replayed_makespan_ns;
  return res;
}

}  // namespace orrery::sim
