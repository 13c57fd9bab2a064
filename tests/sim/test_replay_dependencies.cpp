// traces::span_dependencies() (traces/chakra.hpp) holds the rules of replay's graph
// (sim/replay.hpp builds its edges from it, and the Chakra export writes them): on every kind of
// trace replay meets (DDP with jitter and a straggler, a GPipe pipeline with transfers,
// zero-length spans at one instant on three streams, a 1F1B receive started while a send is in
// flight) replay counts the edges it returns, every edge stays on its rank, none involves a phase,
// and every edge points backwards in (start, end, index) order, so the graph has no cycle.
#include <gtest/gtest.h>

#include <tuple>

#include "orrery/sim/replay.hpp"
#include "orrery/traces/chakra.hpp"
#include "orrery/traces/synth.hpp"

namespace orrery::sim {
namespace {

void expect_same_graph(const traces::Trace& t) {
  ReplayOptions opt;
  opt.identity = true;
  const ReplayResult r = replay(t, Cluster{}, opt);
  const auto deps = traces::span_dependencies(t);
  ASSERT_EQ(deps.size(), t.spans.size());
  size_t edges = 0;
  for (size_t i = 0; i < deps.size(); ++i) {
    for (const int64_t d : {deps[i].pred, deps[i].cross}) {
      if (d < 0) continue;
      ++edges;
      const auto &a = t.spans[static_cast<size_t>(d)], &b = t.spans[i];
      EXPECT_EQ(a.rank, b.rank) << "span " << i;
      EXPECT_NE(a.kind, traces::SpanKind::Phase) << "span " << i;
      EXPECT_LT(std::make_tuple(a.start_ns, a.end_ns, d),
                std::make_tuple(b.start_ns, b.end_ns, static_cast<int64_t>(i)))
          << "span " << i << " depends on a later span " << d;
    }
    if (t.spans[i].kind == traces::SpanKind::Phase) {
      EXPECT_EQ(deps[i].pred, -1);
      EXPECT_EQ(deps[i].cross, -1);
    }
  }
  EXPECT_EQ(edges, r.edges);
  EXPECT_GT(edges, 0u);
}

TEST(ReplayDependencies, DdpTraceWithJitterAndAStraggler) {
  traces::SynthOptions o;
  o.ranks = 4;
  o.steps = 3;
  o.layers = 6;
  o.jitter_ns = 150'000;
  o.straggler_rank = 2;
  o.straggler_delay_ns = 400'000;
  traces::Trace t = traces::synthesize(o);
  t.sort_spans();
  expect_same_graph(t);
}

TEST(ReplayDependencies, PipelineTraceWithTransfers) {
  traces::SynthOptions o;
  o.ranks = 4;
  o.pp = 2;
  o.micro_batches = 4;
  o.steps = 2;
  o.layers = 4;
  traces::Trace t = traces::synthesize(o);
  t.sort_spans();
  expect_same_graph(t);
}

TEST(ReplayDependencies, ZeroLengthSpansAndAReceiveDuringASend) {
  traces::Trace t;
  t.meta.world_size = 2;
  t.comms.push_back({0, traces::CommKind::PP, "pp", {0, 1}});
  const auto k = t.strings.intern("kernel"), c = t.strings.intern("copy"),
             p = t.strings.intern("p2p");
  auto add = [&](int rank, int stream, traces::SpanKind kind, traces::NameId name, int64_t start,
                 int64_t end, traces::CollOp op = traces::CollOp::None, int peer = -1) {
    traces::Span s;
    s.rank = rank, s.stream = stream, s.kind = kind, s.name = name, s.start_ns = start,
    s.end_ns = end;
    s.op = op, s.peer = peer, s.comm = peer >= 0 ? 0 : -1;
    t.spans.push_back(s);
  };
  using K = traces::SpanKind;
  add(0, 0, K::Compute, k, 0, 100);
  for (int i = 0; i < 4; ++i) {
    add(0, 0, K::Compute, k, 100, 100);
    add(0, 1, K::Memcpy, c, 100, 100);
    add(0, 2, K::Compute, k, 100, 100);
  }
  add(0, 1, K::Memcpy, c, 100, 250);
  // Rank 0 posts a send (300-700) and receives (310-500) on the same stream while it is in flight.
  add(0, 3, K::P2P, p, 300, 700, traces::CollOp::Send, 1);
  add(0, 3, K::P2P, p, 310, 500, traces::CollOp::Recv, 1);
  add(0, 0, K::Compute, k, 500, 600);
  add(1, 0, K::Compute, k, 200, 300);
  add(1, 3, K::P2P, p, 300, 500, traces::CollOp::Send, 0);
  add(1, 3, K::P2P, p, 500, 700, traces::CollOp::Recv, 0);
  add(1, 0, K::Compute, k, 700, 800);
  add(0, 4, K::Phase, t.strings.intern("step"), 0, 800);
  t.sort_spans();
  expect_same_graph(t);
}

}  // namespace
}  // namespace orrery::sim
