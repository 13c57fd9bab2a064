// The FFN half of a mixture-of-experts block (model/moe.hpp's rules, one micro-batch): router,
// dispatch to the experts' ep ranks, this rank's experts and the shared experts, combine, and the
// gated sum; and its backward. The maths is written once over a backend's kernels
// (moe_pieces.hpp); this header has what the backends share:
//  - the CPU kernels of the MoE-only steps (ORRERY_MOE_KERNELS; the CUDA ones in
//    cuda/kernels.hpp), which move and weight rows by index tables;
//  - the host-side decisions both backends take from host numbers (moe_plan_*: the top-k routing,
//    the capacity drops, the send order, the aux loss, and the router's (N, E) gradient maths).
//    On CUDA the router probabilities (N, E) and the gates' gradient (N·K) are downloaded for
//    them and the index tables uploaded; the rows and the experts' matmuls stay on the device;
//  - the CPU model's entry points (moe_ffn_forward / moe_ffn_backward over runtime::Gpt).
// gpt_pieces.hpp's block_forward / block_backward call the generic pieces between the block's
// attention half and its residual.
//
// Shapes: N = B·T tokens, C channels, E experts, K = top_k, El experts held, We the expert width
// held (expert width / tp), up 2 under SwiGLU (fc1 rows [gate | up]) else 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "orrery/runtime/model.hpp"

namespace orrery::runtime {

// --- CPU kernels (each also in cuda/kernels.hpp, same arguments, device pointers there).
// probs (N, E) in place: each row's softmax (max-subtracted, summed in double).
void moe_softmax(float* probs, int64_t N, int E);
// dst row i (of C) = src row idx[i], for i < n.
void moe_gather_rows(float* dst, const float* src, const int64_t* idx, int64_t n, int C);
// dst row idx[i] = src row i, for i < n (idx distinct).
void moe_scatter_rows(float* dst, const float* src, const int64_t* idx, int64_t n, int C);
// out row t += Σ_k weight[t·K+k] · rows row[t·K+k] over the kept assignments (row >= 0), k in order.
void moe_gated_sum(float* out, const float* rows, const int64_t* row, const float* weight,
                   int64_t N, int K, int C);
// For each kept assignment a = t·K+k: drows row row[a] = weight[a] · dy row t, and dgate[a] =
// <dy row t, rows row row[a]> (summed in double); dgate is 0 for a dropped one.
void moe_gated_sum_backward(float* drows, float* dgate, const float* dy, const float* rows,
                            const int64_t* row, const float* weight, int64_t N, int K, int C);
// d row t += Σ_k rows row row[t·K+k] over the kept assignments, k in order.
void moe_rows_add(float* d, const float* rows, const int64_t* row, int64_t N, int K, int C);

// clang-format off
#define ORRERY_MOE_KERNELS(X) \
  X(moe_softmax) X(moe_gather_rows) X(moe_scatter_rows) \
  X(moe_gated_sum) X(moe_gated_sum_backward) X(moe_rows_add)
// clang-format on

// --- host-side decisions (moe_block.cpp), the same on every backend.
// From the host router probabilities `probs` (N, E) of block `layer`'s tokens: the routing, its
// aux loss, and the send tables (send_row, send_token, send_counts, send_rows) in model/moe.hpp's
// dispatch order (by destination ep rank, expert, token, slot: global expert order).
void moe_plan_routing(const Gpt& g, const float* probs, int64_t N, MoeRoutingPlan& p);
// From p.recv_counts: the rows each held expert received (expert_rows, expert_begin, recv_rows),
// in recv order (by source ep rank, then expert).
void moe_plan_experts(const Gpt& g, MoeRoutingPlan& p);
// p.dlogits (N, E): the gradient of the router logits from the gates' gradient `dgate` (N·K,
// summed over tp) through the top-k renormalisation, plus the aux loss's (scaled by `scale`), back
// through the softmax of `probs` (N, E).
void moe_router_dlogits(const Gpt& g, const float* probs, const float* dgate, int64_t N,
                        float scale, MoeRoutingPlan& p);

// --- the CPU model's entry points (moe_pieces.hpp over CpuKernels).
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
template <class Acts>
double gpt_aux_loss(const Acts& acts) {
  double sum = 0;
  for (const auto& m : acts.moe) sum += m.aux;
  return sum;
}

// Bytes of one buffer of the MoE state: a host vector's capacity, a device array's size.
template <class Buf>
std::size_t moe_buffer_bytes(const Buf& b) {
  if constexpr (requires { b.capacity(); }) {
    return b.capacity() * sizeof(b.data()[0]);
  } else {
    return b.size_bytes();
  }
}

// Bytes the MoE blocks' forward state and working buffers hold in the backend's memory (routing,
// dispatched and received rows, the experts' activations; sized by the last forward and backward):
// part of mem.activations. On a device the host-side plan (routing, index tables) is not counted.
template <class Acts>
std::size_t moe_state_bytes(const Acts& acts) {
  std::size_t n = 0;
  auto add = [&n](const auto& v) { n += moe_buffer_bytes(v); };
  for (const auto& st : acts.moe) {
    if constexpr (std::is_same_v<std::decay_t<decltype(st.probs)>, std::vector<float>>) {
      add(st.routing.expert);
      add(st.routing.weight);
      add(st.routing.kept);
      for (const auto* v : {&st.send_row, &st.send_token, &st.expert_rows}) add(*v);
      for (const auto* v : {&st.host_probs, &st.host_dgate, &st.dlogits}) add(*v);
    }
    for (const auto* v : {&st.probs, &st.send, &st.recv, &st.out, &st.back, &st.weight}) add(*v);
    for (const auto* v : {&st.send_row_dev, &st.send_token_dev, &st.expert_rows_dev}) add(*v);
    for (const auto* vv : {&st.x, &st.h, &st.act, &st.sh, &st.sact}) {
      for (const auto& v : *vv) add(v);
    }
  }
  const auto& w = acts.moe_work;
  for (const auto* v : {&w.y, &w.dback, &w.dgate, &w.dout_recv, &w.dx, &w.dxs_recv, &w.dy_e,
                        &w.dx_e, &w.dact, &w.dh, &w.dlogits}) {
    add(*v);
  }
  return n;
}

}  // namespace orrery::runtime
