// Host compute priced from measurements (hardware.hpp's HostComputeRates; issue 18 item 4): gradient
// compression's ddp.compress / ddp.decompress at a measured rate per unit of work, the emulated
// 16-bit formats' rounding at a measured rate per element rounded, and `orrery calibrate` fitting
// both exactly from synthetic runs with known rates.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "calibration_fixtures.hpp"
#include "orrery/model/compression.hpp"
#include "orrery/model/names.hpp"
#include "orrery/model/parameters.hpp"
#include "orrery/sim/workload.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim {
namespace {

using testing_fixtures::make_run;
using testing_fixtures::tiny;
using testing_fixtures::Truth;

CostModel cpu_cost(const HostComputeRates& host) {
  HardwareProfile p = default_hardware_profile("cpu", false);
  p.host = host;
  const Device d = *device_preset("cpu");
  return CostModel(p, d.peak_fp32_flops, d.mem_bandwidth_bytes_per_s);
}

// The ddp.compress / ddp.decompress durations of step 1 (after no warm-up), in op order.
std::map<std::string, std::vector<int64_t>> compression_ops(const Workload& w) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& op : w.stages[0].ops) {
    const std::string& n = w.names[op.name];
    if (op.step == 1 && (n == names::kDpCompress || n == names::kDpDecompress))
      out[n].push_back(op.duration_ns);
  }
  return out;
}

Scenario compressed(const char* scheme) {
  Scenario s = testing::small_scenario(4, 2, 1, 1, 2);
  s.runtime.device = "cpu";
  s.parallel.bucket_mb = 1e-9;  // every segment a bucket
  s.parallel.grad_compression = scheme;
  s.compression.powersgd_rank = 4;
  s.compression.topk_ratio = 0.01;
  return s;
}

TEST(HostCompute, Int8AndTopkCostTheirRatePerElement) {
  for (const char* scheme : {"int8", "topk"}) {
    const Scenario s = compressed(scheme);
    HostComputeRates host;
    host.compression[scheme] = CompressionRate{2.5, 0.75};
    WorkloadOptions opt;
    opt.steps = 2;
    const Workload w = build_workload(s, cpu_cost(host), opt);
    const auto ops = compression_ops(w);
    const std::vector<int64_t>& buckets = w.stages[0].bucket_params;
    ASSERT_EQ(ops.at(std::string(names::kDpCompress)).size(), buckets.size()) << scheme;
    ASSERT_EQ(ops.at(std::string(names::kDpDecompress)).size(), buckets.size()) << scheme;
    const bool int8 = std::string(scheme) == "int8";
    for (size_t b = 0; b < buckets.size(); ++b) {
      const double n = double(buckets[b]);
      // compress: 2.5 ns per gradient element; decompress: 0.75 ns per element gathered (int8:
      // n x dp) or per element of the bucket (top-k).
      EXPECT_EQ(ops.at(std::string(names::kDpCompress))[b], std::llround(2.5 * n)) << scheme;
      EXPECT_EQ(ops.at(std::string(names::kDpDecompress))[b],
                std::llround(0.75 * n * (int8 ? 2.0 : 1.0)))
          << scheme;
    }
  }
}

TEST(HostCompute, PowerSgdCostsItsRatePerFlopOfItsProducts) {
  const Scenario s = compressed("powersgd");
  HostComputeRates host;
  host.compression["powersgd"] = CompressionRate{0.5, 3.0};
  WorkloadOptions opt;
  opt.steps = 2;
  const Workload w = build_workload(s, cpu_cost(host), opt);
  const auto ops = compression_ops(w);
  // Per matrix (rows x cols, rank r = min(4, rows, cols)): P = M Q, Q = M^T P and P Q^T, 2 m n r
  // FLOPs each, and the orthonormalisation's 2 m r^2; the plain entries copied back.
  double flops = 0, plain = 0;
  for (const auto& p :
       model::parameter_tensors(model::model_shape(s), model::stage_contents(s, 0))) {
    const size_t m = size_t(p.rows), n = size_t(p.cols);
    if (!model::powersgd_compresses(m, n, 4)) {
      plain += double(p.count());
      continue;
    }
    const double r = double(model::powersgd_effective_rank(m, n, 4));
    flops += 6.0 * double(m) * double(n) * r + 2.0 * double(m) * r * r;
  }
  ASSERT_GT(flops, 0);
  ASSERT_GT(plain, 0);
  int64_t compress = 0, decompress = 0;
  for (int64_t t : ops.at(std::string(names::kDpCompress))) compress += t;
  for (int64_t t : ops.at(std::string(names::kDpDecompress))) decompress += t;
  // Each op rounded to whole ns: within half a ns per op of the closed form.
  EXPECT_NEAR(double(compress), 0.5 * flops,
              0.5 * double(ops.at(std::string(names::kDpCompress)).size()));
  EXPECT_NEAR(double(decompress), 3.0 * plain,
              0.5 * double(ops.at(std::string(names::kDpDecompress)).size()));
}

TEST(HostCompute, WithoutAMeasuredRateTheRooflineEstimateStays) {
  // A rate for int8 only: top-k's compress is its roofline pass (4 FLOPs and 24 bytes per element).
  const Scenario s = compressed("topk");
  HostComputeRates host;
  host.compression["int8"] = CompressionRate{2.5, 0.75};
  const CostModel cost = cpu_cost(host);
  WorkloadOptions opt;
  opt.steps = 2;
  const Workload w = build_workload(s, cost, opt);
  const auto ops = compression_ops(w);
  const std::vector<int64_t>& buckets = w.stages[0].bucket_params;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const double n = double(buckets[b]);
    EXPECT_EQ(ops.at(std::string(names::kDpCompress))[b],
              cost.op_ns({Kernel{OpClass::Elementwise, 4.0 * n, 24.0 * n}}));
  }
  EXPECT_EQ(cost.compression_rate("topk", false), 0.0);
  EXPECT_EQ(cost.compression_rate("int8", true), 0.75);
}

TEST(HostCompute, RoundingCostsItsRatePerElementOnTopOfFp32) {
  Scenario s = testing::small_scenario(4, 1, 1, 1, 1);
  s.runtime.device = "cpu";
  s.runtime.precision = "fp16";
  HostComputeRates host;
  host.rounding_ns["fp16"] = 3.0;
  const CostModel cost = cpu_cost(host);
  const ModelDims d = model_dims(s, 4);
  ASSERT_TRUE(d.emulated_16bit);
  ASSERT_EQ(d.emulated_format, Precision::FP16);
  ModelDims fp32 = d;
  fp32.emulated_16bit = false;
  // A block's forward rounds m(7C) + 12C^2 + m(9C) elements (test_cpu_16bit.cpp).
  const double m = double(s.training.micro_batch) * s.model.seq, C = s.model.d_model;
  const double elements = 16.0 * m * C + 12.0 * C * C;
  EXPECT_DOUBLE_EQ(rounded_elements(*op_kernels(names::kBlockForward, 0, 1, fp32)), elements);
  EXPECT_EQ(cost.named_op_ns(names::kBlockForward, 0, 1, d),
            cost.named_op_ns(names::kBlockForward, 0, 1, fp32) + std::llround(3.0 * elements));
  // bf16 has no measured rate here: its rounding passes stay priced by the roofline.
  s.runtime.precision = "bf16";
  const ModelDims b = model_dims(s, 4);
  EXPECT_EQ(cost.named_op_ns(names::kBlockForward, 0, 1, b),
            cost.op_ns(*op_kernels(names::kBlockForward, 0, 1, b)));
}

TEST(HostCompute, ProfileYamlRoundTripsAndBadRatesAreNamed) {
  HardwareProfile p = default_hardware_profile("cpu", false);
  p.host.compression["topk"] = CompressionRate{14.5, 1.25};
  p.host.rounding_ns["bf16"] = 0.75;
  const HardwareProfile back = parse_hardware_profile(to_yaml(p), "p.yaml");
  EXPECT_DOUBLE_EQ(back.host.compression.at("topk").compress_ns, 14.5);
  EXPECT_DOUBLE_EQ(back.host.compression.at("topk").decompress_ns, 1.25);
  EXPECT_DOUBLE_EQ(back.host.rounding_ns.at("bf16"), 0.75);
  const std::string base = "name: x\ndevice: cpu\n";
  EXPECT_NE(testing_fixtures::parse_error(base + "compression: {zip: {compress_ns: 1}}\n")
                .find("compression.zip"),
            std::string::npos);
  EXPECT_NE(testing_fixtures::parse_error(base + "compression: {int8: {compress_ns: -1}}\n")
                .find("compression.int8.compress_ns"),
            std::string::npos);
  EXPECT_NE(testing_fixtures::parse_error(base + "rounding: {fp8: 1}\n").find("rounding.fp8"),
            std::string::npos);
}

// A dp2 run with int8 compression (the fixture's ops at slowdown 1.5, busier than the plain dp2
// run's 1.2: it must not move the sharing law) whose counted steps each hold one ddp.compress and
// one ddp.decompress span per rank, of the known rates times the step's units (every parameter
// compressed; n x dp gathered) times the slowdown, placed where no collective is in flight.
traces::Trace int8_run(double compress_ns, double decompress_ns) {
  Scenario s = tiny(2);
  s.parallel.grad_compression = "int8";
  traces::Trace t = make_run(s, Truth{}, 1.5, 40'000, 2.0);
  t.path = "run-dp2-int8.db";
  int64_t params = 0;
  for (const auto& p : stage_parameters(s, 0)) params += p.count;
  const auto c = t.strings.intern(std::string(names::kDpCompress));
  const auto dc = t.strings.intern(std::string(names::kDpDecompress));
  int64_t at = 0;
  for (const auto& sp : t.spans) at = std::max(at, sp.end_ns);
  for (int step = 0; step < 4; ++step)
    for (int r = 0; r < 2; ++r)
      for (const auto& [name, ns] : {std::pair{c, compress_ns * double(params)},
                                     std::pair{dc, decompress_ns * 2.0 * params}}) {
        traces::Span sp;
        sp.rank = r, sp.stream = 0, sp.kind = traces::SpanKind::Compute, sp.name = name;
        sp.step = step, sp.micro_batch = 0, sp.layer = -1;
        sp.start_ns = at + 1'000'000;
        sp.end_ns = sp.start_ns + std::llround(ns * 1.5);
        at = sp.end_ns;
        t.spans.push_back(sp);
      }
  return t;
}

// A serial run at fp16: the fixture's fp32 ops, each GEMM op longer by rate x its rounded elements.
traces::Trace fp16_run(double rate) {
  const Scenario fp32 = tiny(1);
  Scenario s = fp32;
  s.runtime.precision = "fp16";
  traces::Trace t = make_run(fp32, Truth{}, 1.0);
  t.meta.scenario_text = to_yaml(s);
  t.path = "run-fp16.db";
  const ModelDims d = model_dims(fp32, 4);
  for (auto& sp : t.spans) {
    const std::string& n = t.name_of(sp);
    if (sp.kind != traces::SpanKind::Compute) continue;
    const auto ks = op_kernels(n, 0, 1, d);
    if (ks) sp.end_ns += std::llround(rate * rounded_elements(*ks));
  }
  return t;
}

TEST(Calibrate, FitsCompressionAndRoundingRatesExactly) {
  const Truth truth;
  std::vector<traces::Trace> runs;
  runs.push_back(make_run(tiny(1), truth, 1.0));
  runs.push_back(make_run(tiny(2), truth, 1.2));
  runs.push_back(int8_run(3.5, 0.8));
  runs.push_back(fp16_run(2.25));
  CalibrationOptions opt;
  opt.cores = 2;
  const CalibrationResult r = calibrate(runs, opt);
  ASSERT_EQ(r.profile.host.compression.count("int8"), 1u);
  const CompressionRate& c = r.profile.host.compression.at("int8");
  // Span times are whole ns: within 1e-6 relative.
  EXPECT_NEAR(c.compress_ns, 3.5, 3.5e-6);
  EXPECT_NEAR(c.decompress_ns, 0.8, 0.8e-6);
  ASSERT_EQ(r.profile.host.rounding_ns.count("fp16"), 1u);
  EXPECT_NEAR(r.profile.host.rounding_ns.at("fp16"), 2.25, 2.25e-6);
  // The int8 and fp16 runs change nothing of the fp32 fit: the same profile as without them.
  EXPECT_NEAR(r.profile.sharing.contention_at_full, 1.2, 1e-6);
  const CalibrationResult base = calibrate({runs[0], runs[1]}, opt);
  EXPECT_EQ(base.profile.sharing.contention_at_full, r.profile.sharing.contention_at_full);
  EXPECT_EQ(base.profile.peak_flops, r.profile.peak_flops);
  EXPECT_EQ(base.profile.memory_bandwidth_bytes_per_s, r.profile.memory_bandwidth_bytes_per_s);
  EXPECT_EQ(base.profile.op_jitter, r.profile.op_jitter);
  EXPECT_EQ(base.profile.rank_jitter, r.profile.rank_jitter);
  ASSERT_EQ(base.profile.ops.size(), r.profile.ops.size());
  for (size_t i = 0; i < base.profile.ops.size(); ++i)
    EXPECT_EQ(base.profile.ops[i].time_ns, r.profile.ops[i].time_ns) << base.profile.ops[i].name;
  ASSERT_EQ(base.profile.collectives.size(), r.profile.collectives.size());
  for (size_t i = 0; i < base.profile.collectives.size(); ++i)
    EXPECT_EQ(base.profile.collectives[i].latency_ns, r.profile.collectives[i].latency_ns);
  // The schemes and formats without a run fall back to the roofline, and say so.
  int fallbacks = 0;
  for (const auto& n : r.notes)
    fallbacks += (n.find("no run with grad_compression topk") != std::string::npos) +
                 (n.find("no run with grad_compression powersgd") != std::string::npos) +
                 (n.find("rounding: no bf16 run") != std::string::npos);
  EXPECT_EQ(fallbacks, 3);
  EXPECT_EQ(r.profile.host.compression.count("topk"), 0u);
  EXPECT_EQ(r.profile.host.rounding_ns.count("bf16"), 0u);
}

}  // namespace
}  // namespace orrery::sim
