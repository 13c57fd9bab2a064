// The FFN half of a mixture-of-experts block, written once over a backend's kernels (the CPU
// model's and the CUDA model's, as gpt_pieces.hpp does for the dense block; the rules are
// model/moe.hpp's, the shapes and the host-side decisions moe_block.hpp's).
//
// Besides gpt_pieces.hpp's kernels, `Kernels` has the MoE kernels (ORRERY_MOE_KERNELS) and
//   template <class T> using Buffer                   the backend's resizable array
//   T* fit(Buffer<T>& b, size_t n)                    b holds n elements (the CPU's vector is
//                                                     resized to n; a device array only grows)
//   const float* to_host(const float* p, size_t n, std::vector<float>& staging)
//                                                     p's n values readable on the host (the CPU:
//                                                     p itself; CUDA: downloaded, the host waits)
//   const T* to_device(const T* h, size_t n, Buffer<T>& staging)
//                                                     host values readable by the kernels (the
//                                                     CPU: h itself; CUDA: uploaded on the stream)
// So the routing is decided on the host from the router probabilities (downloaded on CUDA: N·E
// floats per block), and the router's (N, E) gradient maths is done there from the gates'
// gradient (N·K floats); every row of C channels, the experts' and the router's matmuls stay in the
// backend's memory, moved by index tables (uploaded on CUDA). On the CPU nothing is copied: the
// calls are those of the CPU model before this was made generic, so its numbers are unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/model/names.hpp"
#include "orrery/runtime/model.hpp"
#include "orrery/runtime/moe_block.hpp"

namespace orrery::runtime::moe_pieces {

inline std::size_t block_of(const Gpt& g, int layer) {
  if (layer < g.shard.layer_begin || layer >= g.shard.layer_end || !g.is_moe_block(layer)) {
    throw std::logic_error("moe: layer " + std::to_string(layer) +
                           " is not an MoE block of this shard");
  }
  return static_cast<std::size_t>(layer - g.shard.layer_begin);
}

inline int64_t total(const std::vector<int64_t>& v) {
  int64_t n = 0;
  for (int64_t x : v) n += x;
  return n;
}

// FLOPs of one FFN row (forward): fc1 and fc2.
inline double ffn_row_flops(const Gpt& g) {
  return 2.0 * g.dims.C * g.moe_dims.We * (g.dims.up + 1);
}

// The FFN's forward on n rows: h (n, up·We) = x·fcw^T + fcb, act (n, We), y (n, C) = act·fcprojw^T
// (+ fcprojb on tp rank 0 only: the output is a tp partial).
template <class Kernels>
void ffn_forward(const Kernels& k, const Gpt& g, const FfnParams& p, float* y, float* h, float* act,
                 const float* x, int64_t n) {
  if (n == 0) return;
  const int C = g.dims.C, We = g.moe_dims.We, up = g.dims.up;
  const int rows = static_cast<int>(n);
  k.matmul_forward(h, x, p.fcw, p.fcb, 1, rows, C, up * We);
  if (up == 2) {
    k.swiglu_forward(act, h, static_cast<std::size_t>(n), We);
  } else {
    k.gelu_forward(act, h, static_cast<std::size_t>(n) * We);
  }
  k.matmul_forward(y, act, p.fcprojw, g.shard.tp_rank == 0 ? p.fcprojb : nullptr, 1, rows, We, C);
}

// Its backward: dx (n, C) = the input gradient (overwritten, or added to with `accumulate`); the
// weights' and biases' gradients accumulate (fcprojb's on every tp rank: dy is replicated).
template <class Kernels, class Work>
void ffn_backward(const Kernels& k, const Gpt& g, const FfnParams& p, const FfnParams& dp,
                  float* dx, const float* dy, const float* h, const float* act, const float* x,
                  int64_t n, bool accumulate, Work& w) {
  if (n == 0) return;
  const int C = g.dims.C, We = g.moe_dims.We, up = g.dims.up;
  const int rows = static_cast<int>(n);
  float* dact = k.fit(w.dact, static_cast<std::size_t>(n) * We);
  float* dh = k.fit(w.dh, static_cast<std::size_t>(n) * up * We);
  k.zero(dh, static_cast<std::size_t>(n) * up * We);  // the activations' backward adds
  if (dp.fcprojb != nullptr) k.bias_backward(dp.fcprojb, dy, 1, rows, C);
  k.matmul_backward(dact, dp.fcprojw, nullptr, dy, act, p.fcprojw, 1, rows, We, C, false);
  if (up == 2) {
    k.swiglu_backward(dh, h, dact, static_cast<std::size_t>(n), We);
  } else {
    k.gelu_backward(dh, h, dact, static_cast<std::size_t>(n) * We);
  }
  k.matmul_backward(dx, dp.fcw, dp.fcb, dh, x, p.fcw, 1, rows, C, up * We, accumulate);
}

// moe.router: logits, softmax, the routing and the aux loss (host), and the send buffer (the ln2
// rows of the kept assignments in model/moe.hpp's dispatch order).
template <class Kernels, class State>
void route_and_pack(const Kernels& k, const Gpt& g, const MoeParams& p, const float* ln2, int64_t N,
                    State& st) {
  const int C = g.dims.C, E = g.moe_dims.E;
  const std::size_t NE = static_cast<std::size_t>(N) * E;
  float* probs = k.fit(st.probs, NE);
  k.matmul_forward(probs, ln2, p.router, nullptr, 1, static_cast<int>(N), C, E);
  k.moe_softmax(probs, N, E);
  moe_plan_routing(g, k.to_host(probs, NE, st.host_probs), N, st);
  const int64_t S = st.send_rows;
  float* send = k.fit(st.send, static_cast<std::size_t>(S) * C);
  const int64_t* token =
      k.to_device(st.send_token.data(), static_cast<std::size_t>(S), st.send_token_dev);
  k.moe_gather_rows(send, ln2, token, S, C);
}

// One all-to-all of rows over the ep group (counts in rows, the hook's in elements) into `recv`
// (sized to `capacity_rows`, then to what arrived); returns the rows received. `expect` (may be
// null) must equal the received counts.
template <class Kernels, class Buf>
int64_t ep_exchange(const Kernels& k, const GptHooks& hooks, const char* name, int layer, int C,
                    const float* send, const std::vector<int64_t>& send_counts, std::size_t groups,
                    Buf& recv, std::vector<int64_t>& recv_counts, std::size_t capacity_rows,
                    const std::vector<int64_t>* expect) {
  if (!hooks.ep_all_to_all) {
    throw std::logic_error("moe: parallel.ep > 1 but GptHooks::ep_all_to_all is not set");
  }
  std::vector<int64_t> sc(send_counts.size()), rc(send_counts.size(), 0);
  for (std::size_t i = 0; i < sc.size(); ++i) sc[i] = send_counts[i] * C;
  const std::size_t capacity = std::max<std::size_t>(capacity_rows, 1) * std::size_t(C);
  float* r = k.fit(recv, capacity);
  hooks.ep_all_to_all(name, layer, send, sc.data(), groups, r, rc.data(), capacity);
  recv_counts.resize(rc.size());
  for (std::size_t i = 0; i < rc.size(); ++i) recv_counts[i] = rc[i] / C;
  if (expect != nullptr && *expect != recv_counts) {
    throw InternalError("moe: an all-to-all of layer " + std::to_string(layer) +
                        " received other row counts than its dispatch sent");
  }
  const int64_t rows = total(recv_counts);
  k.fit(recv, static_cast<std::size_t>(rows) * C);
  return rows;
}

// moe.experts: the held experts on their rows of `in` (st.out, recv order), then the shared
// experts on every token, their sum into fcproj (N, C).
template <class Kernels, class State, class Work>
void run_experts(const Kernels& k, const Gpt& g, const MoeParams& p, const float* ln2, int64_t N,
                 State& st, Work& w, const float* in, float* fcproj) {
  const MoeDims& md = g.moe_dims;
  const int C = g.dims.C, We = md.We, up = g.dims.up;
  moe_plan_experts(g, st);
  const int64_t* rows =
      k.to_device(st.expert_rows.data(), st.expert_rows.size(), st.expert_rows_dev);
  float* out = k.fit(st.out, static_cast<std::size_t>(st.recv_rows) * C);
  for (auto* v : {&st.x, &st.h, &st.act}) v->resize(std::size_t(md.El));
  for (int e = 0; e < md.El; ++e) {
    const auto i = std::size_t(e);
    const int64_t n = st.expert_begin[i + 1] - st.expert_begin[i];
    const int64_t* idx = rows + st.expert_begin[i];
    float* x = k.fit(st.x[i], std::size_t(n) * C);
    k.moe_gather_rows(x, in, idx, n, C);
    float* h = k.fit(st.h[i], std::size_t(n) * up * We);
    float* act = k.fit(st.act[i], std::size_t(n) * We);
    float* y = k.fit(w.y, std::size_t(n) * C);
    ffn_forward(k, g, p.experts[i], y, h, act, x, n);
    k.moe_scatter_rows(out, y, idx, n, C);
  }
  k.zero(fcproj, std::size_t(N) * C);
  for (auto* v : {&st.sh, &st.sact}) v->resize(std::size_t(md.S));
  float* y = k.fit(w.y, std::size_t(N) * C);
  for (int j = 0; j < md.S; ++j) {
    float* h = k.fit(st.sh[std::size_t(j)], std::size_t(N) * up * We);
    float* act = k.fit(st.sact[std::size_t(j)], std::size_t(N) * We);
    ffn_forward(k, g, p.shared[std::size_t(j)], y, h, act, ln2, N);
    k.residual_forward(fcproj, fcproj, y, std::size_t(N) * C);
  }
}

// The expert outputs in send order: combined back over ep, or (ep 1) where they were computed.
template <class State>
const float* returned_rows(const Gpt& g, const State& st) {
  return g.moe_dims.ep > 1 ? st.back.data() : st.out.data();
}

// From block `layer`'s a.ln2 to a.fcproj (moe_block.hpp's moe_ffn_forward).
template <class Kernels, class Model, class Acts>
void forward(const Kernels& k, const Model& m, Acts& acts, int layer, const GptHooks& hooks) {
  const Gpt& g = layout_of(m);
  const std::size_t idx = block_of(g, layer);
  const MoeDims& md = g.moe_dims;
  BlockActivations& a = acts.blocks[idx];
  auto& st = acts.moe.at(idx);
  const int C = g.dims.C, K = md.K;
  const int64_t N = int64_t(acts.B) * acts.T;
  {
    OpSpan span(hooks.observer, model::names::kMoeRouter.data(), layer, 2.0 * N * C * md.E);
    route_and_pack(k, g, m.moe[idx], a.ln2, N, st);
  }
  if (hooks.on_routing) hooks.on_routing(layer, st.routing, st.aux);
  const float* in = st.send.data();
  int64_t R = st.send_rows;
  if (md.ep > 1) {
    // At most N·K rows from each ep rank.
    R = ep_exchange(k, hooks, model::names::kMoeDispatch.data(), layer, C, st.send.data(),
                    st.send_counts, std::size_t(md.El), st.recv, st.recv_counts,
                    std::size_t(md.ep * N * K), nullptr);
    in = st.recv.data();
  } else {
    st.recv_counts = st.send_counts;
  }
  {
    const double rows = double(R) + double(N) * md.S;
    OpSpan span(hooks.observer, model::names::kMoeExperts.data(), layer, rows * ffn_row_flops(g));
    run_experts(k, g, m.moe[idx], a.ln2, N, st, acts.moe_work, in, a.fcproj);
  }
  if (md.ep > 1) {
    std::vector<int64_t> back_counts;
    ep_exchange(k, hooks, model::names::kMoeCombine.data(), layer, C, st.out.data(), st.recv_counts,
                std::size_t(md.El), st.back, back_counts, std::size_t(st.send_rows),
                &st.send_counts);
  }
  const std::size_t NK = std::size_t(N) * K;
  OpSpan span(hooks.observer, model::names::kMoeGatedSum.data(), layer,
              2.0 * double(std::size_t(st.send_rows) * C));
  k.moe_gated_sum(a.fcproj, returned_rows(g, st),
                  k.to_device(st.send_row.data(), NK, st.send_row_dev),
                  k.to_device(st.routing.weight.data(), NK, st.weight), N, K, C);
}

// moe.experts.bwd: the held experts' gradients from dout (R, C, recv order) into dx (R, C); the
// shared experts' from dy, their input gradient into dln (N, C, overwritten).
template <class Kernels, class Model, class State, class Work>
void experts_backward(const Kernels& k, Model& m, std::size_t idx, State& st, Work& w,
                      const float* dout, float* dx, const float* dy, const float* ln2, int64_t N,
                      float* dln) {
  const Gpt& g = layout_of(m);
  const MoeDims& md = g.moe_dims;
  const int C = g.dims.C;
  const MoeParams& p = m.moe[idx];
  const MoeParams& dp = m.dmoe[idx];
  const int64_t* rows =
      k.to_device(st.expert_rows.data(), st.expert_rows.size(), st.expert_rows_dev);
  k.zero(dx, std::size_t(st.recv_rows) * C);
  for (int e = 0; e < md.El; ++e) {
    const auto i = std::size_t(e);
    const int64_t n = st.expert_begin[i + 1] - st.expert_begin[i];
    const int64_t* ix = rows + st.expert_begin[i];
    float* dy_e = k.fit(w.dy_e, std::size_t(n) * C);
    float* dx_e = k.fit(w.dx_e, std::size_t(n) * C);
    k.moe_gather_rows(dy_e, dout, ix, n, C);
    ffn_backward(k, g, p.experts[i], dp.experts[i], dx_e, dy_e, st.h[i].data(), st.act[i].data(),
                 st.x[i].data(), n, false, w);
    k.moe_scatter_rows(dx, dx_e, ix, n, C);
  }
  k.zero(dln, std::size_t(N) * C);
  for (int j = 0; j < md.S; ++j) {
    const auto i = std::size_t(j);
    ffn_backward(k, g, p.shared[i], dp.shared[i], dln, dy, st.sh[i].data(), st.sact[i].data(), ln2,
                 N, true, w);
  }
}

// moe.router.bwd: the dispatched rows' gradients dxs (S, C, send order) added to dln; the gates'
// dgate (N·K, summed over tp) and the aux loss's gradient back to the router logits (host), then
// the router's weight gradient; its input gradient on tp rank 0 only (replicated over tp).
template <class Kernels, class Model, class State, class Work>
void router_backward(const Kernels& k, Model& m, std::size_t idx, State& st, Work& w,
                     const float* dxs, const float* dgate, const int64_t* row, const float* ln2,
                     int64_t N, float* dln, float scale) {
  const Gpt& g = layout_of(m);
  const int C = g.dims.C, E = g.moe_dims.E, K = g.moe_dims.K;
  const std::size_t NE = std::size_t(N) * E;
  k.moe_rows_add(dln, dxs, row, N, K, C);
  const float* probs = k.to_host(st.probs.data(), NE, st.host_probs);
  const float* hdgate = k.to_host(dgate, std::size_t(N) * K, st.host_dgate);
  moe_router_dlogits(g, probs, hdgate, N, scale, st);
  const float* dlogits = k.to_device(st.dlogits.data(), NE, w.dlogits);
  k.matmul_backward(g.shard.tp_rank == 0 ? dln : nullptr, m.dmoe[idx].router, nullptr, dlogits, ln2,
                    m.moe[idx].router, 1, static_cast<int>(N), C, E, true);
}

// From s.dres to s.dln (moe_block.hpp's moe_ffn_backward).
template <class Kernels, class Model, class Acts, class Scratch>
void backward(const Kernels& k, Model& m, Acts& acts, Scratch& s, int layer,
              const GptHooks& hooks) {
  const Gpt& g = layout_of(m);
  const std::size_t idx = block_of(g, layer);
  const MoeDims& md = g.moe_dims;
  const BlockActivations& a = acts.blocks[idx];
  auto& st = acts.moe.at(idx);
  auto& w = acts.moe_work;
  const int C = g.dims.C, K = md.K;
  const int64_t N = int64_t(acts.B) * acts.T;
  const std::size_t NK = std::size_t(N) * K, SC = std::size_t(st.send_rows) * C;
  const float* dy = s.dres;
  const int64_t* row = k.to_device(st.send_row.data(), NK, st.send_row_dev);
  float* dback = k.fit(w.dback, SC);
  float* dgate = k.fit(w.dgate, NK);
  {
    OpSpan span(hooks.observer, model::names::kMoeGatedSumBackward.data(), layer, 4.0 * double(SC));
    k.moe_gated_sum_backward(dback, dgate, dy, returned_rows(g, st), row,
                             k.to_device(st.routing.weight.data(), NK, st.weight), N, K, C);
  }
  if (g.shard.tp_size > 1) {
    if (!hooks.tp_all_reduce) throw std::logic_error("moe: tp > 1 but no tp_all_reduce hook");
    hooks.tp_all_reduce(TpPoint::kMoeGateBackward, layer, dgate, NK);
  }
  std::vector<int64_t> counts;
  const float* dout = dback;
  if (md.ep > 1) {
    ep_exchange(k, hooks, model::names::kMoeCombineBackward.data(), layer, C, dback, st.send_counts,
                std::size_t(md.El), w.dout_recv, counts, std::size_t(st.recv_rows),
                &st.recv_counts);
    dout = w.dout_recv.data();
  }
  float* dx = k.fit(w.dx, std::size_t(st.recv_rows) * C);
  {
    const double rows = double(st.recv_rows) + double(N) * md.S;
    OpSpan span(hooks.observer, model::names::kMoeExpertsBackward.data(), layer,
                2.0 * rows * ffn_row_flops(g));
    experts_backward(k, m, idx, st, w, dout, dx, dy, a.ln2, N, s.dln);
  }
  const float* dxs = dx;
  if (md.ep > 1) {
    ep_exchange(k, hooks, model::names::kMoeDispatchBackward.data(), layer, C, dx, st.recv_counts,
                std::size_t(md.El), w.dxs_recv, counts, std::size_t(st.send_rows), &st.send_counts);
    dxs = w.dxs_recv.data();
  }
  OpSpan span(hooks.observer, model::names::kMoeRouterBackward.data(), layer, 4.0 * N * C * md.E);
  router_backward(k, m, idx, st, w, dxs, dgate, row, a.ln2, N, s.dln, acts.objective_scale);
}

}  // namespace orrery::runtime::moe_pieces
