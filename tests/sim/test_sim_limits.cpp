// The simulator's size checks (sweep.hpp: check_simulation_size; workload.hpp: workload_ops_bound):
// the closed-form op bound holds for every layout and schedule and is not loose, realistic
// simulations pass (GPT-3 175B on 16,384 GPUs, every rank), and absurd ones are refused before
// anything is built, with the keys named.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/sim/executor.hpp"
#include "orrery/sim/sweep.hpp"
#include "orrery/sim/workload.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim {
namespace {

using testing::gpt3_175b;
using testing::h100_cost;
using testing::rail_fat_tree;
using testing::small_scenario;

size_t max_stage_ops(const Workload& w) {
  size_t n = 0;
  for (const auto& st : w.stages) n = std::max(n, st.ops.size());
  return n;
}

// The message of the InputError `f` throws ("" when none).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(SimLimits, OpBoundHoldsAndIsTight) {
  struct Case {
    int layers, dp, tp, pp, m, zero, steps;
    const char* schedule;
  };
  const Case cases[] = {
      {4, 1, 1, 1, 1, 0, 1, "1f1b"},   {4, 2, 1, 1, 1, 0, 1, "1f1b"},
      {8, 2, 2, 2, 4, 0, 2, "1f1b"},   {8, 4, 1, 4, 8, 1, 1, "gpipe"},
      {8, 4, 2, 2, 4, 2, 1, "1f1b"},   {12, 4, 1, 1, 3, 3, 2, "1f1b"},
      {12, 2, 2, 3, 6, 3, 1, "gpipe"}, {96, 2, 8, 16, 32, 0, 1, "1f1b"},
  };
  for (const auto& c : cases) {
    Scenario s = small_scenario(c.layers, c.dp, c.tp, c.pp, c.m, c.schedule);
    s.parallel.zero = c.zero;
    s.parallel.bucket_mb = 0.01;  // a bucket per segment: the most DP ops
    const Workload w = build_workload(s, h100_cost(), {c.steps, precision_config("fp32")});
    const double bound = workload_ops_bound(s, c.steps);
    const double ops = double(max_stage_ops(w));
    SCOPED_TRACE("layers " + std::to_string(c.layers) + " dp " + std::to_string(c.dp) + " tp " +
                 std::to_string(c.tp) + " pp " + std::to_string(c.pp) + " m " +
                 std::to_string(c.m) + " zero " + std::to_string(c.zero));
    EXPECT_GE(bound, ops);
    EXPECT_LE(bound, 3 * ops + 30);  // an estimate, not a blanket
  }
}

TEST(SimLimits, OpBoundScalesWithLayersMicroBatchesAndSteps) {
  // tp = 1, zero 0: per step m·(L/pp·2 + 10) + L/pp + 12.
  const Scenario s = small_scenario(8, 2, 1, 2, 4);
  EXPECT_DOUBLE_EQ(workload_ops_bound(s, 1), 4 * (4 * 2 + 10) + 4 + 12);
  EXPECT_DOUBLE_EQ(workload_ops_bound(s, 3), 3 * workload_ops_bound(s, 1));
}

TEST(SimLimits, RealisticSimulationsPass) {
  // GPT-3 175B on 16,384 GPUs: one rank per stage, every rank, with the trace. The estimates stay
  // far below a workstation's memory (the every-rank run is ~2e8 executor entries: a few GB).
  const Scenario s = gpt3_175b(128);
  EXPECT_NO_THROW(check_simulation_size(s, 1, false, true, int64_t(1) << 30));
  const SimulationSize all = estimate_simulation_size(s, 1, true, false);
  EXPECT_EQ(all.world, 16384);
  EXPECT_EQ(all.simulated_ranks, 16384);
  EXPECT_LT(all.bytes, 16e9);
  EXPECT_NO_THROW(check_simulation_size(s, 1, true, false, int64_t(16) << 30));
  // 1,000 layers (DeepNet) and the cap itself pass the layer check.
  EXPECT_NO_THROW(
      check_simulation_size(small_scenario(1000, 2, 1, 1, 1), 1, false, false, int64_t(1) << 30));
  EXPECT_NO_THROW(check_simulation_size(small_scenario(kMaxSimulatedLayers, 2, 1, 1, 1), 1, false,
                                        false, int64_t(4) << 30));
}

// With the rail symmetry (executor.hpp) every rank asked for simulates tp rank 0 of each group: the
// size estimate counts those ranks, as the executor runs them, and the trace's every rank. dp 4 x
// tp 4 x pp 2 on 8 nodes of 4 GPUs of a rail-optimized fat-tree: 8 of 32 ranks simulated.
TEST(SimLimits, RailSymmetrySizesTheRanksTheExecutorSimulates) {
  const Cluster c = rail_fat_tree(8, 4, 8, 2);
  const Scenario s = small_scenario(8, 4, 4, 2, 2);
  SimOptions opt;
  opt.all_ranks = true;
  HardwareProfile prof = profile_for(c);
  EXPECT_EQ(rail_copies(s, c, opt, prof), 4);
  const SimResult r = simulate(s, c, opt);
  const SimulationSize rail = estimate_simulation_size(s, 1, true, false, 4);
  EXPECT_EQ(rail.simulated_ranks, int64_t(r.simulated_ranks));
  EXPECT_EQ(r.simulated_ranks, 8u);
  EXPECT_EQ(r.copied_ranks, 24u);
  // Without the symmetry the executor's per-rank share grows by 24 ranks of ops; the trace holds
  // every rank either way.
  const SimulationSize literal = estimate_simulation_size(s, 1, true, false);
  EXPECT_EQ(literal.simulated_ranks, 32);
  EXPECT_DOUBLE_EQ(literal.bytes - rail.bytes,
                   24 * rail.ops_per_stage * double(sizeof(OpTiming) + sizeof(uint32_t)));
  EXPECT_DOUBLE_EQ(estimate_simulation_size(s, 1, true, true).bytes - literal.bytes,
                   estimate_simulation_size(s, 1, true, true, 4).bytes - rail.bytes);
  // A limit between the two: refused literally, passed with the symmetry.
  const int64_t limit = int64_t((rail.bytes + literal.bytes) / 2);
  EXPECT_NO_THROW(check_simulation_size(s, 1, true, false, limit, 4));
  EXPECT_EQ(error_of([&] { check_simulation_size(s, 1, true, false, limit, 1); }).find("rail"),
            std::string::npos);
  EXPECT_NE(error_of([&] { check_simulation_size(s, 1, true, false, limit, 1); }), "");
  const std::string below =
      error_of([&] { check_simulation_size(s, 1, true, false, int64_t(rail.bytes) - 1, 4); });
  EXPECT_NE(below.find("simulated on 8 of 32 ranks (every rank: --all-ranks or a core-sharing "
                       "profile) (tp rank 0 of each group simulated for its 4 tp ranks: the "
                       "rail symmetry)"),
            std::string::npos)
      << below;
  // Where the executor simulates every rank, one copy each: representatives only, the symmetry
  // turned off, the ranks' spread, tp smaller than the node.
  opt.all_ranks = false;
  EXPECT_EQ(rail_copies(s, c, opt, prof), 1);
  opt.all_ranks = true;
  opt.rail_symmetry = false;
  EXPECT_EQ(rail_copies(s, c, opt, prof), 1);
  opt.rail_symmetry = true;
  prof.rank_jitter = 0.02;
  EXPECT_EQ(rail_copies(s, c, opt, prof), 1);
  prof.rank_jitter = 0;
  EXPECT_EQ(rail_copies(small_scenario(8, 8, 2, 2, 2), c, opt, prof), 1);
}

TEST(SimLimits, TooManyLayersNamesTheKey) {
  const std::string e = error_of([] {
    check_simulation_size(small_scenario(10'000'000, 2, 1, 1, 1), 1, false, false,
                          int64_t(1) << 40);
  });
  EXPECT_NE(e.find("key 'model.layers': 10000000 layers"), std::string::npos) << e;
  EXPECT_NE(e.find("at most 100000"), std::string::npos) << e;
}

TEST(SimLimits, MicroBatchesAboveMemoryNameTheKeys) {
  // 10,000 layers x 100,000 micro-batches: 2e9 ops, over 100 GB, refused against a 16 GB limit.
  Scenario s = small_scenario(10'000, 1, 1, 1, 100'000);
  const std::string e =
      error_of([&] { check_simulation_size(s, 1, false, false, int64_t(16) << 30); });
  EXPECT_NE(e.find("'model.layers' (10000"), std::string::npos) << e;
  EXPECT_NE(e.find("'training.global_batch' 200000"), std::string::npos) << e;
  EXPECT_NE(e.find("17.2 GB"), std::string::npos) << e;  // the stated limit
  // Fewer micro-batches fit.
  s.training.global_batch = 2 * 100;
  EXPECT_NO_THROW(check_simulation_size(s, 1, false, false, int64_t(16) << 30));
}

TEST(SimLimits, OpIdsAre32Bit) {
  // 1e9 steps of a 4-layer model: more ops than 32-bit ids, whatever the memory.
  const std::string e = error_of([] {
    check_simulation_size(small_scenario(4, 2, 1, 1, 1), 1'000'000'000, false, false,
                          int64_t(1) << 62);
  });
  EXPECT_NE(e.find("32-bit op ids"), std::string::npos) << e;
  EXPECT_NE(e.find("1000000000 steps (--steps)"), std::string::npos) << e;
  // build_workload refuses the same before building.
  EXPECT_THROW(build_workload(small_scenario(4, 2, 1, 1, 1), h100_cost(),
                              {1'000'000'000, precision_config("fp32")}),
               InputError);
}

TEST(SimLimits, WorldAboveInt32NamesTheLayout) {
  Scenario s = small_scenario(4, 1, 1, 1, 1);
  s.parallel.dp = 1 << 30;
  s.parallel.tp = 8;
  const std::string e =
      error_of([&] { check_simulation_size(s, 1, false, false, int64_t(1) << 62); });
  EXPECT_NE(
      e.find(
          "'parallel.dp' x 'parallel.tp' x 'parallel.pp' = 1073741824 x 8 x 1 = 8589934592 ranks"),
      std::string::npos)
      << e;
}

TEST(SimLimits, EveryRankAndTraceAreNamed) {
  // 96 layers, 8 micro-batches, on 2^20 simulated ranks with the trace: far over 1 GB.
  Scenario s = small_scenario(96, 1 << 16, 1, 16, 8);
  const std::string e =
      error_of([&] { check_simulation_size(s, 1, true, true, int64_t(1) << 30); });
  EXPECT_NE(e.find("simulated on 1048576 of 1048576 ranks (every rank"), std::string::npos) << e;
  EXPECT_NE(e.find("with the trace (--out)"), std::string::npos) << e;
}

TEST(SimLimits, HundredThousandLayersBuildInLinearTime) {
  // Segment parameters are summed once per stage (the scan per segment was quadratic: minutes).
  const Scenario s = small_scenario(100'000, 2, 1, 1, 1);
  const Workload w = build_workload(s, h100_cost(), {1, precision_config("fp32")});
  EXPECT_LE(double(max_stage_ops(w)), workload_ops_bound(s, 1));
  EXPECT_GE(max_stage_ops(w), size_t(200'000));  // a forward and a backward op per layer
}

}  // namespace
}  // namespace orrery::sim
