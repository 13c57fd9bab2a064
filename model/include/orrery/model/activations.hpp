// Activation memory per op: what each op of a transformer block keeps from its forward for its
// backward, the one table the simulator's memory estimate (sim/memory.hpp) sums. In units of
// s·b·h 16-bit bytes (s sequence, b micro-batch, h d_model) for one micro-batch on one rank,
// following Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
// Models", arXiv 2205.05198, section 4.1), generalised to the block architectures Orrery runs:
// r = kv heads held / heads (grouped-query attention keeps smaller k and v; with fewer kv heads
// than tp ranks each rank keeps one head's, r = tp / heads), f = F / h (the MLP width), u = 2 for
// SwiGLU (fc1 writes gate and up, the activation's input), d = 1 with dropout (GPT blocks, as
// Megatron trains them) or 0 (SwiGLU blocks, trained without dropout as Llama is):
//
//   op              keeps                              units of s·b·h        split over tp
//   ln1             its input                          2                     sequence parallel only
//   qkv             its input (ln1's output)           2                     sequence parallel only
//   attention       q, k, v                            2 + 2r + 2r           yes
//   softmax         its output                         2·a·s/h               yes (attention core)
//   attn_dropout    its mask, its output               (1 + 2)·d·a·s/h       yes (attention core)
//   proj            its input                          2                     yes
//   proj_dropout    its mask                           d                     sequence parallel only
//   ln2             its input                          2                     sequence parallel only
//   fc1             its input (ln2's output)           2                     sequence parallel only
//   act             its input (fc1's output)           2·u·f                 yes
//   fc2             its input                          2·f                   yes
//   mlp_dropout     its mask                           d                     sequence parallel only
//
// The paper's GPT block (r = 1, f = 4, u = 1, d = 1): 34 + 5·a·s/h in all, 10 of it replicated
// under plain tp. RoPE keeps the rotated q and k (its backward needs nothing more), RMSNorm its
// input as LayerNorm does. Recomputation (training.recompute) drops the attention core (selective)
// or all but the block's input, 2 (full): sim/memory.hpp.
#pragma once

#include <string_view>
#include <vector>

#include "orrery/common/scenario.hpp"

namespace orrery::model {

struct ActivationTerm {
  std::string_view op;  // the op of the table above
  double sbh = 0;       // s·b·h 16-bit units, for the whole block (before any tp split)
  bool core = false;    // part of the attention core (scales with a·s/h; selective recomputation)
  bool tp_split = false;  // divided by tp under plain tensor parallelism (else only with sequence
                          // parallelism)
};

// The table for one block of `arch` (resolved: kv_heads, ffn_hidden filled in) with `heads`
// heads, width `d_model`, sequence `seq`, on `tp` tensor-parallel ranks.
std::vector<ActivationTerm> block_activation_terms(const BlockArch& arch, int heads, int d_model,
                                                   int seq, int tp);

// One block's saved activations on one tp rank, in s·b·h 16-bit units: the terms, each divided
// by tp where it splits (every term with sequence parallelism). `core` = the attention core's part,
// `rest` = everything else.
struct BlockActivations {
  double rest = 0, core = 0;
};
BlockActivations block_activations(const std::vector<ActivationTerm>& terms, int tp,
                                   bool sequence_parallel);

}  // namespace orrery::model
