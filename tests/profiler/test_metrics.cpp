// Metrics on small hand-built traces whose answers are known exactly: interval arithmetic,
// overlap and exposed communication, bus bandwidth, step statistics, pipeline bubble, stragglers,
// window clipping and memory peaks.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "builder.hpp"
#include "orrery/common/error.hpp"
#include "orrery/profiler/metrics.hpp"

namespace orrery::profiler {
namespace {

using testing::Builder;
using traces::CollOp;
using traces::Span;
using traces::SpanKind;

TEST(Intervals, MergeNestedTouchingAndDisjoint) {
  const auto m = merge_intervals({{50, 60}, {0, 10}, {10, 20}, {2, 5}, {30, 40}, {35, 45}, {7, 7}});
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].start_ns, 0);
  EXPECT_EQ(m[0].end_ns, 20);  // touching [0,10) and [10,20) merge; [2,5) is nested
  EXPECT_EQ(m[1].start_ns, 30);
  EXPECT_EQ(m[1].end_ns, 45);
  EXPECT_EQ(m[2].start_ns, 50);
  EXPECT_EQ(m[2].end_ns, 60);
  EXPECT_EQ(total_length(m), 20 + 15 + 10);
}

TEST(Intervals, IntersectionLength) {
  const auto a = merge_intervals({{0, 100}, {200, 300}});
  const auto b = merge_intervals({{50, 250}, {290, 400}});
  // [50,100) + [200,250) + [290,300)
  EXPECT_EQ(intersection_length(a, b), 50 + 50 + 10);
  EXPECT_EQ(intersection_length(a, {}), 0);
}

TEST(Intervals, PercentileInterpolatesLinearly) {
  EXPECT_DOUBLE_EQ(percentile({10, 20, 30, 40, 50}, 0.5), 30);
  EXPECT_DOUBLE_EQ(percentile({50, 10, 40, 20, 30}, 0.9), 46);  // pos 3.6: 40 + 0.6 * 10
  EXPECT_DOUBLE_EQ(percentile({1, 2}, 0.5), 1.5);
  EXPECT_DOUBLE_EQ(percentile({7}, 0.9), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 0.5), 0);
}

TEST(Metrics, TwoIntervalsWithKnownOverlap) {
  Builder b(1);
  b.compute(0, 0, 100);
  b.coll(0, 60, 160);
  const Metrics m = compute_metrics(b.t);
  ASSERT_EQ(m.ranks.size(), 1u);
  const TimeBreakdown& tb = m.ranks[0].total;
  EXPECT_EQ(tb.window_ns, 160);
  EXPECT_EQ(tb.compute_ns, 100);
  EXPECT_EQ(tb.comm_ns, 100);
  EXPECT_EQ(tb.overlap_ns, 40);
  EXPECT_EQ(tb.exposed_comm_ns, 60);
  EXPECT_EQ(tb.idle_ns, 0);
  EXPECT_DOUBLE_EQ(tb.overlap_pct(), 40.0);
  EXPECT_DOUBLE_EQ(tb.comm_comp_ratio(), 1.0);
  EXPECT_EQ(m.span_count, 2);
}

TEST(Metrics, NestedAndOverlappingSpansAreMergedPerClassFirst) {
  Builder b(1);
  // Compute on two streams: [0,100) with a nested [10,50) and an overlapping [90,150) elsewhere.
  b.compute(0, 0, 100);
  b.compute(0, 10, 50);
  b.add(0, 2, SpanKind::Optimizer, "adam", 90, 150);  // optimizer work counts as compute
  // Communication: [120,200) with a nested [130,140), plus a P2P [190,210).
  b.coll(0, 120, 200);
  b.coll(0, 130, 140);
  b.add(0, 3, SpanKind::P2P, "send", 190, 210);
  const TimeBreakdown tb = compute_metrics(b.t).ranks[0].total;
  EXPECT_EQ(tb.compute_ns, 150);  // [0,150)
  EXPECT_EQ(tb.comm_ns, 90);      // [120,210)
  EXPECT_EQ(tb.overlap_ns, 30);   // [120,150)
  EXPECT_EQ(tb.exposed_comm_ns, 60);
  EXPECT_EQ(tb.window_ns, 210);
  EXPECT_EQ(tb.idle_ns, 0);
}

TEST(Metrics, ExposedCommIdleAndMemcpy) {
  Builder b(1);
  b.add(0, 5, SpanKind::Phase, "region", 0, 200);  // phases are not work but bound the window
  b.compute(0, 0, 50);
  b.coll(0, 40, 100);
  b.add(0, 4, SpanKind::Memcpy, "h2d", 120, 130);
  b.add(0, 4, SpanKind::Data, "load", 150, 170);  // data loading is not work
  const TimeBreakdown tb = compute_metrics(b.t).ranks[0].total;
  EXPECT_EQ(tb.window_ns, 200);
  EXPECT_EQ(tb.compute_ns, 50);
  EXPECT_EQ(tb.comm_ns, 60);
  EXPECT_EQ(tb.overlap_ns, 10);
  EXPECT_EQ(tb.exposed_comm_ns, 50);
  EXPECT_EQ(tb.memcpy_ns, 10);
  EXPECT_EQ(tb.idle_ns, 200 - 100 - 10);
}

TEST(Metrics, BusBandwidthOfAllReduceOnFourRanks) {
  Builder b(4);
  b.t.comms.push_back({1, traces::CommKind::DP, "pair", {0, 1}});
  // One all-reduce of 400 MB on each of 4 ranks, 100 ms each: algbw 4 GB/s, busbw 4 * 2*3/4 = 6.
  for (int r = 0; r < 4; ++r) b.coll(r, 0, 100'000'000, CollOp::AllReduce, 0, 0, 400'000'000);
  // An all-gather of 1 GB on a 2-rank communicator in 0.5 s: algbw 2 GB/s, busbw 2 * 1/2 = 1.
  for (int r = 0; r < 2; ++r) b.coll(r, 0, 500'000'000, CollOp::AllGather, 1, 0, 1'000'000'000);
  const Metrics m = compute_metrics(b.t);
  ASSERT_EQ(m.collectives.size(), 2u);
  const CollectiveStats& ar = m.collectives[0];
  EXPECT_EQ(ar.op, "all_reduce");
  EXPECT_EQ(ar.comm, 0);
  EXPECT_EQ(ar.comm_name, "world");
  EXPECT_EQ(ar.comm_size, 4);
  EXPECT_EQ(ar.count, 4);
  EXPECT_EQ(ar.ops, 1);
  EXPECT_EQ(ar.bytes, 1'600'000'000);
  EXPECT_EQ(ar.time_ns, 400'000'000);
  EXPECT_DOUBLE_EQ(ar.algbw_gbps, 4.0);
  EXPECT_DOUBLE_EQ(ar.busbw_gbps, 6.0);
  const CollectiveStats& ag = m.collectives[1];
  EXPECT_EQ(ag.op, "all_gather");
  EXPECT_EQ(ag.comm_size, 2);
  EXPECT_EQ(ag.ops, 1);
  EXPECT_DOUBLE_EQ(ag.algbw_gbps, 2.0);
  EXPECT_DOUBLE_EQ(ag.busbw_gbps, 1.0);
}

TEST(Metrics, CollectiveWithoutSeqCountsOpsPerCommunicatorSize) {
  Builder b(2);
  for (int i = 0; i < 3; ++i)
    for (int r = 0; r < 2; ++r) b.coll(r, i * 100, i * 100 + 50, CollOp::Broadcast, 0, -1, 10);
  const Metrics m = compute_metrics(b.t);
  ASSERT_EQ(m.collectives.size(), 1u);
  EXPECT_EQ(m.collectives[0].count, 6);
  EXPECT_EQ(m.collectives[0].ops, 3);
  EXPECT_DOUBLE_EQ(m.collectives[0].busbw_gbps, m.collectives[0].algbw_gbps);  // factor 1
}

TEST(Metrics, StepStatisticsMeanAndPercentiles) {
  Builder b(2);
  // Step s lasts 10·(s+1) ns; rank 1 spans lie inside rank 0's, except step 0 which it extends.
  int64_t now = 0;
  for (int s = 0; s < 5; ++s) {
    const int64_t d = 10 * (s + 1);
    b.compute(0, now, now + d, s);
    b.compute(1, now + 1, now + d - 1, s);
    now += d;
  }
  b.compute(1, -2, 5, 0);  // step 0 becomes the union [-2, 10) over ranks
  Metrics m = compute_metrics(b.t);
  ASSERT_EQ(m.steps.size(), 5u);
  EXPECT_EQ(m.steps[0].start_ns, -2);
  EXPECT_EQ(m.steps[0].end_ns, 10);
  // Durations 12, 20, 30, 40, 50.
  EXPECT_EQ(m.counted_steps, 5);
  EXPECT_DOUBLE_EQ(m.step_mean_ns, (12 + 20 + 30 + 40 + 50) / 5.0);
  EXPECT_DOUBLE_EQ(m.step_p50_ns, 30);
  EXPECT_DOUBLE_EQ(m.step_p90_ns, 46);

  MetricsOptions opt;
  opt.skip_steps = 1;
  m = compute_metrics(b.t, opt);
  EXPECT_TRUE(m.steps[0].warmup);
  EXPECT_FALSE(m.steps[1].warmup);
  EXPECT_EQ(m.counted_steps, 4);
  EXPECT_DOUBLE_EQ(m.step_mean_ns, 35);
  EXPECT_DOUBLE_EQ(m.step_p50_ns, 35);
  EXPECT_DOUBLE_EQ(m.step_p90_ns, 47);  // pos 2.7: 40 + 0.7 * 10
  // Per-rank step breakdowns use the global step window: rank 1 idles 2 ns in step 1.
  EXPECT_EQ(m.ranks[1].by_step.at(1).window_ns, 20);
  EXPECT_EQ(m.ranks[1].by_step.at(1).idle_ns, 2);
}

TEST(Metrics, StepPhaseSpansDefineStepsWhenPresent) {
  Builder b(1);
  b.add(0, 2, SpanKind::Phase, "step", 0, 100, 0);
  b.add(0, 2, SpanKind::Phase, "step", 100, 300, 1);
  b.compute(0, 10, 400, 0);                        // tagged step 0 but the phase spans win
  b.add(0, 2, SpanKind::Phase, "step", 300, 350);  // untagged: ordinal 2 on its rank
  const Metrics m = compute_metrics(b.t);
  ASSERT_EQ(m.steps.size(), 3u);
  EXPECT_EQ(m.steps[0].duration_ns(), 100);
  EXPECT_EQ(m.steps[1].duration_ns(), 200);
  EXPECT_EQ(m.steps[2].step, 2);
  EXPECT_EQ(m.steps[2].duration_ns(), 50);
}

TEST(Metrics, ThroughputTokensFlopsAndMfu) {
  Builder b(2);
  b.t.meta.tokens_per_step = 1000;
  for (int r = 0; r < 2; ++r) {
    for (int s = 0; s < 2; ++s) {
      // Steps of 1 ms; each rank does 5e8 FLOPs per step.
      b.compute(r, s * 1'000'000, s * 1'000'000 + 500'000, s).flops = 5e8;
      b.coll(r, s * 1'000'000 + 500'000, (s + 1) * 1'000'000, CollOp::AllReduce, 0, s, 0, s);
    }
  }
  MetricsOptions opt;
  opt.peak_flops_per_rank = 1e12;
  Metrics m = compute_metrics(b.t, opt);
  EXPECT_DOUBLE_EQ(m.step_mean_ns, 1e6);
  EXPECT_DOUBLE_EQ(m.tokens_per_s, 1e6);     // 1000 tokens per ms
  EXPECT_DOUBLE_EQ(m.achieved_flops, 1e12);  // 2 ranks * 5e8 per ms
  EXPECT_DOUBLE_EQ(m.mfu, 0.5);              // 1e12 / (1e12 * 2)
  // With model FLOPs in the metadata MFU counts those (e.g. without recomputation).
  b.t.meta.model_flops_per_step = 4e8;
  m = compute_metrics(b.t, opt);
  EXPECT_DOUBLE_EQ(m.model_flops_per_s, 4e11);
  EXPECT_DOUBLE_EQ(m.mfu, 0.2);
}

// An ideal GPipe schedule: p stages, m micro-batches, forward f and backward b per micro-batch and
// stage. Stage i runs forward j in [(i+j)f, (i+j+1)f) and, after all forwards, backward j (in
// reverse pipeline order) in [T + (p-1-i+j)b, ...+b), T = (m+p-1)f. The step lasts (m+p-1)(f+b),
// every stage is busy m(f+b): bubble = (p-1)/(m+p-1) of the step.
Builder gpipe(int p, int m, int64_t f, int64_t bw, int steps, bool with_p2p) {
  Builder b(p, p);
  const int64_t step_ns = int64_t(m + p - 1) * (f + bw);
  const int64_t fwd_end = int64_t(m + p - 1) * f;
  for (int s = 0; s < steps; ++s) {
    const int64_t t0 = s * step_ns;
    for (int i = 0; i < p; ++i) {
      for (int j = 0; j < m; ++j) {
        b.add(i, 0, SpanKind::Compute, "fwd", t0 + (i + j) * f, t0 + (i + j + 1) * f, s);
        const int64_t bs = t0 + fwd_end + (p - 1 - i + j) * bw;
        b.add(i, 0, SpanKind::Compute, "bwd", bs, bs + bw, s);
      }
      if (with_p2p && i > 0) {
        // A blocking recv waiting for the first activation: it lies in the bubble.
        Span& r = b.add(i, 1, SpanKind::P2P, "recv", t0, t0 + i * f, s);
        r.op = CollOp::Recv;
        r.peer = i - 1;
      }
    }
  }
  return b;
}

TEST(Metrics, PipelineBubbleMatchesClosedFormForIdealGPipe) {
  for (const auto& [p, m] : std::vector<std::pair<int, int>>{{4, 8}, {2, 1}, {8, 3}}) {
    for (bool p2p : {false, true}) {
      const int64_t f = 100, bw = 200;
      const Metrics mt = compute_metrics(gpipe(p, m, f, bw, 3, p2p).t);
      EXPECT_TRUE(mt.pipeline);
      ASSERT_EQ(mt.steps.size(), 3u);
      EXPECT_EQ(mt.steps[1].duration_ns(), int64_t(m + p - 1) * (f + bw));
      for (const RankMetrics& r : mt.ranks) {
        EXPECT_EQ(r.bubble_ns, 3 * int64_t(p - 1) * (f + bw)) << "p=" << p << " m=" << m;
        EXPECT_EQ(r.counted_step_ns, 3 * int64_t(m + p - 1) * (f + bw));
      }
      EXPECT_NEAR(mt.bubble_pct, 100.0 * (p - 1) / (m + p - 1), 1e-9) << "p=" << p << " m=" << m;
    }
  }
}

TEST(Metrics, NoBubbleWithoutPipelineParallelism) {
  Builder b(2);
  b.compute(0, 0, 10, 0);
  b.compute(1, 0, 5, 0);
  const Metrics m = compute_metrics(b.t);
  EXPECT_FALSE(m.pipeline);
  EXPECT_EQ(m.bubble_pct, 0);
  EXPECT_EQ(m.ranks[1].bubble_ns, 0);
}

TEST(Metrics, StragglerIsTheRankLateInMostCollectives) {
  Builder b(4);
  const int64_t gap = 10'000'000;
  for (int c = 0; c < 10; ++c) {
    for (int r = 0; r < 4; ++r) {
      int64_t start = c * gap;
      if (r == 2 && c < 8) start += 500'000;  // late in 8 of 10
      if (r == 3 && c < 4) start += 300'000;  // late in 4 of 10: not a straggler
      b.coll(r, start, c * gap + 1'000'000, CollOp::AllReduce, 0, c, 1024);
    }
  }
  const Metrics m = compute_metrics(b.t);
  ASSERT_EQ(m.stragglers.size(), 1u);
  EXPECT_EQ(m.stragglers[0], 2);
  // Collectives 0-3: starts {0,0,3e5,5e5} -> median 1.5e5; 4-7: {0,0,0,5e5} -> 0; 8-9: all 0.
  EXPECT_EQ(m.ranks[2].collectives_checked, 10);
  EXPECT_EQ(m.ranks[2].collectives_late, 8);
  EXPECT_DOUBLE_EQ(m.ranks[2].late_ns_mean, (4 * 3.5e5 + 4 * 5e5) / 10);
  EXPECT_EQ(m.ranks[3].collectives_late, 4);
  EXPECT_DOUBLE_EQ(m.ranks[3].late_ns_mean, 4 * 1.5e5 / 10);
  EXPECT_DOUBLE_EQ(m.ranks[0].late_ns_mean, -4 * 1.5e5 / 10);

  MetricsOptions strict;
  strict.straggler_late_fraction = 0.3;
  EXPECT_EQ(compute_metrics(b.t, strict).stragglers, (std::vector<int32_t>{2, 3}));
}

TEST(Metrics, RankLateOftenButEarlyOnTheWholeIsNoStraggler) {
  // Two ranks: the median is their midpoint, so each one's lateness mirrors the other's. Rank 0
  // starts 300 us after rank 1 in collectives 0-5 (late by 150 us > the 100 us threshold, in 6 of
  // 10) and 2 ms before it in 6-9 (early by 1 ms): mean (6 * 150 us - 4 * 1 ms) / 10 = -310 us.
  Builder b(2);
  const int64_t gap = 10'000'000;
  for (int c = 0; c < 10; ++c) {
    const int64_t t0 = c * gap + 3'000'000;
    const int64_t start0 = c < 6 ? t0 + 300'000 : t0 - 2'000'000;
    b.coll(0, start0, t0 + 4'000'000, CollOp::AllReduce, 0, c, 1024);
    b.coll(1, t0, t0 + 4'000'000, CollOp::AllReduce, 0, c, 1024);
  }
  const Metrics m = compute_metrics(b.t);
  EXPECT_EQ(m.ranks[0].collectives_checked, 10);
  EXPECT_EQ(m.ranks[0].collectives_late, 6);
  EXPECT_EQ(m.ranks[1].collectives_late, 4);
  EXPECT_DOUBLE_EQ(m.ranks[0].late_ns_mean, -310'000);
  EXPECT_DOUBLE_EQ(m.ranks[1].late_ns_mean, 310'000);
  EXPECT_TRUE(m.stragglers.empty());
  // Late in 4 of 10 with a positive mean: a straggler once the fraction allows it; rank 0 never.
  MetricsOptions loose;
  loose.straggler_late_fraction = 0.3;
  EXPECT_EQ(compute_metrics(b.t, loose).stragglers, std::vector<int32_t>{1});
}

TEST(Metrics, WindowClipsSpans) {
  Builder b(1);
  b.compute(0, 0, 100).flops = 1000;
  b.coll(0, 50, 150, CollOp::AllReduce, 0, 0, 4000);
  b.compute(0, 500, 600);     // outside the window
  b.compute(0, 10, 20, 0);    // step 0 = [10,20), inside
  b.compute(0, 100, 140, 1);  // step 1 = [100,140), crosses the window's end
  MetricsOptions opt;
  opt.window_start_ns = 25;
  opt.window_end_ns = 125;
  const Metrics m = compute_metrics(b.t, opt);
  const TimeBreakdown& tb = m.ranks[0].total;
  EXPECT_EQ(tb.window_ns, 100);
  EXPECT_EQ(tb.compute_ns, 100);  // [25,125): [25,100) + [100,125)
  EXPECT_EQ(tb.comm_ns, 75);      // [50,125)
  EXPECT_EQ(tb.overlap_ns, 75);
  EXPECT_EQ(tb.exposed_comm_ns, 0);
  EXPECT_EQ(m.span_count, 3);
  // Collectives count whole (bandwidth is not distorted by clipping).
  ASSERT_EQ(m.collectives.size(), 1u);
  EXPECT_EQ(m.collectives[0].time_ns, 100);
  EXPECT_EQ(m.collectives[0].bytes, 4000);
  // Step 0 lies before the window, step 1 crosses its end: neither is reported.
  EXPECT_TRUE(m.steps.empty());
  // No steps: FLOP/s over the analysed extent; the clipped span keeps 75 % of its FLOPs.
  EXPECT_EQ(m.start_ns, 25);
  EXPECT_EQ(m.end_ns, 125);
  EXPECT_DOUBLE_EQ(m.achieved_flops, 750.0 / 100e-9);

  // A window inside one span: everything is that span.
  opt.window_start_ns = 60;
  opt.window_end_ns = 70;
  const TimeBreakdown t2 = compute_metrics(b.t, opt).ranks[0].total;
  EXPECT_EQ(t2.window_ns, 10);
  EXPECT_EQ(t2.compute_ns, 10);
  EXPECT_EQ(t2.overlap_ns, 10);
  EXPECT_EQ(t2.idle_ns, 0);
}

TEST(Metrics, PeakMemoryPerCategoryAndOfTheSum) {
  Builder b(2);
  b.compute(0, 0, 10);
  b.compute(1, 0, 10);
  b.counter(0, "mem.activations", 0, 100);
  b.counter(0, "mem.gradients", 0, 0);
  b.counter(0, "mem.activations", 10, 300);  // sum 300
  // At t=20 activations drop while gradients rise: applied together, the sum is 250, not 550.
  b.counter(0, "mem.gradients", 20, 250);
  b.counter(0, "mem.activations", 20, 0);
  b.counter(0, "other.counter", 5, 1e9);  // not memory
  b.counter(1, "mem.total", 3, 42);
  b.counter(1, "mem.activations", 3, 40);
  // ZeRO offload's counters: listed, not summed (the state they hold left the rank's memory).
  b.counter(0, "mem.offload_host", 10, 1000);
  b.counter(0, "mem.offload_nvme", 10, 500);
  const Metrics m = compute_metrics(b.t);
  EXPECT_DOUBLE_EQ(m.ranks[0].peak_memory_bytes.at("mem.activations"), 300);
  EXPECT_DOUBLE_EQ(m.ranks[0].peak_memory_bytes.at("mem.gradients"), 250);
  EXPECT_EQ(m.ranks[0].peak_memory_bytes.count("other.counter"), 0u);
  EXPECT_DOUBLE_EQ(m.ranks[0].peak_memory_bytes.at("mem.offload_host"), 1000);
  EXPECT_DOUBLE_EQ(m.ranks[0].peak_memory_bytes.at("mem.offload_nvme"), 500);
  EXPECT_DOUBLE_EQ(m.ranks[0].peak_memory_total_bytes, 300);
  EXPECT_DOUBLE_EQ(m.ranks[1].peak_memory_total_bytes, 42);  // "mem.total" when present
}

TEST(Metrics, SpanOrderDoesNotMatter) {
  Builder b(3);
  std::mt19937_64 rng(7);
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 200; ++i) {
      const int64_t a = int64_t(rng() % 100000);
      b.add(r, int(rng() % 3), (rng() % 2) ? SpanKind::Compute : SpanKind::Collective, "x", a,
            a + int64_t(rng() % 1000), i / 50);
    }
  }
  const Metrics m1 = compute_metrics(b.t);
  std::shuffle(b.t.spans.begin(), b.t.spans.end(), rng);
  const Metrics m2 = compute_metrics(b.t);
  ASSERT_EQ(m1.ranks.size(), m2.ranks.size());
  for (size_t i = 0; i < m1.ranks.size(); ++i) {
    EXPECT_EQ(m1.ranks[i].total.compute_ns, m2.ranks[i].total.compute_ns);
    EXPECT_EQ(m1.ranks[i].total.overlap_ns, m2.ranks[i].total.overlap_ns);
    EXPECT_EQ(m1.ranks[i].total.idle_ns, m2.ranks[i].total.idle_ns);
    // Against the reference functions on the same spans.
    std::vector<Interval> c, k;
    for (const auto& s : b.t.spans) {
      if (s.rank != m1.ranks[i].rank) continue;
      (s.kind == SpanKind::Compute ? c : k).push_back({s.start_ns, s.end_ns});
    }
    EXPECT_EQ(m1.ranks[i].total.compute_ns, total_length(merge_intervals(c)));
    EXPECT_EQ(m1.ranks[i].total.overlap_ns,
              intersection_length(merge_intervals(c), merge_intervals(k)));
  }
  EXPECT_EQ(m1.step_mean_ns, m2.step_mean_ns);
}

TEST(Metrics, ThreadCountDoesNotChangeResults) {
  Builder b(5);
  std::mt19937_64 rng(11);
  b.t.meta.tokens_per_step = 100;
  for (int r = 0; r < 5; ++r) {
    for (int i = 0; i < 300; ++i) {
      const int64_t a = int64_t(rng() % 1000000);
      Span& s = b.add(r, int(rng() % 2), (rng() % 2) ? SpanKind::Compute : SpanKind::Collective,
                      "x", a, a + int64_t(rng() % 5000), i / 60);
      s.flops = double(rng() % 1000) * 0.37;
      if (s.kind == SpanKind::Collective) {
        s.op = CollOp::AllReduce;
        s.comm = 0;
        s.seq = i;
        s.bytes = int64_t(rng() % 100000);
      }
    }
  }
  b.t.sort_spans();
  MetricsOptions one, four;
  one.threads = 1;
  four.threads = 4;
  const Metrics a = compute_metrics(b.t, one), c = compute_metrics(b.t, four);
  ASSERT_EQ(a.ranks.size(), c.ranks.size());
  for (size_t i = 0; i < a.ranks.size(); ++i) {
    EXPECT_EQ(a.ranks[i].total.compute_ns, c.ranks[i].total.compute_ns);
    EXPECT_EQ(a.ranks[i].total.exposed_comm_ns, c.ranks[i].total.exposed_comm_ns);
    EXPECT_EQ(a.ranks[i].late_ns_mean, c.ranks[i].late_ns_mean);
    EXPECT_EQ(a.ranks[i].by_step.size(), c.ranks[i].by_step.size());
  }
  EXPECT_EQ(a.achieved_flops, c.achieved_flops);  // bit-identical: fixed summation order
  EXPECT_EQ(a.stragglers, c.stragglers);
  ASSERT_EQ(a.collectives.size(), 1u);
  ASSERT_EQ(c.collectives.size(), 1u);
  EXPECT_EQ(a.collectives[0].bytes, c.collectives[0].bytes);
  EXPECT_EQ(a.collectives[0].ops, c.collectives[0].ops);
  EXPECT_EQ(a.collectives[0].comm_size, 5);
}

TEST(Metrics, SparseSequenceNumbersAreGroupedToo) {
  Builder b(3);
  for (int64_t seq : {int64_t(5), int64_t(1) << 40, int64_t(7)}) {
    for (int r = 0; r < 3; ++r)
      b.coll(r, seq % 1000 + (r == 1 ? 500'000 : 0), seq % 1000 + 600'000, CollOp::AllReduce, 0,
             seq, 8);
  }
  const Metrics m = compute_metrics(b.t);
  EXPECT_EQ(m.collectives[0].ops, 3);
  EXPECT_EQ(m.stragglers, std::vector<int32_t>{1});
}

TEST(Metrics, BadInputIsAnInputError) {
  Builder b(1);
  b.compute(0, 10, 5);
  EXPECT_THROW(compute_metrics(b.t), InputError);
  Builder neg(1);
  neg.compute(0, 0, 1).rank = -3;
  EXPECT_THROW(compute_metrics(neg.t), InputError);
  Builder ok(1);
  MetricsOptions opt;
  opt.window_start_ns = 10;
  opt.window_end_ns = 10;
  EXPECT_THROW(compute_metrics(ok.t, opt), InputError);
}

TEST(Metrics, EmptyTrace) {
  traces::Trace t;
  const Metrics m = compute_metrics(t);
  EXPECT_TRUE(m.ranks.empty());
  EXPECT_EQ(m.span_count, 0);
  EXPECT_EQ(m.step_mean_ns, 0);
}

}  // namespace
}  // namespace orrery::profiler
