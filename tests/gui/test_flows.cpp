// Flows (send -> receive, members of a collective instance) and their start skew, on generated
// traces whose schedule is known in closed form (traces/synth.hpp), without widgets.
#include <gtest/gtest.h>

#include <QAbstractItemModelTester>

#include "orrery/common/format.hpp"
#include "orrery/gui/counter_tracks.hpp"
#include "orrery/gui/flows.hpp"
#include "orrery/gui/models.hpp"
#include "orrery/traces/synth.hpp"

using namespace orrery::gui;
namespace traces = orrery::traces;

namespace {

// 4 ranks, rank 2 loads its data 300 us longer every step, so it starts every all-reduce 300 us
// after the others (the buckets' all-reduce time, 3 ms, is below the 4 ms of backward between
// buckets, so the delay neither grows nor shrinks).
traces::SynthOptions straggler_opts() {
  traces::SynthOptions o;
  o.ranks = 4;
  o.steps = 2;
  o.layers = 4;
  o.straggler_rank = 2;
  o.straggler_delay_ns = 300'000;
  return o;
}

uint32_t find_collective(const traces::Trace& t, int32_t rank, int64_t seq) {
  for (size_t i = 0; i < t.spans.size(); ++i) {
    const auto& s = t.spans[i];
    if (s.kind == traces::SpanKind::Collective && s.rank == rank && s.seq == seq)
      return static_cast<uint32_t>(i);
  }
  ADD_FAILURE() << "no collective seq " << seq << " on rank " << rank;
  return 0;
}

}  // namespace

TEST(GuiFlows, CollectiveInstanceListsEveryRankWithItsStartSkew) {
  const auto t = traces::synthesize(straggler_opts());
  const FlowIndex flows(t);
  // 2 steps x 2 buckets, one instance each; no P2P without a pipeline.
  EXPECT_EQ(flows.collective_count(), 4u);
  EXPECT_EQ(flows.p2p_count(), 0u);
  for (int64_t seq = 0; seq < 4; ++seq) {
    const uint32_t s0 = find_collective(t, 0, seq);
    const FlowInfo f = flows.flow_of(t, s0);
    ASSERT_EQ(f.kind, FlowKind::Collective);
    EXPECT_EQ(f.seq, seq);
    EXPECT_EQ(f.comm, 0);
    ASSERT_EQ(f.members.size(), 4u);
    EXPECT_EQ(f.spread_ns, 300'000) << "seq " << seq;
    EXPECT_EQ(f.last_rank, 2);
    // By start: ranks 0, 1, 3 together, then the straggler.
    EXPECT_EQ(f.members.back().rank, 2);
    EXPECT_EQ(f.members.back().skew_ns, 300'000);
    EXPECT_EQ(f.members.back().wait_ns, 0);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_NE(f.members[i].rank, 2);
      EXPECT_EQ(f.members[i].skew_ns, 0);
      EXPECT_EQ(f.members[i].wait_ns, 300'000);
    }
    // Every member sees the same flow.
    for (const auto& m : f.members) EXPECT_EQ(flows.members_of(m.span).size(), 4u);
  }
  // A compute span is in no flow.
  for (size_t i = 0; i < t.spans.size(); ++i) {
    if (t.spans[i].kind == traces::SpanKind::Compute) {
      EXPECT_EQ(flows.flow_of(t, static_cast<uint32_t>(i)).kind, FlowKind::None);
      EXPECT_TRUE(flows.members_of(static_cast<uint32_t>(i)).empty());
      break;
    }
  }
}

TEST(GuiFlows, DetailsRowsNameTheLastRankAndEachWait) {
  const auto t = traces::synthesize(straggler_opts());
  const FlowIndex flows(t);
  const auto rows = flow_attributes(t, flows.flow_of(t, find_collective(t, 1, 0)));
  auto value = [&](const std::string& k) {
    for (const auto& [a, b] : rows)
      if (a == k) return b;
    return std::string("<none>");
  };
  EXPECT_EQ(value("Flow"), "all_reduce: 4 ranks, world, seq 0");
  EXPECT_EQ(value("Start skew"), orrery::format_duration_ns(300'000));
  EXPECT_EQ(value("Last to arrive"), "rank 2");
  EXPECT_EQ(value("  rank 2"), "+" + orrery::format_duration_ns(300'000) + ", waited " +
                                   orrery::format_duration_ns(0));
  EXPECT_EQ(value("  rank 0"), "+" + orrery::format_duration_ns(0) + ", waited " +
                                   orrery::format_duration_ns(300'000));
  // 3 summary rows and one per rank.
  EXPECT_EQ(rows.size(), 3u + 4u);
}

TEST(GuiFlows, EverySendIsLinkedToItsReceiveOnThePeer) {
  traces::SynthOptions o;
  o.ranks = 4;
  o.pp = 2;
  o.steps = 2;
  o.layers = 4;
  o.micro_batches = 3;
  const auto t = traces::synthesize(o);
  const FlowIndex flows(t);
  // Per pipeline, step and micro-batch: one forward and one backward hop between the two stages.
  // 2 pipelines x 2 steps x 3 micro-batches x 2 hops.
  EXPECT_EQ(flows.p2p_count(), 24u);
  size_t sends = 0;
  for (size_t i = 0; i < t.spans.size(); ++i) {
    const auto& s = t.spans[i];
    if (s.op != traces::CollOp::Send) continue;
    ++sends;
    const FlowInfo f = flows.flow_of(t, static_cast<uint32_t>(i));
    ASSERT_EQ(f.kind, FlowKind::P2P);
    EXPECT_EQ(f.send, i);
    const auto& r = t.spans[f.recv];
    EXPECT_EQ(r.op, traces::CollOp::Recv);
    EXPECT_EQ(r.rank, s.peer);
    EXPECT_EQ(r.peer, s.rank);
    EXPECT_EQ(r.micro_batch, s.micro_batch);
    EXPECT_EQ(r.step, s.step);
    // The receive's flow is the same pair.
    const FlowInfo back = flows.flow_of(t, f.recv);
    EXPECT_EQ(back.send, i);
    EXPECT_EQ(back.recv, f.recv);
  }
  EXPECT_EQ(sends, 24u);
}

// Counter tracks: one step function per (rank, name), the value in effect at a time, and the
// folding into pixel columns (exact at 1 ns per pixel).
namespace {

traces::Trace counter_trace() {
  traces::Trace t;
  const auto mem = t.strings.intern("mem.x");
  const auto loss = t.strings.intern("loss");
  t.counters.push_back({0, mem, 300, 0});
  t.counters.push_back({0, mem, 100, 10});
  t.counters.push_back({1, loss, 150, 2.5});
  t.counters.push_back({0, mem, 200, 30});
  return t;
}

}  // namespace

TEST(GuiCounters, TracksPerRankAndNameWithTheValueInEffect) {
  const auto tracks = counter_tracks(counter_trace());
  ASSERT_EQ(tracks.size(), 2u);
  EXPECT_EQ(tracks[0].rank, 0);
  EXPECT_EQ(tracks[0].name, "mem.x");
  EXPECT_EQ(tracks[0].ts_ns, (std::vector<int64_t>{100, 200, 300}));
  EXPECT_EQ(tracks[0].value, (std::vector<double>{10, 30, 0}));
  EXPECT_EQ(tracks[0].min, 0);
  EXPECT_EQ(tracks[0].max, 30);
  EXPECT_EQ(tracks[1].rank, 1);
  EXPECT_EQ(tracks[1].name, "loss");
  EXPECT_FALSE(counter_value_at(tracks[0], 99).has_value());
  EXPECT_EQ(*counter_value_at(tracks[0], 100), 10);
  EXPECT_EQ(*counter_value_at(tracks[0], 199), 10);
  EXPECT_EQ(*counter_value_at(tracks[0], 250), 30);
  EXPECT_EQ(*counter_value_at(tracks[0], 5000), 0);
  EXPECT_EQ(format_counter("loss", 2.5), "2.5");
  EXPECT_EQ(format_counter("mem.x", 30), orrery::format_bytes(30));
}

TEST(GuiCounters, FoldedIntoPixelColumns) {
  const auto tracks = counter_trace();
  const auto c = counter_tracks(tracks)[0];
  TimeMapping m;
  m.fit(0, 400, 400);  // 1 ns per pixel
  std::vector<CounterColumn> cols;
  fold_counter(c, m, 400, 350, cols);
  // From the first sample (x = 100) to the track's end (350).
  ASSERT_EQ(cols.size(), 251u);
  EXPECT_EQ(cols.front().x, 100);
  EXPECT_EQ(cols.back().x, 350);
  auto at = [&](int x) {
    for (const auto& col : cols)
      if (col.x == x) return col;
    ADD_FAILURE() << "no column " << x;
    return CounterColumn{};
  };
  EXPECT_EQ(at(199).lo, 10);
  EXPECT_EQ(at(199).hi, 10);
  EXPECT_EQ(at(200).lo, 10);  // the step up to 30 happens in this column
  EXPECT_EQ(at(200).hi, 30);
  EXPECT_EQ(at(200).last, 30);
  EXPECT_EQ(at(300).lo, 0);
  EXPECT_EQ(at(300).hi, 30);
  EXPECT_EQ(at(340).hi, 0);
  // Zoomed out, 100 ns per pixel: every sample of the track falls in columns 1..3, whose ranges
  // hold each step.
  TimeMapping wide;
  wide.fit(0, 40'000, 400);
  cols.clear();
  fold_counter(c, wide, 400, 350, cols);
  ASSERT_EQ(cols.size(), 3u);
  EXPECT_EQ(cols[0].x, 1);
  EXPECT_EQ(cols[0].lo, 10);
  EXPECT_EQ(cols[1].hi, 30);
  EXPECT_EQ(cols[2].last, 0);
}

// A range's spans by name: counts, clipped times and shares worked out by hand.
TEST(GuiRangeByName, CountsClippedTimesAndShares) {
  traces::Trace t;
  const auto a = t.strings.intern("a");
  const auto b = t.strings.intern("b");
  const auto c = t.strings.intern("c");
  auto add = [&](int32_t rank, traces::NameId n, int64_t s0, int64_t s1,
                 traces::SpanKind k = traces::SpanKind::Compute) {
    traces::Span s;
    s.rank = rank;
    s.name = n;
    s.start_ns = s0;
    s.end_ns = s1;
    s.kind = k;
    t.spans.push_back(s);
  };
  add(0, a, 0, 100);    // 50 inside [50, 250]
  add(0, b, 100, 150);  // 50
  add(0, a, 200, 300);  // 50
  add(1, a, 50, 250);   // 200
  add(1, b, 250, 260);  // touches the end only: out
  add(1, c, 0, 50);     // touches the start only: out
  add(1, c, 120, 130, traces::SpanKind::Phase);
  auto rows = range_by_name(t, 50, 250);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].name, "a");
  EXPECT_EQ(rows[0].count, 3);
  EXPECT_EQ(rows[0].total_ns, 300);
  EXPECT_EQ(rows[0].mean_ns(), 100);
  EXPECT_EQ(rows[0].max_ns, 200);
  EXPECT_DOUBLE_EQ(rows[0].share, 300.0 / (200.0 * 2));
  EXPECT_EQ(rows[1].name, "b");
  EXPECT_EQ(rows[1].count, 1);
  EXPECT_EQ(rows[1].total_ns, 50);
  EXPECT_DOUBLE_EQ(rows[1].share, 50.0 / 400.0);
  EXPECT_EQ(rows[2].name, "c");
  EXPECT_EQ(rows[2].total_ns, 10);
  // Without phases, c is gone.
  rows = range_by_name(t, 50, 250, kAllKinds & ~kind_bit(traces::SpanKind::Phase));
  EXPECT_EQ(rows.size(), 2u);

  RangeByNameModel m;
  QAbstractItemModelTester tester(&m, QAbstractItemModelTester::FailureReportingMode::Fatal);
  m.set_rows(range_by_name(t, 50, 250));
  EXPECT_EQ(m.rowCount(), 3);
  EXPECT_EQ(m.data(m.index(0, RangeByNameModel::kTotal), Qt::UserRole).toLongLong(), 300);
  EXPECT_EQ(m.data(m.index(0, RangeByNameModel::kShare)).toString(), "75.0 %");
  EXPECT_EQ(m.data(m.index(1, RangeByNameModel::kCount)).toString(), "1");
}
