// The synthetic DDP trace: compute_metrics must return exactly the closed forms documented in
// synth.hpp (written out again here, independently of the generator), also after a round trip
// through the SQLite store.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>

#include "orrery/common/error.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/synth.hpp"

namespace orrery::profiler {
namespace {

using traces::SynthOptions;

struct Expected {
  int64_t compute, comm, exposed, overlap, idle, step;
};

Expected closed_form(const SynthOptions& o) {
  const int64_t L = o.layers, k = o.layers_per_bucket, nb = L / k;
  const int64_t c = k * o.comm_ns_per_layer;
  Expected e{};
  e.compute = L * (o.forward_ns + o.backward_ns) + o.optimizer_ns;
  e.comm = nb * c;
  e.exposed = c + (nb - 1) * std::max<int64_t>(0, c - k * o.backward_ns);
  e.overlap = e.comm - e.exposed;
  e.idle = o.data_ns;
  e.step = o.data_ns + L * (o.forward_ns + o.backward_ns) + e.exposed + o.optimizer_ns;
  return e;
}

void expect_closed_forms(const SynthOptions& o, const Metrics& m) {
  const Expected e = closed_form(o);
  // The generator's own statement of its totals agrees with the formulas written out here.
  const traces::SynthTotals x = traces::synth_totals(o);
  EXPECT_EQ(x.compute_ns, e.compute);
  EXPECT_EQ(x.comm_ns, e.comm);
  EXPECT_EQ(x.exposed_comm_ns, e.exposed);
  EXPECT_EQ(x.overlap_ns, e.overlap);
  EXPECT_EQ(x.idle_ns, e.idle);
  EXPECT_EQ(x.step_ns, e.step);
  EXPECT_EQ(x.allreduce_bytes, int64_t(o.layers) * o.grad_bytes_per_layer);
  const int64_t S = o.steps, R = o.ranks, L = o.layers;
  ASSERT_EQ(m.ranks.size(), size_t(R));
  ASSERT_EQ(m.steps.size(), size_t(S));
  for (const StepStats& st : m.steps) EXPECT_EQ(st.duration_ns(), e.step);
  EXPECT_DOUBLE_EQ(m.step_mean_ns, double(e.step));
  EXPECT_DOUBLE_EQ(m.step_p50_ns, double(e.step));
  EXPECT_DOUBLE_EQ(m.step_p90_ns, double(e.step));
  for (const RankMetrics& r : m.ranks) {
    ASSERT_EQ(r.by_step.size(), size_t(S));
    for (const auto& [step, tb] : r.by_step) {
      EXPECT_EQ(tb.window_ns, e.step);
      EXPECT_EQ(tb.compute_ns, e.compute);
      EXPECT_EQ(tb.comm_ns, e.comm);
      EXPECT_EQ(tb.exposed_comm_ns, e.exposed);
      EXPECT_EQ(tb.overlap_ns, e.overlap);
      EXPECT_EQ(tb.idle_ns, e.idle);
      EXPECT_EQ(tb.memcpy_ns, 0);
    }
    EXPECT_EQ(r.total.window_ns, S * e.step);
    EXPECT_EQ(r.total.compute_ns, S * e.compute);
    EXPECT_EQ(r.total.comm_ns, S * e.comm);
    EXPECT_EQ(r.total.exposed_comm_ns, S * e.exposed);
    EXPECT_EQ(r.total.idle_ns, S * e.idle);
    const double P = double(L) * double(o.grad_bytes_per_layer);
    EXPECT_DOUBLE_EQ(r.peak_memory_bytes.at("mem.parameters"), P);
    EXPECT_DOUBLE_EQ(r.peak_memory_bytes.at("mem.optimizer"), 2 * P);
    EXPECT_DOUBLE_EQ(r.peak_memory_bytes.at("mem.activations"),
                     double(L) * double(o.activation_bytes_per_layer));
    EXPECT_DOUBLE_EQ(r.peak_memory_bytes.at("mem.gradients"), P);
    EXPECT_DOUBLE_EQ(
        r.peak_memory_total_bytes,
        3 * P + double(L) * double(std::max(o.activation_bytes_per_layer, o.grad_bytes_per_layer)));
  }
  EXPECT_EQ(m.total.compute_ns, R * S * e.compute);
  ASSERT_EQ(m.collectives.size(), 1u);
  const CollectiveStats& ar = m.collectives[0];
  const int64_t nb = L / o.layers_per_bucket;
  EXPECT_EQ(ar.op, "all_reduce");
  EXPECT_EQ(ar.comm_size, R);
  EXPECT_EQ(ar.count, R * S * nb);
  EXPECT_EQ(ar.ops, S * nb);
  EXPECT_EQ(ar.bytes, R * S * L * o.grad_bytes_per_layer);
  EXPECT_EQ(ar.time_ns, R * S * e.comm);
  const double algbw = double(o.grad_bytes_per_layer) / double(o.comm_ns_per_layer);
  EXPECT_NEAR(ar.algbw_gbps, algbw, 1e-12 * algbw);
  EXPECT_NEAR(ar.busbw_gbps, algbw * 2.0 * (R - 1) / R, 1e-12 * algbw);
  const double flops_per_step = double(R) * L * (o.forward_flops + o.backward_flops);
  EXPECT_NEAR(m.achieved_flops, flops_per_step / (double(e.step) * 1e-9), 1e-9 * m.achieved_flops);
  EXPECT_NEAR(m.model_flops_per_s, m.achieved_flops, 1e-9 * m.achieved_flops);
  EXPECT_TRUE(m.stragglers.empty());
  EXPECT_FALSE(m.pipeline);
}

TEST(Synth, DefaultTraceHasTheDocumentedTotals) {
  SynthOptions o;
  o.peak_flops_per_rank = 1e12;
  const traces::Trace t = traces::synthesize(o);
  EXPECT_EQ(int64_t(t.spans.size()), traces::synth_span_count(o));
  EXPECT_EQ(int64_t(t.spans.size()), 4 * 10 * (2 * 12 + 6 + 6));
  EXPECT_EQ(t.counters.size(), size_t(4 * 10 * 7));
  const Metrics m = compute_metrics(t);
  expect_closed_forms(o, m);
  // Defaults: c = 3 ms <= k·b = 4 ms, so only the last bucket is exposed; step 39.7 ms.
  EXPECT_EQ(closed_form(o).step, 39'700'000);
  EXPECT_DOUBLE_EQ(m.tokens_per_s, 4 * 8 * 1024 / 39.7e-3);
  EXPECT_NEAR(m.mfu, 4 * 12 * 6e9 / 39.7e-3 / 4e12, 1e-12);
}

TEST(Synth, QueuedBucketsWhenCommunicationIsSlowerThanBackward) {
  SynthOptions o;
  o.ranks = 3;
  o.steps = 4;
  o.layers = 8;
  o.layers_per_bucket = 2;
  o.comm_ns_per_layer = 3'000'000;  // c = 6 ms > k·b = 4 ms: buckets queue
  const Metrics m = compute_metrics(traces::synthesize(o));
  expect_closed_forms(o, m);
  EXPECT_EQ(closed_form(o).exposed, 6'000'000 + 3 * 2'000'000);
}

TEST(Synth, SkipStepsLeavesTheStatisticsUnchanged) {
  SynthOptions o;
  o.steps = 5;
  MetricsOptions mo;
  mo.skip_steps = 2;
  const Metrics m = compute_metrics(traces::synthesize(o), mo);
  EXPECT_EQ(m.counted_steps, 3);
  EXPECT_DOUBLE_EQ(m.step_mean_ns, double(closed_form(o).step));
}

TEST(Synth, StragglerRankIsDetected) {
  SynthOptions o;
  o.ranks = 5;
  o.steps = 3;
  o.straggler_rank = 3;
  o.straggler_delay_ns = 1'000'000;
  const Metrics m = compute_metrics(traces::synthesize(o));
  EXPECT_EQ(m.stragglers, std::vector<int32_t>{3});
  EXPECT_DOUBLE_EQ(m.ranks[3].late_ns_mean, 1e6);  // every bucket starts 1 ms after the median
  // The others wait for it: the step is 1 ms longer, and so is each rank's first all-reduce.
  EXPECT_DOUBLE_EQ(m.step_mean_ns, double(closed_form(o).step + 1'000'000));
}

TEST(Synth, SeedDeterminesTheJitter) {
  SynthOptions o;
  o.ranks = 3;
  o.steps = 4;
  o.jitter_ns = 50'000;
  const auto a = traces::synthesize(o), b = traces::synthesize(o);
  o.seed = 2;
  const auto c = traces::synthesize(o);
  ASSERT_EQ(a.spans.size(), b.spans.size());
  bool same_ab = true, same_ac = true;
  for (size_t i = 0; i < a.spans.size(); ++i) {
    same_ab = same_ab && a.spans[i].start_ns == b.spans[i].start_ns &&
              a.spans[i].end_ns == b.spans[i].end_ns;
    same_ac = same_ac && a.spans[i].start_ns == c.spans[i].start_ns;
  }
  EXPECT_TRUE(same_ab);
  EXPECT_FALSE(same_ac);
  // Jitter moves time around but not the work: compute per rank stays the closed form.
  const Metrics m = compute_metrics(c);
  EXPECT_EQ(m.ranks[0].total.compute_ns, o.steps * closed_form(o).compute);
}

TEST(Synth, SpansAreSortedAndStepsForSpanTarget) {
  SynthOptions o;
  o.ranks = 2;
  o.steps = 2;
  SynthOptions pipe = o;
  pipe.ranks = 4;
  pipe.pp = 2;
  for (const auto& opt : {o, pipe}) {
    const traces::Trace t = traces::synthesize(opt);
    for (size_t i = 1; i < t.spans.size(); ++i) {
      const auto& p = t.spans[i - 1];
      const auto& s = t.spans[i];
      ASSERT_TRUE(p.rank < s.rank || (p.rank == s.rank && p.stream < s.stream) ||
                  (p.rank == s.rank && p.stream == s.stream && p.start_ns <= s.start_ns))
          << "pp " << opt.pp << " span " << i;
    }
  }
  EXPECT_EQ(traces::synth_steps_for_spans(o, 5'000'000), (5'000'000 + 71) / 72);
}

// Pipeline mode (GPipe), closed forms written out independently of the generator.
TEST(Synth, PipelineTraceHasTheDocumentedTotalsAndBubble) {
  SynthOptions o;
  o.ranks = 8;
  o.pp = 4;
  o.micro_batches = 6;
  o.layers = 8;
  o.layers_per_bucket = 1;
  o.steps = 3;
  const traces::Trace t = traces::synthesize(o);
  EXPECT_EQ(int64_t(t.spans.size()), traces::synth_span_count(o));
  const int64_t pp = 4, dp = 2, mb = 6, Ls = 2, S = 3;
  const int64_t F = Ls * o.forward_ns, B = Ls * o.backward_ns;
  const int64_t C = Ls * o.comm_ns_per_layer;  // Ls buckets of one layer
  const int64_t step = o.data_ns + (mb + pp - 1) * (F + B) + C + o.optimizer_ns;
  const int64_t bubble = o.data_ns + (pp - 1) * (F + B);
  EXPECT_EQ(traces::synth_totals(o).step_ns, step);
  EXPECT_EQ(traces::synth_totals(o).bubble_ns, bubble);
  // Spans: per rank and step 2·m·Ls layer spans + data + optimizer + 4 phases + Ls all-reduces,
  // plus 4·m transfers (send + recv, forward + backward) per pipeline hop.
  EXPECT_EQ(int64_t(t.spans.size()), S * (8 * (2 * mb * Ls + 6 + Ls) + dp * 4 * mb * (pp - 1)));

  const Metrics m = compute_metrics(t);
  EXPECT_TRUE(m.pipeline);
  ASSERT_EQ(m.steps.size(), size_t(S));
  EXPECT_DOUBLE_EQ(m.step_mean_ns, double(step));
  for (const RankMetrics& r : m.ranks) {
    for (const auto& [s, tb] : r.by_step) {
      EXPECT_EQ(tb.window_ns, step);
      EXPECT_EQ(tb.compute_ns, mb * (F + B) + o.optimizer_ns);
      EXPECT_EQ(tb.comm_ns, C);
      EXPECT_EQ(tb.exposed_comm_ns, C);
      EXPECT_EQ(tb.idle_ns, bubble);
    }
    EXPECT_EQ(r.bubble_ns, S * bubble) << "rank " << r.rank;
    EXPECT_DOUBLE_EQ(r.peak_memory_total_bytes,
                     3.0 * Ls * double(o.grad_bytes_per_layer) +
                         double(mb * Ls) * double(o.activation_bytes_per_layer));
  }
  EXPECT_NEAR(m.bubble_pct, 100.0 * double(bubble) / double(step), 1e-9);
  EXPECT_TRUE(m.stragglers.empty());
  // One all-reduce group per stage (2 ranks each: busbw = algbw · 2·1/2), plus sends and recvs.
  int all_reduce_groups = 0;
  for (const auto& c : m.collectives) {
    if (c.op != "all_reduce") continue;
    ++all_reduce_groups;
    EXPECT_EQ(c.comm_size, 2);
    EXPECT_EQ(c.count, S * Ls * dp);
    EXPECT_EQ(c.ops, S * Ls);
    EXPECT_DOUBLE_EQ(c.busbw_gbps, c.algbw_gbps);
  }
  EXPECT_EQ(all_reduce_groups, pp);
  const double flops = double(dp * mb * 8) * (o.forward_flops + o.backward_flops);
  EXPECT_NEAR(m.achieved_flops, flops / (double(step) * 1e-9), 1e-9 * m.achieved_flops);
}

TEST(Synth, PipelineBubbleIsTheGPipeFractionWithoutOverheads) {
  for (const auto& [pp, mb] : std::vector<std::pair<int, int>>{{2, 1}, {4, 4}, {4, 16}, {8, 3}}) {
    SynthOptions o;
    o.ranks = pp;  // dp = 1: no all-reduce
    o.pp = pp;
    o.micro_batches = mb;
    o.layers = 2 * pp;
    o.layers_per_bucket = 1;
    o.data_ns = 0;
    o.optimizer_ns = 0;
    o.steps = 2;
    const Metrics m = compute_metrics(traces::synthesize(o));
    EXPECT_NEAR(m.bubble_pct, 100.0 * (pp - 1) / (mb + pp - 1), 1e-9) << pp << " " << mb;
  }
}

TEST(Synth, BadOptionsAreInputErrors) {
  SynthOptions o;
  o.layers = 7;  // not divisible by layers_per_bucket = 2
  EXPECT_THROW(traces::synthesize(o), InputError);
  o = {};
  o.ranks = 0;
  EXPECT_THROW(traces::synthesize(o), InputError);
  o = {};
  o.straggler_rank = 4;
  EXPECT_THROW(traces::synthesize(o), InputError);
  o = {};
  o.pp = 3;  // does not divide 4 ranks
  EXPECT_THROW(traces::synthesize(o), InputError);
  o = {};
  o.pp = 2;
  o.jitter_ns = 5;
  EXPECT_THROW(traces::synthesize(o), InputError);
  // Durations whose sums overflow int64 ns, and a span target near 2^63 (both were signed
  // overflows under UBSan): InputErrors.
  o = {};
  o.jitter_ns = std::numeric_limits<int64_t>::max();
  EXPECT_THROW(traces::synthesize(o), InputError);
  o = {};
  o.straggler_rank = 1;
  o.straggler_delay_ns = std::numeric_limits<int64_t>::max();
  EXPECT_THROW(traces::synthesize(o), InputError);
  o = {};
  EXPECT_THROW(traces::synth_steps_for_spans(o, std::numeric_limits<int64_t>::max()), InputError);
  EXPECT_EQ(traces::synth_steps_for_spans(o, traces::synth_span_count(o) / o.steps * 3), 3);
}

TEST(Synth, MetricsAreTheSameAfterAStoreRoundTrip) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("orrery_profiler_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "synth.db").string();
  SynthOptions o;
  o.ranks = 3;
  o.steps = 3;
  o.layers = 4;
  traces::write_trace(traces::synthesize(o), path);
  const traces::Trace t = traces::load_trace(path);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(t.meta.source, traces::TraceSource::Synth);
  expect_closed_forms(o, compute_metrics(t));
}

}  // namespace
}  // namespace orrery::profiler
