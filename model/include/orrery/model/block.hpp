// A transformer block's operations in forward order, and where Megatron tensor parallelism cuts
// them into the three pieces the runtime runs and records ("fwd.block" / "bwd.block" spans, split
// by the two tp all-reduces) and the simulator prices (cost_model.cpp). One table for both.
//
// Forward: [ln1 qkv attention proj] tp-sum [attn residual, ln2 fc1 gelu fc2] tp-sum [mlp residual]
//   (the row-parallel proj and fc2 leave partial sums; the residual adds need the whole sum).
// Backward, the forward ops in reverse: [mlp residual, fc2 gelu fc1] tp-sum [ln2, attn residual,
//   proj attention qkv] tp-sum [ln1] (the column-parallel fc1 and qkv backward leave partial input
//   gradients).
#pragma once

#include <array>

namespace orrery::model {

enum class BlockOp : int {
  Ln1,
  Qkv,
  Attention,
  Proj,
  AttnResidual,
  Ln2,
  Fc1,
  Gelu,
  Fc2,
  MlpResidual
};
inline constexpr int kBlockOps = 10;
inline constexpr int kTpBlockPieces = 3;  // pieces of a block under tp > 1 (one piece at tp = 1)

struct OpRange {
  int begin, end;  // [begin, end) in BlockOp order (forward) or in reverse BlockOp order (backward)
};
// Forward piece k holds BlockOps [begin, end).
inline constexpr std::array<OpRange, kTpBlockPieces> kForwardPieces{{{0, 4}, {4, 9}, {9, 10}}};
// Backward piece k holds the BlockOps from end-1 down to begin, in that order.
inline constexpr std::array<OpRange, kTpBlockPieces> kBackwardPieces{{{6, 10}, {1, 6}, {0, 1}}};

// Activation recomputation (training.recompute, Korthikanti et al. 2022), run in the backward just
// before the block's backward, from what the forward kept:
// - full: the block kept only its input (the residual stream at its boundary); the recomputation
//   runs the forward ops [Ln1, Fc2): everything the backward reads. Fc2's product, its tp sum and
//   the MLP residual are not read by the backward (the block's output is kept as the next block's
//   input), so they are not recomputed. Under tp > 1 two pieces around the attention
//   projection's tp all-reduce, as the forward's first two pieces less Fc2.
// - selective: the block kept everything but the attention probabilities (B·heads·T·T, the
//   5·a·s/h term of the paper's s·b·h·(34 + 5·a·s/h)); the recomputation runs the attention core
//   [Attention, Proj) once, whatever tp.
inline constexpr std::array<OpRange, 2> kRecomputePieces{{{0, 4}, {4, 8}}};  // tp > 1
inline constexpr OpRange kRecomputeBlock{0, 8};                              // tp = 1
inline constexpr OpRange kRecomputeAttention{2, 3};

}  // namespace orrery::model
