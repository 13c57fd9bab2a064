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
// Sequence parallelism (parallel.sequence_parallel, Korthikanti et al. 2022): the residual stream,
// the LayerNorms and the residual adds work on this rank's 1/tp of the tokens; each tp all-reduce
// becomes a reduce-scatter of the partial product onto the token shards, and each LayerNorm output
// is all-gathered before the column-parallel matmul that reads it. Five pieces each way:
// Forward:  [Ln1] all-gather [Qkv Attention Proj] reduce-scatter [AttnResidual Ln2] all-gather
//           [Fc1 Gelu Fc2] reduce-scatter [MlpResidual]
// Backward: [MlpResidual] all-gather(dy) [Fc2 Gelu Fc1] reduce-scatter(dln2) [Ln2 AttnResidual]
//           all-gather [Proj Attention Qkv] reduce-scatter(dln1) [Ln1], then one tp all-reduce of the
//           replicated LayerNorm and row-parallel bias gradients, which each rank summed over its
//           tokens only ("tp.grad_all_reduce", 6·C values per block).
// The full recomputation under sequence parallelism reruns [Ln1] all-gather [Qkv Attention Proj]
// reduce-scatter [AttnResidual Ln2] all-gather [Fc1 Gelu] (kSpRecomputePieces: four pieces, three
// collectives).
inline constexpr int kSpBlockPieces = 5;
inline constexpr std::array<OpRange, kSpBlockPieces> kSpForwardPieces{
    {{0, 1}, {1, 4}, {4, 6}, {6, 9}, {9, 10}}};
inline constexpr std::array<OpRange, kSpBlockPieces> kSpBackwardPieces{
    {{9, 10}, {6, 9}, {4, 6}, {1, 4}, {0, 1}}};
inline constexpr std::array<OpRange, 4> kSpRecomputePieces{{{0, 1}, {1, 4}, {4, 6}, {6, 8}}};
// Which tp collective follows piece k (forward and recomputation: all-gather after even pieces,
// reduce-scatter after odd ones; backward: all-gather after even pieces, reduce-scatter after odd).
inline constexpr bool sp_gather_after(int piece) { return piece % 2 == 0; }

inline constexpr std::array<OpRange, 2> kRecomputePieces{{{0, 4}, {4, 8}}};  // tp > 1
inline constexpr OpRange kRecomputeBlock{0, 8};                              // tp = 1
inline constexpr OpRange kRecomputeAttention{2, 3};

}  // namespace orrery::model
