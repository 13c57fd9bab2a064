// Model FLOPs of the reference GPT (shared/reference/gpt.md), per piece of work, as the runtime
// reports them in its spans (OpObserver) and as the simulator's cost model must count them.
// Part of the one model description (model/): the runtime and the simulator both include it.
//
// Counting (gpt.md, Kaplan et al. 2020): per token, forward = 2 * (parameters touched by a
// matrix-vector product or an elementwise affine: weights, biases, LayerNorm gains and shifts)
// + 2 * T * C per layer for attention (scores and weighted sum, the causal count) + 2 * C * V for
// the tied LM head. Embedding lookups, softmax, GELU and the loss count as zero. Backward = 2 x
// forward, piece by piece. The attention term is the model-FLOPs count; the CPU kernels compute the
// full T x T score matrix with sgemm, so they execute about 2 * T * C per layer more than counted.
//
// Tensor parallelism with tp slices: a block's weights, biases and attention heads are divided
// over the tp ranks, so every block term is divided by tp (the replicated LayerNorms and
// row-parallel biases are counted as divided too: a simplification worth < 0.1 %). The head is not
// sliced.
//
// Per block, per token (tp = 1):
//   attention part  = 2 * (C*3C + 3C  +  C*C + C  +  2C)  + 2*T*C     (qkv, proj, ln1)
//   mlp part        = 2 * (C*4C + 4C  +  4C*C + C  +  2C)             (fc1, fc2, ln2)
//   block           = attention part + mlp part = 2 * (12C^2 + 13C) + 2*T*C
// Head, per token   = 2 * 2C + 2*C*V                                    (final LayerNorm, LM head)
#pragma once

#include <algorithm>
#include <cstdint>

#include "orrery/common/scenario.hpp"

namespace orrery::model::flops {

using ::orrery::BlockArch;
using ::orrery::ModelConfig;

struct Dims {
  int64_t batch = 1;    // B, sequences in the micro-batch
  int64_t seq = 1;      // T
  int64_t d_model = 1;  // C
  int64_t vocab = 1;    // V
  int64_t tp = 1;       // tensor-parallel slices of each block
  // Llama-style blocks (common/scenario.hpp's BlockArch); the defaults are GPT's.
  // Key/value channels, kv_heads x head size; 0 = d_model (multi-head). Under tp with fewer kv
  // heads than ranks each rank computes one replicated head, so dims_of makes it tp x head size
  // (every rank's kv_width / tp is the work it does).
  int64_t kv_width = 0;
  int64_t ffn = 0;       // MLP width F; 0 = 4 d_model
  bool swiglu = false;   // fc1 is [gate | up], 2F outputs, and the activation multiplies them
  bool rmsnorm = false;  // norms have a gain only
  bool bias = true;      // biases in the linear layers and norms
};
// Dims of a micro-batch of `batch` sequences of `seq` tokens under tp, for the scenario's block.
inline Dims dims_of(const BlockArch& a, int64_t batch, int64_t seq, int64_t d_model, int64_t heads,
                    int64_t vocab, int64_t tp) {
  Dims d{batch, seq, d_model, vocab, tp};
  const BlockArch r = a.resolve(static_cast<int>(heads), static_cast<int>(d_model));
  d.kv_width = std::max<int64_t>(r.kv_heads, tp) * (d_model / heads);
  d.ffn = r.ffn_hidden;
  d.swiglu = a.swiglu();
  d.rmsnorm = a.rmsnorm();
  d.bias = a.bias;
  return d;
}
// The same for a scenario's model (model.* keys; block_arch resolves the block).
inline Dims dims_of(const ModelConfig& m, int64_t batch, int64_t tp = 1) {
  return dims_of(block_arch(m), batch, m.seq, m.d_model, m.heads, m.vocab, tp);
}
inline double kv_width(const Dims& d) {
  return static_cast<double>(d.kv_width > 0 ? d.kv_width : d.d_model);
}
inline double ffn(const Dims& d) { return static_cast<double>(d.ffn > 0 ? d.ffn : 4 * d.d_model); }

inline double tokens(const Dims& d) {
  return static_cast<double>(d.batch) * static_cast<double>(d.seq);
}

// Forward FLOPs of one BlockOp (model/block.hpp's order; the counting above, every term divided by
// tp), per token with b = 1 when the block has biases, else 0, Ckv the key/value width, F the MLP
// width, m = 2 for SwiGLU (gate and up) else 1:
//   Ln 2·2C (LayerNorm with bias) or 2·C (RMSNorm, or no bias), Qkv 2·(C·(C + 2Ckv) + b(C + 2Ckv)),
//   Attention 2·T·C, Proj 2·(C·C + bC), Fc1 2·m·(F·C + bF), Fc2 2·(F·C + bC); residual adds and the
//   activation 0. GPT's block (Ckv = C, F = 4C, m = 1, b = 1): Ln 4C, Qkv 2(3C² + 3C), Proj
//   2(C² + C), Fc1 2(4C² + 4C), Fc2 2(4C² + C). They sum to block_forward.
inline double block_op_forward(const Dims& d, int op) {
  const double c = static_cast<double>(d.d_model), t = static_cast<double>(d.seq);
  const double b = d.bias ? 1.0 : 0.0, kv = kv_width(d), f = ffn(d), m = d.swiglu ? 2.0 : 1.0;
  double per_token = 0;
  switch (op) {
    case 0:  // Ln1
    case 5:  // Ln2
      per_token = 2.0 * c * (!d.rmsnorm && d.bias ? 2.0 : 1.0);
      break;
    case 1:
      per_token = 2.0 * (c * (c + 2.0 * kv) + b * (c + 2.0 * kv));
      break;
    case 2:
      per_token = 2.0 * t * c;
      break;
    case 3:
      per_token = 2.0 * (c * c + b * c);
      break;
    case 6:
      per_token = 2.0 * m * (f * c + b * f);
      break;
    case 8:
      per_token = 2.0 * (f * c + b * c);
      break;
    default:
      per_token = 0.0;  // residual adds, the activation
  }
  return tokens(d) * per_token / static_cast<double>(d.tp);
}
// The FLOPs of BlockOps [begin, end), forward, or backward (2x).
inline double block_ops_flops(const Dims& d, bool forward, int begin, int end) {
  double f = 0;
  for (int op = begin; op < end; ++op) f += block_op_forward(d, op);
  return forward ? f : 2.0 * f;
}

// Forward of the attention half of one block: ln1, qkv, attention, output projection.
inline double block_attention_forward(const Dims& d) { return block_ops_flops(d, true, 0, 4); }
// Forward of the MLP half of one block: ln2, fc1, the activation, fc2.
inline double block_mlp_forward(const Dims& d) { return block_ops_flops(d, true, 4, 10); }
inline double block_forward(const Dims& d) {
  return block_attention_forward(d) + block_mlp_forward(d);
}
inline double block_backward(const Dims& d) { return 2.0 * block_forward(d); }

// The FLOPs a block's span carries, as the runtime records them and the simulator's ops carry
// them: the whole block at tp = 1 (pieces = 1), else piece k of the three tensor-parallel pieces
// (model/block.hpp's cut): forward attention, mlp, 0; backward 2·mlp, 2·attention, 0 (the MLP
// half's backward runs first).
inline double block_piece(const Dims& d, bool forward, int piece, int pieces) {
  if (pieces == 1) return forward ? block_forward(d) : block_backward(d);
  if (piece == 0) return forward ? block_attention_forward(d) : 2.0 * block_mlp_forward(d);
  if (piece == 1) return forward ? block_mlp_forward(d) : 2.0 * block_attention_forward(d);
  return 0.0;
}

// Activation recomputation (model/block.hpp), the FLOPs its spans carry (executed work, which the
// model FLOPs of MFU exclude): full, piece k of `pieces` (1 at tp = 1, else 2: the attention half,
// then ln2, fc1 and GELU, i.e. the MLP half less fc2's 2·(4C·C + C) per token); selective, the
// attention core 2·T·C per token.
inline double recompute_block_piece(const Dims& d, int piece, int pieces) {
  const double mlp_less_fc2 = block_ops_flops(d, true, 5, 8);
  if (pieces == 1) return block_attention_forward(d) + mlp_less_fc2;
  return piece == 0 ? block_attention_forward(d) : mlp_less_fc2;
}
inline double recompute_attention(const Dims& d) {
  return tokens(d) * 2.0 * static_cast<double>(d.seq) * static_cast<double>(d.d_model) /
         static_cast<double>(d.tp);
}

// Token + position embedding lookup: counted as zero.
inline double embed_forward(const Dims&) { return 0.0; }
inline double embed_backward(const Dims&) { return 0.0; }

// Final norm + LM head, tied or not (+ cross-entropy, counted as zero).
inline double head_forward(const Dims& d) {
  const double c = static_cast<double>(d.d_model), v = static_cast<double>(d.vocab);
  return tokens(d) * (2.0 * c * (!d.rmsnorm && d.bias ? 2.0 : 1.0) + 2.0 * c * v);
}
// Its two parts: the final norm (over this rank's 1/tp of the tokens under sequence
// parallelism, which splits the head's spans there) and the LM head.
inline double head_norm_forward(const Dims& d, bool sequence_parallel) {
  return tokens(d) * 2.0 * static_cast<double>(d.d_model) * (!d.rmsnorm && d.bias ? 2.0 : 1.0) /
         (sequence_parallel ? static_cast<double>(d.tp) : 1.0);
}
inline double head_lm_forward(const Dims& d) {
  return tokens(d) * 2.0 * static_cast<double>(d.d_model) * static_cast<double>(d.vocab);
}
inline double head_backward(const Dims& d) { return 2.0 * head_forward(d); }

// Whole model, forward + backward, for `layers` blocks (tp = 1 gives gpt.md's 3 x forward).
inline double model_forward(const Dims& d, int64_t layers) {
  return static_cast<double>(layers) * block_forward(d) + head_forward(d);
}
inline double model_step(const Dims& d, int64_t layers) { return 3.0 * model_forward(d, layers); }

// Parameters of one block of the full model (Dims at tp = 1), for the block they describe: two norms,
// qkv, proj, fc1 (two matrices for SwiGLU), fc2, with their biases when the block has them.
inline int64_t params_per_block(const Dims& d) {
  const int64_t c = d.d_model, kv = d.kv_width > 0 ? d.kv_width : c;
  const int64_t f = d.ffn > 0 ? d.ffn : 4 * c, m = d.swiglu ? 2 : 1, b = d.bias ? 1 : 0;
  const int64_t norms = 2 * c * (!d.rmsnorm && d.bias ? 2 : 1);
  return norms + c * (c + 2 * kv) + b * (c + 2 * kv) + c * c + b * c + m * (f * c + b * f) + f * c +
         b * c;
}
// Parameter counts (for MFU and memory): non-embedding = L * (12C^2 + 13C) + 2C; embedding = V*C + T*C.
inline int64_t params_non_embedding(int64_t layers, int64_t c) {
  return layers * (12 * c * c + 13 * c) + 2 * c;
}
inline int64_t params_embedding(int64_t vocab, int64_t seq, int64_t c) {
  return vocab * c + seq * c;
}

}  // namespace orrery::model::flops
