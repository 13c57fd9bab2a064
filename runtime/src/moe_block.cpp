// The FFN half of a mixture-of-experts block on CPUs (moe_block.hpp; the rules are
// model/moe.hpp's: routing, capacity drops, the aux loss, the dispatch order, tp and ep).
#include "orrery/runtime/moe_block.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/model/moe.hpp"
#include "orrery/model/names.hpp"
#include "orrery/runtime/kernels.hpp"

namespace orrery::runtime {
namespace {

namespace moe = ::orrery::model::moe;
using Rows = std::vector<float>;

std::size_t block_of(const Gpt& g, int layer) {
  if (layer < g.shard.layer_begin || layer >= g.shard.layer_end || !g.is_moe_block(layer)) {
    throw std::logic_error("moe: layer " + std::to_string(layer) +
                           " is not an MoE block of this shard");
  }
  return static_cast<std::size_t>(layer - g.shard.layer_begin);
}

// probs (N, E) in place: each row's softmax (max-subtracted, summed in double).
void softmax_rows(float* p, int64_t N, int E) {
  for (int64_t t = 0; t < N; ++t) {
    float* r = p + t * E;
    const float mx = *std::max_element(r, r + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += r[e] = std::exp(r[e] - mx);
    const auto inv = static_cast<float>(1.0 / sum);
    for (int e = 0; e < E; ++e) r[e] *= inv;
  }
}

// The FFN's forward on n rows: h (n, up·We) = x·fcw^T + fcb, act (n, We), y (n, C) = act·fcprojw^T
// (+ fcprojb on tp rank 0 only: the output is a tp partial).
void ffn_forward(const Gpt& g, const FfnParams& p, float* y, float* h, float* act, const float* x,
                 int64_t n) {
  if (n == 0) return;
  const int C = g.dims.C, We = g.moe_dims.We, up = g.dims.up;
  const int rows = static_cast<int>(n);
  matmul_forward(h, x, p.fcw, p.fcb, 1, rows, C, up * We);
  if (up == 2) {
    swiglu_forward(act, h, static_cast<std::size_t>(n), We);
  } else {
    gelu_forward(act, h, static_cast<std::size_t>(n) * We);
  }
  matmul_forward(y, act, p.fcprojw, g.shard.tp_rank == 0 ? p.fcprojb : nullptr, 1, rows, We, C);
}

// Its backward: dx (n, C) = the input gradient (overwritten, or added to with `accumulate`); the
// weights' and biases' gradients accumulate (fcprojb's on every tp rank: dy is replicated).
void ffn_backward(const Gpt& g, const FfnParams& p, const FfnParams& dp, float* dx, const float* dy,
                  const float* h, const float* act, const float* x, int64_t n, bool accumulate) {
  if (n == 0) return;
  const int C = g.dims.C, We = g.moe_dims.We, up = g.dims.up;
  const int rows = static_cast<int>(n);
  Rows dact(static_cast<std::size_t>(n) * We), dh(static_cast<std::size_t>(n) * up * We, 0.0f);
  if (dp.fcprojb != nullptr) bias_backward(dp.fcprojb, dy, 1, rows, C);
  matmul_backward(dact.data(), dp.fcprojw, nullptr, dy, act, p.fcprojw, 1, rows, We, C, false);
  if (up == 2) {
    swiglu_backward(dh.data(), h, dact.data(), static_cast<std::size_t>(n), We);
  } else {
    gelu_backward(dh.data(), h, dact.data(), static_cast<std::size_t>(n) * We);
  }
  matmul_backward(dx, dp.fcw, dp.fcb, dh.data(), x, p.fcw, 1, rows, C, up * We, accumulate);
}

// FLOPs of one FFN row (forward): fc1 and fc2.
double ffn_row_flops(const Gpt& g) { return 2.0 * g.dims.C * g.moe_dims.We * (g.dims.up + 1); }

// moe.router: logits, softmax, routing, aux loss, and the send buffer (model/moe.hpp's order: by
// destination ep rank, expert, token, slot, which is global expert order since rank r holds
// experts [r·El, (r+1)·El)).
void route_and_pack(const Gpt& g, const MoeParams& p, const float* ln2, int64_t N,
                    MoeBlockState& st) {
  const MoeDims& md = g.moe_dims;
  const int C = g.dims.C, E = md.E, K = md.K;
  st.probs.resize(static_cast<std::size_t>(N) * E);
  matmul_forward(st.probs.data(), ln2, p.router, nullptr, 1, static_cast<int>(N), C, E);
  softmax_rows(st.probs.data(), N, E);
  st.routing = moe::route(st.probs.data(), N, E, K, moe::capacity(g.config.moe, N));
  st.aux = moe::aux_loss(st.probs.data(), st.routing, g.config.moe.aux_loss_coef);
  std::vector<std::vector<int64_t>> of(static_cast<std::size_t>(E));
  for (int64_t a = 0; a < N * K; ++a) {
    if (st.routing.kept[std::size_t(a)])
      of[std::size_t(st.routing.expert[std::size_t(a)])].push_back(a);
  }
  st.send_row.assign(static_cast<std::size_t>(N * K), -1);
  st.send_counts.assign(static_cast<std::size_t>(E), 0);
  int64_t row = 0;
  for (int e = 0; e < E; ++e) {
    st.send_counts[std::size_t(e)] = static_cast<int64_t>(of[std::size_t(e)].size());
    for (int64_t a : of[std::size_t(e)]) st.send_row[std::size_t(a)] = row++;
  }
  st.send.resize(static_cast<std::size_t>(row) * C);
  for (int64_t a = 0; a < N * K; ++a) {
    const int64_t r = st.send_row[std::size_t(a)];
    if (r >= 0) std::memcpy(st.send.data() + r * C, ln2 + (a / K) * C, sizeof(float) * C);
  }
}

int64_t total(const std::vector<int64_t>& v) {
  int64_t n = 0;
  for (int64_t x : v) n += x;
  return n;
}

// One all-to-all of rows over the ep group (counts in rows, the hook's in elements). `recv` is
// resized to what arrives; `expect` (may be null) must equal the received counts.
void ep_exchange(const GptHooks& hooks, const char* name, int layer, int C, const Rows& send,
                 const std::vector<int64_t>& send_counts, std::size_t groups, Rows& recv,
                 std::vector<int64_t>& recv_counts, std::size_t capacity_rows,
                 const std::vector<int64_t>* expect) {
  if (!hooks.ep_all_to_all) {
    throw std::logic_error("moe: parallel.ep > 1 but GptHooks::ep_all_to_all is not set");
  }
  std::vector<int64_t> sc(send_counts.size()), rc(send_counts.size(), 0);
  for (std::size_t i = 0; i < sc.size(); ++i) sc[i] = send_counts[i] * C;
  recv.resize(std::max<std::size_t>(capacity_rows, 1) * static_cast<std::size_t>(C));
  hooks.ep_all_to_all(name, layer, send.data(), sc.data(), groups, recv.data(), rc.data(),
                      recv.size());
  recv_counts.resize(rc.size());
  for (std::size_t i = 0; i < rc.size(); ++i) recv_counts[i] = rc[i] / C;
  if (expect != nullptr && *expect != recv_counts) {
    throw InternalError("moe: an all-to-all of layer " + std::to_string(layer) +
                        " received other row counts than its dispatch sent");
  }
  recv.resize(static_cast<std::size_t>(total(recv_counts)) * C);
}

// The rows each held expert received, in recv order (by source ep rank, then expert).
std::vector<std::vector<int64_t>> expert_rows(const std::vector<int64_t>& recv_counts, int ep,
                                              int El) {
  std::vector<std::vector<int64_t>> rows(static_cast<std::size_t>(El));
  int64_t off = 0;
  for (int q = 0; q < ep; ++q) {
    for (int e = 0; e < El; ++e) {
      for (int64_t i = 0; i < recv_counts[std::size_t(q * El + e)]; ++i) {
        rows[std::size_t(e)].push_back(off++);
      }
    }
  }
  return rows;
}

// moe.experts: the held experts on their rows (st.out, recv order), then the shared experts on
// every token, their sum into fcproj (N, C).
void run_experts(const Gpt& g, const MoeParams& p, const float* ln2, int64_t N, MoeBlockState& st,
                 const Rows& in, float* fcproj) {
  const MoeDims& md = g.moe_dims;
  const int C = g.dims.C, We = md.We, up = g.dims.up;
  st.rows = expert_rows(st.recv_counts, md.ep, md.El);
  st.out.assign(in.size(), 0.0f);
  st.x.resize(std::size_t(md.El));
  st.h.resize(std::size_t(md.El));
  st.act.resize(std::size_t(md.El));
  Rows y;
  for (int e = 0; e < md.El; ++e) {
    const auto& rows = st.rows[std::size_t(e)];
    const auto n = static_cast<int64_t>(rows.size());
    auto& x = st.x[std::size_t(e)];
    x.resize(std::size_t(n) * C);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(x.data() + i * C, in.data() + rows[std::size_t(i)] * C, sizeof(float) * C);
    }
    st.h[std::size_t(e)].resize(std::size_t(n) * up * We);
    st.act[std::size_t(e)].resize(std::size_t(n) * We);
    y.resize(std::size_t(n) * C);
    ffn_forward(g, p.experts[std::size_t(e)], y.data(), st.h[std::size_t(e)].data(),
                st.act[std::size_t(e)].data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(st.out.data() + rows[std::size_t(i)] * C, y.data() + i * C, sizeof(float) * C);
    }
  }
  std::fill(fcproj, fcproj + N * C, 0.0f);
  st.sh.resize(std::size_t(md.S));
  st.sact.resize(std::size_t(md.S));
  y.resize(std::size_t(N) * C);
  for (int j = 0; j < md.S; ++j) {
    st.sh[std::size_t(j)].resize(std::size_t(N) * up * We);
    st.sact[std::size_t(j)].resize(std::size_t(N) * We);
    ffn_forward(g, p.shared[std::size_t(j)], y.data(), st.sh[std::size_t(j)].data(),
                st.sact[std::size_t(j)].data(), ln2, N);
    for (int64_t i = 0; i < N * C; ++i) fcproj[i] += y[std::size_t(i)];
  }
}

// The expert outputs in send order: combined back over ep, or (ep 1) where they were computed.
const Rows& returned_rows(const Gpt& g, const MoeBlockState& st) {
  return g.moe_dims.ep > 1 ? st.back : st.out;
}

}  // namespace

void moe_ffn_forward(const Gpt& g, GptActivations& acts, int layer, const GptHooks& hooks) {
  const std::size_t idx = block_of(g, layer);
  const MoeDims& md = g.moe_dims;
  const MoeParams& p = g.moe[idx];
  BlockActivations& a = acts.blocks[idx];
  MoeBlockState& st = acts.moe.at(idx);
  const int C = g.dims.C, K = md.K;
  const int64_t N = int64_t(acts.B) * acts.T;
  {
    OpSpan span(hooks.observer, model::names::kMoeRouter.data(), layer, 2.0 * N * C * md.E);
    route_and_pack(g, p, a.ln2, N, st);
  }
  if (hooks.on_routing) hooks.on_routing(layer, st.routing, st.aux);
  if (md.ep > 1) {
    // At most N·K rows from each ep rank.
    ep_exchange(hooks, model::names::kMoeDispatch.data(), layer, C, st.send, st.send_counts,
                std::size_t(md.El), st.recv, st.recv_counts, std::size_t(md.ep * N * K), nullptr);
  } else {
    st.recv_counts = st.send_counts;
  }
  const Rows& in = md.ep > 1 ? st.recv : st.send;
  {
    const double rows = double(in.size() / std::size_t(C)) + double(N) * md.S;
    OpSpan span(hooks.observer, model::names::kMoeExperts.data(), layer, rows * ffn_row_flops(g));
    run_experts(g, p, a.ln2, N, st, in, a.fcproj);
  }
  if (md.ep > 1) {
    std::vector<int64_t> back_counts;
    ep_exchange(hooks, model::names::kMoeCombine.data(), layer, C, st.out, st.recv_counts,
                std::size_t(md.El), st.back, back_counts, st.send.size() / std::size_t(C),
                &st.send_counts);
  }
  const Rows& back = returned_rows(g, st);
  OpSpan span(hooks.observer, model::names::kMoeGatedSum.data(), layer, 2.0 * double(back.size()));
  for (int64_t t = 0; t < N; ++t) {
    float* o = a.fcproj + t * C;
    for (int k = 0; k < K; ++k) {
      const auto as = static_cast<std::size_t>(t * K + k);
      const int64_t r = st.send_row[as];
      if (r < 0) continue;
      const float w = st.routing.weight[as];
      const float* b = back.data() + r * C;
      for (int c = 0; c < C; ++c) o[c] += w * b[c];
    }
  }
}

namespace {

// moe.gated_sum.bwd: dback (S, C) = g · dy per kept assignment; dgate (N·K) = <dy, returned row>
// (this tp rank's partial).
void gated_sum_backward(const Gpt& g, const MoeBlockState& st, const float* dy, int64_t N,
                        Rows& dback, Rows& dgate) {
  const int C = g.dims.C, K = g.moe_dims.K;
  const Rows& back = returned_rows(g, st);
  dback.assign(st.send.size(), 0.0f);
  dgate.assign(static_cast<std::size_t>(N * K), 0.0f);
  for (int64_t t = 0; t < N; ++t) {
    const float* d = dy + t * C;
    for (int k = 0; k < K; ++k) {
      const auto as = static_cast<std::size_t>(t * K + k);
      const int64_t r = st.send_row[as];
      if (r < 0) continue;
      const float w = st.routing.weight[as];
      const float* b = back.data() + r * C;
      float* db = dback.data() + r * C;
      double dot = 0;
      for (int c = 0; c < C; ++c) {
        db[c] = w * d[c];
        dot += double(d[c]) * b[c];
      }
      dgate[as] = static_cast<float>(dot);
    }
  }
}

// moe.experts.bwd: the held experts' gradients from dout (R, C, recv order) into dx (R, C); the
// shared experts' from dy, their input gradient into dln (N, C, overwritten).
void experts_backward(Gpt& g, std::size_t idx, const MoeBlockState& st, const Rows& dout, Rows& dx,
                      const float* dy, const float* ln2, int64_t N, float* dln) {
  const MoeDims& md = g.moe_dims;
  const int C = g.dims.C;
  const MoeParams& p = g.moe[idx];
  const MoeParams& dp = g.dmoe[idx];
  dx.assign(dout.size(), 0.0f);
  Rows dy_e, dx_e;
  for (int e = 0; e < md.El; ++e) {
    const auto& rows = st.rows[std::size_t(e)];
    const auto n = static_cast<int64_t>(rows.size());
    dy_e.resize(std::size_t(n) * C);
    dx_e.resize(std::size_t(n) * C);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(dy_e.data() + i * C, dout.data() + rows[std::size_t(i)] * C, sizeof(float) * C);
    }
    ffn_backward(g, p.experts[std::size_t(e)], dp.experts[std::size_t(e)], dx_e.data(), dy_e.data(),
                 st.h[std::size_t(e)].data(), st.act[std::size_t(e)].data(),
                 st.x[std::size_t(e)].data(), n, false);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(dx.data() + rows[std::size_t(i)] * C, dx_e.data() + i * C, sizeof(float) * C);
    }
  }
  std::fill(dln, dln + N * C, 0.0f);
  for (int j = 0; j < md.S; ++j) {
    ffn_backward(g, p.shared[std::size_t(j)], dp.shared[std::size_t(j)], dln, dy,
                 st.sh[std::size_t(j)].data(), st.sact[std::size_t(j)].data(), ln2, N, true);
  }
}

// moe.router.bwd: the dispatched rows' gradients dxs (S, C, send order) added to dln; the gates'
// dgate (N·K, summed over tp) through the renormalisation, plus the aux loss's, through the
// softmax into the router's weights; its input gradient on tp rank 0 only (replicated over tp).
void router_backward(Gpt& g, std::size_t idx, const MoeBlockState& st, const Rows& dxs,
                     const Rows& dgate, const float* ln2, int64_t N, float* dln, float scale) {
  const MoeDims& md = g.moe_dims;
  const int C = g.dims.C, E = md.E, K = md.K;
  for (int64_t t = 0; t < N; ++t) {
    float* d = dln + t * C;
    for (int k = 0; k < K; ++k) {
      const int64_t r = st.send_row[std::size_t(t * K + k)];
      if (r < 0) continue;
      const float* x = dxs.data() + r * C;
      for (int c = 0; c < C; ++c) d[c] += x[c];
    }
  }
  Rows dprobs(static_cast<std::size_t>(N) * E, 0.0f);
  for (int64_t t = 0; t < N; ++t) {
    // g_k = p_{e_k} / Z over the top_k: dp_{e_j} = (dg_j - Σ_k dg_k g_k) / Z.
    const float* pr = st.probs.data() + t * E;
    double z = 0, sdg = 0;
    for (int k = 0; k < K; ++k) {
      const auto as = static_cast<std::size_t>(t * K + k);
      z += pr[st.routing.expert[as]];
      sdg += double(dgate[as]) * st.routing.weight[as];
    }
    for (int k = 0; k < K; ++k) {
      const auto as = static_cast<std::size_t>(t * K + k);
      dprobs[std::size_t(t * E + st.routing.expert[as])] +=
          static_cast<float>((dgate[as] - sdg) / z);
    }
  }
  moe::aux_loss_backward(dprobs.data(), st.routing, g.config.moe.aux_loss_coef * scale);
  for (int64_t t = 0; t < N; ++t) {  // softmax: dlogit_e = p_e (dp_e - Σ_j p_j dp_j)
    const float* pr = st.probs.data() + t * E;
    float* d = dprobs.data() + t * E;
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += double(pr[e]) * d[e];
    for (int e = 0; e < E; ++e) d[e] = static_cast<float>(pr[e] * (d[e] - dot));
  }
  matmul_backward(g.shard.tp_rank == 0 ? dln : nullptr, g.dmoe[idx].router, nullptr, dprobs.data(),
                  ln2, g.moe[idx].router, 1, static_cast<int>(N), C, E, true);
}

}  // namespace

void moe_ffn_backward(Gpt& g, GptActivations& acts, GptGradScratch& s, int layer,
                      const GptHooks& hooks) {
  const std::size_t idx = block_of(g, layer);
  const MoeDims& md = g.moe_dims;
  const BlockActivations& a = acts.blocks[idx];
  const MoeBlockState& st = acts.moe.at(idx);
  const int C = g.dims.C;
  const int64_t N = int64_t(acts.B) * acts.T;
  const float* dy = s.dres;
  Rows dback, dgate;
  {
    OpSpan span(hooks.observer, model::names::kMoeGatedSumBackward.data(), layer,
                4.0 * double(st.send.size()));
    gated_sum_backward(g, st, dy, N, dback, dgate);
  }
  if (g.shard.tp_size > 1) {
    if (!hooks.tp_all_reduce) throw std::logic_error("moe: tp > 1 but no tp_all_reduce hook");
    hooks.tp_all_reduce(TpPoint::kMoeGateBackward, layer, dgate.data(), dgate.size());
  }
  Rows dout_recv;
  if (md.ep > 1) {
    std::vector<int64_t> counts;
    ep_exchange(hooks, model::names::kMoeCombineBackward.data(), layer, C, dback, st.send_counts,
                std::size_t(md.El), dout_recv, counts, st.recv.size() / std::size_t(C),
                &st.recv_counts);
  }
  const Rows& dout = md.ep > 1 ? dout_recv : dback;
  Rows dx;
  {
    const double rows = double(dout.size() / std::size_t(C)) + double(N) * md.S;
    OpSpan span(hooks.observer, model::names::kMoeExpertsBackward.data(), layer,
                2.0 * rows * ffn_row_flops(g));
    experts_backward(g, idx, st, dout, dx, dy, a.ln2, N, s.dln);
  }
  Rows dxs_recv;
  if (md.ep > 1) {
    std::vector<int64_t> counts;
    ep_exchange(hooks, model::names::kMoeDispatchBackward.data(), layer, C, dx, st.recv_counts,
                std::size_t(md.El), dxs_recv, counts, st.send.size() / std::size_t(C),
                &st.send_counts);
  }
  OpSpan span(hooks.observer, model::names::kMoeRouterBackward.data(), layer, 4.0 * N * C * md.E);
  router_backward(g, idx, st, md.ep > 1 ? dxs_recv : dx, dgate, a.ln2, N, s.dln,
                  acts.objective_scale);
}

std::size_t moe_state_bytes(const GptActivations& acts) {
  std::size_t n = 0;
  auto add = [&n](const auto& v) { n += v.capacity() * sizeof(v[0]); };
  for (const auto& st : acts.moe) {
    add(st.probs);
    add(st.routing.expert);
    add(st.routing.weight);
    add(st.routing.kept);
    add(st.send_row);
    add(st.send);
    add(st.recv);
    add(st.out);
    add(st.back);
    for (const auto* vv : {&st.x, &st.h, &st.act, &st.sh, &st.sact}) {
      for (const auto& v : *vv) add(v);
    }
    for (const auto& v : st.rows) add(v);
  }
  return n;
}

double gpt_aux_loss(const GptActivations& acts) {
  double sum = 0;
  for (const auto& m : acts.moe) sum += m.aux;
  return sum;
}

}  // namespace orrery::runtime
