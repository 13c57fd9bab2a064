// Tests of scenario parsing: defaults, overrides, and the messages for bad input.
#include <gtest/gtest.h>

#include <fstream>

#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"

namespace orrery {
namespace {

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_scenario(yaml, "s.yaml", overrides);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Scenario, ParsesKeysAndDefaults) {
  const Scenario s = parse_scenario(
      "model:\n  layers: 6\n  d_model: 384\n  heads: 6\ntraining:\n  global_batch: 16\n  "
      "micro_batch: 4\n"
      "parallel:\n  dp: 2\n  overlap: false\n",
      "s.yaml");
  EXPECT_EQ(s.model.layers, 6);
  EXPECT_EQ(s.model.d_model, 384);
  EXPECT_EQ(s.model.vocab, 8192);  // default
  EXPECT_EQ(s.parallel.dp, 2);
  EXPECT_FALSE(s.parallel.overlap);
  EXPECT_EQ(s.world_size(), 2);
  EXPECT_EQ(s.micro_batches_per_step(), 2);  // 16 / (2 * 4)
}

TEST(Scenario, OverridesApplyAndAreTyped) {
  const Scenario s = parse_scenario(
      "model:\n  layers: 4\n", "s.yaml",
      {"model.layers=8", "parallel.schedule=gpipe", "training.lr=0.001", "profile.enabled=false"});
  EXPECT_EQ(s.model.layers, 8);
  EXPECT_EQ(s.parallel.schedule, "gpipe");
  EXPECT_DOUBLE_EQ(s.training.lr, 0.001);
  EXPECT_FALSE(s.profile.enabled);
  // The stored text carries the override, so traces record what actually ran.
  const Scenario again = parse_scenario(s.text, "again");
  EXPECT_EQ(again.model.layers, 8);
}

TEST(Scenario, UnknownKeyNamesLineAndSuggests) {
  EXPECT_EQ(error_of("model:\n  layers: 4\n  layer: 3\n"),
            "s.yaml:3: key 'model.layer': unknown key (did you mean 'model.layers'?)");
  EXPECT_EQ(error_of("trainng:\n  steps: 3\n"),
            "s.yaml:1: key 'trainng': unknown key (did you mean 'training'?)");
}

TEST(Scenario, WrongTypeNamesLine) {
  EXPECT_EQ(error_of("training:\n  steps: ten\n"),
            "s.yaml:2: key 'training.steps': expected an integer, got 'ten'");
  EXPECT_EQ(error_of("parallel:\n  overlap: maybe\n"),
            "s.yaml:2: key 'parallel.overlap': expected true or false, got 'maybe'");
}

TEST(Scenario, BadOverride) {
  EXPECT_EQ(error_of("", {"model.layres=3"}),
            "--set 'model.layres=3': unknown key 'model.layres' (did you mean 'model.layers'?)");
  EXPECT_EQ(error_of("", {"noequals"}),
            "--set 'noequals': expected key=value, e.g. --set training.steps=20");
}

TEST(Scenario, ImpossibleLayoutsAreRefused) {
  EXPECT_NE(error_of("model:\n  heads: 4\nparallel:\n  tp: 3\n")
                .find("model.heads (4) must be divisible by tp"),
            std::string::npos);
  EXPECT_NE(error_of("model:\n  layers: 2\nparallel:\n  pp: 4\n")
                .find("4 pipeline stages but only 2 layers"),
            std::string::npos);
  EXPECT_NE(error_of("parallel:\n  zero: 2\n").find("needs parallel.dp >= 2"), std::string::npos);
  EXPECT_NE(error_of("training:\n  global_batch: 10\n  micro_batch: 4\n")
                .find("must be divisible by dp (1)"),
            std::string::npos);
  EXPECT_NE(error_of("parallel:\n  zero: 5\n").find("expected 0, 1, 2 or 3"), std::string::npos);
}

// Issue 18 item 1's keys: parsed with their defaults, every bad value refused naming the key.
TEST(Scenario, GradCompressionKeysParseAndBadValuesNameTheKey) {
  const Scenario d = parse_scenario("", "s.yaml");
  EXPECT_EQ(d.parallel.grad_compression, "none");
  EXPECT_EQ(d.compression.powersgd_rank, 4);
  EXPECT_DOUBLE_EQ(d.compression.topk_ratio, 0.01);
  EXPECT_EQ(d.compression.start_step, 0);
  const Scenario s = parse_scenario(
      "training:\n  micro_batch: 4\nparallel:\n  dp: 2\n  zero: 1\n  grad_compression: "
      "powersgd\ncompression:\n  "
      "powersgd_rank: 2\n  topk_ratio: 0.05\n  start_step: 10\n",
      "s.yaml");
  EXPECT_EQ(s.parallel.grad_compression, "powersgd");
  EXPECT_EQ(s.compression.powersgd_rank, 2);
  EXPECT_DOUBLE_EQ(s.compression.topk_ratio, 0.05);
  EXPECT_EQ(s.compression.start_step, 10);
  EXPECT_EQ(parse_scenario(to_yaml(s), "again").compression.start_step, 10);
  EXPECT_EQ(error_of("", {"parallel.grad_compression=fp8"}),
            "s.yaml: key 'parallel.grad_compression': expected none, int8, powersgd or topk, got "
            "'fp8'");
  EXPECT_EQ(error_of("", {"compression.powersgd_rank=0"}),
            "s.yaml: key 'compression.powersgd_rank': must be >= 1");
  EXPECT_EQ(error_of("", {"compression.topk_ratio=0"}),
            "s.yaml: key 'compression.topk_ratio': must be in (0, 1]");
  EXPECT_EQ(error_of("", {"compression.topk_ratio=1.5"}),
            "s.yaml: key 'compression.topk_ratio': must be in (0, 1]");
  EXPECT_EQ(error_of("", {"compression.start_step=-1"}),
            "s.yaml: key 'compression.start_step': must be >= 0");
  for (const std::string z : {"2", "3"}) {
    EXPECT_EQ(error_of("parallel:\n  dp: 2\n  zero: " + z + "\n  grad_compression: int8\n"),
              "s.yaml: key 'parallel.grad_compression': 'int8' compresses the dp all-reduce, "
              "which ZeRO stage " +
                  z + " replaces with a reduce-scatter: use parallel.zero 0 or 1, or none");
  }
  EXPECT_EQ(error_of("training:\n  micro_batch: 4\nparallel:\n  dp: 2\n  zero: 2\n  "
                     "grad_compression: none\n"),
            "");
}

// Issue 18 item 2's keys: runtime.precision by device, fp16's loss scaling, parallel.grad_dtype.
TEST(Scenario, MixedPrecisionKeysParseAndBadValuesNameTheKey) {
  const Scenario d = parse_scenario("", "s.yaml");
  EXPECT_EQ(d.runtime.precision, "fp32");
  EXPECT_EQ(d.parallel.grad_dtype, "fp32");
  EXPECT_EQ(d.training.loss_scale, 65536.0);
  EXPECT_EQ(d.training.loss_scale_window, 2000);
  const Scenario s = parse_scenario(
      "training:\n  loss_scale: 1024\n  loss_scale_window: 5\nparallel:\n  grad_dtype: "
      "fp16\nruntime:\n  precision: fp16\n",
      "s.yaml");
  EXPECT_EQ(precision_of(s.runtime), Precision::FP16);
  EXPECT_EQ(grad_dtype_of(s.parallel), Precision::FP16);
  EXPECT_EQ(s.training.loss_scale, 1024.0);
  EXPECT_EQ(parse_scenario(to_yaml(s), "again").training.loss_scale_window, 5);
  EXPECT_EQ(precision_of(parse_scenario("", "s", {"runtime.precision=bf16"}).runtime),
            Precision::BF16);
  EXPECT_EQ(error_of("", {"runtime.precision=tf32"}),
            "s.yaml: key 'runtime.precision': tf32 runs on device cuda only (device cpu: fp32, "
            "bf16 or fp16)");
  EXPECT_EQ(error_of("", {"runtime.precision=tf32", "runtime.device=cuda"}), "");
  EXPECT_EQ(error_of("", {"runtime.precision=fp16", "runtime.device=cuda"}),
            "s.yaml: key 'runtime.precision': fp16 runs on device cpu only (device cuda: fp32, "
            "tf32 or bf16)");
  EXPECT_EQ(error_of("", {"runtime.precision=FP16"}),
            "s.yaml: key 'runtime.precision': expected fp32, tf32, bf16 or fp16, got 'FP16'");
  EXPECT_EQ(error_of("", {"training.loss_scale=0"}),
            "s.yaml: key 'training.loss_scale': must be a finite number > 0");
  EXPECT_EQ(error_of("", {"training.loss_scale_window=0"}),
            "s.yaml: key 'training.loss_scale_window': must be >= 1");
  EXPECT_EQ(error_of("", {"parallel.grad_dtype=tf32"}),
            "s.yaml: key 'parallel.grad_dtype': expected fp32, bf16 or fp16, got 'tf32'");
  EXPECT_EQ(error_of("", {"parallel.grad_dtype=bf16", "runtime.device=cuda"}),
            "s.yaml: key 'parallel.grad_dtype': 16-bit gradient all-reduce runs on device cpu "
            "only");
  EXPECT_EQ(error_of("parallel:\n  dp: 2\n  grad_dtype: bf16\n  grad_compression: int8\n"),
            "s.yaml: key 'parallel.grad_dtype': 'bf16' needs parallel.grad_compression none (got "
            "'int8'): a compressed gradient is not sent in 16 bits");
  RuntimeConfig r;
  r.precision = "fp16";
  EXPECT_EQ(precision_of(r), Precision::FP16);
  ParallelConfig p;
  p.grad_dtype = "fp8";
  EXPECT_THROW(grad_dtype_of(p), InputError);
}

// parallel.pp_layers: a YAML sequence or, from --set, a comma string; validated against pp, the
// layers and the schedule, each refusal naming the key and the numbers.
TEST(Scenario, PpLayersParseFromYamlAndFromSet) {
  const std::string base = "model:\n  layers: 48\nparallel:\n  pp: 4\n";
  const Scenario y = parse_scenario(base + "  pp_layers: [11, 12, 12, 13]\n", "s.yaml");
  EXPECT_EQ(y.parallel.pp_layers, (std::vector<int>{11, 12, 12, 13}));
  const Scenario c = parse_scenario(base, "s.yaml", {"parallel.pp_layers=11,12,12,13"});
  EXPECT_EQ(c.parallel.pp_layers, (std::vector<int>{11, 12, 12, 13}));
  const Scenario f = parse_scenario(base, "s.yaml", {"parallel.pp_layers=[13, 12, 12, 11]"});
  EXPECT_EQ(f.parallel.pp_layers, (std::vector<int>{13, 12, 12, 11}));
  const Scenario spaced = parse_scenario(base, "s.yaml", {"parallel.pp_layers= 11, 12 ,12,13"});
  EXPECT_EQ(spaced.parallel.pp_layers, (std::vector<int>{11, 12, 12, 13}));
  EXPECT_TRUE(parse_scenario(base, "s.yaml").parallel.pp_layers.empty());  // default: even split
  // Back through the stored text and through to_yaml.
  EXPECT_EQ(parse_scenario(c.text, "again").parallel.pp_layers, c.parallel.pp_layers);
  EXPECT_EQ(parse_scenario(to_yaml(y), "r.yaml").parallel.pp_layers, y.parallel.pp_layers);
  EXPECT_TRUE(
      parse_scenario(to_yaml(parse_scenario(base, "s.yaml")), "r.yaml").parallel.pp_layers.empty());
  // pp_layers replaces the "layers divisible by pp" rule: 5 layers over 2 stages.
  const Scenario odd =
      parse_scenario("model:\n  layers: 5\nparallel:\n  pp: 2\n  pp_layers: [2, 3]\n", "s.yaml");
  EXPECT_EQ(odd.parallel.pp_layers, (std::vector<int>{2, 3}));
  EXPECT_NE(
      error_of("model:\n  layers: 5\nparallel:\n  pp: 2\n")
          .find("must be divisible by the number of pipeline stages (2), or give each stage's "
                "layers in parallel.pp_layers"),
      std::string::npos);
}

TEST(Scenario, PpLayersRefusedWithTheNumbers) {
  const std::string base = "model:\n  layers: 48\nparallel:\n  pp: 4\n";
  EXPECT_EQ(error_of(base, {"parallel.pp_layers=12,12,24"}),
            "s.yaml: key 'parallel.pp_layers': [12, 12, 24]: 3 entries, but dp=1 tp=1 pp=4 has 4 "
            "pipeline stages (one entry per stage)");
  EXPECT_EQ(error_of(base, {"parallel.pp_layers=11,12,12,12"}),
            "s.yaml: key 'parallel.pp_layers': [11, 12, 12, 12]: the stages hold 47 layers in all, "
            "but model.layers is 48");
  EXPECT_EQ(error_of(base, {"parallel.pp_layers=0,16,16,16"}),
            "s.yaml: key 'parallel.pp_layers': [0, 16, 16, 16]: stage 0 has 0 layers; every stage "
            "needs at least 1");
  EXPECT_EQ(
      error_of(base, {"parallel.pp_layers=-1,17,16,16"}),
      "s.yaml: key 'parallel.pp_layers': [-1, 17, 16, 16]: stage 0 has -1 layers; every stage "
      "needs at least 1");
  EXPECT_EQ(
      error_of(base +
               "  schedule: interleaved\n  virtual_stages: 2\n  pp_layers: [12, 12, 12, 12]\n"),
      "s.yaml: key 'parallel.pp_layers': [12, 12, 12, 12]: the interleaved schedule cuts the "
      "layers into pp x virtual_stages equal chunks and cannot take layers per stage; use "
      "schedule gpipe or 1f1b with pp_layers, or leave pp_layers empty");
  EXPECT_EQ(error_of(base + "  pp_layers: 11,x,12,13\n"),
            "s.yaml:5: key 'parallel.pp_layers': expected a list of integers ([11, 12, 12, 13], or "
            "11,12,12,13 on the command line), got '11,x,12,13'");
  EXPECT_NE(
      error_of(base + "  pp_layers: [11, [12], 12, 13]\n").find("expected a list of integers"),
      std::string::npos);
  EXPECT_NE(error_of(base + "  pp_layers: {a: 1}\n")
                .find("key 'parallel.pp_layers': expected a list of integers"),
            std::string::npos);
  EXPECT_NE(error_of(base, {"parallel.pp_layers=11,,12,13"}).find("expected a list of integers"),
            std::string::npos);
}

TEST(Scenario, MalformedYamlAndMissingFile) {
  EXPECT_NE(error_of("model: [1, 2\n").find("s.yaml:"), std::string::npos);
  EXPECT_NE(error_of("model: [1, 2\n").find("malformed YAML"), std::string::npos);
  try {
    load_scenario("/nonexistent/x.yaml");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "/nonexistent/x.yaml: cannot open scenario file (no such file)");
  }
}

TEST(Scenario, RoundTripsThroughYaml) {
  Scenario s = parse_scenario(
      "model:\n  layers: 8\nparallel:\n  dp: 2\n  bucket_mb: 4.5\ntraining:\n  global_batch: 16\n",
      "s.yaml");
  const Scenario r = parse_scenario(to_yaml(s), "r.yaml");
  EXPECT_EQ(r.model.layers, 8);
  EXPECT_EQ(r.parallel.dp, 2);
  EXPECT_DOUBLE_EQ(r.parallel.bucket_mb, 4.5);
  EXPECT_EQ(r.training.global_batch, 16);
}

// Inputs found by fuzz/fuzz_scenario (fuzz/README.md): each was an uncaught YAML exception.
TEST(Scenario, FuzzFindingsAreInputErrors) {
  // --set into a section that the file gives as a scalar (was YAML::BadSubscript).
  EXPECT_EQ(
      error_of("parallel: 3\n", {"parallel.dp=2"}),
      "--set 'parallel.dp=2': key 'parallel' in the scenario is not a section (a map of keys)");
  // A key that is a list (was YAML::TypedBadConversion).
  EXPECT_NE(error_of("? [a, b]\n: 1\n").find("a key must be a name, not a list or map"),
            std::string::npos);
  EXPECT_NE(error_of("model:\n  ? {x: 1}\n  : 2\n").find("s.yaml:2: key 'model'"),
            std::string::npos);
}

}  // namespace orrery

namespace orrery {
// Issue 19's keys: model.moe.* and parallel.ep, each bad value naming its key.
TEST(Scenario, MoeKeysParseAndBadValuesNameTheKey) {
  const Scenario d = parse_scenario("", "s.yaml");
  EXPECT_FALSE(d.model.moe.enabled());
  EXPECT_EQ(d.parallel.ep, 1);
  const std::string moe =
      "training:\n  global_batch: 8\n  micro_batch: 2\nmodel:\n  moe:\n    experts: 8\n    "
      "top_k: 2\n    every: 2\n    expert_ffn_hidden: 512\n    shared_experts: 1\n    "
      "capacity_factor: 1.25\n    aux_loss_coef: 0.02\nparallel:\n  dp: 4\n  ep: 2\n";
  const Scenario s = parse_scenario(moe, "s.yaml");
  EXPECT_EQ(s.model.moe.experts, 8);
  EXPECT_EQ(s.model.moe.every, 2);
  EXPECT_EQ(s.model.moe.expert_ffn_hidden, 512);
  EXPECT_EQ(s.model.moe.shared_experts, 1);
  EXPECT_DOUBLE_EQ(s.model.moe.capacity_factor, 1.25);
  EXPECT_DOUBLE_EQ(s.model.moe.aux_loss_coef, 0.02);
  EXPECT_EQ(s.parallel.ep, 2);
  const Scenario again = parse_scenario(to_yaml(s), "again");
  EXPECT_EQ(again.model.moe.experts, 8);
  EXPECT_EQ(again.parallel.ep, 2);
  EXPECT_EQ(error_of(moe, {"model.moe.top_k=9"}),
            "s.yaml: key 'model.moe.top_k': must be between 1 and model.moe.experts (8), got 9");
  EXPECT_EQ(error_of(moe, {"model.moe.capacity_factor=-0.5"}),
            "s.yaml: key 'model.moe.capacity_factor': must be >= 0 (0: dropless), got -0.5");
  EXPECT_EQ(error_of(moe, {"parallel.ep=3"}),
            "s.yaml: key 'parallel.ep': dp=4 tp=1 pp=1 ep=3: ep must divide dp: the experts are "
            "sharded over ep consecutive ranks of the data-parallel group");
  EXPECT_EQ(error_of(moe, {"model.moe.experts=6", "parallel.ep=4"}),
            "s.yaml: key 'parallel.ep': dp=4 tp=1 pp=1 ep=4: model.moe.experts (6) must be "
            "divisible by ep, each rank holding experts / ep whole experts");
  EXPECT_EQ(error_of("", {"parallel.ep=2"}),
            "s.yaml: key 'parallel.ep': expert parallelism shards the experts of model.moe, but "
            "model.moe.experts is 0 (a dense model): set model.moe.experts or use ep 1");
  EXPECT_NE(error_of(moe, {"training.recompute=full"}).find("key 'training.recompute'"),
            std::string::npos);
  EXPECT_EQ(error_of(moe, {"training.recompute=selective"}), "");
  // model.moe.first_dense: the leading dense blocks (4 layers by default, every 2: MoE blocks 0, 2).
  EXPECT_EQ(parse_scenario(moe, "s.yaml", {"model.moe.first_dense=1"}).model.moe.first_dense, 1);
  EXPECT_EQ(error_of(moe, {"model.moe.first_dense=-1"}),
            "s.yaml: key 'model.moe.first_dense': must be >= 0 (the number of leading dense "
            "blocks), got -1");
  EXPECT_EQ(error_of(moe, {"model.moe.first_dense=3"}),
            "s.yaml: key 'model.moe.first_dense': leaves no MoE block: blocks 3..3 of "
            "model.layers 4 hold none with l % model.moe.every (2) == 0; lower it or set "
            "model.moe.experts 0");
}
}  // namespace orrery

namespace orrery {
// NVMe offload takes MoE blocks (the experts' moments follow the dense shard's in the file).
TEST(Scenario, MoeWithOffloadIsAccepted) {
  const std::string moe =
      "model:\n  moe:\n    experts: 4\nparallel:\n  dp: 2\n  ep: 2\n  zero: 3\ntraining:\n  "
      "micro_batch: 4\n";
  EXPECT_EQ(error_of(moe), "");
  EXPECT_EQ(error_of(moe, {"zero.offload_optimizer=nvme", "zero.nvme_path=/tmp"}), "");
  EXPECT_EQ(error_of(moe, {"zero.offload_optimizer=nvme", "zero.offload_params=nvme",
                           "zero.nvme_path=/tmp"}),
            "");
}
}  // namespace orrery

namespace orrery {
// zero.overlap_grad_reduce / overlap_param_gather: defaults off; on with ZeRO 1/2 only; every
// combination they do not cover refused naming the key.
TEST(Scenario, ZeroOverlapKeysAndTheirRefusals) {
  const std::string z1 = "parallel:\n  dp: 2\n  zero: 1\ntraining:\n  micro_batch: 4\n";
  const Scenario off = parse_scenario(z1, "s.yaml");
  EXPECT_FALSE(off.zero.overlap_grad_reduce);
  EXPECT_FALSE(off.zero.overlap_param_gather);
  const std::vector<std::string> on{"zero.overlap_grad_reduce=true",
                                    "zero.overlap_param_gather=true"};
  const Scenario s = parse_scenario(z1, "s.yaml", on);
  EXPECT_TRUE(s.zero.overlap_grad_reduce);
  EXPECT_TRUE(s.zero.overlap_param_gather);
  EXPECT_EQ(error_of(z1, {"zero.overlap_grad_reduce=true", "parallel.zero=2"}), "");
  auto refused = [&](std::vector<std::string> sets, const std::string& key) {
    for (const auto& o : on) sets.insert(sets.begin(), o);
    const std::string e = error_of(z1, sets);
    EXPECT_NE(e.find("key '" + key + "'"), std::string::npos) << e;
  };
  refused({"parallel.zero=0"}, "zero.overlap_grad_reduce");
  refused({"parallel.zero=3"}, "zero.overlap_grad_reduce");
  refused({"parallel.grad_compression=int8"}, "zero.overlap_grad_reduce");
  refused({"model.moe.experts=4"}, "zero.overlap_grad_reduce");
  refused({"zero.offload_optimizer=nvme", "zero.nvme_path=/tmp"}, "zero.overlap_grad_reduce");
  refused({"parallel.tp=2", "model.heads=2", "model.kv_heads=1"}, "zero.overlap_grad_reduce");
  refused({"zero.overlap_grad_reduce=false"}, "zero.overlap_param_gather");
  EXPECT_NE(error_of(z1, {"zero.overlap_param_gather=yes please"})
                .find("key 'zero.overlap_param_gather'"),
            std::string::npos);
}
}  // namespace orrery
