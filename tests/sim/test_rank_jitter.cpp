// The ranks' spread (HardwareProfile::rank_jitter): expected normal order statistics, the executor's
// per-(rank, step) scaling of compute, the YAML key, and calibrate's fit from per-step compute totals.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"
#include "orrery/sim/calibrate.hpp"
#include "orrery/sim/cost_model.hpp"
#include "orrery/sim/executor.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/sim/workload.hpp"

#include "calibration_fixtures.hpp"

namespace orrery::sim {
namespace {

TEST(ExpectedOrderStatistics, MatchTheClosedFormsAndTables) {
  EXPECT_EQ(expected_normal_order_statistics(1), std::vector<double>{0.0});
  // n = 2: E[max] = 1 / sqrt(pi); n = 3: 3 / (2 sqrt(pi)); tabulated (Harter 1961): n = 4: 1.02938,
  // 0.29701; n = 8: 1.42360.
  const auto q2 = expected_normal_order_statistics(2);
  ASSERT_EQ(q2.size(), 2u);
  EXPECT_NEAR(q2[1], 1.0 / std::sqrt(M_PI), 1e-6);
  EXPECT_NEAR(q2[0], -q2[1], 1e-9);
  EXPECT_NEAR(expected_normal_order_statistics(3)[2], 1.5 / std::sqrt(M_PI), 1e-6);
  EXPECT_NEAR(expected_normal_order_statistics(3)[1], 0.0, 1e-9);
  const auto q4 = expected_normal_order_statistics(4);
  EXPECT_NEAR(q4[3], 1.02938, 1e-5);
  EXPECT_NEAR(q4[2], 0.29701, 1e-5);
  EXPECT_NEAR(q4[0] + q4[3], 0.0, 1e-9);
  const auto q8 = expected_normal_order_statistics(8);
  EXPECT_NEAR(q8[7], 1.42360, 1e-5);
  for (size_t i = 1; i < q8.size(); ++i) EXPECT_LT(q8[i - 1], q8[i]);
}

TEST(HardwareProfileYaml, RankJitterRoundTripsAndIsChecked) {
  HardwareProfile p = default_hardware_profile("cpu", false);
  p.rank_jitter = 0.035;
  EXPECT_DOUBLE_EQ(parse_hardware_profile(to_yaml(p), "j.yaml").rank_jitter, 0.035);
  EXPECT_DOUBLE_EQ(parse_hardware_profile("name: x\n", "j.yaml").rank_jitter, 0.0);
  try {
    parse_hardware_profile("name: x\nrank_jitter: 1.5\n", "j.yaml");
    FAIL() << "accepted rank_jitter 1.5";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rank_jitter"), std::string::npos) << e.what();
  }
}

Scenario dp2_scenario() {
  return parse_scenario(
      "name: j\nmodel: {layers: 2, d_model: 64, heads: 2, vocab: 512, seq: 32}\n"
      "training: {steps: 2, global_batch: 8, micro_batch: 4}\nparallel: {dp: 2, bucket_mb: 1}\n"
      "runtime: {device: cpu, threads: 1}\n",
      "j.yaml");
}

// dp2_scenario's workload on a 2-GPU node, every rank simulated, each collective taking comm_ns.
struct Dp2Sim {
  Workload w;
  Cluster c;
  ExecutorOptions o;
};
Dp2Sim dp2_sim(int64_t comm_ns) {
  const HardwareProfile p = default_hardware_profile("cpu", false);
  const CostModel cost(p, 1e10, 1e10);
  Dp2Sim d{build_workload(dp2_scenario(), cost, {2, precision_config("fp32")}),
           testing_fixtures::plain_cluster(2, 2), {}};
  d.o.all_ranks = true;
  d.o.comm_time = [comm_ns](const CollectiveRequest&) { return comm_ns; };
  return d;
}

// Rank r's compute op of step s runs (1 + jitter · q[(r + s) mod 2]) times its workload duration.
TEST(ExecutorRankJitter, ScalesEachRanksComputeByItsRotatedQuantile) {
  Dp2Sim d = dp2_sim(1000);
  const Workload& w = d.w;
  const Cluster& c = d.c;
  ExecutorOptions& o = d.o;
  o.rank_jitter = 0.1;
  const ExecResult r = execute(w, c, o);
  ASSERT_EQ(r.ranks.size(), 2u);
  const auto q = expected_normal_order_statistics(2);
  int checked = 0;
  for (int ri = 0; ri < 2; ++ri) {
    const auto& prog = *r.ranks[ri].program;
    for (size_t i = 0; i < prog.ops.size(); ++i) {
      const Op& op = prog.ops[i];
      if (op.kind != traces::SpanKind::Compute || op.step < 0 || op.duration_ns < 1000) continue;
      const double f = 1.0 + 0.1 * q[(ri + op.step) % 2];
      const auto& t = r.ranks[ri].ops[i];
      EXPECT_EQ(t.end_ns - t.start_ns, std::llround(double(op.duration_ns) * f)) << ri << " " << i;
      ++checked;
    }
  }
  EXPECT_GT(checked, 10);
  // Without it (or with representatives only) the durations are the workload's.
  o.rank_jitter = 0;
  const ExecResult plain = execute(w, c, o);
  const auto& op0 = plain.ranks[0].ops[0];
  EXPECT_EQ(op0.end_ns - op0.start_ns, plain.ranks[0].program->ops[0].duration_ns);
}

// A traced run of `ranks` ranks whose rank r computes fwd.block for (1 + d_r) · 10 ms each step.
traces::Trace jitter_run(const Scenario& s, int ranks, const std::vector<double>& d) {
  traces::Trace t;
  t.meta.source = traces::TraceSource::Real;
  t.meta.scenario_text = to_yaml(s);
  t.meta.world_size = ranks;
  t.path = "r" + std::to_string(ranks) + ".db";
  for (int r = 0; r < ranks; ++r) t.ranks.push_back({r, "host", "cpu", r, 0, 0});
  const auto name = t.strings.intern("fwd.block");
  for (int step = 0; step < 4; ++step)
    for (int r = 0; r < ranks; ++r) {
      traces::Span sp;
      sp.rank = r, sp.kind = traces::SpanKind::Compute, sp.name = name, sp.step = step, sp.layer = 0;
      sp.start_ns = int64_t(step) * 100'000'000;
      sp.end_ns = sp.start_ns + std::llround(10e6 * (1.0 + d[static_cast<size_t>(r)]));
      t.spans.push_back(sp);
    }
  t.sort_spans();
  return t;
}

TEST(Calibrate, RankJitterIsThePooledRelativeSpreadOfPerStepCompute) {
  Scenario s1 = dp2_scenario();
  s1.parallel.dp = 1;
  s1.training.global_batch = 4;
  const Scenario s2 = dp2_scenario();
  std::vector<traces::Trace> runs;
  runs.push_back(jitter_run(s1, 1, {0.0}));
  // Rank totals 9.5 and 10.5 ms: deviations -/+ 0.05 from the mean, one degree of freedom per step:
  // rank_jitter = sqrt(2 · 0.05²) = 0.0707.
  runs.push_back(jitter_run(s2, 2, {-0.05, 0.05}));
  CalibrationOptions opt;
  opt.cores = 2;
  const CalibrationResult r = calibrate(runs, opt);
  EXPECT_NEAR(r.profile.rank_jitter, std::sqrt(2.0) * 0.05, 1e-6);
  // A lone run gives none.
  runs.pop_back();
  EXPECT_DOUBLE_EQ(calibrate(runs, opt).profile.rank_jitter, 0.0);
}

TEST(HardwareProfileYaml, OpJitterRoundTripsAndIsChecked) {
  HardwareProfile p = default_hardware_profile("cpu", false);
  p.op_jitter = 0.055;
  EXPECT_DOUBLE_EQ(parse_hardware_profile(to_yaml(p), "j.yaml").op_jitter, 0.055);
  EXPECT_THROW(parse_hardware_profile("name: x\nop_jitter: -0.1\n", "j.yaml"), InputError);
}

// The first collective waits σ · E[max of 2] = σ / sqrt(pi) longer, σ² = Σ (op_jitter · d)² over the
// compute each member ran before it (both ranks ran the same ops).
TEST(ExecutorOpJitter, FirstCollectiveWaitsForTheExpectedLaterArrival) {
  Dp2Sim d = dp2_sim(1'000'000);
  const Workload& w = d.w;
  const Cluster& c = d.c;
  ExecutorOptions& o = d.o;
  const ExecResult plain = execute(w, c, o);
  o.op_jitter = 0.1;
  const ExecResult jit = execute(w, c, o);
  const auto& prog = *plain.ranks[0].program;
  size_t first = prog.ops.size();
  for (size_t i = 0; i < prog.ops.size() && first == prog.ops.size(); ++i)
    if (prog.ops[i].kind == traces::SpanKind::Collective) first = i;
  ASSERT_LT(first, prog.ops.size());
  const int64_t launched = plain.ranks[0].ops[first].active_ns;
  double var = 0;
  for (size_t i = 0; i < prog.ops.size(); ++i) {
    const auto k = prog.ops[i].kind;
    if (k == traces::SpanKind::Collective || k == traces::SpanKind::P2P) continue;
    const auto& t = plain.ranks[0].ops[i];
    if (t.start_ns >= 0 && t.start_ns < launched) var += std::pow(0.1 * double(t.end_ns - t.start_ns), 2);
  }
  ASSERT_GT(var, 0);
  EXPECT_EQ(jit.ranks[0].ops[first].active_ns, launched);
  EXPECT_NEAR(double(jit.ranks[0].ops[first].end_ns - plain.ranks[0].ops[first].end_ns),
              std::sqrt(var) / std::sqrt(M_PI), 2.0);
}

// A run whose every rank computes fwd.block for d[step] ms in each step.
traces::Trace op_jitter_run(const Scenario& s, const std::vector<double>& d) {
  traces::Trace t = jitter_run(s, 2, {0.0, 0.0});
  for (auto& sp : t.spans) sp.end_ns = sp.start_ns + std::llround(1e6 * d[static_cast<size_t>(sp.step)]);
  return t;
}

TEST(Calibrate, OpJitterIsTheRelativeSpreadOfRepeatedOps) {
  Scenario s1 = dp2_scenario();
  s1.parallel.dp = 1;
  s1.training.global_batch = 4;
  std::vector<traces::Trace> runs;
  runs.push_back(jitter_run(s1, 1, {0.0}));
  // Counted steps 1..3 (step 0 is warm-up): 12, 10, 8 ms: mean 10, sample sd 2, op_jitter 0.2.
  runs.push_back(op_jitter_run(dp2_scenario(), {30.0, 12.0, 10.0, 8.0}));
  CalibrationOptions opt;
  opt.cores = 2;
  EXPECT_NEAR(calibrate(runs, opt).profile.op_jitter, 0.2, 1e-9);
}

}  // namespace
}  // namespace orrery::sim
