// Mixture-of-experts blocks (issue 19; model.moe.* and parallel.ep in common/scenario.hpp): the one
// description the runtime (CPU kernels, the training loop) and the simulator (op graph, costs,
// memory) follow, so a real and a simulated trace of one MoE scenario line up span by span.
//
// Which blocks: block l has an MoE FFN when l >= first_dense and l % every == 0 (Megatron's
// moe_layer_freq; DeepSeek-V3's first three blocks dense are first_dense 3, Hugging Face's
// first_k_dense_replace), else the dense MLP. In an MoE block the dense fc1/act/fc2 are replaced
// by a router and experts; the attention half, the LayerNorms and the residuals are the dense
// block's.
//
// Routing (route() below, for a micro-batch's tokens on one rank): router logits x·Wr (Wr (E, C), no
// bias), softmax over the E experts, the top_k largest probabilities (ties to the lower expert
// index), their weights renormalised to sum to 1 over the top_k (Mixtral). Capacity (capacity()):
// with capacity_factor > 0 each expert keeps at most ceil(factor · tokens · top_k / E) assignments,
// taken in GShard's priority order: every token's first choice (tokens in order) before any second
// choice, and so on; a dropped assignment contributes nothing (its weight is not redistributed; the
// residual carries the token). capacity_factor 0: dropless. Load-balancing loss (Switch, Fedus et
// al. 2021, eq. 4): aux = coef · E · Σ_e f_e · P_e per MoE block and micro-batch, f_e the fraction of
// the tokens · top_k assignments routed to e before the capacity drop (a constant for the gradient),
// P_e the mean router probability of e; added to the micro-batch's loss.
//
// Shared experts (DeepSeek): shared_experts always-on FFNs of the expert width on every token,
// their outputs summed ungated into the MoE output. Their weights are dense parameters (reduced over
// dp like the attention's).
//
// Tensor parallelism: every expert (and shared expert) is cut over tp as the dense MLP is (fc1
// column-parallel, fc2 row-parallel, fc2's bias added by tp rank 0 only), so an expert's output row
// is a partial sum. The router is replicated (its input, ln2's output, is replicated), so every tp
// rank routes identically. The gated sum Σ_k g_k · partial_k is linear in the partials: the block's
// usual tp all-reduce after it makes it whole. In the backward, d partial_k = g_k · dy is local, but
// d g_k = <dy, out_k> needs the sum over tp of <dy, partial_k>: one tp all-reduce of tokens · top_k
// values (kTpMoeGateAllReduce). The router's input gradient, identical on the tp ranks, is added on
// tp rank 0 only before the usual tp all-reduce of ln2's output gradient.
//
// Expert parallelism (parallel.ep, divides dp and experts): dp rank d has ep rank d % ep in the ep
// group of the ep consecutive dp ranks d - d % ep ... (same tp and pp coordinates), and holds
// experts [r·E/ep, (r+1)·E/ep) of ep rank r. Dispatch: the assignments kept are sent, token rows of
// C values, to the ep rank holding their expert (counts exchanged first, then the rows; on CPUs
// MPI_Alltoall + MPI_Alltoallv), in each destination's buffer by expert, then token, then slot; the
// experts run on what they received; combine sends the output rows back the same way. The expert
// parameters' gradients are summed over the expert-data-parallel group (the dp/ep ranks of the same
// ep rank) and divided by dp, as the dense gradients are averaged over dp; ZeRO 1/2 shard the
// expert optimizer state over that group. An ep rank whose experts receive no rows still joins
// every all-to-all and every reduction (with zero rows).
//
// Spans of an MoE block (names.hpp; the simulator builds the same ops in this order). Forward:
//   fwd.block [Ln1 .. Ln2] (tp > 1: split by the attention's tp all-reduce, as dense)
//   moe.router      compute: router GEMM, softmax, top-k, capacity, permutation
//   moe.dispatch    all_to_all over the ep group (ep > 1 only)
//   moe.experts     compute: this rank's routed experts, then the shared experts
//   moe.combine     all_to_all over the ep group (ep > 1 only)
//   moe.gated_sum   compute: Σ_k g_k · expert rows + shared experts' output
//   tp.all_reduce   (tp > 1)
//   fwd.block [MlpResidual]
// Backward (the reverse):
//   bwd.block [MlpResidual]
//   moe.gated_sum.bwd    compute: d rows = g · dy, d gates
//   tp.moe_gate_all_reduce (tp > 1; tokens · top_k values)
//   moe.combine.bwd      all_to_all (ep > 1): output-row gradients to the experts' ranks
//   moe.experts.bwd      compute
//   moe.dispatch.bwd     all_to_all (ep > 1): input-row gradients back
//   moe.router.bwd       compute: un-permute, softmax/top-k and aux-loss backward, router GEMMs
//   tp.all_reduce        (tp > 1; ln2's output gradient, as dense)
//   bwd.block [Ln2 .. Ln1] (tp > 1: split by the attention's tp all-reduce, as dense)
// An all_to_all span's bytes are this rank's whole send buffer (rows for itself included) · C ·
// element size; busbw factor (n-1)/n (traces busbw_factor). Counters, per step and rank, summed over
// the step's micro-batches: moe_tokens_counter(l, e) (assignments routed to expert e of block l on
// this rank, before the drop) and moe_dropped_counter(l).
//
// What the CPU runtime records within these rules (runtime/src/moe_block.cpp, issue 19), for the
// simulator to match span by span. N = a micro-batch's tokens on the rank, C, E, K = top_k, S =
// the rows this rank dispatches (its kept assignments), R = the rows its experts receive, We = the
// expert width / tp, up = 2 for SwiGLU else 1, Sh = shared experts:
//   FLOPs  moe.router 2·N·C·E; moe.experts (R + N·Sh)·2·C·We·(up+1); moe.gated_sum 2·S·C;
//          moe.gated_sum.bwd 4·S·C; moe.experts.bwd 2× moe.experts'; moe.router.bwd 4·N·C·E.
//          The MoE block's fwd.block pieces: [Ln1 .. Ln2] flops::block_attention_forward (tp > 1:
//          that on the piece before the attention's tp all-reduce, 0 on the one after),
//          [MlpResidual] 0; backward [MlpResidual] 0, then 2·block_attention_forward on the piece
//          before the attention's tp all-reduce and 0 after it.
//   The counts exchange is inside the all-to-all's span (one span per moe.dispatch, ...).
//   Expert gradients: DDP buckets of the experts' tensors (model/buckets.hpp's rule on the MoE
//   blocks' expert ranges in ready order, the last block first; parallel.bucket_mb), named
//   kEdpAllReduce, averaged over the edp group as each bucket's blocks complete in the step's last
//   micro-batch (as DDP's, after the dense bucket that the same block completes), on the comm.dp
//   stream; then multiplied by 1/ep (sum over edp / dp). No edp.all_reduce when edp has one rank
//   (dp = ep). The experts' tensors are not in DDP's dense buckets nor in its parameter broadcast.
//   The reported loss stays the LM loss; the aux losses (coef included, summed over the rank's MoE
//   blocks, mean over micro-batches) are StepResult::aux_loss; their gradients are in the backward.
//
// Not yet (refused by validate_layout): sequence parallelism and full recomputation with MoE blocks.
// ZeRO 1/2: with ep = 1 the experts are replicated over dp = edp and sharded with the dense
// tensors by the one dp partition of the whole array (no edp.all_reduce). With ep > 1 the dense
// prefix is partitioned over dp and the experts' range over their edp group: per reduction (one a
// step for ZeRO 1, one per micro-batch for ZeRO 2) the dense zero.reduce_scatter on dp, then the
// experts' zero.reduce_scatter on edp (averaged, then x 1/ep; none when edp has one rank); AdamW on
// both shards; zero.all_gather of the dense shards on dp, then of the expert shards on edp. Not yet
// in the runtime (refused by check_supported naming the key): ZeRO 3, gradient compression with
// ZeRO, checkpoints with ep > 1, device cuda. Gradient compression (ZeRO 0) compresses DDP's dense
// buckets only; the experts' edp.all_reduce stays fp32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orrery/common/scenario.hpp"

namespace orrery::model::moe {

using ::orrery::MoeConfig;

inline bool is_moe_block(const MoeConfig& m, int layer) {
  return m.enabled() && layer >= m.first_dense && layer % m.every == 0;
}
// MoE blocks among blocks [first, last).
int moe_blocks(const MoeConfig& m, int first, int last);
// Each expert's FFN width: model.moe.expert_ffn_hidden, or the dense width.
int expert_width(const ModelConfig& m);

// Assignments one expert keeps of a micro-batch of `tokens` tokens: ceil(factor · tokens · top_k /
// experts); -1 when dropless (capacity_factor 0).
int64_t capacity(const MoeConfig& m, int64_t tokens);

// Parameters of one whole (un-sliced) expert FFN of width `width` on C channels: fc1 (width or, with
// SwiGLU, 2·width rows of C) and fc2 (C rows of width), with their biases when `bias`.
int64_t expert_parameters(int64_t d_model, int64_t width, bool swiglu, bool bias);
// The router's weights: E rows of C.
inline int64_t router_parameters(int64_t d_model, int64_t experts) { return d_model * experts; }

// The ep rank of dp rank d, the first dp rank of its ep group, and the experts ep rank r holds.
inline int ep_rank(int dp_rank, int ep) { return dp_rank % ep; }
inline int ep_group_index(int dp_rank, int ep) { return dp_rank / ep; }
struct ExpertRange {
  int first = 0, count = 0;
};
inline ExpertRange local_experts(int experts, int ep, int rank) {
  return {rank * (experts / ep), experts / ep};
}

// One micro-batch's routing on one rank (tokens · top_k assignments, token-major: assignment
// t·top_k + k is token t's k-th choice, in descending probability).
struct Routing {
  int64_t tokens = 0;
  int top_k = 0;
  int experts = 0;
  std::vector<int> expert;      // (tokens · top_k) chosen expert
  std::vector<float> weight;    // (tokens · top_k) renormalised combine weight
  std::vector<uint8_t> kept;    // (tokens · top_k) 1 unless dropped by the capacity
  std::vector<int64_t> routed;  // (experts) assignments routed to each expert, before the drop
  std::vector<int64_t> taken;   // (experts) assignments each expert keeps
  int64_t dropped = 0;
};
// Routes from the softmax probabilities `probs` (tokens, experts), row-major, by the rules above;
// `capacity` from capacity() (-1: dropless).
Routing route(const float* probs, int64_t tokens, int experts, int top_k, int64_t capacity);

// The load-balancing loss of one routing (coef · E · Σ_e f_e · P_e) and its gradient with respect
// to the probabilities: d aux / d probs[t][e] = coef · E · f_e / tokens (written to dprobs, added).
double aux_loss(const float* probs, const Routing& r, double coef);
void aux_loss_backward(float* dprobs, const Routing& r, double coef);

// Simulated router imbalance (model.moe.router_skew s): expert e's share of the assignments is
// proportional to (e + 1)^-s, normalised to sum to 1 (s = 0: uniform, 1 / E each).
std::vector<double> expert_load_shares(int experts, double skew);

// Counter names (names.hpp style).
std::string moe_tokens_counter(int layer, int expert);  // "moe.tokens[l=3,e=5]"
std::string moe_dropped_counter(int layer);             // "moe.dropped[l=3]"

}  // namespace orrery::model::moe
