// Finite-difference helpers shared by the kernel and model tests: random inputs, the objective
// sum(w * out) in double, central differences against an analytic gradient, and the whole-model
// check (every parameter of every tensor).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "orrery/runtime/model.hpp"

namespace orrery::runtime::fd {

inline std::vector<float> randn(std::size_t n, float stddev, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// n token ids in [0, V).
inline std::vector<int32_t> tokens(int n, int V, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = static_cast<int32_t>(gen() % static_cast<uint32_t>(V));
  return v;
}

// Larger random parameters than the initialisation, so every gradient is well above fp32 noise
// (norm gains around 1).
inline void scramble(Gpt& m, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 0.3f);
  for (const auto& t : m.tensors) {
    const bool gain = t.name.find("ln") != std::string::npos && t.name.back() == 'w';
    for (std::size_t i = 0; i < t.count; ++i)
      m.params[t.offset + i] = gain ? 1.0f + d(gen) : d(gen);
  }
}

// The largest normalised error |a - n| / (|a| + |n| + floor) of an analytic gradient against
// central differences of `objective` with respect to `x`, entry by entry.
inline double max_fd_error(std::vector<float>& x, const std::vector<float>& analytic,
                           const std::function<double()>& objective, float eps = 1e-2f,
                           double floor = 1e-2) {
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + eps;
    const double up = objective();
    x[i] = saved - eps;
    const double down = objective();
    x[i] = saved;
    const double numeric = (up - down) / (2.0 * eps);
    const double err =
        std::abs(numeric - analytic[i]) / (std::abs(numeric) + std::abs(analytic[i]) + floor);
    worst = std::max(worst, err);
  }
  return worst;
}

// Every parameter of `m` against central differences of the mean loss on (in, tg), B x T tokens:
// each tensor's worst normalised error below 1e-2. `grads` are the analytic gradients (m.grads
// after one backward of the same batch).
inline void expect_model_gradients(Gpt& m, const std::vector<float>& grads,
                                   const std::vector<int32_t>& in, const std::vector<int32_t>& tg,
                                   int B, int T, float eps = 1e-2f) {
  auto acts = gpt_activations(m, B, T);
  for (const auto& t : m.tensors) {
    double worst = 0.0;
    std::size_t worst_i = 0;
    for (std::size_t i = 0; i < t.count; ++i) {
      float& p = m.params[t.offset + i];
      const float saved = p;
      p = saved + eps;
      const double up = gpt_forward(m, acts, in.data(), tg.data());
      p = saved - eps;
      const double down = gpt_forward(m, acts, in.data(), tg.data());
      p = saved;
      const double numeric = (up - down) / (2.0 * eps);
      const double analytic = grads[t.offset + i];
      const double err =
          std::abs(numeric - analytic) / (std::abs(numeric) + std::abs(analytic) + 1e-2);
      if (err > worst) {
        worst = err;
        worst_i = i;
      }
    }
    EXPECT_LT(worst, 1e-2) << t.name << "[" << worst_i << "]";
  }
}

}  // namespace orrery::runtime::fd
