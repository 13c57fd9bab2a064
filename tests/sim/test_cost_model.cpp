// Cost model: roofline closed forms, the runtime's FLOP counting reproduced kernel by kernel, and
// hardware profile files (parsing, errors, round trip, shipped defaults).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

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
  p.precision = "fp32";
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
    ++n;
  }
  EXPECT_GE(n, 4);
}

}  // namespace
}  // namespace orrery::sim
