// The mixture-of-experts block's CPU kernels, its host-side decisions (both backends') and the CPU
// model's entry points (moe_block.hpp; the maths over any backend is moe_pieces.hpp's, the rules
// model/moe.hpp's: routing, capacity drops, the aux loss, the dispatch order, tp and ep).
//
// These loops are compiled with the default flags (not kernels.cpp's FMA contraction), as they were
// when the CPU model's MoE block lived here whole: the CPU's numbers are the same to the bit.
#include "orrery/runtime/moe_block.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "orrery/model/moe.hpp"
#include "orrery/runtime/gpt_pieces.hpp"
#include "orrery/runtime/moe_pieces.hpp"

namespace orrery::runtime {

namespace moe = ::orrery::model::moe;

// ------------------------------------------------------------------------------ CPU kernels

void moe_softmax(float* p, int64_t N, int E) {
  for (int64_t t = 0; t < N; ++t) {
    float* r = p + t * E;
    const float mx = *std::max_element(r, r + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += r[e] = std::exp(r[e] - mx);
    const auto inv = static_cast<float>(1.0 / sum);
    for (int e = 0; e < E; ++e) r[e] *= inv;
  }
}

void moe_gather_rows(float* dst, const float* src, const int64_t* idx, int64_t n, int C) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * C, src + idx[i] * C, sizeof(float) * std::size_t(C));
  }
}

void moe_scatter_rows(float* dst, const float* src, const int64_t* idx, int64_t n, int C) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + idx[i] * C, src + i * C, sizeof(float) * std::size_t(C));
  }
}

void moe_gated_sum(float* out, const float* rows, const int64_t* row, const float* weight,
                   int64_t N, int K, int C) {
  for (int64_t t = 0; t < N; ++t) {
    float* o = out + t * C;
    for (int k = 0; k < K; ++k) {
      const auto as = static_cast<std::size_t>(t * K + k);
      const int64_t r = row[as];
      if (r < 0) continue;
      const float w = weight[as];
      const float* b = rows + r * C;
      for (int c = 0; c < C; ++c) o[c] += w * b[c];
    }
  }
}

void moe_gated_sum_backward(float* drows, float* dgate, const float* dy, const float* rows,
                            const int64_t* row, const float* weight, int64_t N, int K, int C) {
  std::fill(dgate, dgate + N * K, 0.0f);
  for (int64_t t = 0; t < N; ++t) {
    const float* d = dy + t * C;
    for (int k = 0; k < K; ++k) {
      const auto as = static_cast<std::size_t>(t * K + k);
      const int64_t r = row[as];
      if (r < 0) continue;
      const float w = weight[as];
      const float* b = rows + r * C;
      float* db = drows + r * C;
      double dot = 0;
      for (int c = 0; c < C; ++c) {
        db[c] = w * d[c];
        dot += double(d[c]) * b[c];
      }
      dgate[as] = static_cast<float>(dot);
    }
  }
}

void moe_rows_add(float* d, const float* rows, const int64_t* row, int64_t N, int K, int C) {
  for (int64_t t = 0; t < N; ++t) {
    float* o = d + t * C;
    for (int k = 0; k < K; ++k) {
      const int64_t r = row[std::size_t(t * K + k)];
      if (r < 0) continue;
      const float* x = rows + r * C;
      for (int c = 0; c < C; ++c) o[c] += x[c];
    }
  }
}

// ------------------------------------------------------------------------ host-side decisions

void moe_plan_routing(const Gpt& g, const float* probs, int64_t N, MoeRoutingPlan& p) {
  const MoeDims& md = g.moe_dims;
  const int E = md.E, K = md.K;
  p.routing = moe::route(probs, N, E, K, moe::capacity(g.config.moe, N));
  p.aux = moe::aux_loss(probs, p.routing, g.config.moe.aux_loss_coef);
  std::vector<std::vector<int64_t>> of(static_cast<std::size_t>(E));
  for (int64_t a = 0; a < N * K; ++a) {
    if (p.routing.kept[std::size_t(a)])
      of[std::size_t(p.routing.expert[std::size_t(a)])].push_back(a);
  }
  p.send_row.assign(static_cast<std::size_t>(N * K), -1);
  p.send_counts.assign(static_cast<std::size_t>(E), 0);
  p.send_token.clear();
  int64_t row = 0;
  for (int e = 0; e < E; ++e) {
    p.send_counts[std::size_t(e)] = static_cast<int64_t>(of[std::size_t(e)].size());
    for (int64_t a : of[std::size_t(e)]) {
      p.send_row[std::size_t(a)] = row++;
      p.send_token.push_back(a / K);
    }
  }
  p.send_rows = row;
}

void moe_plan_experts(const Gpt& g, MoeRoutingPlan& p) {
  const int ep = g.moe_dims.ep, El = g.moe_dims.El;
  // Where block (source q, expert e) begins in recv order (q-major).
  std::vector<int64_t> at(p.recv_counts.size() + 1, 0);
  for (std::size_t i = 0; i < p.recv_counts.size(); ++i) at[i + 1] = at[i] + p.recv_counts[i];
  p.recv_rows = at.back();
  p.expert_rows.clear();
  p.expert_begin.assign(std::size_t(El) + 1, 0);
  for (int e = 0; e < El; ++e) {
    for (int q = 0; q < ep; ++q) {
      const auto b = std::size_t(q * El + e);
      for (int64_t r = at[b]; r < at[b + 1]; ++r) p.expert_rows.push_back(r);
    }
    p.expert_begin[std::size_t(e) + 1] = static_cast<int64_t>(p.expert_rows.size());
  }
}

void moe_router_dlogits(const Gpt& g, const float* probs, const float* dgate, int64_t N,
                        float scale, MoeRoutingPlan& p) {
  const MoeDims& md = g.moe_dims;
  const int E = md.E, K = md.K;
  const moe::Routing& rt = p.routing;
  std::vector<float>& d = p.dlogits;
  d.assign(static_cast<std::size_t>(N) * E, 0.0f);
  for (int64_t t = 0; t < N; ++t) {
    // g_k = p_{e_k} / Z over the top_k: dp_{e_j} = (dg_j - Σ_k dg_k g_k) / Z.
    const float* pr = probs + t * E;
    double z = 0, sdg = 0;
    for (int k = 0; k < K; ++k) {
      const auto as = static_cast<std::size_t>(t * K + k);
      z += pr[rt.expert[as]];
      sdg += double(dgate[as]) * rt.weight[as];
    }
    for (int k = 0; k < K; ++k) {
      const auto as = static_cast<std::size_t>(t * K + k);
      d[std::size_t(t * E + rt.expert[as])] += static_cast<float>((dgate[as] - sdg) / z);
    }
  }
  moe::aux_loss_backward(d.data(), rt, g.config.moe.aux_loss_coef * scale);
  for (int64_t t = 0; t < N; ++t) {  // softmax: dlogit_e = p_e (dp_e - Σ_j p_j dp_j)
    const float* pr = probs + t * E;
    float* r = d.data() + t * E;
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += double(pr[e]) * r[e];
    for (int e = 0; e < E; ++e) r[e] = static_cast<float>(pr[e] * (r[e] - dot));
  }
}

// ------------------------------------------------------------------------------ the CPU model

void moe_ffn_forward(const Gpt& g, GptActivations& acts, int layer, const GptHooks& hooks) {
  moe_pieces::forward(CpuKernels{}, g, acts, layer, hooks);
}

void moe_ffn_backward(Gpt& g, GptActivations& acts, GptGradScratch& s, int layer,
                      const GptHooks& hooks) {
  moe_pieces::backward(CpuKernels{}, g, acts, s, layer, hooks);
}

}  // namespace orrery::runtime
