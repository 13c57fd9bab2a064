// Span-level comparison: alignment by (rank, step, name, occurrence), errors per op class and name,
// step renumbering between a multi-step trace and a one-step one, unmatched spans.
#include <gtest/gtest.h>

#include "orrery/profiler/compare.hpp"
#include "orrery/traces/synth.hpp"

namespace orrery::profiler {
namespace {

const CompareRow* find(const std::vector<CompareRow>& rows, const std::string& key) {
  for (const auto& r : rows)
    if (r.key == key) return &r;
  return nullptr;
}

TEST(CompareSpans, ErrorsPerClassAndName) {
  traces::SynthOptions o;
  o.ranks = 2;
  o.steps = 3;
  o.layers = 4;
  const traces::Trace a = traces::synthesize(o);
  traces::SynthOptions o2 = o;
  o2.forward_ns = o.forward_ns * 3 / 2;  // forward 50 % slower, the rest equal
  const traces::Trace b = traces::synthesize(o2);
  CompareOptions opt;
  opt.skip_steps = 1;
  const SpanComparison c = compare_spans(a, b, opt);
  EXPECT_EQ(c.steps_compared, 2);
  EXPECT_EQ(c.only_a, 0);
  EXPECT_EQ(c.only_b, 0);
  // Per rank and step: 2L compute, L/k all-reduces, data, optimizer, 4 phases (synth.hpp).
  EXPECT_EQ(c.matched, int64_t(o.ranks) * 2 * (2 * o.layers + o.layers / o.layers_per_bucket + 6));
  const auto* fwd = find(c.by_class, "compute");
  ASSERT_NE(fwd, nullptr);  // synth names layers.<i>.forward: class "compute"
  const auto* f0 = find(c.by_name, "layers.0.forward");
  ASSERT_NE(f0, nullptr);
  EXPECT_EQ(f0->pairs, o.ranks * 2);
  EXPECT_NEAR(f0->error_pct(), 50.0, 1e-9);
  EXPECT_NEAR(f0->mean_abs_error_pct(), 50.0, 1e-9);
  const auto* b0 = find(c.by_name, "layers.0.backward");
  ASSERT_NE(b0, nullptr);
  EXPECT_NEAR(b0->error_pct(), 0.0, 1e-12);
  const auto* ar = find(c.by_class, "collective.all_reduce");
  ASSERT_NE(ar, nullptr);
  EXPECT_EQ(ar->pairs, o.ranks * 2 * o.layers / o.layers_per_bucket);
  EXPECT_NEAR(ar->error_pct(), 0.0, 1e-12);
  // Compute class: forward is L·f of L·(f + b) per step: error = 0.5·f / (f + b).
  EXPECT_NEAR(fwd->error_pct(), 100.0 * 0.5 * o.forward_ns / double(o.forward_ns + o.backward_ns), 1e-9);
  // Steps: A's is the synthetic closed form; B's longer by L·f/2.
  EXPECT_DOUBLE_EQ(c.step_a_ns, double(traces::synth_totals(o).step_ns));
  EXPECT_DOUBLE_EQ(c.step_b_ns, double(traces::synth_totals(o2).step_ns));
  EXPECT_NE(format_comparison(c).find("layers.0.forward"), std::string::npos);
}

TEST(CompareSpans, OneStepTraceLinesUpWithTheFirstCountedStep) {
  traces::SynthOptions o;
  o.ranks = 2;
  o.steps = 4;
  o.layers = 2;
  o.layers_per_bucket = 1;
  const traces::Trace a = traces::synthesize(o);
  traces::SynthOptions one = o;
  one.steps = 1;
  one.ranks = 1;  // B simulates rank 0 only
  one.backward_ns = o.backward_ns * 2;
  const traces::Trace b = traces::synthesize(one);
  const SpanComparison c = compare_spans(a, b, {1});
  EXPECT_EQ(c.steps_compared, 1);
  // Only rank 0 compared (rank 1 is absent from B): 2L + L + 6 spans.
  EXPECT_EQ(c.matched, 2 * o.layers + o.layers + 6);
  const auto* b1 = find(c.by_name, "layers.1.backward");
  ASSERT_NE(b1, nullptr);
  EXPECT_NEAR(b1->error_pct(), 100.0, 1e-9);
}

TEST(CompareSpans, UnmatchedSpansAreCounted) {
  traces::SynthOptions o;
  o.ranks = 1;
  o.steps = 2;
  o.layers = 4;
  const traces::Trace a = traces::synthesize(o);
  traces::SynthOptions fewer = o;
  fewer.layers = 2;
  const traces::Trace b = traces::synthesize(fewer);
  const SpanComparison c = compare_spans(a, b, {0});
  // Layers 2 and 3 (forward and backward) and the second bucket's all-reduce exist only in A, in
  // both steps.
  EXPECT_EQ(c.only_a, 2 * (4 + 1));
  EXPECT_EQ(c.only_b, 0);
}

}  // namespace
}  // namespace orrery::profiler
