// simulate() and sweep(): the breakdown adds up to the step, a pure pipeline's bubble is the closed
// form, fit_layout fills or rejects a cluster, the scaling table and the layout search, trace output,
// and bit-identical results for identical input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <tuple>

#include "orrery/common/error.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/sim/sim_target.hpp"
#include "orrery/sim/sweep.hpp"
#include "orrery/traces/store.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim {
namespace {

using testing::gpt3_175b;
using testing::h100_cluster;
using testing::small_scenario;

TEST(Simulate, BreakdownAddsUpToTheStep) {
  Scenario s = small_scenario(8, 2, 2, 2, 8);
  const Cluster c = h100_cluster(8);
  SimOptions opt;
  const SimResult r = simulate(s, c, opt);
  const auto& b = r.breakdown;
  EXPECT_EQ(r.simulated_ranks, 2u);
  EXPECT_GT(r.step_time_ns, 0);
  EXPECT_NEAR(b.window_ns, double(r.step_time_ns), 1e-6);
  // The pipeline's transfers are part of the bubble (profiler::account_step), not added to it.
  EXPECT_NEAR(b.compute_ns + b.exposed_tp_ns + b.exposed_dp_ns + b.bubble_ns + b.idle_ns,
              b.window_ns, 1e-6 * b.window_ns);
  EXPECT_GT(b.exposed_pp_ns, 0);
  EXPECT_LE(b.exposed_pp_ns, b.bubble_ns);
  EXPECT_GT(b.exposed_tp_ns, 0);
  EXPECT_GT(b.bubble_ns, 0);
  EXPECT_EQ(b.idle_ns, 0);  // pp > 1: waiting is bubble
  // Throughput identities.
  EXPECT_NEAR(r.tokens_per_s,
              double(s.training.global_batch) * s.model.seq / (r.step_time_ns * 1e-9),
              1e-9 * r.tokens_per_s);
  EXPECT_NEAR(r.mfu, r.tflops_per_gpu * 1e12 / r.peak_flops, 1e-12);
  EXPECT_EQ(r.peak_flops, 989e12);  // H100 bf16 from the default profile's precision
  EXPECT_EQ(r.precision, "mixed");
}

// One bubble definition: the simulator's breakdown and compute_metrics over the trace the
// simulation writes (what `orrery report sim.db` prints) are the same numbers, for a pipeline with
// tp and dp and for a pp = 1 layout (idle instead of bubble).
TEST(Simulate, BreakdownIsTheReportOfItsOwnTrace) {
  for (const auto& [dp, tp, pp] : {std::tuple{2, 2, 2}, std::tuple{2, 2, 1}, std::tuple{1, 1, 4}}) {
    Scenario s = small_scenario(8, dp, tp, pp, 8);
    SimOptions opt;
    opt.keep_trace = true;
    opt.steps = 3;
    opt.all_ranks = true;
    const SimResult r = simulate(s, h100_cluster(dp * tp * pp), opt);
    ASSERT_TRUE(r.trace.has_value());
    profiler::MetricsOptions mo;
    mo.skip_steps = 1;  // the simulator counts steps 1.. when it simulates more than one
    const profiler::Metrics m = profiler::compute_metrics(*r.trace, mo);
    ASSERT_EQ(m.counted_steps, 2);
    EXPECT_NEAR(m.step_mean_ns, double(r.step_time_ns), 1.0);
    profiler::StepAccount sum;
    for (const auto& rm : m.ranks) sum += rm.counted;
    const double n = double(m.ranks.size()) * m.counted_steps;
    const auto& b = r.breakdown;
    const std::string at = std::to_string(dp) + "x" + std::to_string(tp) + "x" + std::to_string(pp);
    EXPECT_NEAR(double(sum.window_ns) / n, b.window_ns, 1e-6 * b.window_ns) << at;
    EXPECT_NEAR(double(sum.compute_ns) / n, b.compute_ns, 1e-6 * b.window_ns) << at;
    EXPECT_NEAR(double(sum.exposed_tp_ns) / n, b.exposed_tp_ns, 1e-6 * b.window_ns) << at;
    EXPECT_NEAR(double(sum.exposed_dp_ns) / n, b.exposed_dp_ns, 1e-6 * b.window_ns) << at;
    EXPECT_NEAR(double(sum.p2p_ns) / n, b.exposed_pp_ns, 1e-6 * b.window_ns) << at;
    EXPECT_NEAR(double(sum.rest_ns) / n, b.bubble_ns + b.idle_ns, 1e-6 * b.window_ns) << at;
    EXPECT_EQ(m.pipeline, pp > 1) << at;
    if (pp > 1) {
      EXPECT_GT(b.bubble_ns, 0) << at;
      EXPECT_NEAR(m.bubble_pct, 100.0 * b.bubble_ns / b.window_ns, 1e-6) << at;
    } else {
      EXPECT_EQ(b.bubble_ns, 0) << at;
    }
  }
}

TEST(Simulate, FitLayoutFillsOrRejects) {
  Scenario s = small_scenario(8, 1, 2, 2, 8);  // tp·pp = 4
  EXPECT_EQ(fit_layout(s, h100_cluster(16)).parallel.dp, 4);
  EXPECT_EQ(fit_layout(s, h100_cluster(4)).parallel.dp, 1);
  Scenario t = small_scenario(8, 1, 8, 2, 8);  // tp·pp = 16 does not divide 8
  EXPECT_THROW(fit_layout(t, h100_cluster(8)), InputError);
  // 8 sequences per step cannot be split over dp = 16 replicas.
  Scenario u = small_scenario(8, 1, 1, 1, 4);
  u.training.global_batch = 8;
  EXPECT_THROW(fit_layout(u, h100_cluster(16)), InputError);
  EXPECT_THROW(simulate(s, h100_cluster(16), {}), InputError);  // layout not fitted
}

TEST(Simulate, TraceRoundTripsThroughTheStore) {
  const Scenario s = small_scenario(4, 2, 2, 2, 4);
  const Cluster c = h100_cluster(8);
  SimOptions opt;
  opt.keep_trace = true;
  opt.steps = 2;
  const SimResult r = simulate(s, c, opt);
  ASSERT_TRUE(r.trace.has_value());
  const auto path = std::filesystem::temp_directory_path() / "orrery_test_sim_trace.db";
  traces::write_trace(*r.trace, path.string());
  const traces::Trace t = traces::load_trace(path.string());
  EXPECT_EQ(t.meta.source, traces::TraceSource::Sim);
  EXPECT_EQ(t.spans.size(), r.trace->spans.size());
  EXPECT_EQ(t.ranks.size(), 2u);
  EXPECT_EQ(t.meta.dp, 2);
  EXPECT_EQ(t.ranks[1].pp, 1);
  EXPECT_EQ(t.counters.size(), 2u * 4);
  std::filesystem::remove(path);
}

TEST(Simulate, BitIdenticalRuns) {
  Scenario s = small_scenario(8, 2, 2, 2, 8);
  s.parallel.zero = 2;
  const Cluster c = h100_cluster(16);
  const Scenario f = fit_layout(s, c);
  SimOptions opt;
  opt.keep_trace = true;
  const SimResult a = simulate(f, c, opt), b = simulate(f, c, opt);
  EXPECT_EQ(a.step_time_ns, b.step_time_ns);
  EXPECT_EQ(a.events, b.events);
  ASSERT_EQ(a.trace->spans.size(), b.trace->spans.size());
  for (size_t i = 0; i < a.trace->spans.size(); ++i) {
    ASSERT_EQ(a.trace->spans[i].start_ns, b.trace->spans[i].start_ns);
    ASSERT_EQ(a.trace->spans[i].end_ns, b.trace->spans[i].end_ns);
  }
  EXPECT_EQ(to_json(a).dump(), [&] {
    auto j = to_json(b);
    j["wall_s"] = a.wall_s;
    return j.dump();
  }());
}

TEST(Sweep, ScalingTableAndSearch) {
  Scenario s = small_scenario(8, 1, 2, 2, 16);  // global batch 32
  const Cluster c = h100_cluster(8);
  SweepOptions opt;
  opt.gpus = {4, 8, 16, 3};
  opt.sim.network = NetworkModel::Analytical;
  auto rows = sweep(s, c, opt);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_TRUE(rows[0].ok);
  EXPECT_EQ(rows[0].result.dp, 1);
  EXPECT_EQ(rows[1].result.dp, 2);
  EXPECT_EQ(rows[2].result.dp, 4) << rows[2].note;
  EXPECT_FALSE(rows[3].ok);  // tp·pp = 4 does not divide 3
  EXPECT_NE(rows[3].note.find("does not divide"), std::string::npos) << rows[3].note;
  EXPECT_DOUBLE_EQ(rows[0].efficiency, 1.0);
  EXPECT_GT(rows[2].result.tokens_per_s, rows[0].result.tokens_per_s);
  // Search: the best found is at least as fast as the scenario's own layout at that size.
  opt.search = true;
  opt.search_top = 3;
  opt.gpus = {8};
  int progress_lines = 0;
  opt.progress = [&](const std::string&) { ++progress_lines; };
  const auto best = sweep(s, c, opt);
  ASSERT_TRUE(best[0].ok);
  EXPECT_EQ(best[0].simulated, 3);
  EXPECT_EQ(progress_lines, 3);
  EXPECT_GE(best[0].result.tokens_per_s, rows[1].result.tokens_per_s * (1 - 1e-12));
  EXPECT_TRUE(best[0].result.fits);
  // Why: the picked layout's bubble and exposed communication, then the runner-up, which is no
  // faster; the other simulated layouts are kept fastest first.
  ASSERT_EQ(best[0].others.size(), 2u);
  EXPECT_GE(best[0].others[0].tokens_per_s, best[0].others[1].tokens_per_s);
  EXPECT_LE(best[0].others[0].tokens_per_s, best[0].result.tokens_per_s);
  const std::string why = explain_choice(best[0]);
  const auto& x = best[0].result;
  const auto& y = best[0].others[0];
  char want[160];
  std::snprintf(want, sizeof want, "picked dp=%d tp=%d pp=%d zero %d mb %d: bubble %.1f %%", x.dp,
                x.tp, x.pp, x.zero, x.micro_batch,
                100.0 * x.breakdown.bubble_ns / x.breakdown.window_ns);
  EXPECT_NE(why.find(want), std::string::npos) << why;
  std::snprintf(want, sizeof want, "; next dp=%d tp=%d pp=%d zero %d mb %d: step %+.1f %%", y.dp,
                y.tp, y.pp, y.zero, y.micro_batch,
                100.0 * (double(y.step_time_ns) - double(x.step_time_ns)) / double(x.step_time_ns));
  EXPECT_NE(why.find(want), std::string::npos) << why;
  EXPECT_NE(why.find(std::to_string(best[0].candidates) + " layouts fit memory, 3 simulated"),
            std::string::npos)
      << why;
  EXPECT_EQ(explain_choice(rows[1]), "");  // no search
  // Output formats carry every row.
  const std::string csv = format_sweep_csv(rows);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5);
  EXPECT_EQ(to_json(rows).size(), 4u);
}

// A distributed sweep runs the planned jobs elsewhere and hands back their results in job order:
// a runner that simulates them last to first (as another rank might) and returns them through the
// wire format gives the same rows, the same table and the same CSV as the default.
TEST(Sweep, RunnerAndWireGiveTheSameTable) {
  Scenario s = small_scenario(8, 1, 2, 2, 16);
  const Cluster c = h100_cluster(8);
  SweepOptions opt;
  opt.gpus = {4, 8, 16};
  opt.search = true;
  opt.search_top = 3;
  opt.sim.network = NetworkModel::Analytical;
  const auto ref = sweep(s, c, opt);
  size_t planned = 0;
  opt.runner = [&](const std::vector<SweepJob>& jobs) {
    planned = jobs.size();
    std::vector<SimResult> out(jobs.size());
    for (size_t k = jobs.size(); k-- > 0;)
      out[k] = simulate(jobs[k].scenario, *jobs[k].cluster, jobs[k].options);
    return results_from_wire(results_to_wire(out));
  };
  const auto got = sweep(s, c, opt);
  EXPECT_EQ(planned, 9u);  // 3 sizes x 3 simulated layouts
  EXPECT_EQ(format_sweep_table(got), format_sweep_table(ref));
  EXPECT_EQ(format_sweep_csv(got), format_sweep_csv(ref));
  // The wire keeps every field exactly (doubles bit for bit), the trace aside.
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const SimResult &a = got[i].result, &b = ref[i].result;
    EXPECT_EQ(a.step_time_ns, b.step_time_ns);
    EXPECT_EQ(a.tokens_per_s, b.tokens_per_s);
    EXPECT_EQ(a.breakdown.bubble_ns, b.breakdown.bubble_ns);
    ASSERT_EQ(a.memory.size(), b.memory.size());
    for (size_t m = 0; m < a.memory.size(); ++m)
      EXPECT_EQ(a.memory[m].total_bytes, b.memory[m].total_bytes);
    ASSERT_EQ(a.stages.size(), b.stages.size());
    for (size_t m = 0; m < a.stages.size(); ++m) EXPECT_EQ(a.stages[m].flops, b.stages[m].flops);
  }
  // A runner that returns the wrong number of results is an internal error, not a short table.
  opt.runner = [](const std::vector<SweepJob>&) { return std::vector<SimResult>{}; };
  EXPECT_THROW(sweep(s, c, opt), InternalError);
  EXPECT_THROW(results_from_wire("{\"results\": 3}"), InputError);
}

// The closed-form estimate of --search asks for whole blocks (pieces 1) also under sequence
// parallelism; that used to be "no op named 'fwd.block' (piece 0 of 1)" for every such scenario.
TEST(Sweep, SearchWithSequenceParallelism) {
  Scenario s = small_scenario(8, 1, 2, 2, 16);
  s.parallel.sequence_parallel = true;
  const Cluster c = h100_cluster(8);
  SweepOptions opt;
  opt.gpus = {8};
  opt.search = true;
  opt.search_top = 2;
  opt.sim.network = NetworkModel::Analytical;
  const auto rows = sweep(s, c, opt);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_TRUE(rows[0].ok) << rows[0].note;
}

// Where replicas' collectives contend on the fabric, orrery sim simulates every rank by default
// (replica_contention_matters): a job over more than one node of an oversubscribed or not
// rail-optimized fat-tree; not on one node, a crossbar or a non-blocking rail-optimized fat-tree.
TEST(SimTarget, ReplicaContentionMattersOnSharedFabricsOnly) {
  const Scenario two_nodes = small_scenario(4, 16, 1, 1, 1);  // dp 16: 16 GPUs, 2 nodes of 8
  const Scenario one_node = small_scenario(4, 8, 1, 1, 1);
  ASSERT_EQ(two_nodes.world_size(), 16);
  Cluster c = h100_cluster(16);
  ASSERT_EQ(c.topo.kind, TopologyKind::FatTree);
  EXPECT_FALSE(replica_contention_matters(two_nodes, c));  // non-blocking, rail-optimized
  c.topo.oversubscription = 2;
  EXPECT_TRUE(replica_contention_matters(two_nodes, c));
  EXPECT_FALSE(replica_contention_matters(one_node, c));  // within a node: NVSwitch
  c.topo.oversubscription = 1;
  c.topo.rail_optimized = false;
  EXPECT_TRUE(replica_contention_matters(two_nodes, c));
  EXPECT_FALSE(replica_contention_matters(one_node, h100_cluster(8)));  // crossbar
  // Rail-optimized and non-blocking, but a rail's NICs fill more than one leaf: radix 4 leaves have
  // 2 ports down, so 2 nodes fit one leaf per rail and 4 do not (their rails cross the spines).
  Cluster small_leaves = h100_cluster(16);
  small_leaves.gpus_per_node = 2;
  small_leaves.topo.radix = 4;
  ASSERT_EQ(fat_tree_leaf_down_ports(small_leaves.topo), 2);
  small_leaves.nodes = 2;
  build_topology(small_leaves);
  EXPECT_FALSE(replica_contention_matters(small_scenario(4, 4, 1, 1, 1), small_leaves));
  small_leaves.nodes = 4;
  build_topology(small_leaves);
  EXPECT_TRUE(replica_contention_matters(small_scenario(4, 8, 1, 1, 1), small_leaves));
  // GPT-3 175B on 16,384 GPUs of h100-1024's design (2,048 nodes, 32 per leaf): every rank.
  EXPECT_TRUE(replica_contention_matters(gpt3_175b(128), h100_cluster(16384)));
  EXPECT_FALSE(replica_contention_matters(gpt3_175b(2), h100_cluster(256)));  // 32 nodes: one leaf
}

}  // namespace
}  // namespace orrery::sim
