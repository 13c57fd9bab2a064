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

#include <cstdint>

namespace orrery::model::flops {

struct Dims {
  int64_t batch = 1;    // B, sequences in the micro-batch
  int64_t seq = 1;      // T
  int64_t d_model = 1;  // C
  int64_t vocab = 1;    // V
  int64_t tp = 1;       // tensor-parallel slices of each block
};

inline double tokens(const Dims& d) {
  return static_cast<double>(d.batch) * static_cast<double>(d.seq);
}

// Forward of the attention half of one block: ln1, qkv, attention, output projection.
inline double block_attention_forward(const Dims& d) {
  const double c = static_cast<double>(d.d_model), t = static_cast<double>(d.seq);
  return tokens(d) * (2.0 * (4.0 * c * c + 6.0 * c) + 2.0 * t * c) / static_cast<double>(d.tp);
}
// Forward of the MLP half of one block: ln2, fc1, GELU, fc2.
inline double block_mlp_forward(const Dims& d) {
  const double c = static_cast<double>(d.d_model);
  return tokens(d) * (2.0 * (8.0 * c * c + 7.0 * c)) / static_cast<double>(d.tp);
}
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

// Forward FLOPs of one BlockOp (model/block.hpp's order; the counting above, every term divided by
// tp): Ln 2·2C, Qkv 2·(3C·C + 3C), Attention 2·T·C, Proj 2·(C·C + C), Fc1 2·(4C·C + 4C), Fc2
// 2·(4C·C + C) per token; residual adds and GELU 0. They sum to block_forward.
inline double block_op_forward(const Dims& d, int op) {
  const double c = static_cast<double>(d.d_model), t = static_cast<double>(d.seq);
  double per_token = 0;
  switch (op) {
    case 0:  // Ln1
    case 5:  // Ln2
      per_token = 4.0 * c;
      break;
    case 1:
      per_token = 2.0 * (3.0 * c * c + 3.0 * c);
      break;
    case 2:
      per_token = 2.0 * t * c;
      break;
    case 3:
      per_token = 2.0 * (c * c + c);
      break;
    case 6:
      per_token = 2.0 * (4.0 * c * c + 4.0 * c);
      break;
    case 8:
      per_token = 2.0 * (4.0 * c * c + c);
      break;
    default:
      per_token = 0.0;  // residual adds, GELU
  }
  return tokens(d) * per_token / static_cast<double>(d.tp);
}
// The FLOPs of BlockOps [begin, end), forward, or backward (2x).
inline double block_ops_flops(const Dims& d, bool forward, int begin, int end) {
  double f = 0;
  for (int op = begin; op < end; ++op) f += block_op_forward(d, op);
  return forward ? f : 2.0 * f;
}

// Activation recomputation (model/block.hpp), the FLOPs its spans carry (executed work, which the
// model FLOPs of MFU exclude): full, piece k of `pieces` (1 at tp = 1, else 2: the attention half,
// then ln2, fc1 and GELU, i.e. the MLP half less fc2's 2·(4C·C + C) per token); selective, the
// attention core 2·T·C per token.
inline double recompute_block_piece(const Dims& d, int piece, int pieces) {
  const double c = static_cast<double>(d.d_model);
  const double mlp_less_fc2 =
      tokens(d) * (2.0 * (4.0 * c * c + 6.0 * c)) / static_cast<double>(d.tp);
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

// Final LayerNorm + tied LM head (+ cross-entropy, counted as zero).
inline double head_forward(const Dims& d) {
  const double c = static_cast<double>(d.d_model), v = static_cast<double>(d.vocab);
  return tokens(d) * (2.0 * 2.0 * c + 2.0 * c * v);
}
// Its two parts: the final LayerNorm (over this rank's 1/tp of the tokens under sequence
// parallelism, which splits the head's spans there) and the LM head.
inline double head_norm_forward(const Dims& d, bool sequence_parallel) {
  return tokens(d) * 4.0 * static_cast<double>(d.d_model) /
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

// Parameter counts (for MFU and memory): non-embedding = L * (12C^2 + 13C) + 2C; embedding = V*C + T*C.
inline int64_t params_non_embedding(int64_t layers, int64_t c) {
  return layers * (12 * c * c + 13 * c) + 2 * c;
}
inline int64_t params_embedding(int64_t vocab, int64_t seq, int64_t c) {
  return vocab * c + seq * c;
}

}  // namespace orrery::model::flops
