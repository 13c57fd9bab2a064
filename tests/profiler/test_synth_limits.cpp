// The synthetic generator's size check (synth.hpp: synth_memory_bytes, check_synth_size): the
// estimate covers what synthesize() allocates and absurd options are refused before it, with the
// options named.
#include <gtest/gtest.h>

#include <string>

#include "orrery/common/error.hpp"
#include "orrery/traces/synth.hpp"

namespace orrery::traces {
namespace {

std::string error_of(const SynthOptions& o, int64_t limit) {
  try {
    check_synth_size(o, limit);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(SynthLimits, EstimateCoversTheSpansAndCounters) {
  SynthOptions o;  // 4 ranks, 10 steps, 12 layers, buckets of 2: 4·10·(24 + 6 + 6) = 1440 spans
  const Trace t = synthesize(o);
  ASSERT_EQ(t.spans.size(), 1440u);
  const double held = double(t.spans.size()) * sizeof(Span) + double(t.counters.size()) * sizeof(CounterSample);
  EXPECT_GE(synth_memory_bytes(o), held);
  EXPECT_LE(synth_memory_bytes(o), 2 * held);
  SynthOptions p = o;  // pipeline mode: the estimate follows synth_span_count
  p.pp = 2;
  p.micro_batches = 3;
  const Trace tp = synthesize(p);
  EXPECT_GE(synth_memory_bytes(p), double(tp.spans.size()) * sizeof(Span));
}

TEST(SynthLimits, HugeLayersRanksStepsAreRefusedWithTheOptionNamed) {
  SynthOptions o;
  o.layers = 2147483647;
  o.layers_per_bucket = 1;
  std::string e = error_of(o, int64_t(16) << 30);
  EXPECT_NE(e.find("--layers 2147483647"), std::string::npos) << e;
  EXPECT_NE(e.find("2.58e+11 spans"), std::string::npos) << e;  // 4·10·(3·(2^31 − 1) + 6)
  EXPECT_NE(e.find("17.2 GB"), std::string::npos) << e;         // the limit, stated
  EXPECT_THROW(synthesize(o), InputError);                      // physical memory: refused first

  SynthOptions r;
  r.ranks = 2147483647;
  e = error_of(r, int64_t(16) << 30);
  EXPECT_NE(e.find("--ranks 2147483647"), std::string::npos) << e;

  SynthOptions p;
  p.pp = 4;
  p.ranks = 8;
  p.layers = 8;
  p.micro_batches = 100'000'000;
  e = error_of(p, int64_t(16) << 30);
  EXPECT_NE(e.find("--micro-batches 100000000"), std::string::npos) << e;
}

TEST(SynthLimits, OrdinaryRequestsPass) {
  SynthOptions o;
  o.ranks = 64;
  o.steps = 100;
  o.layers = 96;
  EXPECT_NO_THROW(check_synth_size(o, int64_t(1) << 30));  // 1.25e6 spans: ~130 MB
}

TEST(SynthLimits, StepsForSpansRefusesOverflowingPerStepCounts) {
  SynthOptions o;
  o.ranks = 2147483647;
  o.layers = 2147483646;
  o.pp = 2;
  o.micro_batches = 2147483647;
  EXPECT_THROW(synth_steps_for_spans(o, 1000), InputError);
}

}  // namespace
}  // namespace orrery::traces
