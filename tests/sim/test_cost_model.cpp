// Cost model: roofline closed forms, the runtime's FLOP counting reproduced kernel by kernel, and
// hardware profile files (parsing, errors, round trip, shipped defaults).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"
#include "orrery/model/block.hpp"
#include "orrery/model/flops.hpp"
#include "orrery/model/names.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/cost_model.hpp"
#include "orrery/sim/hardware.hpp"

namespace orrery::sim {
namespace {

HardwareProfile flat_profile(double fe, double be, int64_t overhead_ns) {
  HardwareProfile p;
  p.name = "flat";
  for (auto& c : p.classes) c = ClassCost{fe, be, overhead_ns};
  return p;
}

TEST(Roofline, ComputeBoundAndMemoryBound) {
  // Peak 100 TFLOP/s at 50 %, bandwidth 1 TB/s at 80 %, 3 us overhead.
  const CostModel cm(flat_profile(0.5, 0.8, 3000), 100e12, 1e12);
  // 1e12 FLOPs, 1 MB: compute-bound, 1e12 / 50e12 s = 20 ms.
  EXPECT_EQ(cm.kernel_ns({OpClass::Gemm, 1e12, 1e6}), 20'000'000 + 3000);
  // 1e6 FLOPs, 8e9 bytes: memory-bound, 8e9 / 0.8e12 s = 10 ms.
  EXPECT_EQ(cm.kernel_ns({OpClass::Elementwise, 1e6, 8e9}), 10'000'000 + 3000);
  // Exactly balanced: 5e10 FLOPs and 8e8 bytes both take 1 ms.
  EXPECT_EQ(cm.kernel_ns({OpClass::Attention, 5e10, 8e8}), 1'000'000 + 3000);
  // An op is its kernels in sequence.
  EXPECT_EQ(cm.op_ns({{OpClass::Gemm, 1e12, 1e6}, {OpClass::Elementwise, 1e6, 8e9}}),
            30'000'000 + 6000);
  // Zero work costs the overhead only.
  EXPECT_EQ(cm.kernel_ns({OpClass::LayerNorm, 0, 0}), 3000);
}

TEST(Roofline, PerClassEfficiencyAndProfileOverrides) {
  HardwareProfile p = flat_profile(1.0, 1.0, 0);
  p.classes[int(OpClass::Gemm)].flops_efficiency = 0.25;
  p.peak_flops = 10e12;  // overrides the device's
  const CostModel cm(p, 999e12, 1e12);
  EXPECT_EQ(cm.peak_flops(), 10e12);
  EXPECT_EQ(cm.kernel_ns({OpClass::Gemm, 1e10, 0}), 4'000'000);       // 1e10 / 2.5e12
  EXPECT_EQ(cm.kernel_ns({OpClass::Attention, 1e10, 0}), 1'000'000);  // 1e10 / 10e12
  EXPECT_THROW(CostModel(flat_profile(1, 1, 0), 0, 1e12), InputError);
}

TEST(Kernels, FlopsEqualTheRuntimeCounting) {
  for (int64_t tp : {1, 2, 4}) {
    ModelDims d;
    d.batch = 4, d.seq = 256, d.d_model = 384, d.heads = 6, d.vocab = 8192, d.layers = 6, d.tp = tp,
    d.act_bytes = 4;
    model::flops::Dims r{4, 256, 384, 8192, tp};
    auto near = [](double a, double b) { return std::abs(a - b) <= 1e-12 * std::abs(b); };
    EXPECT_TRUE(
        near(total_flops(attention_forward_kernels(d)), model::flops::block_attention_forward(r)))
        << tp;
    EXPECT_TRUE(near(total_flops(mlp_forward_kernels(d)), model::flops::block_mlp_forward(r)))
        << tp;
    EXPECT_TRUE(
        near(total_flops(attention_backward_kernels(d)) + total_flops(mlp_backward_kernels(d)),
             model::flops::block_backward(r)));
    EXPECT_TRUE(near(total_flops(head_forward_kernels(d)), model::flops::head_forward(r)));
    EXPECT_TRUE(near(total_flops(head_backward_kernels(d)), model::flops::head_backward(r)));
    EXPECT_EQ(total_flops(embedding_forward_kernels(d)), 0.0);
  }
}

// parallel.vocab_parallel (Megatron's column-parallel output layer): the LM head's GEMM and the
// softmax/loss over V/tp logits per rank, the final LayerNorm whole: closed form.
TEST(Kernels, VocabParallelHeadSplitsTheLmHeadOverTp) {
  for (int64_t tp : {2, 4, 8}) {
    ModelDims d;
    d.batch = 2, d.seq = 128, d.d_model = 256, d.heads = 8, d.vocab = 4096, d.layers = 2, d.tp = tp,
    d.act_bytes = 2;
    model::flops::Dims r{2, 128, 256, 4096, tp};
    const double whole = total_flops(head_forward_kernels(d));
    const auto whole_k = head_forward_kernels(d);
    d.vocab_parallel = true;
    const auto k = head_forward_kernels(d);
    const double n = 2.0 * 128, c = 256, v = 4096;
    EXPECT_DOUBLE_EQ(whole, model::flops::head_forward(r));
    EXPECT_DOUBLE_EQ(total_flops(k), n * 2 * c * 2 + n * 2 * c * v / double(tp)) << tp;
    ASSERT_EQ(k.size(), 3u);
    EXPECT_DOUBLE_EQ(k[2].bytes, 2.0 * 2 * n * v / double(tp));  // logits read + written, bf16
    EXPECT_DOUBLE_EQ(k[2].bytes * double(tp), whole_k[2].bytes);
    EXPECT_DOUBLE_EQ(total_flops(head_backward_kernels(d)), 2 * total_flops(k));
  }
}

// Llama-style blocks: every piece the runtime records (tp's three, sequence parallelism's five,
// the recomputations') carries the FLOPs of its BlockOps, model/flops.hpp's counting.
TEST(Kernels, LlamaBlockFlopsEqualTheRuntimeCountingPieceByPiece) {
  // 4 kv heads over tp 1, 2, 4, and 2 over tp 4: one replicated head per rank, whose k and v the
  // qkv GEMM of every rank computes (kv_width = tp x head size, so kv_width / tp per rank).
  for (const auto& [kv, tp] :
       {std::pair<int, int64_t>{4, 1}, std::pair<int, int64_t>{4, 2}, std::pair<int, int64_t>{4, 4},
        std::pair<int, int64_t>{2, 4}, std::pair<int, int64_t>{2, 1}}) {
    for (bool sp : {false, true}) {
      if (sp && tp == 1) continue;
      ModelDims d;
      d.batch = 2, d.seq = 128, d.d_model = 256, d.heads = 8, d.vocab = 1000, d.layers = 4,
      d.tp = tp;
      d.act_bytes = 2;
      d.sequence_parallel = sp;
      d.arch.kv_heads = kv;
      d.arch.ffn_hidden = 704;
      d.arch.activation = Activation::Swiglu;
      d.arch.norm = Norm::RmsNorm;
      d.arch.position = Position::Rope;
      d.arch.tied_embeddings = false;
      d.arch.bias = false;
      const auto r = flop_dims(d);
      EXPECT_EQ(r.kv_width, std::max<int64_t>(kv, tp) * 32);
      EXPECT_EQ(r.ffn, 704);
      auto near = [](double a, double b) { return std::abs(a - b) <= 1e-12 * std::abs(b); };
      const auto all = block_forward_kernels(d);
      for (int op = 0; op < model::kBlockOps; ++op) {
        double f = 0;
        for (const auto& k : all) f += k.op == op ? k.flops : 0.0;
        EXPECT_TRUE(near(f, model::flops::block_op_forward(r, op)))
            << "op " << op << " kv " << kv << " tp " << tp;
      }
      const int pieces = sp ? model::kSpBlockPieces : (tp > 1 ? model::kTpBlockPieces : 1);
      for (int k = 0; k < pieces; ++k) {
        for (bool fwd : {true, false}) {
          const auto ks = op_kernels(
              fwd ? model::names::kBlockForward : model::names::kBlockBackward, k, pieces, d);
          ASSERT_TRUE(ks.has_value());
          const model::OpRange range =
              sp ? (fwd ? model::kSpForwardPieces[size_t(k)] : model::kSpBackwardPieces[size_t(k)])
              : pieces == 1
                  ? model::OpRange{0, model::kBlockOps}
                  : (fwd ? model::kForwardPieces[size_t(k)] : model::kBackwardPieces[size_t(k)]);
          const double want = model::flops::block_ops_flops(r, fwd, range.begin, range.end);
          EXPECT_TRUE(near(total_flops(*ks), want))
              << "piece " << k << " kv " << kv << " tp " << tp << " sp " << sp;
        }
      }
      // The head (untied: the same FLOPs as tied) and the RoPE kernel in the Qkv op.
      // Under sequence parallelism the final norm runs on this rank's 1/tp of the tokens.
      EXPECT_TRUE(near(total_flops(head_forward_kernels(d)),
                       model::flops::head_norm_forward(r, sp) + model::flops::head_lm_forward(r)))
          << "sp " << sp;
      // The qkv GEMM per rank: (C/tp + 2 x its kv heads' width) outputs over C inputs.
      const double per_rank_kv = double(kv >= tp ? kv / tp : 1) * 32;
      EXPECT_TRUE(near(model::flops::block_op_forward(r, int(model::BlockOp::Qkv)),
                       2.0 * 256 * 256 * (256.0 / double(tp) + 2 * per_rank_kv)))
          << "kv " << kv << " tp " << tp;
      int qkv_kernels = 0;
      for (const auto& k : all) qkv_kernels += k.op == int(model::BlockOp::Qkv);
      EXPECT_EQ(qkv_kernels, 2);
    }
  }
}

TEST(Kernels, GemmBytesClosedForm) {
  // qkv of the attention half: reads x (n·C), W (3C/tp·C), writes (n·3C/tp), in act_bytes.
  ModelDims d;
  d.batch = 2, d.seq = 64, d.d_model = 128, d.heads = 4, d.vocab = 512, d.tp = 2, d.act_bytes = 2;
  const auto ks = attention_forward_kernels(d);
  ASSERT_EQ(ks[1].cls, OpClass::Gemm);
  const double n = 128, c = 128;
  EXPECT_EQ(ks[1].bytes, 2 * (n * c + 3 * c / 2 * c + n * 3 * c / 2));
}

TEST(Kernels, ModelFlopsPerStep) {
  Scenario s;
  s.model = {4, 256, 4, 8192, 128, "gpt-tiny"};
  s.training.micro_batch = 8;
  s.training.global_batch = 32;
  s.parallel.dp = 2;
  // 2 micro-batches per replica, 2 replicas: 4 × 3 × forward of 8 sequences.
  model::flops::Dims r{8, 128, 256, 8192, 1};
  EXPECT_DOUBLE_EQ(model_flops_per_step(s), 4 * model::flops::model_step(r, 4));
}

TEST(HardwareProfile, ParsesEveryKey) {
  const char* yaml = R"(
name: test
device: H100-SXM
precision: bf16
peak_flops: 9.0e14
memory_bandwidth_gbps: 3000
data_load_us: 12.5
kernels:
  gemm: {flops_efficiency: 0.8, bandwidth_efficiency: 0.9, overhead_us: 4}
  softmax_loss: {flops_efficiency: 1.0, bandwidth_efficiency: 0.5, overhead_us: 2.5}
collectives:
  - {op: all_reduce, scope: intra_node, latency_us: 8, bus_bandwidth_gbps: 360}
  - {op: all_reduce, latency_us: 20, bus_bandwidth_gbps: 40}
machine:
  host: dgx01
  gpus: 8x H100
)";
  const HardwareProfile p = parse_hardware_profile(yaml, "t.yaml");
  EXPECT_EQ(p.name, "test");
  EXPECT_EQ(p.peak_flops, 9e14);
  EXPECT_EQ(p.memory_bandwidth_bytes_per_s, 3e12);
  EXPECT_EQ(p.data_load_ns, 12'500);
  EXPECT_EQ(p.cost(OpClass::Gemm).flops_efficiency, 0.8);
  EXPECT_EQ(p.cost(OpClass::SoftmaxLoss).overhead_ns, 2'500);
  EXPECT_EQ(p.cost(OpClass::Attention).flops_efficiency, 1.0);  // absent: the default
  ASSERT_EQ(p.collectives.size(), 2u);
  EXPECT_EQ(p.find_override(traces::CollOp::AllReduce, true)->latency_ns, 8'000);
  EXPECT_EQ(p.find_override(traces::CollOp::AllReduce, false)->latency_ns, 20'000);
  EXPECT_EQ(p.find_override(traces::CollOp::AllGather, false), nullptr);
  EXPECT_EQ(p.machine.at("host"), "dgx01");
  // Round trip through to_yaml.
  const HardwareProfile q = parse_hardware_profile(to_yaml(p), "round");
  EXPECT_EQ(q.cost(OpClass::Gemm).bandwidth_efficiency, 0.9);
  EXPECT_EQ(q.collectives.size(), 2u);
  EXPECT_EQ(q.data_load_ns, p.data_load_ns);
}

TEST(HardwareProfile, BadInputIsAnInputError) {
  EXPECT_THROW(parse_hardware_profile("kernels: {gemm: {flops_efficiency: 1.5}}", "x"), InputError);
  EXPECT_THROW(parse_hardware_profile("kernels: {gemmm: {}}", "x"), InputError);
  EXPECT_THROW(parse_hardware_profile("speed: 3", "x"), InputError);
  EXPECT_THROW(parse_hardware_profile("precision: fp8", "x"), InputError);
  EXPECT_THROW(parse_hardware_profile("collectives: [{op: shuffle, bus_bandwidth_gbps: 1}]", "x"),
               InputError);
  EXPECT_THROW(parse_hardware_profile("data_load_us: -1", "x"), InputError);
  EXPECT_THROW(load_hardware_profile("/nonexistent/profile.yaml"), InputError);
  try {
    parse_hardware_profile("name: a\nkernels:\n  gemm: {flops_efficiency: 2}\n", "p.yaml");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("p.yaml:3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("kernels.gemm.flops_efficiency"), std::string::npos)
        << e.what();
  }
}

// Inputs found with fuzz/fuzz_hardware (fuzz/README.md): uncaught YAML exceptions and out-of-range
// double -> int casts (UBSan); each is now an InputError.
TEST(HardwareProfile, FuzzFindingsAreInputErrors) {
  for (const char* yaml :
       {"name: {a: 1}", "? [a]: 1", "machine: {? [x]: 1}", "collectives: [5]",
        "collectives: [{op: [all_reduce], bus_bandwidth_gbps: 1}]",
        "collectives: [{op: all_reduce, ranks: 1e20, bus_bandwidth_gbps: 1}]",
        "cluster: {ranks_per_node: 1e30}", "cluster: {ranks_per_node: 2, nodes: 1e12}",
        "cluster: {ranks_per_node: 2, memory_capacity_gb: 1e300}", "sharing: {cores: 1e10}",
        "data_load_us: 1e300"}) {
    EXPECT_THROW(parse_hardware_profile(yaml, "x"), InputError) << yaml;
  }
}

// fuzz_hardware finding (fuzz/corpus/fuzz_hardware/regress-cr-device.yaml): strings that read back
// as something else when written plain (empty, a lone carriage return, surrounding spaces) are
// written quoted, so to_yaml's output parses back to the same strings.
TEST(HardwareProfile, StringsThatAreNotPlainRoundTrip) {
  HardwareProfile p = default_hardware_profile("cpu", false);
  p.name = "";
  p.device = "\r";
  p.precision = Precision::FP32;
  p.machine["source"] = " padded ";
  const HardwareProfile q = parse_hardware_profile(to_yaml(p), "roundtrip.yaml");
  EXPECT_EQ(q.name, "");
  EXPECT_EQ(q.device, "\r");
  EXPECT_EQ(q.machine.at("source"), " padded ");
}

TEST(HardwareProfile, ShippedDefaultsLoadAndMatchTheBuiltIns) {
  const std::filesystem::path dir =
      std::filesystem::path(ORRERY_SOURCE_DIR) / "scenarios" / "hardware";
  int n = 0;
  for (const auto& name : device_preset_names()) {
    const auto file = dir / (name + ".yaml");
    ASSERT_TRUE(std::filesystem::exists(file)) << file;
    const HardwareProfile p = load_hardware_profile(file.string());
    const HardwareProfile b = default_hardware_profile(name, name != "cpu");
    EXPECT_EQ(p.device, name);
    EXPECT_EQ(p.precision, b.precision);
    for (int c = 0; c < kOpClassCount; ++c) {
      EXPECT_EQ(p.classes[c].flops_efficiency, b.classes[c].flops_efficiency) << name << " " << c;
      EXPECT_EQ(p.classes[c].bandwidth_efficiency, b.classes[c].bandwidth_efficiency)
          << name << " " << c;
      EXPECT_EQ(p.classes[c].overhead_ns, b.classes[c].overhead_ns) << name << " " << c;
    }
    EXPECT_DOUBLE_EQ(p.offload.host_link_bytes_per_s, b.offload.host_link_bytes_per_s) << name;
    EXPECT_EQ(p.offload.host_link_shared_by, b.offload.host_link_shared_by) << name;
    EXPECT_DOUBLE_EQ(p.offload.host_adamw_bytes_per_s, b.offload.host_adamw_bytes_per_s) << name;
    EXPECT_DOUBLE_EQ(p.offload.nvme_read_bytes_per_s, b.offload.nvme_read_bytes_per_s) << name;
    EXPECT_DOUBLE_EQ(p.offload.nvme_write_bytes_per_s, b.offload.nvme_write_bytes_per_s) << name;
    EXPECT_EQ(p.gemm_shape.sms, b.gemm_shape.sms) << name;
    EXPECT_EQ(p.gemm_shape.k_fixed, b.gemm_shape.k_fixed) << name;
    EXPECT_EQ(p.gemm_shape.max_split_k, b.gemm_shape.max_split_k) << name;
    EXPECT_EQ(p.gemm_shape.clock_hz, b.gemm_shape.clock_hz) << name;
    EXPECT_EQ(p.gemm_shape.l2_bytes_per_s, b.gemm_shape.l2_bytes_per_s) << name;
    EXPECT_EQ(p.gemm_shape.iteration_latency_cycles, b.gemm_shape.iteration_latency_cycles) << name;
    EXPECT_EQ(p.gemm_shape.tile_k_bytes, b.gemm_shape.tile_k_bytes) << name;
    EXPECT_EQ(p.gemm_shape.kernel_latency_cycles, b.gemm_shape.kernel_latency_cycles) << name;
    ASSERT_EQ(p.gemm_shape.tiles.size(), b.gemm_shape.tiles.size()) << name;
    for (size_t i = 0; i < p.gemm_shape.tiles.size(); ++i) {
      EXPECT_EQ(p.gemm_shape.tiles[i].m, b.gemm_shape.tiles[i].m) << name << " tile " << i;
      EXPECT_EQ(p.gemm_shape.tiles[i].n, b.gemm_shape.tiles[i].n) << name << " tile " << i;
      EXPECT_EQ(p.gemm_shape.tiles[i].relative, b.gemm_shape.tiles[i].relative)
          << name << " tile " << i;
    }
    ++n;
  }
  EXPECT_GE(n, 4);
}

// ---- GEMMs priced by shape (hardware.hpp GemmShapeModel, cost_model.hpp gemm_shape_efficiency).

GemmShapeModel one_tile_model(int sms, double k_fixed, int max_split_k) {
  GemmShapeModel g;
  g.sms = sms;
  g.tiles = {{128, 128, 1.0}};
  g.k_fixed = k_fixed;
  g.max_split_k = max_split_k;
  return g;
}

TEST(GemmShape, TileAndWaveQuantisationInClosedForm) {
  const GemmShapeModel g = one_tile_model(4, 0, 1);
  // 2 x 2 tiles fill the 4 SMs in one wave: the ideal.
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(g, 256, 256, 1000), 1.0);
  // One row more: 3 x 2 tiles, two waves of 128 x 128 tiles for 257 x 256 outputs.
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(g, 257, 256, 1000), 257.0 * 256 / (4.0 * 2 * 128 * 128));
  // Half the SMs busy: one tile, one wave.
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(g, 128, 256, 1000), 0.5);
  // A tile's fixed cost in units of K: k / (k + k_fixed).
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(one_tile_model(4, 24, 1), 256, 256, 1000), 1000.0 / 1024);
}

TEST(GemmShape, SplitKFillsIdleSms) {
  // One output tile over 4 SMs: split 4 ways, each a quarter of K (plus the fixed cost).
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(one_tile_model(4, 0, 4), 128, 128, 1024), 1.0);
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(one_tile_model(4, 32, 4), 128, 128, 1024),
                   256.0 / (256 + 32));
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(one_tile_model(4, 0, 1), 128, 128, 1024), 0.25);
  // Never split into more blocks than SMs: 3 tiles over 4 SMs stay unsplit.
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(one_tile_model(4, 0, 4), 384, 128, 1024), 0.75);
}

TEST(GemmShape, TheFastestCandidateTileWins) {
  GemmShapeModel g = one_tile_model(4, 0, 1);
  g.tiles.push_back({64, 64, 0.5});
  // 128 x 128 outputs: one big tile (0.25 of the SMs) or 4 small ones in one wave at half rate.
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(g, 128, 128, 1000), 0.5);
  // 256 x 256: the big tile fills the SMs.
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(g, 256, 256, 1000), 1.0);
}

// The device terms in closed form: 4 SMs, one 128 x 128 tile, a peak that makes one SM's MMA of
// one output element over one K element 1 ps (unit = 2 · sms / peak), 16-bit operands (64 of K per
// 128-byte iteration). The tile's MMAs take 128 · 128 = 16384 ps per K element.
constexpr double kUnitPeak = 8e12;  // 2 · 4 / 8e12 = 1 ps

TEST(GemmShape, IterationLatencyInClosedForm) {
  GemmShapeModel g = one_tile_model(4, 0, 1);
  g.clock_hz = 1e9;
  g.iteration_latency_cycles = 64;  // 64 ns per 64-element iteration: 1000 ps per K element
  const GemmDevice dev{kUnitPeak, 0, 2};
  // 2 x 2 tiles in one wave over K = 1024: 16384 of MMA and 1000 of latency per K element.
  EXPECT_NEAR(gemm_shape_efficiency(g, 256, 256, 1024, dev), 16384.0 / 17384, 1e-12);
  // K = 16, a quarter of an iteration: its MMAs, and one whole iteration's latency.
  EXPECT_NEAR(gemm_shape_efficiency(g, 256, 256, 16, dev), 16.0 * 16384 / (16 * 16384 + 64000),
              1e-12);
  // Without a device (or a clock) no latency: the quantisation alone.
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(g, 256, 256, 1024), 1.0);
  // fp32 operands: 32 of K per iteration, twice the latency per K element.
  EXPECT_NEAR(gemm_shape_efficiency(g, 256, 256, 1024, {kUnitPeak, 0, 4}), 16384.0 / 18384, 1e-12);
}

TEST(GemmShape, OperandBytesAtTheSmsShareOfL2) {
  GemmShapeModel g = one_tile_model(4, 0, 1);
  // (128 + 128) x 2 bytes per K element at l2 / 4 per SM: 2048 / l2 s, twice the MMAs' 16384 ps.
  g.l2_bytes_per_s = 2048.0 / 32768e-12;
  EXPECT_NEAR(gemm_shape_efficiency(g, 256, 256, 1024, {kUnitPeak, 0, 2}), 0.5, 1e-12);
  // Four times the bandwidth: the MMAs bound it again.
  g.l2_bytes_per_s *= 4;
  EXPECT_NEAR(gemm_shape_efficiency(g, 256, 256, 1024, {kUnitPeak, 0, 2}), 1.0, 1e-12);
}

TEST(GemmShape, LoadWidthIsTheLargestPowerOfTwoOfTheDimensionsBytes) {
  EXPECT_EQ(gemm_load_bytes(1024, 2048, 1024, 4), 16);  // capped at 16 bytes
  EXPECT_EQ(gemm_load_bytes(647, 30, 96, 4), 4);        // 647 floats: align1, 4-byte loads
  EXPECT_EQ(gemm_load_bytes(1024, 2798, 64, 4), 8);     // 2798 = 2 x 1399: 8 bytes
  EXPECT_EQ(gemm_load_bytes(255, 256, 1024, 2), 2);     // 255 bf16 elements: 2-byte loads
  EXPECT_EQ(gemm_load_bytes(2048, 4608, 12288, 2), 16);
  EXPECT_EQ(gemm_load_bytes(1.25, 4096, 4096, 2), 16);  // not a whole number: unknown, full width
}

// The same 4 SMs and unit peak, fp32 operands: (128 + 128) x 4 bytes per K element at l2 / 4 per
// SM. At l2 = 2.5e11 B/s that is 16384 ps with 16-byte loads, the MMAs' time: 256 x 256 x 1024
// runs at the ideal. K = 1023 is 4092 bytes, a multiple of 4 but not 8: 4-byte loads bring the
// operands in at a quarter of the rate, 65536 ps per K element, 4 x the MMAs'.
TEST(GemmShape, NarrowLoadsOfAnUnalignedShapeSlowTheOperandFill) {
  GemmShapeModel g = one_tile_model(4, 0, 1);
  g.l2_bytes_per_s = 2.5e11;
  const GemmDevice dev{kUnitPeak, 0, 4};
  const double aligned = gemm_shape_efficiency(g, 256, 256, 1024, dev);
  const double align1 = gemm_shape_efficiency(g, 256, 256, 1023, dev);
  EXPECT_NEAR(aligned, 1.0, 1e-12);
  EXPECT_NEAR(align1, 0.25, 1e-12);
  // Time per FLOP, align1 over aligned: the load width's ratio, 16 / 4.
  EXPECT_NEAR(aligned / align1, 4.0, 1e-12);
  // 2798-wide (8-byte loads): half the rate, 32768 ps per K element.
  EXPECT_NEAR(gemm_shape_efficiency(g, 256, 256, 1022, dev), 0.5, 1e-12);
  // A kernel whose rows stack a batch says its own load width (calibrate's bmm): 16 bytes here.
  Kernel k{OpClass::Gemm, 2.0 * 256 * 256 * 1023, 0};
  k.gm = 256, k.gn = 256, k.gk = 1023, k.elem_bytes = 4, k.load_bytes = 16;
  EXPECT_NEAR(gemm_shape_efficiency(g, k, dev), 1.0, 1e-12);
  // Without an L2 figure there is no operand-fill term, and alignment changes nothing.
  g.l2_bytes_per_s = 0;
  EXPECT_NEAR(gemm_shape_efficiency(g, 256, 256, 1023, dev), 1.0, 1e-12);
}

// A skinny product, 65536 x 16 over 4096 in bf16 on the H100 preset: its 16 columns use an eighth
// of a 128-wide tile, while its bytes (the 65536 x 4096 input) take longer than its tiles, so it
// costs its bytes at the gemm class's fraction of HBM bandwidth, plus the kernel latency and the
// overhead.
TEST(GemmShape, ASkinnyProductIsPricedByItsBytes) {
  const HardwareProfile p = default_hardware_profile("H100-SXM", true);
  const Device h100 = *device_preset("H100-SXM");
  const double peak = h100.peak_flops(Precision::BF16), bw = h100.mem_bandwidth_bytes_per_s;
  const CostModel cm(p, peak, bw);
  const double m = 65536, n = 16, k = 4096;
  Kernel g{OpClass::Gemm, 2 * m * n * k, 2 * (m * k + k * n + m * n)};
  g.gm = m, g.gn = n, g.gk = k, g.elem_bytes = 2;
  const ClassCost& c = p.cost(OpClass::Gemm);
  const double compute_s =
      g.flops / (peak * c.flops_efficiency * gemm_shape_efficiency(p.gemm_shape, g, {peak, bw}));
  const double bytes_s = g.bytes / (bw * c.bandwidth_efficiency);
  ASSERT_GT(bytes_s, 1.5 * compute_s);
  const double latency_s = p.gemm_shape.kernel_latency_cycles / p.gemm_shape.clock_hz;
  EXPECT_EQ(cm.kernel_ns(g),
            static_cast<int64_t>(std::ceil((bytes_s + latency_s) * 1e9)) + c.overhead_ns);
  // At half the bandwidth efficiency (a calibrated profile's measured fraction): twice the bytes'.
  HardwareProfile slow = p;
  slow.classes[static_cast<int>(OpClass::Gemm)].bandwidth_efficiency = c.bandwidth_efficiency / 2;
  EXPECT_EQ(CostModel(slow, peak, bw).kernel_ns(g),
            static_cast<int64_t>(std::ceil((2 * bytes_s + latency_s) * 1e9)) + c.overhead_ns);
}

// Every GEMM kernel pays the shape model's kernel latency once (its prologue and epilogue): the
// floor under a small product. 5000 cycles at 1 GHz: 5 us on top of a 64 x 64 x 64 product's
// roofline, which the latency dwarfs; a kernel without a shape, or of another class, does not pay it.
TEST(GemmShape, EveryGemmKernelPaysTheKernelLatencyOnce) {
  HardwareProfile p = default_hardware_profile("H100-SXM", true);
  p.gemm_shape.clock_hz = 1e9;
  p.gemm_shape.kernel_latency_cycles = 5000;
  const double peak = 989e12, bw = 3.35e12;
  HardwareProfile none = p;
  none.gemm_shape.kernel_latency_cycles = 0;
  Kernel g{OpClass::Gemm, 2.0 * 64 * 64 * 64, 2.0 * 3 * 64 * 64};
  g.gm = 64, g.gn = 64, g.gk = 64, g.elem_bytes = 2;
  const int64_t with = CostModel(p, peak, bw).kernel_ns(g);
  const int64_t without = CostModel(none, peak, bw).kernel_ns(g);
  EXPECT_NEAR(double(with - without), 5000.0, 1.0);
  EXPECT_GT(with, 5000 + p.cost(OpClass::Gemm).overhead_ns);
  Kernel flat = g;
  flat.gm = flat.gn = flat.gk = 0;
  EXPECT_EQ(CostModel(p, peak, bw).kernel_ns(flat), CostModel(none, peak, bw).kernel_ns(flat));
  Kernel el{OpClass::Elementwise, 0, 1e6};
  EXPECT_EQ(CostModel(p, peak, bw).kernel_ns(el), CostModel(none, peak, bw).kernel_ns(el));
}

TEST(GemmShape, SplitKPaysForItsPartialOutputs) {
  const GemmShapeModel g = one_tile_model(4, 0, 4);
  // One 128 x 128 tile over K = 1024. Split s: (1024 / s) x 16384 ps of MMAs, and 8 · s · 128²
  // bytes of fp32 partials at 1.25e11 B/s: s x 1048576 ps. s = 1, 2, 3, 4: 16.8, 10.5, 8.7 and
  // 8.4 million ps, so 4 ways, at half the ideal 4194304.
  EXPECT_NEAR(gemm_shape_efficiency(g, 128, 128, 1024, {kUnitPeak, 1.25e11, 2}), 0.5, 1e-12);
  // With an L2 figure the partials go through L2 at its bandwidth instead (they fit in it).
  GemmShapeModel l2 = g;
  l2.l2_bytes_per_s = 1.25e11;
  EXPECT_NEAR(gemm_shape_efficiency(l2, 128, 128, 1024, {kUnitPeak, 1e15, 2}), 0.5, 1e-12);
  // Free partials (no bandwidth given): the ideal, as before.
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(g, 128, 128, 1024, {kUnitPeak, 0, 2}), 1.0);
  // The presets split until the grid fills the SMs once, not at most 4 ways.
  EXPECT_EQ(gemm_shape_model("A100-SXM-80GB").max_split_k, 108);
  EXPECT_EQ(gemm_shape_model("H100-SXM").max_split_k, 132);
}

TEST(GemmShape, OffWithoutAModelOrAShape) {
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(GemmShapeModel{}, 1, 1, 1), 1.0);
  const HardwareProfile cpu = default_hardware_profile("cpu", false);
  EXPECT_FALSE(cpu.gemm_shape.enabled());
  Kernel k{OpClass::Gemm, 1e9, 1e6};
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(gemm_shape_model("H100-SXM"), k), 1.0);  // no shape
  k.gm = 16, k.gn = 16, k.gk = 16;
  k.cls = OpClass::Elementwise;
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(gemm_shape_model("H100-SXM"), k), 1.0);
}

TEST(GemmShape, BackwardIsTheHarmonicMeanOfItsTwoProducts) {
  const GemmShapeModel g = gemm_shape_model("H100-SXM");
  Kernel k{OpClass::Gemm, 2 * 2.0 * 2048 * 4608 * 12288, 0};
  k.gm = 2048, k.gn = 4608, k.gk = 12288;
  k.gemm_backward = true;
  const double a = gemm_shape_efficiency(g, 2048, 12288, 4608);  // input gradient
  const double b = gemm_shape_efficiency(g, 12288, 4608, 2048);  // weight gradient
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(g, k), 2.0 / (1.0 / a + 1.0 / b));
  // The block's backward kernels carry their forward shape, flagged.
  ModelDims d;
  d.batch = 1, d.seq = 2048, d.d_model = 12288, d.heads = 96, d.vocab = 51200, d.tp = 8;
  d.act_bytes = 2;
  const auto fwd = block_forward_kernels(d);
  const auto bwd = op_kernels("bwd.block", 0, 1, d);
  ASSERT_TRUE(bwd.has_value());
  int gemms = 0;
  for (const auto& x : *bwd) {
    if (x.cls != OpClass::Gemm) continue;
    ++gemms;
    EXPECT_TRUE(x.gemm_backward);
    EXPECT_EQ(x.gm, 2048);
  }
  EXPECT_EQ(gemms, 4);
  EXPECT_EQ(fwd[1].cls, OpClass::Gemm);  // qkv: 2048 tokens x 3·12288/8 over 12288
  EXPECT_EQ(fwd[1].gn, 3.0 * 12288 / 8);
  EXPECT_EQ(fwd[1].gk, 12288);
  EXPECT_FALSE(fwd[1].gemm_backward);
}

// The presets reproduce the published maxima they were fitted to (scenarios/hardware/README.md),
// and skinny or small products fall far below them.
double tflops(const std::string& device, double m, double n, double k) {
  const HardwareProfile p = default_hardware_profile(device, true);
  const double peak = device == "A100-SXM-80GB" ? 312e12 : 989e12;
  const CostModel cm(p, peak, 3.35e12);
  Kernel g{OpClass::Gemm, 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n)};
  g.gm = m, g.gn = n, g.gk = k;
  const int64_t ns = cm.kernel_ns(g) - p.cost(OpClass::Gemm).overhead_ns;
  return 2.0 * m * n * k / (double(ns) * 1e-9) / 1e12;
}

TEST(GemmShape, PresetsReachThePublishedMaxima) {
  EXPECT_NEAR(tflops("H200", 8192, 8192, 8192), 790.0, 790.0 * 0.01);
  EXPECT_NEAR(tflops("H100-SXM", 6144, 17920, 2816), 792.1, 792.1 * 0.01);
  EXPECT_NEAR(tflops("A100-SXM-80GB", 6912, 16384, 2048), 267.9, 267.9 * 0.01);
  // Far below: a 16-token product (memory-bound on its weights) and a 1024^3 one (8 x 4 tiles
  // on 132 SMs, one partial wave).
  EXPECT_LT(tflops("H100-SXM", 16, 4096, 4096), 100.0);
  EXPECT_LT(tflops("H100-SXM", 1024, 1024, 1024), 0.9 * 790.0);
  // 132 x 2 tiles of 128 x 256 are two full waves on the 132 SMs; 8 more columns need a third
  // (or smaller tiles): 0.938 -> 0.635 of the ceiling (both compute-bound: 512 FLOP per byte).
  const double full = tflops("H100-SXM", 16896, 512, 8192);
  const double more = tflops("H100-SXM", 16896, 520, 8192);
  EXPECT_NEAR(more / full, 0.6744 / 0.9961, 0.005);
}

TEST(Attention, UnfusedInClosedForm) {
  const HardwareProfile p = parse_hardware_profile(
      "name: u\nprecision: bf16\nattention_kernel: unfused\nkernels:\n"
      "  gemm: {flops_efficiency: 0.5, bandwidth_efficiency: 1.0, overhead_us: 1}\n"
      "  elementwise: {flops_efficiency: 1.0, bandwidth_efficiency: 0.5, overhead_us: 2}\n",
      "u.yaml");
  EXPECT_FALSE(p.attention_fused);
  EXPECT_FALSE(parse_hardware_profile(to_yaml(p), "again.yaml").attention_fused);
  const double peak = 1e15, bw = 2e12;
  const CostModel cm(p, peak, bw);
  ModelDims d;
  d.batch = 2, d.seq = 1024, d.d_model = 1024, d.heads = 8, d.vocab = 1000, d.tp = 2;
  d.act_bytes = 2;
  const auto fwd = block_forward_kernels(d);
  const Kernel* att = nullptr;
  for (const auto& k : fwd)
    if (k.cls == OpClass::Attention) att = &k;
  ASSERT_NE(att, nullptr);
  EXPECT_EQ(att->gm, 1024);
  EXPECT_EQ(att->gk, 128);
  EXPECT_EQ(att->gbatch, 2.0 * 8 / 2);
  // Two GEMMs of 2·(B·H/tp·T)·T·hd FLOPs at half the peak, 4 T² elements per head at half the
  // bandwidth, three kernels' overheads; the q, k, v, o traffic is smaller here.
  const double rows = 8.0 * 1024;
  const double gemm_s = 2 * (2.0 * rows * 1024 * 128) / (peak * 0.5);
  const double scores_s = 4.0 * 2 * rows * 1024 / (bw * 0.5);
  const int64_t want = int64_t(std::ceil((gemm_s + scores_s) * 1e9)) + 2 * 1000 + 2000;
  EXPECT_EQ(cm.kernel_ns(*att), want);
  // Backward: twice the forward's work.
  const auto bwd = op_kernels("bwd.block", 0, 1, d);
  ASSERT_TRUE(bwd.has_value());
  for (const auto& k : *bwd) {
    if (k.cls != OpClass::Attention) continue;
    EXPECT_EQ(cm.kernel_ns(k), int64_t(std::ceil(2 * (gemm_s + scores_s) * 1e9)) + 4000);
  }
  // Fused (the default) is the class's roofline, unchanged.
  HardwareProfile f = p;
  f.attention_fused = true;
  const CostModel cf(f, peak, bw);
  const ClassCost& a = f.cost(OpClass::Attention);
  EXPECT_EQ(cf.kernel_ns(*att),
            int64_t(std::ceil(std::max(att->flops / (peak * a.flops_efficiency),
                                       att->bytes / (bw * a.bandwidth_efficiency)) *
                              1e9)) +
                a.overhead_ns);
  EXPECT_THROW(parse_hardware_profile("name: x\nattention_kernel: flash\n", "x.yaml"), InputError);
}

TEST(HardwareProfile, GemmShapeRoundTripAndBadInput) {
  const std::string base = "name: g\ndevice: H100-SXM\nprecision: bf16\n";
  const HardwareProfile p = parse_hardware_profile(
      base +
          "gemm_shape: {sms: 8, tiles: [{m: 64, n: 32, relative: 0.5}, {m: 16, n: 16}], "
          "k_fixed: 12.5, max_split_k: 3, clock_mhz: 1500, l2_bandwidth_gbps: 6000, "
          "iteration_latency_cycles: 48.5, tile_k_bytes: 64, kernel_latency_cycles: 700}\n",
      "g.yaml");
  ASSERT_TRUE(p.gemm_shape.enabled());
  EXPECT_EQ(p.gemm_shape.sms, 8);
  ASSERT_EQ(p.gemm_shape.tiles.size(), 2u);
  EXPECT_EQ(p.gemm_shape.tiles[0].n, 32);
  EXPECT_EQ(p.gemm_shape.tiles[0].relative, 0.5);
  EXPECT_EQ(p.gemm_shape.tiles[1].relative, 1.0);
  EXPECT_EQ(p.gemm_shape.k_fixed, 12.5);
  EXPECT_EQ(p.gemm_shape.max_split_k, 3);
  const HardwareProfile q = parse_hardware_profile(to_yaml(p), "again.yaml");
  EXPECT_EQ(q.gemm_shape.sms, 8);
  ASSERT_EQ(q.gemm_shape.tiles.size(), 2u);
  EXPECT_EQ(q.gemm_shape.tiles[0].m, 64);
  EXPECT_EQ(q.gemm_shape.k_fixed, 12.5);
  EXPECT_EQ(q.gemm_shape.max_split_k, 3);
  EXPECT_EQ(q.gemm_shape.clock_hz, 1500e6);
  EXPECT_EQ(q.gemm_shape.l2_bytes_per_s, 6000e9);
  EXPECT_EQ(q.gemm_shape.iteration_latency_cycles, 48.5);
  EXPECT_EQ(q.gemm_shape.tile_k_bytes, 64);
  EXPECT_EQ(q.gemm_shape.kernel_latency_cycles, 700);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"gemm_shape: {sms: 8}", "needs sms and tiles"},
      {"gemm_shape: {sms: 0, tiles: [{m: 1, n: 1}]}", "gemm_shape.sms"},
      {"gemm_shape: {sms: 8, tiles: []}", "gemm_shape.tiles"},
      {"gemm_shape: {sms: 8, tiles: [{m: 1}]}", "needs n"},
      {"gemm_shape: {sms: 8, tiles: [{m: 1, n: 1, relative: 0}]}", "gemm_shape.tiles[0].relative"},
      {"gemm_shape: {sms: 8, tiles: [{m: 1.5, n: 1}]}", "gemm_shape.tiles[0].m"},
      {"gemm_shape: {sms: 8, tiles: [{m: 1, n: 1}], k_fixed: -1}", "gemm_shape.k_fixed"},
      {"gemm_shape: {sms: 8, tiles: [{m: 1, n: 1}], waves: 2}", "waves"},
      {"gemm_shape: {sms: 8, tiles: [{m: 1, n: 1}], iteration_latency_cycles: 9}", "clock_mhz"},
      {"gemm_shape: {sms: 8, tiles: [{m: 1, n: 1}], kernel_latency_cycles: 9}", "clock_mhz"},
      {"gemm_shape: {sms: 8, tiles: [{m: 1, n: 1}], kernel_latency_cycles: -1}",
       "gemm_shape.kernel_latency_cycles"},
      {"gemm_shape: {sms: 8, tiles: [{m: 1, n: 1}], clock_mhz: -5}", "gemm_shape.clock_mhz"},
      {"gemm_shape: {sms: 8, tiles: [{m: 1, n: 1}], tile_k_bytes: 0}", "gemm_shape.tile_k_bytes"},
  };
  for (const auto& [yaml, want] : bad) {
    try {
      parse_hardware_profile(base + yaml + "\n", "bad.yaml");
      ADD_FAILURE() << yaml << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.yaml"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace orrery::sim
