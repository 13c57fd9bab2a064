// Mixture-of-experts rules shared by the runtime and the simulator (model/moe.hpp).
#include "orrery/model/moe.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace orrery::model::moe {

int moe_blocks(const MoeConfig& m, int first, int last) {
  int n = 0;
  for (int l = first; l < last; ++l) n += is_moe_block(m, l) ? 1 : 0;
  return n;
}

int expert_width(const ModelConfig& m) {
  return m.moe.expert_ffn_hidden > 0 ? m.moe.expert_ffn_hidden : block_arch(m).ffn_hidden;
}

int64_t capacity(const MoeConfig& m, int64_t tokens) {
  if (m.capacity_factor <= 0) return -1;
  const double c = m.capacity_factor * static_cast<double>(tokens) * m.top_k / m.experts;
  return static_cast<int64_t>(std::ceil(c));
}

int64_t expert_parameters(int64_t d_model, int64_t width, bool swiglu, bool bias) {
  const int64_t fc1_rows = swiglu ? 2 * width : width;
  int64_t n = fc1_rows * d_model + d_model * width;
  if (bias) n += fc1_rows + d_model;
  return n;
}

namespace {
// The top_k experts of one probability row, in descending probability (ties: lower index first).
void top_k_of(const float* p, int experts, int top_k, int* out) {
  std::vector<int> idx(static_cast<size_t>(experts));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(),
                    [p](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  std::copy(idx.begin(), idx.begin() + top_k, out);
}
}  // namespace

Routing route(const float* probs, int64_t tokens, int experts, int top_k, int64_t capacity) {
  Routing r;
  r.tokens = tokens;
  r.top_k = top_k;
  r.experts = experts;
  const auto n = static_cast<size_t>(tokens * top_k);
  r.expert.resize(n);
  r.weight.resize(n);
  r.kept.assign(n, 1);
  r.routed.assign(static_cast<size_t>(experts), 0);
  r.taken.assign(static_cast<size_t>(experts), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* p = probs + t * experts;
    int* e = r.expert.data() + t * top_k;
    top_k_of(p, experts, top_k, e);
    float sum = 0;
    for (int k = 0; k < top_k; ++k) sum += p[e[k]];
    for (int k = 0; k < top_k; ++k) r.weight[static_cast<size_t>(t * top_k + k)] = p[e[k]] / sum;
  }
  // GShard's priority: all first choices (tokens in order), then all second choices, ...
  for (int k = 0; k < top_k; ++k) {
    for (int64_t t = 0; t < tokens; ++t) {
      const auto a = static_cast<size_t>(t * top_k + k);
      const auto e = static_cast<size_t>(r.expert[a]);
      ++r.routed[e];
      if (capacity >= 0 && r.taken[e] >= capacity) {
        r.kept[a] = 0;
        ++r.dropped;
      } else {
        ++r.taken[e];
      }
    }
  }
  return r;
}

double aux_loss(const float* probs, const Routing& r, double coef) {
  if (r.tokens == 0) return 0.0;
  const double assignments = static_cast<double>(r.tokens) * r.top_k;
  double sum = 0;
  for (int e = 0; e < r.experts; ++e) {
    double mean_p = 0;
    for (int64_t t = 0; t < r.tokens; ++t) mean_p += probs[t * r.experts + e];
    mean_p /= static_cast<double>(r.tokens);
    sum += static_cast<double>(r.routed[static_cast<size_t>(e)]) / assignments * mean_p;
  }
  return coef * r.experts * sum;
}

void aux_loss_backward(float* dprobs, const Routing& r, double coef) {
  if (r.tokens == 0) return;
  const double assignments = static_cast<double>(r.tokens) * r.top_k;
  for (int e = 0; e < r.experts; ++e) {
    const double f = static_cast<double>(r.routed[static_cast<size_t>(e)]) / assignments;
    const auto g = static_cast<float>(coef * r.experts * f / static_cast<double>(r.tokens));
    for (int64_t t = 0; t < r.tokens; ++t) dprobs[t * r.experts + e] += g;
  }
}

std::vector<double> expert_load_shares(int experts, double skew) {
  std::vector<double> s(static_cast<size_t>(experts));
  double sum = 0;
  for (int e = 0; e < experts; ++e) sum += s[static_cast<size_t>(e)] = std::pow(e + 1.0, -skew);
  for (double& x : s) x /= sum;
  return s;
}

std::string moe_tokens_counter(int layer, int expert) {
  return "moe.tokens[l=" + std::to_string(layer) + ",e=" + std::to_string(expert) + "]";
}
std::string moe_dropped_counter(int layer) {
  return "moe.dropped[l=" + std::to_string(layer) + "]";
}

}  // namespace orrery::model::moe
