// Memory estimate: ZeRO model-state formulas exactly, Korthikanti's activation formula, micro-batches
// in flight per schedule, and the fits check.
#include <gtest/gtest.h>

#include <string>

#include "orrery/common/error.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/memory.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim {
namespace {

TEST(Memory, ZeroStagesMixedPrecision) {
  // Rajbhandari et al.: Ψ parameters, N = 8, K = 12: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N.
  const double psi = 7.5e9, n = 8;
  const auto p = precision_config("mixed");
  auto total = [&](int z) {
    const auto m = model_state_bytes(psi, z, int(n), p);
    return m.parameters + m.gradients + m.optimizer;
  };
  EXPECT_EQ(total(0), 16 * psi);
  EXPECT_EQ(total(1), 4 * psi + 12 * psi / n);
  EXPECT_EQ(total(2), 2 * psi + 14 * psi / n);
  EXPECT_EQ(total(3), 16 * psi / n);
  // The paper's example: 7.5B parameters, N = 64, stage 3: 120 GB / 64 = 1.875 GB.
  EXPECT_EQ(model_state_bytes(psi, 3, 64, p).parameters +
                model_state_bytes(psi, 3, 64, p).gradients +
                model_state_bytes(psi, 3, 64, p).optimizer,
            1.875e9);
}

TEST(Memory, ZeroStagesFp32) {
  const double psi = 1e6;
  const auto p = precision_config("fp32");
  const auto z0 = model_state_bytes(psi, 0, 4, p);
  EXPECT_EQ(z0.parameters, 4 * psi);
  EXPECT_EQ(z0.gradients, 4 * psi);
  EXPECT_EQ(z0.optimizer, 8 * psi);
  const auto z2 = model_state_bytes(psi, 2, 4, p);
  EXPECT_EQ(z2.parameters, 4 * psi);
  EXPECT_EQ(z2.gradients, psi);
  EXPECT_EQ(z2.optimizer, 2 * psi);
}

TEST(Memory, ActivationsKorthikanti) {
  // GPT-3 175B, b = 1, t = 1: s·b·h·(34 + 5·a·s/h) bytes per layer in 16-bit.
  Scenario s = testing::gpt3_175b(8);
  s.parallel.tp = 1;
  const double sbh = 2048.0 * 1 * 12288;
  EXPECT_EQ(activation_bytes_per_layer(s, precision_config("mixed")),
            sbh * (34 + 5.0 * 96 * 2048 / 12288));
  EXPECT_EQ(activation_bytes_per_layer(s, precision_config("fp32")),
            2 * sbh * (34 + 5.0 * 96 * 2048 / 12288));
  // With tp = 8 and sequence parallelism every term is divided by tp.
  s.parallel.tp = 8;
  s.parallel.sequence_parallel = true;
  EXPECT_EQ(activation_bytes_per_layer(s, precision_config("mixed")),
            sbh * (34 + 5.0 * 96 * 2048 / 12288) / 8);
  // Plain tensor parallelism keeps the LayerNorm and dropout regions' 10·s·b·h replicated.
  s.parallel.sequence_parallel = false;
  EXPECT_EQ(activation_bytes_per_layer(s, precision_config("mixed")),
            sbh * (10 + 24.0 / 8 + 5.0 * 96 * 2048 / (12288 * 8)));
}

// The same derivation for Llama-style blocks (memory.cpp's layer_terms): r = kv_heads/heads,
// f = F/h, SwiGLU (u = 2), no dropout: s·b·h·(8 + (4 + 4r + 2uf + 2f)/t + 2·a·s/(h·t)).
TEST(Memory, ActivationsOfLlamaBlocks) {
  Scenario s;
  s.model.layers = 32;
  s.model.d_model = 4096;
  s.model.heads = 32;
  s.model.vocab = 128256;
  s.model.seq = 8192;
  s.model.kv_heads = 8;  // Llama-3 8B (arXiv 2407.21783, table 3)
  s.model.ffn_hidden = 14336;
  s.model.activation = "swiglu";
  s.model.norm = "rmsnorm";
  s.model.position = "rope";
  s.model.tied_embeddings = false;
  s.model.bias = false;
  s.training.micro_batch = 1;
  s.training.global_batch = 1;
  const auto p = precision_config("mixed");
  const double sbh = 8192.0 * 4096;
  // r = 1/4, f = 3.5: 4 + 1 + 14 + 7 = 26 divided, 8 replicated; core 2·32·8192/4096 = 128.
  EXPECT_EQ(activation_bytes_per_layer(s, p), sbh * (8 + 26 + 128));
  s.parallel.tp = 4;
  EXPECT_EQ(activation_bytes_per_layer(s, p), sbh * (8 + 26.0 / 4 + 128.0 / 4));
  s.parallel.sequence_parallel = true;
  EXPECT_EQ(activation_bytes_per_layer(s, p), sbh * (34.0 / 4 + 128.0 / 4));
  s.training.recompute = "selective";
  EXPECT_EQ(activation_bytes_per_layer(s, p), sbh * 34.0 / 4);
  // 2 kv heads over tp 4: each rank keeps one (replicated) head's k and v, as 4 heads over 4
  // would: r = 4/32 (divided 4 + 0.5 + 14 + 7 = 25.5), against 2/32 unreplicated.
  s.training.recompute = "none";
  s.parallel.sequence_parallel = false;
  s.model.kv_heads = 2;
  EXPECT_EQ(activation_bytes_per_layer(s, p), sbh * (8 + 25.5 / 4 + 128.0 / 4));
  s.model.kv_heads = 4;
  EXPECT_EQ(activation_bytes_per_layer(s, p), sbh * (8 + 25.5 / 4 + 128.0 / 4));
  s.model.kv_heads = 8;
  // Without grouped-query attention (Llama-2 7B's MLP, F = 11008): r = 1, f = 2.6875.
  s.model.kv_heads = 0;
  s.model.ffn_hidden = 11008;
  s.parallel.tp = 1;
  s.parallel.sequence_parallel = false;
  s.training.recompute = "none";
  EXPECT_EQ(activation_bytes_per_layer(s, p), sbh * (8 + 24.125 + 128));
}

// Korthikanti et al. 2022, Table 2: selective recomputation drops the 5·a·s/h term, full keeps
// 2·s·b·h (the layer's input); sequence parallelism divides what is left by t. Recomputation adds
// its workspace once per rank: one layer without recomputation (full), one attention core
// (selective).
TEST(Memory, ActivationsWithRecomputation) {
  Scenario s = testing::gpt3_175b(8);
  const double sbh = 2048.0 * 1 * 12288, core = 5.0 * 96 * 2048 / (12288 * 8);
  const auto p = precision_config("mixed");
  s.training.recompute = "selective";
  EXPECT_EQ(activation_bytes_per_layer(s, p), sbh * (10 + 24.0 / 8));
  EXPECT_EQ(recompute_workspace_bytes(s, p), sbh * core);
  s.parallel.sequence_parallel = true;
  EXPECT_EQ(activation_bytes_per_layer(s, p), sbh * 34 / 8);
  s.training.recompute = "full";
  EXPECT_EQ(activation_bytes_per_layer(s, p), sbh * 2 / 8);
  EXPECT_EQ(recompute_workspace_bytes(s, p), sbh * (34.0 / 8 + core));
  s.parallel.sequence_parallel = false;
  EXPECT_EQ(activation_bytes_per_layer(s, p), sbh * 2);
  EXPECT_EQ(recompute_workspace_bytes(s, p), sbh * (10 + 24.0 / 8 + core));
  s.training.recompute = "none";
  EXPECT_EQ(recompute_workspace_bytes(s, p), 0);
  // A stage's estimate: in flight × layers × per layer + the workspace (+ embedding, logits).
  s.training.recompute = "full";
  const auto e = estimate_memory(s, p, 0);
  EXPECT_EQ(e[5].activations_bytes, 11 * 6 * sbh * 2 + sbh * (10 + 24.0 / 8 + core));
  s.training.recompute = "sometimes";
  EXPECT_THROW(activation_bytes_per_layer(s, p), InputError);
}

// The layouts Megatron-LM trains these models with on A100-80GB (Korthikanti et al. 2022, Table 3:
// tp 8, pp 8 / 35 / 64, micro-batch 1, dp 1) fit with full recomputation and do not without it.
// Stage 0 holds pp micro-batches in flight (1F1B), each layer's input 2·s·b·h bytes, plus one
// layer's workspace and the embedding output; model states 16 bytes per parameter.
TEST(Memory, MegatronLayoutsFitOnlyWithRecomputation) {
  struct Want {
    const char* file;
    double h, a, layers, pp;
  };
  for (const Want& w :
       {Want{"gpt3-175b.yaml", 12288, 96, 96, 8}, Want{"mt-nlg-530b.yaml", 20480, 128, 105, 35},
        Want{"gpt-1t.yaml", 25600, 160, 128, 64}}) {
    Scenario s = load_scenario(std::string(ORRERY_SOURCE_DIR) + "/scenarios/megatron/" + w.file);
    ASSERT_EQ(s.training.recompute, "full") << w.file;
    const auto p = precision_config("mixed");
    const int64_t a100 = device_preset("A100-SXM-80GB")->mem_capacity_bytes;
    const auto e = estimate_memory(s, p, a100);
    const double sbh = 2048.0 * w.h, per_stage = w.layers / w.pp;
    const double workspace = sbh * (10 + 24.0 / 8 + 5 * w.a * 2048 / (w.h * 8));
    EXPECT_EQ(e[0].micro_batches_in_flight, int(w.pp)) << w.file;
    EXPECT_DOUBLE_EQ(e[0].activations_bytes, w.pp * (per_stage * 2 * sbh + 2 * sbh) + workspace)
        << w.file;
    for (const auto& x : e) {
      EXPECT_TRUE(x.fits) << w.file << " stage " << x.stage << ": " << x.total_bytes / 1e9 << " GB";
      EXPECT_EQ(x.total_bytes,
                x.parameters_bytes + x.gradients_bytes + x.optimizer_bytes + x.activations_bytes);
    }
    s.training.recompute = "none";
    EXPECT_FALSE(estimate_memory(s, p, a100)[0].fits) << w.file << " fits without recomputation";
  }
}

// parallel.vocab_parallel: stage 0 holds V/tp rows of wte (the whole wpe), the last stage V/tp of
// its wte copy and of the fp32 logits and their gradient; the stages between are unchanged.
TEST(Memory, VocabParallelSplitsEmbeddingAndLogits) {
  Scenario s = load_scenario(std::string(ORRERY_SOURCE_DIR) + "/scenarios/megatron/gpt3-175b.yaml");
  s.parallel.vocab_parallel = false;
  const auto p = precision_config("mixed");
  const auto whole = estimate_memory(s, p, 0);
  s.parallel.vocab_parallel = true;
  const auto split = estimate_memory(s, p, 0);
  const double wte = 51200.0 * 12288, tp = 8;
  EXPECT_EQ(double(whole[0].param_count - split[0].param_count), wte - wte / tp);
  EXPECT_EQ(double(whole[7].param_count - split[7].param_count), wte - wte / tp);
  EXPECT_EQ(whole[3].param_count, split[3].param_count);
  const double logits = 1.0 * 2048 * 51200 * 4.0 * 2.0;
  EXPECT_DOUBLE_EQ(whole[7].activations_bytes - split[7].activations_bytes, logits - logits / tp);
  EXPECT_DOUBLE_EQ(whole[0].activations_bytes, split[0].activations_bytes);
  s.model.vocab = 51201;
  EXPECT_THROW(validate_layout(s), InputError);
}

TEST(Memory, MicroBatchesInFlight) {
  Scenario s = testing::small_scenario(8, 1, 1, 4, 8, "1f1b");
  auto e = estimate_memory(s, precision_config("fp32"), 0);
  ASSERT_EQ(e.size(), 4u);
  for (int st = 0; st < 4; ++st) EXPECT_EQ(e[st].micro_batches_in_flight, 4 - st);
  s.parallel.schedule = "gpipe";
  e = estimate_memory(s, precision_config("fp32"), 0);
  for (int st = 0; st < 4; ++st) EXPECT_EQ(e[st].micro_batches_in_flight, 8);
  // Middle stage: activations = in flight × layers per stage × per-layer bytes.
  EXPECT_EQ(e[1].activations_bytes,
            8 * 2 * activation_bytes_per_layer(s, precision_config("fp32")));
  EXPECT_TRUE(e[1].fits);  // capacity 0: unknown
}

// parallel.pp_layers: each stage's activations count its own blocks, its parameters its own
// tensors; the even split's total is the same.
TEST(Memory, UnevenStagesCountTheirOwnLayers) {
  Scenario s = testing::small_scenario(8, 1, 1, 4, 8, "1f1b");
  s.parallel.pp_layers = {1, 2, 2, 3};
  const PrecisionConfig fp32 = precision_config("fp32");
  const auto e = estimate_memory(s, fp32, 0);
  ASSERT_EQ(e.size(), 4u);
  const double per_layer = activation_bytes_per_layer(s, fp32);
  const double sbh2 = 128.0 * 2 * 256 * 2;         // stage 0's embedding output
  const double logits = 2.0 * 128 * 1024 * 4 * 2;  // the last stage's logits and their gradient
  const int64_t block_params = 12LL * 256 * 256 + 13LL * 256;
  for (int st = 0; st < 4; ++st) {
    EXPECT_EQ(e[st].layers, s.parallel.pp_layers[size_t(st)]);
    const double want =
        (per_layer * s.parallel.pp_layers[size_t(st)] + (st == 0 ? sbh2 : 0.0)) * (4 - st) +
        (st == 3 ? logits : 0.0);
    EXPECT_DOUBLE_EQ(e[st].activations_bytes, want) << st;
  }
  // Middle stages hold blocks only: parameters = blocks x the block's.
  EXPECT_EQ(e[1].param_count, 2 * block_params);
  EXPECT_EQ(e[2].param_count, 2 * block_params);
  s.parallel.pp_layers.clear();
  const auto even = estimate_memory(s, fp32, 0);
  EXPECT_EQ(even[1].layers, 2);
  EXPECT_EQ(even[1].param_count, e[1].param_count);
  EXPECT_DOUBLE_EQ(even[3].activations_bytes, (per_layer * 2) * 1 + logits);
}

// Interleaved 1F1B (v chunks of per_stage / v layers): stage s holds its warm-up forwards plus one,
// min(2(p-s-1) + (v-1)p + 1, m·v) chunk passes, at the peak (Narayanan et al. 2021: more in flight
// than 1F1B's p - s, each a v-th of a stage). p = 4, v = 2, m = 8, 16 layers (2 per chunk).
TEST(Memory, InterleavedChunksInFlight) {
  Scenario s = testing::small_scenario(16, 1, 1, 4, 8, "interleaved");
  s.parallel.virtual_stages = 2;
  const auto p = precision_config("fp32");
  const auto e = estimate_memory(s, p, 0);
  ASSERT_EQ(e.size(), 4u);
  const double chunk = 2 * activation_bytes_per_layer(s, p);  // 16 / (4 · 2) layers
  for (int st = 1; st < 4; ++st) {  // stage 0 adds the embedding output to its chunk-0 passes
    const int passes = std::min(2 * (4 - st - 1) + 4 + 1, 16);
    EXPECT_EQ(e[st].activations_bytes - (st == 3 ? 2.0 * 128 * 1024 * 4 * 2 : 0.0), passes * chunk)
        << st;
    EXPECT_EQ(e[st].micro_batches_in_flight, (passes + 1) / 2) << st;
  }
  // Stage 0: 11 chunk passes; 1F1B would hold 4 whole stages (8 chunks' worth).
  EXPECT_EQ(e[0].micro_batches_in_flight, 6);
  EXPECT_GT(e[0].activations_bytes, 11 * chunk);
  s.parallel.schedule = "1f1b";
  EXPECT_GT(e[0].activations_bytes, estimate_memory(s, p, 0)[0].activations_bytes);
}

TEST(Memory, Gpt3FitsOnlyWhenSharded) {
  // tp 8, pp 16 on 80 GB: 6 layers of 12·12288²/8 ≈ 1.36B parameters per rank; mixed precision
  // 16 bytes each = 21.7 GB of states, plus up to 16 micro-batches of activations on stage 0.
  const auto p = precision_config("mixed");
  const Scenario s = testing::gpt3_175b(8);
  const auto e = estimate_memory(s, p, 80'000'000'000);
  EXPECT_EQ(e[5].param_count, 6 * (12LL * 12288 * 12288 / 8 + 7 * 12288 / 8 + 6 * 12288));
  EXPECT_EQ(e[5].micro_batches_in_flight, 11);
  for (const auto& x : e)
    EXPECT_EQ(x.total_bytes,
              x.parameters_bytes + x.gradients_bytes + x.optimizer_bytes + x.activations_bytes);
  // The same model on tp 1, pp 1 does not fit one GPU.
  Scenario one = s;
  one.parallel.tp = 1, one.parallel.pp = 1, one.parallel.dp = 1;
  const auto e1 = estimate_memory(one, p, 80'000'000'000);
  EXPECT_FALSE(e1[0].fits);
}

}  // namespace
}  // namespace orrery::sim
