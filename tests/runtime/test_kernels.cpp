// Every CPU kernel of the GPT against an independent reference: forward values against naive
// double-precision loops, backward against central finite differences of the objective
// sum(w * out) (w random), evaluated in double from the fp32 forward.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "fd_check.hpp"
#include "orrery/runtime/kernels.hpp"

namespace orrery::runtime {
namespace {

using fd::dot;
using fd::max_fd_error;
using fd::randn;

constexpr double kTol = 5e-3;  // fp32 forward, eps 1e-2: about 1e-4 truncation + roundoff

TEST(Kernels, LayerNormForwardMatchesDouble) {
  const int B = 2, T = 3, C = 8;
  auto x = randn(B * T * C, 1.5f, 1), w = randn(C, 1.0f, 2), b = randn(C, 1.0f, 3);
  std::vector<float> out(B * T * C), mean(B * T), rstd(B * T);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), B, T, C);
  double maxdiff = 0.0;
  for (int i = 0; i < B * T; ++i) {
    double m = 0.0, v = 0.0;
    for (int c = 0; c < C; ++c) m += x[i * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[i * C + c] - m) * (x[i * C + c] - m);
    v /= C;
    for (int c = 0; c < C; ++c) {
      const double ref = (x[i * C + c] - m) / std::sqrt(v + 1e-5) * w[c] + b[c];
      maxdiff = std::max(maxdiff, std::abs(ref - out[i * C + c]));
    }
  }
  EXPECT_LT(maxdiff, 1e-5);
}

TEST(Kernels, LayerNormBackwardMatchesFiniteDifferences) {
  const int B = 2, T = 3, C = 8;
  auto x = randn(B * T * C, 1.5f, 4), w = randn(C, 1.0f, 5), b = randn(C, 1.0f, 6);
  const auto wout = randn(B * T * C, 1.0f, 7);
  std::vector<float> out(B * T * C), mean(B * T), rstd(B * T);
  auto objective = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), B, T, C);
    return dot(out, wout);
  };
  objective();
  std::vector<float> dx(x.size(), 0.0f), dw(C, 0.0f), db(C, 0.0f);
  layernorm_backward(dx.data(), dw.data(), db.data(), wout.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), B, T, C);
  EXPECT_LT(max_fd_error(x, dx, objective), kTol);
  EXPECT_LT(max_fd_error(w, dw, objective), kTol);
  EXPECT_LT(max_fd_error(b, db, objective), kTol);
}

TEST(Kernels, MatmulForwardAndBackward) {
  const int B = 2, T = 3, C = 5, OC = 7;
  auto x = randn(B * T * C, 1.0f, 8), w = randn(OC * C, 1.0f, 9), bias = randn(OC, 1.0f, 10);
  const auto wout = randn(B * T * OC, 1.0f, 11);
  std::vector<float> out(B * T * OC);
  auto objective = [&] {
    matmul_forward(out.data(), x.data(), w.data(), bias.data(), B, T, C, OC);
    return dot(out, wout);
  };
  objective();
  double maxdiff = 0.0;
  for (int i = 0; i < B * T; ++i) {
    for (int o = 0; o < OC; ++o) {
      double ref = bias[o];
      for (int c = 0; c < C; ++c) ref += static_cast<double>(x[i * C + c]) * w[o * C + c];
      maxdiff = std::max(maxdiff, std::abs(ref - out[i * OC + o]));
    }
  }
  EXPECT_LT(maxdiff, 1e-5);
  std::vector<float> dx(x.size(), 0.0f), dw(w.size(), 0.0f), db(OC, 0.0f);
  matmul_backward(dx.data(), dw.data(), db.data(), wout.data(), x.data(), w.data(), B, T, C, OC);
  EXPECT_LT(max_fd_error(x, dx, objective), kTol);
  EXPECT_LT(max_fd_error(w, dw, objective), kTol);
  EXPECT_LT(max_fd_error(bias, db, objective), kTol);
}

// Naive causal attention in double, for the forward check: qkv rows [q (NH heads) | k (NKV) |
// v (NKV)], query head h reading key/value head h / (NH / NKV).
std::vector<double> attention_reference(const std::vector<float>& qkv, int B, int T, int C, int NH,
                                        int NKV) {
  const int hs = C / NH, W = C + 2 * NKV * hs, group = NH / NKV;
  std::vector<double> out(static_cast<std::size_t>(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const int g = h / group;
      for (int t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double acc = 0.0;
          for (int i = 0; i < hs; ++i) {
            acc += static_cast<double>(qkv[(b * T + t) * W + h * hs + i]) *
                   qkv[(b * T + j) * W + C + g * hs + i];
          }
          s[j] = acc / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (int i = 0; i < hs; ++i) {
          double acc = 0.0;
          for (int j = 0; j <= t; ++j)
            acc += s[j] / sum * qkv[(b * T + j) * W + C + (NKV + g) * hs + i];
          out[(b * T + t) * C + h * hs + i] = acc;
        }
      }
    }
  }
  return out;
}

void check_attention(int B, int T, int C, int NH, uint32_t seed, int NKV = 0) {
  if (NKV == 0) NKV = NH;
  const int W = C + 2 * NKV * (C / NH);
  auto qkv = randn(static_cast<std::size_t>(B) * T * W, 1.0f, seed);
  const auto wout = randn(static_cast<std::size_t>(B) * T * C, 1.0f, seed + 1);
  std::vector<float> out(static_cast<std::size_t>(B) * T * C),
      att(static_cast<std::size_t>(B) * NH * T * T);
  auto objective = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, NKV);
    return dot(out, wout);
  };
  objective();
  const auto ref = attention_reference(qkv, B, T, C, NH, NKV);
  double maxdiff = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i)
    maxdiff = std::max(maxdiff, std::abs(ref[i] - out[i]));
  EXPECT_LT(maxdiff, 1e-5) << "T=" << T << " NKV=" << NKV;
  std::vector<float> dqkv(qkv.size(), 0.0f), datt(att.size());
  attention_backward(dqkv.data(), datt.data(), wout.data(), qkv.data(), att.data(), B, T, C, NH,
                     NKV);
  EXPECT_LT(max_fd_error(qkv, dqkv, objective, 1e-2f), kTol) << "T=" << T << " NKV=" << NKV;
}

TEST(Kernels, AttentionForwardAndBackward) { check_attention(2, 5, 8, 2, 12); }

// T larger than the causal block (64) exercises the blocked sgemm paths.
TEST(Kernels, AttentionAcrossCausalBlocks) { check_attention(1, 70, 4, 2, 14); }

// Grouped-query (4 query heads over 2 key/value heads) and multi-query attention.
TEST(Kernels, GroupedQueryAttentionForwardAndBackward) { check_attention(2, 5, 8, 4, 30, 2); }
TEST(Kernels, MultiQueryAttentionForwardAndBackward) { check_attention(1, 6, 8, 4, 32, 1); }

TEST(Kernels, GeluForwardAndBackward) {
  const std::size_t N = 64;
  auto x = randn(N, 2.0f, 16);
  const auto wout = randn(N, 1.0f, 17);
  std::vector<float> out(N);
  auto objective = [&] {
    gelu_forward(out.data(), x.data(), N);
    return dot(out, wout);
  };
  objective();
  for (std::size_t i = 0; i < N; ++i) {
    const double v = x[i];
    const double ref =
        0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(out[i], ref, 1e-6 * (1.0 + std::abs(ref)));
  }
  std::vector<float> dx(N, 0.0f);
  gelu_backward(dx.data(), x.data(), wout.data(), N);
  EXPECT_LT(max_fd_error(x, dx, objective), kTol);
}

TEST(Kernels, SoftmaxCrossEntropyForwardAndBackward) {
  const int B = 2, T = 3, V = 11;
  auto logits = randn(B * T * V, 2.0f, 18);
  const std::vector<int32_t> targets = {0, 3, 10, 5, 5, 1};
  std::vector<float> work(logits.size()), losses(B * T);
  auto objective = [&] {
    work = logits;
    return static_cast<double>(
        softmax_crossentropy_forward(losses.data(), work.data(), targets.data(), B, T, V));
  };
  const double mean = objective();
  double ref_mean = 0.0;
  for (int i = 0; i < B * T; ++i) {
    double mx = -1e300, sum = 0.0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(logits[i * V + j]));
    for (int j = 0; j < V; ++j) sum += std::exp(logits[i * V + j] - mx);
    const double loss = std::log(sum) - (logits[i * V + targets[i]] - mx);
    EXPECT_NEAR(losses[i], loss, 1e-5);
    double p_sum = 0.0;
    for (int j = 0; j < V; ++j) p_sum += work[i * V + j];
    EXPECT_NEAR(p_sum, 1.0, 1e-6);
    ref_mean += loss / (B * T);
  }
  EXPECT_NEAR(mean, ref_mean, 1e-6);
  softmax_crossentropy_backward(work.data(), targets.data(), 1.0f / (B * T), B, T, V);
  std::vector<float> dlogits = work;
  EXPECT_LT(max_fd_error(logits, dlogits, objective, 1e-2f), kTol);
}

TEST(Kernels, EncoderForwardAndBackward) {
  const int B = 2, T = 3, C = 4, V = 5;
  auto wte = randn(V * C, 1.0f, 19), wpe = randn(T * C, 1.0f, 20);
  const std::vector<int32_t> inp = {1, 4, 1, 0, 2, 2};  // repeated tokens accumulate
  const auto wout = randn(B * T * C, 1.0f, 21);
  std::vector<float> out(B * T * C);
  auto objective = [&] {
    encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, wout);
  };
  objective();
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      for (int c = 0; c < C; ++c) {
        EXPECT_EQ(out[(b * T + t) * C + c], wte[inp[b * T + t] * C + c] + wpe[t * C + c]);
      }
    }
  }
  std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
  encoder_backward(dwte.data(), dwpe.data(), wout.data(), inp.data(), B, T, C);
  EXPECT_LT(max_fd_error(wte, dwte, objective), kTol);
  EXPECT_LT(max_fd_error(wpe, dwpe, objective), kTol);
}

TEST(Kernels, BiasResidualAndBiasBackward) {
  const int B = 1, T = 2, C = 3;
  const std::vector<float> r = {1, 2, 3, 4, 5, 6}, p = {10, 20, 30, 40, 50, 60},
                           bias = {100, 200, 300};
  std::vector<float> out(6);
  bias_residual_forward(out.data(), r.data(), p.data(), bias.data(), B, T, C);
  EXPECT_EQ(out, (std::vector<float>{111, 222, 333, 144, 255, 366}));
  std::vector<float> db(3, 1.0f);
  bias_backward(db.data(), r.data(), B, T, C);
  EXPECT_EQ(db, (std::vector<float>{6, 8, 10}));
}

// Two threads must give the same numbers as one (the OpenMP paths split rows, never reorder a row).
TEST(Kernels, ThreadCountDoesNotChangeResults) {
  const int B = 4, T = 64, C = 64, V = 512, NH = 4;
  auto x = randn(static_cast<std::size_t>(B) * T * 3 * C, 1.0f, 22);
  auto logits = randn(static_cast<std::size_t>(B) * T * V, 1.0f, 23);
  std::vector<int32_t> targets(static_cast<std::size_t>(B) * T);
  for (std::size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<int32_t>((i * 7) % V);
  auto run = [&](int threads) {
    set_compute_threads(threads);
    std::vector<float> out(static_cast<std::size_t>(B) * T * C),
        att(static_cast<std::size_t>(B) * NH * T * T);
    attention_forward(out.data(), att.data(), x.data(), B, T, C, NH, NH);
    std::vector<float> lg = logits, losses(static_cast<std::size_t>(B) * T);
    const float loss =
        softmax_crossentropy_forward(losses.data(), lg.data(), targets.data(), B, T, V);
    out.push_back(loss);
    return out;
  };
  const auto one = run(1);
  const auto two = run(2);
  set_compute_threads(1);
  ASSERT_EQ(one.size(), two.size());
  double maxdiff = 0.0;
  for (std::size_t i = 0; i < one.size(); ++i)
    maxdiff = std::max(maxdiff, static_cast<double>(std::abs(one[i] - two[i])));
  EXPECT_LT(maxdiff, 1e-5);
}

}  // namespace
}  // namespace orrery::runtime
