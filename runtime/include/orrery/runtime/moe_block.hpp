// The FFN half of a mixture-of-experts block on CPUs (model/moe.hpp's rules, one micro-batch):
// router, dispatch to the experts' ep ranks, this rank's experts and the shared experts, combine,
// and the gated sum; and its backward. gpt_pieces.hpp's block_forward / block_backward call these
// between the block's attention half and its residual.
//
// Shapes: N = B·T tokens, C channels, E experts, K = top_k, El experts held, We the expert width
// held (expert width / tp), up 2 under SwiGLU (fc1 rows [gate | up]) else 1.
#pragma once

#include "orrery/runtime/model.hpp"

namespace orrery::runtime {

// From block `layer`'s ln2 output a.ln2 (N, C) to a.fcproj (N, C): the shared experts' outputs
// plus Σ_k g_k · expert_k(token), this tp rank's partial (the caller sums it over tp). Spans
// moe.router, moe.dispatch (ep > 1), moe.experts, moe.combine (ep > 1), moe.gated_sum; the
// routing and the aux loss stay in acts.moe for the backward and go to hooks.on_routing.
void moe_ffn_forward(const Gpt& m, GptActivations& acts, int layer, const GptHooks& hooks);

// From s.dres (dy, (N, C)) to s.dln (N, C), this tp rank's partial of the gradient of ln2's
// output (the caller sums it over tp); accumulates the router's, the held experts' and the shared
// experts' gradients, with the aux loss's scaled by acts.objective_scale. Spans moe.gated_sum.bwd,
// tp.moe_gate_all_reduce (tp > 1, through hooks.tp_all_reduce at TpPoint::kMoeGateBackward),
// moe.combine.bwd (ep > 1), moe.experts.bwd, moe.dispatch.bwd (ep > 1), moe.router.bwd.
void moe_ffn_backward(Gpt& m, GptActivations& acts, GptGradScratch& s, int layer,
                      const GptHooks& hooks);

// The load-balancing losses of the micro-batch's MoE blocks on this shard, summed (0 without).
double gpt_aux_loss(const GptActivations& acts);

// Bytes the MoE blocks' forward state holds (routing, dispatched and received rows, the experts'
// activations; sized by the last forward): part of mem.activations.
std::size_t moe_state_bytes(const GptActivations& acts);

}  // namespace orrery::runtime
