// Lanes, rows and the folding of narrow spans (Tracy's approach), checked with exact counts and
// without painting; and the vertical lane layout.
#include <gtest/gtest.h>

#include <random>

#include "orrery/gui/lane_layout.hpp"
#include "orrery/gui/trace_index.hpp"
#include "orrery/traces/synth.hpp"

using namespace orrery::gui;
using orrery::traces::Span;
using orrery::traces::SpanKind;
using orrery::traces::Trace;

namespace {

Span make_span(int32_t rank, int32_t stream, int64_t start, int64_t end,
               SpanKind k = SpanKind::Compute) {
  Span s;
  s.rank = rank;
  s.stream = stream;
  s.start_ns = start;
  s.end_ns = end;
  s.kind = k;
  return s;
}

Trace one_lane(const std::vector<std::pair<int64_t, int64_t>>& spans) {
  Trace t;
  t.strings.intern("k");
  for (auto [a, b] : spans) t.spans.push_back(make_span(0, 0, a, b));
  t.sort_spans();
  return t;
}

std::vector<DrawItem> fold(const Trace& t, int64_t t0, int64_t t1, double width_px) {
  TraceIndex idx(t);
  TimeMapping m;
  m.fit(t0, t1, width_px);
  std::vector<DrawItem> out;
  for (const auto& row : idx.lanes().at(0).rows) fold_row(row, m, width_px, 3.0, out);
  return out;
}

uint64_t total_count(const std::vector<DrawItem>& items) {
  uint64_t n = 0;
  for (const auto& i : items) n += i.count;
  return n;
}

}  // namespace

TEST(Folding, ThousandContiguousOneNsSpansInHundredPixelsAreOneBlock) {
  std::vector<std::pair<int64_t, int64_t>> v;
  for (int i = 0; i < 1000; ++i) v.emplace_back(i, i + 1);
  const auto items = fold(one_lane(v), 0, 1000, 100);  // 10 ns/px: each span is 0.1 px
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].count, 1000u);
  EXPECT_EQ(items[0].start_ns, 0);
  EXPECT_EQ(items[0].end_ns, 1000);
}

TEST(Folding, SpansWithGapsBelowThreePixelsFoldToo) {
  std::vector<std::pair<int64_t, int64_t>> v;
  for (int i = 0; i < 1000; ++i) v.emplace_back(10 * i, 10 * i + 1);
  const auto items = fold(one_lane(v), 0, 10'000, 100);  // 100 ns/px; gaps of 9 ns = 0.09 px
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].count, 1000u);
}

TEST(Folding, SpansTenPixelsApartStaySeparate) {
  std::vector<std::pair<int64_t, int64_t>> v;
  for (int i = 0; i < 1000; ++i) v.emplace_back(100'000 * i, 100'000 * i + 1);
  const auto items = fold(one_lane(v), 0, 100'000'000, 10'000);  // 10 us/px: spans 10 px apart
  ASSERT_EQ(items.size(), 1000u);
  for (const auto& it : items) EXPECT_EQ(it.count, 1u);
}

TEST(Folding, ClustersFoldIntoOneBlockEach) {
  // 10 clusters of 100 spans of 1 ns, 10 ns apart (a cluster is 0.1 px), clusters 100 px apart.
  std::vector<std::pair<int64_t, int64_t>> v;
  for (int c = 0; c < 10; ++c) {
    for (int i = 0; i < 100; ++i)
      v.emplace_back(c * 1'000'000 + i * 10, c * 1'000'000 + i * 10 + 1);
  }
  const auto items = fold(one_lane(v), 0, 10'000'000, 1000);
  ASSERT_EQ(items.size(), 10u);
  for (int c = 0; c < 10; ++c) {
    EXPECT_EQ(items[c].count, 100u);
    EXPECT_EQ(items[c].start_ns, c * 1'000'000);
    EXPECT_EQ(items[c].end_ns, c * 1'000'000 + 991);
  }
}

TEST(Folding, WideSpansAreNeverFolded) {
  // A 100 px span, 50 spans of 1 ns, another 100 px span: 3 items, the middle one counting 50.
  std::vector<std::pair<int64_t, int64_t>> v{{0, 1'000'000}};
  for (int i = 0; i < 50; ++i) v.emplace_back(1'000'000 + 2 * i, 1'000'000 + 2 * i + 1);
  v.emplace_back(1'000'100, 2'000'100);
  const auto items = fold(one_lane(v), 0, 10'000'000, 1000);  // 10 us/px
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].count, 1u);
  EXPECT_EQ(items[1].count, 50u);
  EXPECT_EQ(items[2].count, 1u);
  EXPECT_EQ(items[2].start_ns, 1'000'100);
}

TEST(Folding, OnlyTheVisibleWindowIsVisited) {
  std::vector<std::pair<int64_t, int64_t>> v;
  for (int i = 0; i < 10; ++i) v.emplace_back(i * 1'000'000, (i + 1) * 1'000'000);
  auto items = fold(one_lane(v), 2'000'000, 3'000'000, 100);
  ASSERT_EQ(items.size(), 1u);  // spans 1 and 3 only touch the window's edges
  EXPECT_EQ(items[0].start_ns, 2'000'000);
  // Zooming into the 1000 contiguous spans shows them one by one.
  std::vector<std::pair<int64_t, int64_t>> w;
  for (int i = 0; i < 1000; ++i) w.emplace_back(i, i + 1);
  items = fold(one_lane(w), 0, 100, 1000);  // 0.1 ns/px: each span 10 px
  ASSERT_EQ(items.size(), 100u);
  EXPECT_EQ(total_count(items), 100u);
}

TEST(Folding, CountsAddUpToTheVisibleSpansAtEveryZoom) {
  // Random non-overlapping spans: whatever the zoom, every span overlapping the window is drawn
  // exactly once (alone or in a block), items are ordered and do not overlap.
  std::mt19937_64 rng(7);
  std::vector<std::pair<int64_t, int64_t>> v;
  int64_t t = 0;
  for (int i = 0; i < 20000; ++i) {
    t += static_cast<int64_t>(rng() % 200);
    const int64_t d =
        (rng() % 10 == 0) ? static_cast<int64_t>(rng() % 100000) : static_cast<int64_t>(rng() % 50);
    v.emplace_back(t, t + d + 1);
    t += d + 1;
  }
  const Trace tr = one_lane(v);
  for (double width : {1000.0, 1920.0}) {
    for (int64_t span_ns : {t, t / 10, t / 1000, int64_t{5000}, int64_t{100}}) {
      for (int64_t t0 : {int64_t{0}, t / 3, t / 2 + 17}) {
        const auto items = fold(tr, t0, t0 + span_ns, width);
        uint64_t expected = 0;
        for (auto [a, b] : v) expected += (b > t0 && a < t0 + span_ns) ? 1 : 0;
        EXPECT_EQ(total_count(items), expected) << "t0=" << t0 << " len=" << span_ns;
        for (size_t i = 1; i < items.size(); ++i) EXPECT_LE(items[i - 1].end_ns, items[i].start_ns);
        EXPECT_LE(items.size(), static_cast<size_t>(width) + 2);
      }
    }
  }
}

TEST(TraceIndex, NestedSpansGoOneRowDown) {
  Trace t;
  t.strings.intern("x");
  t.spans = {make_span(0, 2, 0, 100, SpanKind::Phase),   make_span(0, 2, 0, 40, SpanKind::Phase),
             make_span(0, 2, 0, 10, SpanKind::Phase),    make_span(0, 2, 40, 90, SpanKind::Phase),
             make_span(0, 2, 100, 200, SpanKind::Phase), make_span(1, 0, 5, 6)};
  t.sort_spans();
  TraceIndex idx(t);
  ASSERT_EQ(idx.lanes().size(), 2u);
  const Lane& l = idx.lanes()[0];
  ASSERT_EQ(l.rows.size(), 3u);
  EXPECT_EQ(l.rows[0].size(), 2u);  // [0,100) and [100,200)
  EXPECT_EQ(l.rows[1].size(), 2u);  // [0,40) and [40,90)
  EXPECT_EQ(l.rows[2].size(), 1u);  // [0,10)
  EXPECT_EQ(idx.start_ns(), 0);
  EXPECT_EQ(idx.end_ns(), 200);
  EXPECT_EQ(idx.lane_of(1, 0), 1);
  EXPECT_EQ(idx.lane_of(1, 1), -1);
  EXPECT_EQ(span_at(l.rows[1], 45), 1);
  EXPECT_EQ(span_at(l.rows[1], 95), -1);
}

TEST(TraceIndex, DeepOverlapSharesTheLastRowAndStillFoldsExactly) {
  Trace t;
  t.strings.intern("x");
  for (int i = 0; i < 20; ++i) t.spans.push_back(make_span(0, 0, i, 1000 - i));
  t.sort_spans();
  TraceIndex idx(t);
  const Lane& l = idx.lanes()[0];
  ASSERT_EQ(l.rows.size(), static_cast<size_t>(TraceIndex::kMaxRows));
  EXPECT_EQ(l.rows.back().size(), 20u - (TraceIndex::kMaxRows - 1));
  EXPECT_FALSE(l.rows.back().max_end_ns.empty());
  TimeMapping m;
  m.fit(0, 1000, 100);
  std::vector<DrawItem> items;
  for (const auto& r : l.rows) fold_row(r, m, 100, 3, items);
  EXPECT_EQ(total_count(items), 20u);
}

TEST(TraceIndex, KindFilterAndSynthTrace) {
  orrery::traces::SynthOptions o;
  o.ranks = 2;
  o.steps = 3;
  o.layers = 4;
  const Trace t = orrery::traces::synthesize(o);
  TraceIndex all(t);
  EXPECT_EQ(all.span_count(), static_cast<size_t>(orrery::traces::synth_span_count(o)));
  EXPECT_EQ(all.lanes().size(), 6u);  // 2 ranks x (compute, comm, phases)
  TraceIndex no_phases(t, kAllKinds & ~kind_bit(SpanKind::Phase));
  EXPECT_EQ(no_phases.span_count(),
            all.span_count() - 2u * 3u * 4u);  // step, forward, backward, optimizer
  EXPECT_EQ(no_phases.lanes().size(), 6u);     // the phases lane stays, empty
  // Fit all: every span is counted once.
  TimeMapping m;
  m.fit(all.start_ns(), all.end_ns(), 1200);
  uint64_t n = 0;
  for (const auto& lane : all.lanes()) {
    for (const auto& row : lane.rows) {
      std::vector<DrawItem> items;
      fold_row(row, m, 1200, 3, items);
      n += total_count(items);
    }
  }
  EXPECT_EQ(n, all.span_count());
}

TEST(LaneLayout, PositionsAndCollapse) {
  Trace t;
  t.strings.intern("x");
  for (int r = 0; r < 4; ++r) {
    t.spans.push_back(make_span(r, 0, 0, 10));
    t.spans.push_back(make_span(r, 1, 0, 10));
    t.spans.push_back(make_span(r, 1, 2, 5));  // nested: lane (r, 1) has two rows
    orrery::traces::RankInfo ri;
    ri.rank = r;
    ri.dp = r / 2;
    ri.tp = r % 2;
    t.ranks.push_back(ri);
  }
  t.sort_spans();
  TraceIndex idx(t);
  LaneLayout l;
  l.build(idx, t.ranks, GroupBy::Rank, {});
  ASSERT_EQ(l.rows().size(), 12u);  // 4 x (rank header + 2 lanes)
  const double lane1 = LaneLayout::kRowHeight + LaneLayout::kLanePad;
  const double lane2 = 2 * LaneLayout::kRowHeight + LaneLayout::kLanePad;
  const double per_rank = LaneLayout::kRankHeight + lane1 + lane2;
  EXPECT_DOUBLE_EQ(l.total_height(), 4 * per_rank);
  EXPECT_DOUBLE_EQ(l.rows()[4].y, per_rank + LaneLayout::kRankHeight);
  EXPECT_EQ(l.rows()[4].lane, idx.lane_of(1, 0));
  EXPECT_EQ(l.row_at(per_rank + 1), 3);
  EXPECT_EQ(l.row_at(-1), -1);

  l.toggle("r:1");
  l.build(idx, t.ranks, GroupBy::Rank, {});
  EXPECT_EQ(l.rows().size(), 10u);
  EXPECT_DOUBLE_EQ(l.total_height(), 3 * per_rank + LaneLayout::kRankHeight);
  EXPECT_EQ(l.row_of_lane(idx.lane_of(1, 0)), -1);

  // dp groups: ranks sharing (tp, pp) -> {0, 2} with tp 0 and {1, 3} with tp 1.
  const auto groups = group_ranks(idx, t.ranks, GroupBy::DP);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].label, "dp[tp=0,pp=0]");
  EXPECT_EQ(groups[0].ranks, (std::vector<int32_t>{0, 2}));
  const auto tp = group_ranks(idx, t.ranks, GroupBy::TP);
  ASSERT_EQ(tp.size(), 2u);
  EXPECT_EQ(tp[1].ranks, (std::vector<int32_t>{2, 3}));
  l.toggle("r:1");
  l.toggle("g:dp[tp=1,pp=0]");
  l.build(idx, t.ranks, GroupBy::DP, {{0, 0}});
  // group 0 header, rank 0 (1 lane left), rank 2 (2 lanes), group 1 header (collapsed)
  ASSERT_EQ(l.rows().size(), 7u);
  EXPECT_EQ(l.rows()[0].kind, LayoutRow::Kind::Group);
  EXPECT_EQ(l.rows()[6].kind, LayoutRow::Kind::Group);
  EXPECT_TRUE(l.rows()[6].collapsed);
  EXPECT_EQ(l.rows()[2].lane, idx.lane_of(0, 1));
  EXPECT_EQ(l.rows()[0].label, "dp[tp=0,pp=0]  (2 ranks)");

  // A group of one rank says "1 rank".
  const auto one =
      group_ranks(idx, t.ranks, GroupBy::PP);  // pp groups share (dp, tp): one rank each
  ASSERT_EQ(one.size(), 4u);
  LaneLayout lp;
  lp.build(idx, t.ranks, GroupBy::PP, {});
  EXPECT_EQ(lp.rows()[0].label, "pp[dp=0,tp=0]  (1 rank)");
}

// A folded block's time per kind, busy time and dominant kind come from the row's running sums:
// 100 groups of a 10 ns "data" span then a 70 ns compute span, 100 ns apart, fold into one block
// whose first span is data but whose time is 7/8 compute.
TEST(Folding, SummaryGivesTheKindThatCoversMostOfTheBlockAndItsBusyTime) {
  Trace t;
  t.strings.intern("k");
  for (int g = 0; g < 100; ++g) {
    t.spans.push_back(make_span(0, 0, 100 * g, 100 * g + 10, SpanKind::Data));
    t.spans.push_back(make_span(0, 0, 100 * g + 10, 100 * g + 80, SpanKind::Compute));
  }
  t.sort_spans();
  TraceIndex idx(t);
  ASSERT_EQ(idx.lanes().at(0).rows.size(), 1u);
  const auto& row = idx.lanes()[0].rows[0];
  TimeMapping m;
  m.fit(0, 10'000, 200);  // 50 ns/px: every span is under 3 px, every gap 0.4 px
  std::vector<DrawItem> items;
  fold_row(row, m, 200, 3.0, items);
  ASSERT_EQ(items.size(), 1u);
  ASSERT_EQ(items[0].count, 200u);
  EXPECT_EQ(t.spans[row.span[items[0].first]].kind, SpanKind::Data);  // the first span is data
  const FoldSummary f = summarize(row, items[0]);
  EXPECT_EQ(f.count, 200u);
  EXPECT_EQ(f.start_ns, 0);
  EXPECT_EQ(f.end_ns, 9'980);
  EXPECT_EQ(f.kind_ns[static_cast<size_t>(SpanKind::Data)], 1'000);
  EXPECT_EQ(f.kind_ns[static_cast<size_t>(SpanKind::Compute)], 7'000);
  EXPECT_EQ(f.busy_ns, 8'000);
  EXPECT_EQ(f.dominant, SpanKind::Compute);
  EXPECT_DOUBLE_EQ(f.busy_fraction(), 8'000.0 / 9'980.0);

  // A sub-run (spans 20..59: groups 10..29) sums only its own spans.
  const FoldSummary part = summarize(row, DrawItem{1'000, 2'980, 20, 40});
  EXPECT_EQ(part.kind_ns[static_cast<size_t>(SpanKind::Data)], 200);
  EXPECT_EQ(part.kind_ns[static_cast<size_t>(SpanKind::Compute)], 1'400);
  EXPECT_EQ(part.busy_ns, 1'600);
}
