// Calibration from GPU traces (sim/calibrate.hpp step 5, traces/kernel_work.hpp): a Kineto trace
// of one H100 whose kernel durations come from a known profile
// (tests/data/calibrate/make_kineto_h100_fixture.py: gemm ceiling 0.80 under the H100 gemm_shape
// model, attention 0.62, elementwise 0.90, layernorm 0.75, softmax_loss 0.70, optimizer 0.78 of
// HBM bandwidth, 4.5 us per kernel) must give that profile back; a trace without shapes fits
// nothing and says so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "calibration_fixtures.hpp"
#include "orrery/common/error.hpp"
#include "orrery/sim/calibrate.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/cost_model.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/traces/import.hpp"
#include "orrery/traces/kernel_work.hpp"

namespace orrery::sim {
namespace {

const std::string kData = std::string(ORRERY_SOURCE_DIR) + "/tests/data/calibrate/";

traces::Trace load(const std::string& name) {
  traces::Trace t = traces::import_kineto({kData + name});
  t.path = name;
  return t;
}

const GpuFitRow& row(const CalibrationResult& r, const std::string& param) {
  for (const auto& g : r.gpu)
    if (g.parameter == param) return g;
  throw std::runtime_error("no row " + param);
}

// The relative error of the fit for the operator rows whose shape starts with `shape`.
double worst_error_pct(const CalibrationResult& r, const std::string& shape) {
  double worst = -1;
  for (const auto& o : r.ops)
    if (o.shape.rfind(shape, 0) == 0) worst = std::max(worst, std::fabs(o.error_pct()));
  return worst;
}

TEST(KernelWork, ImporterKeepsEachKernelsShareOfItsOpsWork) {
  const traces::Trace t = load("kineto_h100_calib.json");
  const auto rows = traces::read_kernel_work(t);
  // 36 ops, of which the split-K product launches 2 kernels and the fused AdamW 3: 39 kernels.
  ASSERT_EQ(rows.size(), 39u);
  std::map<int64_t, int> per_group;
  for (const auto& k : rows) per_group[k.group] += 1;
  EXPECT_EQ(per_group.size(), 36u);
  // Each row names a kernel span of the trace carrying 1/n of its op's FLOPs and bytes.
  double gemm_flops = 0;
  for (const auto& k : rows) {
    const auto it = std::find_if(t.spans.begin(), t.spans.end(), [&](const traces::Span& s) {
      return s.rank == k.rank && s.stream == k.stream && s.start_ns == k.start_ns &&
             s.end_ns == k.end_ns;
    });
    ASSERT_NE(it, t.spans.end());
    EXPECT_DOUBLE_EQ(it->flops, k.work.flops / per_group[k.group]);
    if (k.work.cls == "gemm") gemm_flops += it->flops;
  }
  // The GEMMs' FLOPs, 2·M·N·K each, summed over the fixture's products.
  const double expect =
      2.0 * (8192.0 * 8192 * 8192 + 3 * 4096.0 * 4096 * 4096 + 2048.0 * 4608 * 12288 +
             2048.0 * 12288 * 1536 + 2 * 1024.0 * 1024 * 1024 + 2 * 16896.0 * 512 * 8192 +
             2 * 16896.0 * 520 * 8192 + 8 * 1024.0 * 1024 * 2048 + 2048.0 * 1024 * 1024 +
             16.0 * 4096 * 4096 + 2 * 256.0 * 256 * 256 + 512.0 * 512 * 8192);
  EXPECT_NEAR(gemm_flops / expect, 1.0, 1e-12);
  EXPECT_EQ(traces::recorded_gpu_names(t).front(), "NVIDIA H100 80GB HBM3");
}

TEST(KernelWork, OperatorRules) {
  using K = traces::OpInput::Kind;
  auto tensor = [](std::vector<int64_t> d, std::string type = "c10::BFloat16") {
    traces::OpInput x;
    x.kind = K::Tensor;
    x.dims = std::move(d);
    x.type = std::move(type);
    return x;
  };
  const auto mm = traces::op_work("aten::mm", {tensor({64, 128}), tensor({128, 32})});
  ASSERT_TRUE(mm);
  EXPECT_EQ(mm->cls, "gemm");
  EXPECT_DOUBLE_EQ(mm->flops, 2.0 * 64 * 32 * 128);
  EXPECT_DOUBLE_EQ(mm->bytes, 2.0 * (64 * 128 + 128 * 32 + 64 * 32));
  // K differs between the operands: not a product the rule knows.
  EXPECT_FALSE(traces::op_work("aten::mm", {tensor({64, 128}), tensor({127, 32})}));
  const auto lin = traces::op_work("aten::linear", {tensor({4, 8, 128}), tensor({32, 128})});
  ASSERT_TRUE(lin);
  EXPECT_DOUBLE_EQ(lin->m, 32);
  EXPECT_DOUBLE_EQ(lin->n, 32);
  // fp32 operands: 4 bytes each.
  EXPECT_EQ(
      traces::op_work("aten::mm", {tensor({2, 2}, "float"), tensor({2, 2}, "float")})->elem_bytes,
      4);
  // Attention: causal counts half the scores (the simulator's counting), backward twice.
  std::vector<traces::OpInput> sdpa = {
      tensor({2, 4, 256, 64}), tensor({2, 4, 256, 64}), tensor({2, 4, 256, 64}), {}, {}, {}, {}};
  sdpa[4].concrete = "True";
  const auto causal = traces::op_work("aten::_scaled_dot_product_flash_attention", sdpa);
  sdpa[4].concrete = "False";
  const auto full = traces::op_work("aten::_scaled_dot_product_flash_attention", sdpa);
  ASSERT_TRUE(causal && full);
  EXPECT_DOUBLE_EQ(causal->flops, 2.0 * 2 * 4 * 256 * 256 * 64);
  EXPECT_DOUBLE_EQ(full->flops, 2 * causal->flops);
  // The op that launches the kernel in PyTorch 2.x takes [B, T, H, D]: the same work.
  std::vector<traces::OpInput> inner = {tensor({2, 256, 4, 64}),
                                        tensor({2, 256, 4, 64}),
                                        tensor({2, 256, 4, 64}),
                                        {},
                                        {},
                                        {},
                                        {},
                                        {},
                                        {}};
  inner[8].concrete = "True";
  const auto fa = traces::op_work("aten::_flash_attention_forward", inner);
  ASSERT_TRUE(fa);
  EXPECT_DOUBLE_EQ(fa->flops, causal->flops);
  EXPECT_DOUBLE_EQ(fa->bytes, causal->bytes);
  EXPECT_FALSE(traces::op_work("aten::conv2d", {tensor({1, 3, 8, 8}), tensor({4, 3, 3, 3})}));
}

TEST(CalibrateGpu, RecoversTheProfileTheKernelsWereGeneratedFrom) {
  CalibrationOptions opt;
  opt.name = "h100-test";
  const CalibrationResult r = calibrate({load("kineto_h100_calib.json")}, opt);
  const HardwareProfile& p = r.profile;
  EXPECT_EQ(p.device, "H100-SXM");
  EXPECT_EQ(p.precision, Precision::BF16);
  // Within 0.5 % of the generating profile (the durations are whole nanoseconds).
  const double tol = 0.005;
  EXPECT_NEAR(p.cost(OpClass::Gemm).flops_efficiency / 0.80, 1.0, tol);
  EXPECT_NEAR(p.cost(OpClass::Attention).flops_efficiency / 0.62, 1.0, tol);
  EXPECT_NEAR(p.cost(OpClass::Elementwise).bandwidth_efficiency / 0.90, 1.0, tol);
  EXPECT_NEAR(p.cost(OpClass::LayerNorm).bandwidth_efficiency / 0.75, 1.0, tol);
  EXPECT_NEAR(p.cost(OpClass::SoftmaxLoss).bandwidth_efficiency / 0.70, 1.0, tol);
  EXPECT_NEAR(p.cost(OpClass::Optimizer).bandwidth_efficiency / 0.78, 1.0, tol);
  for (const auto& c : p.classes) EXPECT_NEAR(double(c.overhead_ns) / 4500.0, 1.0, 0.01);
  // The main loop's iteration latency the GEMMs were generated with (the preset's is 64).
  EXPECT_NEAR(p.gemm_shape.iteration_latency_cycles / 96.0, 1.0, 0.01);
  for (const auto& g : r.gpu) {
    EXPECT_TRUE(g.fitted) << g.parameter;
    EXPECT_GT(g.kernels, 0) << g.parameter;
    ASSERT_EQ(g.traces.size(), 1u);
    EXPECT_EQ(g.traces.front(), "kineto_h100_calib.json");
  }
  // 18 products in 19 kernels, less the memory-bound 16 x 4096 x 4096 (its time is its bytes').
  EXPECT_EQ(row(r, "gemm.flops_efficiency").kernels, 18);
  EXPECT_EQ(row(r, "gemm_shape.iteration_latency_cycles").kernels, 18);
  EXPECT_EQ(row(r, "optimizer.bandwidth_efficiency").kernels, 4);  // AdamW's 3 and foreach's 1
  EXPECT_LT(r.compute_rel_rms, 0.001);
  // The YAML carries the fitted numbers, and says where each came from.
  const std::string yaml = calibrated_yaml(r);
  EXPECT_NE(yaml.find("# fit: gemm.flops_efficiency"), std::string::npos);
  EXPECT_NE(yaml.find("from 18 kernels of kineto_h100_calib.json"), std::string::npos);
  const HardwareProfile back = parse_hardware_profile(yaml, "calibrated.yaml");
  EXPECT_NEAR(back.cost(OpClass::Gemm).flops_efficiency, p.cost(OpClass::Gemm).flops_efficiency,
              1e-3);
  EXPECT_TRUE(back.gemm_shape.enabled());
}

// The third wave: 16896 x 520 x 8192 needs a third wave of 128 x 256 tiles where 16896 x 512 x
// 8192 fills two, so it takes about 1.5x as long for 1.6 % more FLOPs. Only the shape model tells
// the two apart: with one flat GEMM rate the fit cannot price both.
TEST(CalibrateGpu, TheThirdWaveIsFittedOnlyWithTheShapeModel) {
  const traces::Trace t = load("kineto_h100_calib.json");
  CalibrationOptions opt;
  const CalibrationResult shaped = calibrate({t}, opt);
  opt.flat_gemm = true;
  const CalibrationResult flat = calibrate({t}, opt);
  double t512 = 0, t520 = 0;
  for (const auto& o : shaped.ops) {
    if (o.shape == "16896x512x8192 e2") t512 = o.measured_ns;
    if (o.shape == "16896x520x8192 e2") t520 = o.measured_ns;
  }
  ASSERT_GT(t512, 0);
  EXPECT_GT(t520 / t512, 1.4);
  EXPECT_LT(worst_error_pct(shaped, "16896x5"), 0.5);
  EXPECT_GT(worst_error_pct(flat, "16896x5"), 15.0);
  // The flat fit's "ceiling" is no longer the 0.80 the kernels were generated with.
  EXPECT_GT(std::fabs(flat.profile.cost(OpClass::Gemm).flops_efficiency / 0.80 - 1.0), 0.05);
  EXPECT_FALSE(flat.profile.gemm_shape.enabled());
}

TEST(CalibrateGpu, ATraceWithoutShapesKeepsTheDefaultsAndSaysWhich) {
  const CalibrationResult r = calibrate({load("kineto_h100_noshapes.json")}, {});
  const HardwareProfile def = default_hardware_profile("H100-SXM", true);
  // The overhead, six class rates, the GEMMs' bandwidth and kernel latency, the iteration latency
  // and the L2 operand rate.
  ASSERT_EQ(r.gpu.size(), 11u);
  for (const auto& g : r.gpu) {
    EXPECT_FALSE(g.fitted) << g.parameter;
    EXPECT_FALSE(g.why.empty()) << g.parameter;
    bool noted = false;
    for (const auto& n : r.notes)
      noted = noted || (n.rfind(g.parameter + " not fitted", 0) == 0 &&
                        n.find("kept the H100-SXM default") != std::string::npos);
    EXPECT_TRUE(noted) << g.parameter;
  }
  EXPECT_EQ(r.profile.gemm_shape.iteration_latency_cycles, def.gemm_shape.iteration_latency_cycles);
  for (int c = 0; c < kOpClassCount; ++c) {
    EXPECT_EQ(r.profile.classes[c].flops_efficiency, def.classes[c].flops_efficiency);
    EXPECT_EQ(r.profile.classes[c].bandwidth_efficiency, def.classes[c].bandwidth_efficiency);
    EXPECT_EQ(r.profile.classes[c].overhead_ns, def.classes[c].overhead_ns);
  }
  bool why = false;
  for (const auto& n : r.notes) why = why || n.find("record_shapes=True") != std::string::npos;
  EXPECT_TRUE(why);
  EXPECT_NE(calibrated_yaml(r).find("NOT FITTED"), std::string::npos);
}

// An fp32 PyTorch job on an A100 (deviceProperties) whose three GEMMs ran on kernels named
// `kernel`: one per op, each op [1000 i, 1000 i + 500) us launching at 1000 i + 100 us.
std::string fp32_gemm_job(const std::string& kernel) {
  std::string ev;
  const int dims[3][3] = {{1024, 1024, 1024}, {2048, 1024, 4096}, {4096, 4096, 1024}};
  for (int i = 0; i < 3; ++i) {
    const std::string m = std::to_string(dims[i][0]), n = std::to_string(dims[i][1]),
                      k = std::to_string(dims[i][2]), ts = std::to_string(1000 * (i + 1)),
                      c = std::to_string(50 + i);
    ev += R"({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": )" + ts +
          R"(, "dur": 500, "args": {"External id": )" + std::to_string(i + 1) +
          R"(, "Input Dims": [[)" + m + ", " + k + "], [" + k + ", " + n +
          R"(]], "Input type": ["float", "float"]}},)";
    ev +=
        R"({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": )" +
        std::to_string(1000 * (i + 1) + 100) + R"(, "dur": 5, "args": {"External id": )" +
        std::to_string(i + 1) + R"(, "correlation": )" + c + "}},";
    ev += R"({"ph": "X", "cat": "kernel", "name": ")" + kernel +
          R"(", "pid": 0, "tid": 7, "ts": )" + std::to_string(1000 * (i + 1) + 200) +
          R"(, "dur": )" + std::to_string(100 * (i + 1)) +
          R"(, "args": {"device": 0, "stream": 7, "correlation": )" + c + "}}" + (i < 2 ? "," : "");
  }
  return R"({"deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}], "traceEvents": [)" +
         ev + "]}";
}

// fp32 operands on tensor-core kernels are a TF32 job, fitted against the TF32 peak; on CUDA-core
// kernels (sgemm) an fp32 one.
TEST(CalibrateGpu, Fp32OperandsOnTensorCoreKernelsAreTf32) {
  const auto run = [](const std::string& kernel) {
    return calibrate({traces::import_kineto_texts({fp32_gemm_job(kernel)}, {"job.json"})}, {});
  };
  const auto noted = [](const CalibrationResult& r) {
    for (const auto& n : r.notes)
      if (n.find("TF32 tensor-core kernels") != std::string::npos) return true;
    return false;
  };
  const CalibrationResult tc =
      run("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>");
  EXPECT_EQ(tc.profile.device, "A100-SXM-80GB");
  EXPECT_EQ(tc.profile.precision, Precision::TF32);
  EXPECT_TRUE(noted(tc));
  const CalibrationResult simt = run("ampere_sgemm_128x64_nn");
  EXPECT_EQ(simt.profile.precision, Precision::FP32);
  EXPECT_FALSE(noted(simt));
  for (const char* name :
       {"ampere_tf32_s1688gemm_tf32_128x128_32x3", "sm80_xmma_gemm_tf32f32_tf32f32_f32_tn_n",
        "volta_h884gemm_64x64_ldg8_nn hmma"})
    EXPECT_TRUE(traces::tf32_tensor_core_kernel(name)) << name;
  for (const char* name : {"volta_sgemm_32x128_tt", "ampere_sgemm_128x64_nn", "gemv2T_kernel_val"})
    EXPECT_FALSE(traces::tf32_tensor_core_kernel(name)) << name;
}

// A PyTorch job on an A100 whose GEMMs' kernel times are what the cost model itself gives under a
// known profile: the preset's shape model (the L2 term, split-K with its reduction) with a main-loop
// iteration latency of 300 cycles, the GEMM ceiling 0.7 of the TF32 peak and 5 us per kernel. fp32
// operands on tensor-core kernels (TF32). Shapes from large to skinny and small, so that the
// latency (a share of each iteration that grows as the tile's MMAs shrink) is told from the ceiling.
struct GemmShapeCase {
  int64_t m, n, k;
};
const GemmShapeCase kLatencyShapes[] = {{4096, 4096, 4096}, {2048, 8192, 1024}, {1024, 1024, 1024},
                                        {512, 512, 8192},   {64, 4096, 4096},   {4096, 64, 2048},
                                        {256, 256, 256},    {128, 128, 65536},  {2048, 2048, 128},
                                        {8192, 256, 512},   {96, 8192, 1024},   {1024, 96, 512}};

HardwareProfile latency_truth() {
  HardwareProfile p = default_hardware_profile("A100-SXM-80GB", true);
  p.precision = Precision::TF32;
  p.gemm_shape.iteration_latency_cycles = 300;
  p.classes[static_cast<int>(OpClass::Gemm)].flops_efficiency = 0.7;
  for (auto& c : p.classes) c.overhead_ns = 5000;
  return p;
}

// `reduced`: every third op launches a second kernel after its GEMM (a split-K reduction), of
// the per-kernel overhead's length, as the cost model prices a second launch.
std::string model_priced_job(const HardwareProfile& truth,
                             const std::vector<GemmShapeCase>& shapes = {std::begin(kLatencyShapes),
                                                                         std::end(kLatencyShapes)},
                             bool reduced = false) {
  const Device a100 = *device_preset("A100-SXM-80GB");
  const CostModel cm(truth, a100.peak_flops(Precision::TF32), a100.mem_bandwidth_bytes_per_s);
  std::string ev;
  int i = 0;
  for (const auto& s : shapes) {
    Kernel k{OpClass::Gemm, 2.0 * s.m * s.n * s.k, 4.0 * (s.m * s.k + s.k * s.n + s.m * s.n)};
    k.gm = double(s.m), k.gn = double(s.n), k.gk = double(s.k), k.elem_bytes = 4;
    const double dur_us = double(cm.kernel_ns(k)) / 1000.0;
    const std::string ts = std::to_string(10000 * (i + 1)), id = std::to_string(i + 1),
                      c = std::to_string(100 + i);
    char dur[32];
    std::snprintf(dur, sizeof dur, "%.3f", dur_us);
    ev += std::string(i ? "," : "") +
          R"({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": )" + ts +
          R"(, "dur": 5000, "args": {"External id": )" + id + R"(, "Input Dims": [[)" +
          std::to_string(s.m) + ", " + std::to_string(s.k) + "], [" + std::to_string(s.k) + ", " +
          std::to_string(s.n) + R"(]], "Input type": ["float", "float"]}},)";
    ev += R"({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, )"
          R"("ts": )" +
          std::to_string(10000 * (i + 1) + 100) + R"(, "dur": 5, "args": {"External id": )" + id +
          R"(, "correlation": )" + c + "}},";
    ev += R"({"ph": "X", "cat": "kernel", "name": "sm80_xmma_gemm_tf32f32_tf32f32_f32_nn", )"
          R"("pid": 0, "tid": 7, "ts": )" +
          std::to_string(10000 * (i + 1) + 200) + R"(, "dur": )" + dur +
          R"(, "args": {"device": 0, "stream": 7, "correlation": )" + c + "}}";
    if (reduced && i % 3 == 0) {
      const std::string c2 = std::to_string(5000 + i);
      ev += R"(,{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, )"
            R"("tid": 1, "ts": )" +
            std::to_string(10000 * (i + 1) + 150) + R"(, "dur": 5, "args": {"External id": )" + id +
            R"(, "correlation": )" + c2 + "}}";
      ev += R"(,{"ph": "X", "cat": "kernel", "name": "splitKreduce_kernel", "pid": 0, "tid": 7, )"
            R"("ts": )" +
            std::to_string(10000 * (i + 1) + 9000) + R"(, "dur": )" +
            std::to_string(double(truth.classes[0].overhead_ns) / 1000.0) +
            R"(, "args": {"device": 0, "stream": 7, "correlation": )" + c2 + "}}";
    }
    ++i;
  }
  return R"({"deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}], "traceEvents": [)" +
         ev + "]}";
}

TEST(CalibrateGpu, RecoversTheIterationLatencyOfKernelsTheModelPriced) {
  const HardwareProfile truth = latency_truth();
  const CalibrationResult r =
      calibrate({traces::import_kineto_texts({model_priced_job(truth)}, {"job.json"})}, {});
  const HardwareProfile& p = r.profile;
  EXPECT_EQ(p.precision, Precision::TF32);
  // Exact but for the kernel times' whole nanoseconds.
  EXPECT_NEAR(p.gemm_shape.iteration_latency_cycles / 300.0, 1.0, 0.005);
  EXPECT_NEAR(p.cost(OpClass::Gemm).flops_efficiency / 0.7, 1.0, 0.005);
  EXPECT_NEAR(double(p.classes[0].overhead_ns) / 5000.0, 1.0, 0.005);
  EXPECT_TRUE(row(r, "gemm_shape.iteration_latency_cycles").fitted);
  // 12 products, less 128 x 128 x 65536: split 108 ways it is on its bytes' side.
  EXPECT_EQ(row(r, "gemm_shape.iteration_latency_cycles").kernels, 11);
  EXPECT_LT(r.compute_rel_rms, 0.001);
  // The fitted latency goes into the profile's YAML.
  const HardwareProfile back = parse_hardware_profile(calibrated_yaml(r), "calibrated.yaml");
  EXPECT_NEAR(back.gemm_shape.iteration_latency_cycles, p.gemm_shape.iteration_latency_cycles,
              1e-3 * p.gemm_shape.iteration_latency_cycles);
  // Without the shape model (--flat-gemm) the latency is not fitted, and the notes say why.
  CalibrationOptions flat;
  flat.flat_gemm = true;
  const CalibrationResult f =
      calibrate({traces::import_kineto_texts({model_priced_job(truth)}, {"job.json"})}, flat);
  EXPECT_FALSE(row(f, "gemm_shape.iteration_latency_cycles").fitted);
}

// The new GEMM terms from kernels the cost model priced: unaligned shapes (1705, 9375, 647, 2798
// columns: 4- and 8-byte loads, which the preset's L2 operand rate binds), skinny products on
// the bytes side at half the preset's bandwidth efficiency, and a kernel latency of 3000 cycles
// (told from the overhead by the split-K reductions' second launches).
TEST(CalibrateGpu, RecoversTheGemmBandwidthKernelLatencyAndL2Rate) {
  HardwareProfile truth = latency_truth();
  truth.gemm_shape.kernel_latency_cycles = 3000;
  truth.classes[static_cast<int>(OpClass::Gemm)].bandwidth_efficiency = 0.425;
  std::vector<GemmShapeCase> shapes(std::begin(kLatencyShapes), std::end(kLatencyShapes));
  for (const GemmShapeCase& s : std::initializer_list<GemmShapeCase>{{1024, 512, 9375},
                                                                     {1024, 1705, 1024},
                                                                     {647, 2048, 2048},
                                                                     {4096, 2798, 512},
                                                                     {98304, 647, 30},
                                                                     {65536, 16, 4096},
                                                                     {16, 8192, 8192},
                                                                     {2047, 2047, 2047}})
    shapes.push_back(s);
  const auto job = traces::import_kineto_texts({model_priced_job(truth, shapes, true)}, {"j.json"});
  const CalibrationResult r = calibrate({job}, {});
  const HardwareProfile& p = r.profile;
  EXPECT_NEAR(p.cost(OpClass::Gemm).bandwidth_efficiency / 0.425, 1.0, 0.01);
  EXPECT_NEAR(p.gemm_shape.kernel_latency_cycles / 3000.0, 1.0, 0.02);
  EXPECT_NEAR(p.gemm_shape.l2_bytes_per_s / truth.gemm_shape.l2_bytes_per_s, 1.0, 0.02);
  EXPECT_NEAR(p.gemm_shape.iteration_latency_cycles / 300.0, 1.0, 0.02);
  EXPECT_NEAR(p.cost(OpClass::Gemm).flops_efficiency / 0.7, 1.0, 0.01);
  EXPECT_NEAR(double(p.classes[0].overhead_ns) / 5000.0, 1.0, 0.01);
  for (const char* name : {"gemm.bandwidth_efficiency", "gemm_shape.kernel_latency_cycles",
                           "gemm_shape.l2_bandwidth_gbps"})
    EXPECT_TRUE(row(r, name).fitted) << name;
  EXPECT_LT(r.compute_rel_rms, 0.002);
  // Without the reductions every op launches its GEMM alone: the latency is not told from the
  // overhead, and the preset's stands.
  const CalibrationResult alone = calibrate(
      {traces::import_kineto_texts({model_priced_job(truth, shapes, false)}, {"j.json"})}, {});
  EXPECT_FALSE(row(alone, "gemm_shape.kernel_latency_cycles").fitted);
  EXPECT_EQ(alone.profile.gemm_shape.kernel_latency_cycles,
            default_hardware_profile("A100-SXM-80GB", true).gemm_shape.kernel_latency_cycles);
}

// --check prices the traces with a given profile and fits nothing: the generating profile
// explains its own kernels, the preset (latency 64, ceiling 0.899) does not.
TEST(CalibrateGpu, CheckPricesTheTracesWithAGivenProfile) {
  const HardwareProfile truth = latency_truth();
  const auto trace = traces::import_kineto_texts({model_priced_job(truth)}, {"job.json"});
  CalibrationOptions opt;
  opt.check = truth;
  const CalibrationResult own = calibrate({trace}, opt);
  EXPECT_TRUE(own.gpu.empty());
  ASSERT_EQ(own.ops.size(), 12u);
  for (const auto& o : own.ops) EXPECT_NEAR(o.fitted_ns, o.measured_ns, 1.0) << o.shape;
  opt.check = default_hardware_profile("A100-SXM-80GB", true);
  EXPECT_GT(calibrate({trace}, opt).compute_rel_rms, 0.05);
}

TEST(CalibrateGpu, AnUnknownGpuNeedsDevice) {
  traces::Trace t = load("kineto_h100_calib.json");
  t.meta.extra_json = R"({"import":{"format":"kineto"}})";  // no devices, no kernel work
  for (auto& r : t.ranks) r.device = "cuda:0";
  try {
    (void)calibrate({t}, {});
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--device"), std::string::npos) << e.what();
  }
  CalibrationOptions opt;
  opt.device = "A100-SXM-80GB";
  EXPECT_EQ(calibrate({t}, opt).profile.device, "A100-SXM-80GB");
  opt.device = "cpu";
  EXPECT_THROW((void)calibrate({t}, opt), InputError);
}

// Orrery's own CUDA traces: op spans (fwd.block, bwd.head, adamw, ...) with the cost model's kernels
// for them. Three runs whose op times are linear in known rates (calibration_fixtures.hpp's
// Truth), marked as runs on an H100, at shapes where the GEMMs (tokens x C^2), attention (tokens x
// T x C) and the softmax (tokens x V) scale apart: micro-batch 4, sequence 64, d_model 64; 2, 128,
// 64; 2, 64, 128. The fit gives those rates back as efficiencies of the H100's fp32 peaks (the
// scenario's runtime.precision), with the flat GEMM rate the Truth has. Elementwise and LayerNorm
// bytes both scale as tokens x C in every op, so op spans cannot tell them apart: only their op
// times are checked.
Scenario sized(int micro_batch, int seq, int d_model) {
  return parse_scenario(
      "name: t\nmodel: {layers: 2, d_model: " + std::to_string(d_model) +
          ", heads: 2, vocab: 512, seq: " + std::to_string(seq) +
          "}\ntraining: {steps: 4, global_batch: " + std::to_string(micro_batch) +
          ", micro_batch: " + std::to_string(micro_batch) +
          "}\nparallel: {dp: 1, bucket_mb: 1}\nruntime: {device: cpu, threads: 1}\n",
      "test.yaml");
}

TEST(CalibrateGpu, OrrerysOwnCudaOpSpans) {
  using testing_fixtures::make_run;
  const testing_fixtures::Truth truth;
  std::vector<traces::Trace> runs = {make_run(sized(4, 64, 64), truth, 1.0),
                                     make_run(sized(2, 128, 64), truth, 1.0),
                                     make_run(sized(2, 64, 128), truth, 1.0)};
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].path = "run" + std::to_string(i) + ".db";
    runs[i].meta.layout.device = "cuda";
    for (auto& r : runs[i].ranks) r.device = "cuda:0 NVIDIA H100 80GB HBM3";
  }
  CalibrationOptions opt;
  opt.flat_gemm = true;
  const CalibrationResult r = calibrate(runs, opt);
  const Device h100 = *device_preset("H100-SXM");
  const double peak = h100.peak_flops(Precision::FP32), bw = h100.mem_bandwidth_bytes_per_s;
  EXPECT_EQ(r.profile.precision, Precision::FP32);
  const auto& p = r.profile;
  EXPECT_NEAR(p.cost(OpClass::Gemm).flops_efficiency * peak * truth.s_flop[0], 1.0, 0.01);
  EXPECT_NEAR(p.cost(OpClass::Attention).flops_efficiency * peak * truth.s_flop[1], 1.0, 0.01);
  EXPECT_NEAR(p.cost(OpClass::SoftmaxLoss).bandwidth_efficiency * bw * truth.s_byte[2], 1.0, 0.01);
  EXPECT_NEAR(p.cost(OpClass::Optimizer).bandwidth_efficiency * bw * truth.s_byte[3], 1.0, 0.01);
  EXPECT_NEAR(double(p.classes[0].overhead_ns) / (truth.overhead_s * 1e9), 1.0, 0.01);
  EXPECT_LT(r.compute_rel_rms, 0.01);
  EXPECT_TRUE(row(r, "gemm.flops_efficiency").fitted);
  EXPECT_EQ(row(r, "gemm.flops_efficiency").traces.size(), 3u);
}

}  // namespace
}  // namespace orrery::sim
