// Calibration: the fitting maths on data with known parameters (NNLS, affine fits), the core-sharing
// law, the profile's new sections round-tripping through YAML, and a whole calibration on generated
// "real" traces whose op times, slowdown and collective costs are known exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "calibration_fixtures.hpp"
#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"
#include "orrery/sim/calibrate.hpp"
#include "orrery/sim/core_sharing.hpp"
#include "orrery/sim/cost_model.hpp"
#include "orrery/sim/workload.hpp"

namespace orrery::sim {
namespace {

using testing_fixtures::make_run;
using testing_fixtures::tiny;
using testing_fixtures::Truth;

TEST(Nnls, RecoversAKnownNonNegativeSolution) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.1, 2.0);
  const int rows = 20, cols = 5;
  const std::vector<double> truth{1.0, 2.0, 0.0, 3.0, 0.5};
  std::vector<double> a(rows * cols), b(rows, 0.0);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      a[i * cols + j] = u(rng);
      b[i] += a[i * cols + j] * truth[j];
    }
  const auto x = nnls(a, rows, cols, b);
  for (int j = 0; j < cols; ++j) EXPECT_NEAR(x[j], truth[j], 1e-9) << j;
}

TEST(Nnls, ClampsWhereLeastSquaresGoesNegative) {
  // min |x1 - 1|² + |x1 + x2 - (-1)|²... rows: [1 0] x = 1, [0 1] x = -2: x2 would be -2, so 0.
  const std::vector<double> a{1, 0, 0, 1};
  const std::vector<double> b{1, -2};
  const auto x = nnls(a, 2, 2, b);
  EXPECT_NEAR(x[0], 1.0, 1e-12);
  EXPECT_EQ(x[1], 0.0);
  // KKT on a coupled case: A = [[1,1],[1,2],[1,3]], b = [3, 2, 1] (LS slope is negative).
  const std::vector<double> a2{1, 1, 1, 2, 1, 3};
  const std::vector<double> b2{3, 2, 1};
  const auto y = nnls(a2, 3, 2, b2);
  EXPECT_NEAR(y[0], 2.0, 1e-12);  // the mean of b, with the slope clamped at 0
  EXPECT_EQ(y[1], 0.0);
}

TEST(AffineFit, RecoversLatencyAndThroughputExactly) {
  // time = a + flops / b with a = 3 us and b = 40 GFLOP/s.
  const double a = 3000, b = 40.0;  // ns, FLOP per ns
  std::vector<double> x, y;
  for (double f : {1e6, 5e6, 2e7, 1e8, 3e8}) {
    x.push_back(f);
    y.push_back(a + f / b);
  }
  const AffineFit fit = fit_affine_nonneg(x, y);
  EXPECT_NEAR(fit.intercept, a, 1e-6 * a);
  EXPECT_NEAR(1.0 / fit.slope, b, 1e-9 * b);
  EXPECT_NEAR(fit.r2, 1.0, 1e-12);
  EXPECT_EQ(fit.points, 5);
}

TEST(AffineFit, NegativeInterceptClampsToZero) {
  // y = 2x - 1 on x in {1, 2, 3}: with intercept >= 0 the fit is through the origin, slope Σxy/Σx².
  const AffineFit f = fit_affine_nonneg({1, 2, 3}, {1, 3, 5});
  EXPECT_EQ(f.intercept, 0.0);
  EXPECT_NEAR(f.slope, (1.0 + 6 + 15) / 14.0, 1e-12);
}

TEST(LatencySteps, RingCounts) {
  EXPECT_EQ(latency_steps(traces::CollOp::AllReduce, 4), 6);
  EXPECT_EQ(latency_steps(traces::CollOp::AllGather, 4), 3);
  EXPECT_EQ(latency_steps(traces::CollOp::ReduceScatter, 8), 7);
  EXPECT_EQ(latency_steps(traces::CollOp::Send, 2), 1);
  EXPECT_EQ(latency_steps(traces::CollOp::AllReduce, 1), 0);
}

TEST(CoreSharing, LawBelowAndBeyondTheCores) {
  CoreSharing s;
  s.cores = 4;
  s.threads_per_rank = 1;
  s.contention_at_full = 1.3;
  s.oversubscription_exponent = 1.0;
  s.comm_exponent = 0.5;
  EXPECT_DOUBLE_EQ(compute_slowdown(s, 1), 1.0);
  EXPECT_DOUBLE_EQ(compute_slowdown(s, 4), 1.3);
  EXPECT_NEAR(compute_slowdown(s, 2), 1.1, 1e-12);  // 1 + 0.3 · (2−1)/(4−1)
  EXPECT_NEAR(compute_slowdown(s, 8), 2.6, 1e-12);  // 1.3 · 2
  EXPECT_DOUBLE_EQ(comm_slowdown(s, 4), 1.0);
  EXPECT_NEAR(comm_slowdown(s, 16), 2.0, 1e-12);  // 4^0.5
  s.threads_per_rank = 2;                         // 2 ranks of 2 threads fill 4 cores
  EXPECT_DOUBLE_EQ(compute_slowdown(s, 2), 1.3);
  CoreSharing none;
  EXPECT_DOUBLE_EQ(compute_slowdown(none, 64), 1.0);
}

TEST(CoreSharing, ProfileForRanksScalesKernelTimes) {
  HardwareProfile p = default_hardware_profile("cpu", false);
  p.peak_flops = 10e9;
  p.memory_bandwidth_bytes_per_s = 5e9;
  p.sharing.cores = 2;
  p.sharing.contention_at_full = 1.25;
  p.collectives.push_back({traces::CollOp::AllReduce, CollectiveScope::Any, 2, 10'000, 2e9, 0, {}});
  const HardwareProfile q = profile_for_ranks(p, 4);  // u = 2: 1.25 · 2 = 2.5
  const CostModel a(p, 1, 1), b(q, 1, 1);
  const Kernel gemm{OpClass::Gemm, 1e9, 1e6};
  const Kernel ln{OpClass::LayerNorm, 1e3, 1e8};
  EXPECT_NEAR(double(b.kernel_ns(gemm)), 2.5 * double(a.kernel_ns(gemm)), 2.0);
  EXPECT_NEAR(double(b.kernel_ns(ln)), 2.5 * double(a.kernel_ns(ln)), 2.0);
  EXPECT_EQ(q.collectives[0].latency_ns, 20'000);  // comm: u^1 = 2
  EXPECT_DOUBLE_EQ(q.collectives[0].bus_bandwidth_bytes_per_s, 1e9);
  EXPECT_EQ(profile_for_ranks(p, 2).classes[0].overhead_ns,
            std::llround(1.25 * p.classes[0].overhead_ns));
}

TEST(HardwareProfileYaml, ClusterSharingAndSizedOverridesRoundTrip) {
  HardwareProfile p = default_hardware_profile("cpu", false);
  p.name = "rt";
  p.peak_flops = 12e9;
  p.memory_bandwidth_bytes_per_s = 6e9;
  p.cluster.nodes = 1;
  p.cluster.ranks_per_node = 8;
  p.cluster.peak_flops = 12e9;
  p.cluster.link_bytes_per_s = 3e9;
  p.cluster.link_latency_ns = 4000;
  p.sharing.cores = 2;
  p.sharing.contention_at_full = 1.1;
  p.sharing.oversubscription_exponent = 0.9;
  p.collectives.push_back({traces::CollOp::AllReduce, CollectiveScope::Any, 4, 30'000, 2e9, 0, {}});
  p.collectives.push_back({traces::CollOp::AllReduce, CollectiveScope::Any, 0, 10'000, 4e9, 0, {}});
  const HardwareProfile q = parse_hardware_profile(to_yaml(p), "rt.yaml");
  EXPECT_EQ(q.cluster.ranks_per_node, 8);
  EXPECT_EQ(q.cluster.link_latency_ns, 4000);
  EXPECT_DOUBLE_EQ(q.cluster.link_bytes_per_s, 3e9);
  EXPECT_EQ(q.sharing.cores, 2);
  EXPECT_DOUBLE_EQ(q.sharing.oversubscription_exponent, 0.9);
  ASSERT_EQ(q.collectives.size(), 2u);
  // The sized override wins for groups of 4, the general one elsewhere.
  EXPECT_EQ(q.find_override(traces::CollOp::AllReduce, true, 4)->latency_ns, 30'000);
  EXPECT_EQ(q.find_override(traces::CollOp::AllReduce, true, 2)->latency_ns, 10'000);
  EXPECT_EQ(q.find_override(traces::CollOp::AllReduce, true)->latency_ns, 10'000);
  const Cluster c = cluster_from_profile(q, 4);
  EXPECT_EQ(c.num_gpus(), 4);
  EXPECT_DOUBLE_EQ(c.device.peak_fp32_flops, 12e9);
  EXPECT_THROW(cluster_from_profile(q, 9), InputError);
  EXPECT_THROW(cluster_from_profile(default_hardware_profile("cpu", false), 2), InputError);
  EXPECT_THROW(parse_hardware_profile("sharing: {cores: 2, typo: 1}\n", "bad.yaml"), InputError);
}

// ---- a whole calibration on generated traces with known costs (Truth, tiny and make_run:
// calibration_fixtures.hpp)

TEST(Calibrate, RecoversOpTimesSlowdownAndCollectiveCosts) {
  const Truth truth;
  std::vector<traces::Trace> runs;
  // Two shapes alone, and the same shapes on 2 ranks sharing 2 cores at 1.2x, with all-reduces of
  // 25 us + bytes / 3 GB/s.
  runs.push_back(make_run(tiny(1, 4, 64), truth, 1.0, 0, 1));
  runs.push_back(make_run(tiny(1, 2, 32), truth, 1.0, 0, 1));
  runs.push_back(make_run(tiny(2, 4, 64), truth, 1.2, 25'000, 3.0));
  CalibrationOptions opt;
  opt.cores = 2;
  opt.name = "test";
  const CalibrationResult r = calibrate(runs, opt);

  // Every op of the calibration shapes is reproduced by the fitted profile's cost model.
  ASSERT_FALSE(r.ops.empty());
  // (Within 3 %: the roofline's max() and the near-collinear FLOP columns of these small shapes keep
  // the non-negative fit from being exact; the maths itself is checked exactly above.)
  for (const auto& o : r.ops)
    EXPECT_NEAR(o.fitted_ns, o.measured_ns, 0.03 * o.measured_ns + 50) << o.name << " " << o.shape;
  EXPECT_LT(r.compute_rel_rms, 0.03);
  // The 2-rank run is 1.2x slower: contention at full = 1.2 (2 ranks on 2 cores).
  EXPECT_NEAR(r.profile.sharing.contention_at_full, 1.2, 1e-6);
  EXPECT_EQ(r.profile.sharing.cores, 2);
  // All-reduce over 2 ranks: 25 us and 3 GB/s, recovered exactly from the sizes.
  ASSERT_EQ(r.collectives.size(), 1u);
  EXPECT_NEAR(r.collectives[0].latency_ns, 25'000, 1.0);
  EXPECT_NEAR(r.collectives[0].busbw_bytes_per_s, 3e9, 3e9 * 1e-6);
  const auto* o2 = r.profile.find_override(traces::CollOp::AllReduce, true, 2);
  ASSERT_NE(o2, nullptr);
  EXPECT_EQ(o2->latency_ns, 25'000);
  // Four ranks: the per-step latency (25 us / 2 steps) times 6 ring steps.
  const auto* o4 = r.profile.find_override(traces::CollOp::AllReduce, true, 4);
  ASSERT_NE(o4, nullptr);
  EXPECT_NEAR(double(o4->latency_ns), 75'000, 1.0);
  // Data loading: 5 us per micro-batch (the host time of the serial run not covered by ops).
  EXPECT_NEAR(double(r.profile.data_load_ns), 5000, 1.0);
  // The machine: one node with the fitted peak; the YAML parses back to the same profile.
  EXPECT_EQ(r.profile.cluster.nodes, 1);
  const HardwareProfile back = parse_hardware_profile(calibrated_yaml(r), "calibrated.yaml");
  EXPECT_DOUBLE_EQ(back.sharing.contention_at_full, r.profile.sharing.contention_at_full);
  EXPECT_EQ(back.collectives.size(), r.profile.collectives.size());
  const CostModel c1(r.profile, r.profile.peak_flops, r.profile.memory_bandwidth_bytes_per_s);
  const CostModel c2(back, back.peak_flops, back.memory_bandwidth_bytes_per_s);
  const auto ks = head_forward_kernels(model_dims(tiny(1, 4, 64), 4));
  EXPECT_NEAR(double(c1.op_ns(ks)), double(c2.op_ns(ks)), 1e-4 * double(c1.op_ns(ks)) + 10);
}

TEST(Calibrate, WritesTheLoneRankMediansAsMeasuredOps) {
  const Truth truth;
  std::vector<traces::Trace> runs;
  runs.push_back(make_run(tiny(1, 4, 64), truth, 1.0, 0, 1));
  runs.push_back(make_run(tiny(2, 4, 64), truth, 1.2, 25'000, 3.0));
  CalibrationOptions opt;
  opt.cores = 2;
  const CalibrationResult r = calibrate(runs, opt);
  // One measured entry per op of the one shape, at its lone-rank time: the serial run's time, and the
  // 2-rank run's divided by its 1.2 slowdown, are the truth itself.
  const ModelDims d = model_dims(tiny(1, 4, 64), 4);
  int found = 0;
  for (const auto& m : r.profile.ops) {
    if (m.name == "adamw") continue;
    auto ks = op_kernels(m.name, m.piece, m.pieces, d);
    ASSERT_TRUE(ks.has_value()) << m.name;
    EXPECT_EQ(m.batch, 4);
    EXPECT_EQ(m.seq, 64);
    EXPECT_EQ(m.tp, 1);
    EXPECT_NEAR(double(m.time_ns), truth.op_ns(*ks), 2.0) << m.name;
    ++found;
  }
  EXPECT_EQ(found, 6);  // fwd/bwd of embed, block, head
  // The simulator's cost of those ops is then exactly the measurement, whatever the class fit says.
  const CostModel cost(r.profile, r.profile.peak_flops, r.profile.memory_bandwidth_bytes_per_s);
  EXPECT_NEAR(double(cost.named_op_ns("bwd.block", 0, 1, d)),
              truth.op_ns(*op_kernels("bwd.block", 0, 1, d)), 2.0);
  // --roofline-only: no measured ops.
  opt.measured_ops = false;
  EXPECT_TRUE(calibrate(runs, opt).profile.ops.empty());
}

TEST(CostModel, NamedOpsScaleTheNearestMeasurementByTheRooflineRatio) {
  HardwareProfile p = default_hardware_profile("cpu", false);
  for (auto& c : p.classes) c.overhead_ns = 0;  // times linear in FLOPs and bytes
  const CostModel roof(p, 10e9, 5e9);
  ModelDims d;
  d.batch = 8, d.seq = 128, d.d_model = 256, d.heads = 4, d.vocab = 8192, d.tp = 1, d.act_bytes = 4;
  const double t_full = double(roof.op_ns(*op_kernels("fwd.block", 0, 1, d)));
  // Measured: fwd.block at b8 tp1 took 3x the roofline; adamw over 1e6 parameters 7 ms.
  p.ops.push_back({"fwd.block", 0, 1, 8, 128, 256, 4, 8192, 1, 0, std::llround(3 * t_full)});
  p.ops.push_back({"adamw", 0, 1, 1, 1, 1, 1, 1, 1, 1e6, 7'000'000});
  const CostModel cost(p, 10e9, 5e9);
  // At the measured shape: the measurement.
  EXPECT_EQ(cost.named_op_ns("fwd.block", 0, 1, d), std::llround(3 * t_full));
  // Half the micro-batch: 3x the roofline of the smaller op (ratio of the two rooflines).
  ModelDims h = d;
  h.batch = 4;
  const double t_half = double(roof.op_ns(*op_kernels("fwd.block", 0, 1, h)));
  EXPECT_NEAR(double(cost.named_op_ns("fwd.block", 0, 1, h)), 3 * t_half, 2.0);
  // A tp piece scales from the whole block measured at tp 1.
  ModelDims t2 = d;
  t2.tp = 2;
  const double t_piece = double(roof.op_ns(*op_kernels("fwd.block", 1, 3, t2)));
  EXPECT_NEAR(double(cost.named_op_ns("fwd.block", 1, 3, t2)), 3 * t_piece, 2.0);
  // adamw: linear in the parameters (bytes only), so twice the parameters take twice the time.
  EXPECT_NEAR(double(cost.named_op_ns("adamw", 0, 1, d, 2e6)), 14'000'000, 2.0);
  // Ops without a measurement keep the roofline; unknown names are an error.
  EXPECT_EQ(cost.named_op_ns("fwd.head", 0, 1, d), roof.op_ns(*op_kernels("fwd.head", 0, 1, d)));
  EXPECT_THROW(cost.named_op_ns("fwd.nothing", 0, 1, d), InputError);
  // The nearest of two measurements is used: a b4 entry wins for b4.
  p.ops.push_back({"fwd.block", 0, 1, 4, 128, 256, 4, 8192, 1, 0, 1234567});
  const CostModel two(p, 10e9, 5e9);
  EXPECT_EQ(two.named_op_ns("fwd.block", 0, 1, h), 1234567);
  EXPECT_EQ(two.named_op_ns("fwd.block", 0, 1, d), std::llround(3 * t_full));
}

TEST(HardwareProfileYaml, MeasuredOpsRoundTripAndBadEntriesAreNamed) {
  HardwareProfile p = default_hardware_profile("cpu", false);
  p.ops.push_back({"fwd.block", 1, 3, 8, 128, 256, 4, 8192, 2, 0, 1'500'000});
  p.ops.push_back({"adamw", 0, 1, 1, 1, 1, 1, 1, 1, 5.25e6, 29'695'300});
  const HardwareProfile q = parse_hardware_profile(to_yaml(p), "ops.yaml");
  ASSERT_EQ(q.ops.size(), 2u);
  EXPECT_EQ(q.ops[0].name, "fwd.block");
  EXPECT_EQ(q.ops[0].piece, 1);
  EXPECT_EQ(q.ops[0].pieces, 3);
  EXPECT_EQ(q.ops[0].tp, 2);
  EXPECT_EQ(q.ops[0].batch, 8);
  EXPECT_EQ(q.ops[0].time_ns, 1'500'000);
  EXPECT_DOUBLE_EQ(q.ops[1].params, 5.25e6);
  EXPECT_EQ(q.ops[1].time_ns, 29'695'300);
  auto err = [](const std::string& y) {
    try {
      parse_hardware_profile(y, "bad.yaml");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err("ops: [{name: fwd.block, batch: 8}]").find("ops[].time_us"), std::string::npos);
  EXPECT_NE(err("ops: [{name: fwd.block, piece: 3, pieces: 3, time_us: 1}]").find("ops[].piece"),
            std::string::npos);
  EXPECT_NE(err("ops: [{name: fwd.block, batch: 0.5, time_us: 1}]").find("ops[].batch"),
            std::string::npos);
  EXPECT_NE(err("ops: [{name: fwd.block, colour: red, time_us: 1}]").find("unknown key"),
            std::string::npos);
  EXPECT_NE(err("ops: {name: x}").find("expected a list"), std::string::npos);
}

TEST(Calibrate, BadInput) {
  {
    // Options out of range are named (an ASan/UBSan session found them accepted silently).
    std::vector<traces::Trace> one;
    one.push_back(testing_fixtures::make_run(testing_fixtures::tiny(1, 4, 64),
                                             testing_fixtures::Truth{}, 1.0));
    for (auto [field, value, name] :
         {std::tuple{0, -1, "--cores"}, std::tuple{1, -2, "--threads"},
          std::tuple{2, -1, "--skip-steps"}, std::tuple{3, 0, "--ranks-per-node"}}) {
      CalibrationOptions bad;
      (field == 0   ? bad.cores
       : field == 1 ? bad.threads_per_rank
       : field == 2 ? bad.skip_steps
                    : bad.ranks_per_node) = value;
      try {
        calibrate(one, bad);
        ADD_FAILURE() << name << " " << value << " accepted";
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      }
    }
  }
  traces::Trace empty;
  empty.path = "x.db";
  EXPECT_THROW(calibrate({empty}), InputError);  // no scenario
  EXPECT_THROW(calibrate({}), InputError);
}

}  // namespace
}  // namespace orrery::sim
