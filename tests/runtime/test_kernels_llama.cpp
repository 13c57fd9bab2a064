// The CPU kernels of Llama-style blocks (kernels.hpp): RMSNorm, SwiGLU, RoPE, grouped-query and
// multi-query attention, LayerNorm without its shift, the embedding without positions. Forward
// values against double-precision loops or closed forms, backward against central finite
// differences of sum(w * out) (as test_kernels.cpp), and the identities each op must satisfy.
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

constexpr double kTol = 5e-3;

TEST(LlamaKernels, RmsNormForwardMatchesDouble) {
  const int B = 2, T = 3, C = 8;
  const auto x = randn(B * T * C, 1.5f, 1), w = randn(C, 1.0f, 2);
  std::vector<float> out(B * T * C), rstd(B * T);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), B, T, C);
  for (int i = 0; i < B * T; ++i) {
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += static_cast<double>(x[i * C + c]) * x[i * C + c];
    const double r = 1.0 / std::sqrt(ss / C + 1e-5);
    EXPECT_NEAR(rstd[i], r, 1e-6 * r);
    for (int c = 0; c < C; ++c) EXPECT_NEAR(out[i * C + c], x[i * C + c] * r * w[c], 1e-5);
  }
}

TEST(LlamaKernels, RmsNormBackwardMatchesFiniteDifferences) {
  const int B = 2, T = 3, C = 8;
  auto x = randn(B * T * C, 1.5f, 3), w = randn(C, 1.0f, 4);
  const auto wout = randn(B * T * C, 1.0f, 5);
  std::vector<float> out(B * T * C), rstd(B * T);
  auto objective = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), B, T, C);
    return dot(out, wout);
  };
  objective();
  std::vector<float> dx(x.size(), 0.5f), dw(C, 0.25f);  // backward accumulates: start non-zero
  rmsnorm_backward(dx.data(), dw.data(), wout.data(), x.data(), w.data(), rstd.data(), B, T, C);
  for (auto& v : dx) v -= 0.5f;
  for (auto& v : dw) v -= 0.25f;
  EXPECT_LT(max_fd_error(x, dx, objective), kTol);
  EXPECT_LT(max_fd_error(w, dw, objective), kTol);
}

TEST(LlamaKernels, SwigluForwardAndBackward) {
  const std::size_t N = 6;
  const int F = 5;
  auto x = randn(N * 2 * F, 2.0f, 6);
  const auto wout = randn(N * F, 1.0f, 7);
  std::vector<float> out(N * F);
  auto objective = [&] {
    swiglu_forward(out.data(), x.data(), N, F);
    return dot(out, wout);
  };
  objective();
  for (std::size_t i = 0; i < N; ++i) {
    for (int j = 0; j < F; ++j) {
      const double g = x[i * 2 * F + j], u = x[i * 2 * F + F + j];
      const double ref = g / (1.0 + std::exp(-g)) * u;
      EXPECT_NEAR(out[i * F + j], ref, 1e-6 * (1.0 + std::abs(ref)));
    }
  }
  std::vector<float> dx(x.size(), 0.0f);
  swiglu_backward(dx.data(), x.data(), wout.data(), N, F);
  EXPECT_LT(max_fd_error(x, dx, objective), kTol);
}

// Closed form of the rotate-half rotation in double.
double rope_ref(const std::vector<float>& x, std::size_t row, int head, int i, int t, int hs, int W,
                double theta) {
  const int half = hs / 2, pair = i < half ? i : i - half;
  const double a = t * std::pow(theta, -2.0 * pair / hs);
  const double lo = x[row * W + head * hs + pair], hi = x[row * W + head * hs + pair + half];
  return i < half ? lo * std::cos(a) - hi * std::sin(a) : hi * std::cos(a) + lo * std::sin(a);
}

TEST(LlamaKernels, RopeRotatesQAndKAndLeavesV) {
  const int B = 2, T = 7, NH = 4, NKV = 2, hs = 8, W = (NH + 2 * NKV) * hs;
  const float theta = 10000.0f;
  const auto x = randn(static_cast<std::size_t>(B) * T * W, 1.0f, 8);
  auto y = x;
  rope_forward(y.data(), B, T, NH, NKV, hs, theta);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::size_t row = static_cast<std::size_t>(b) * T + t;
      for (int h = 0; h < NH + NKV; ++h) {
        double before = 0.0, after = 0.0;
        for (int i = 0; i < hs; ++i) {
          EXPECT_NEAR(y[row * W + h * hs + i], rope_ref(x, row, h, i, t, hs, W, theta), 2e-6);
          before += static_cast<double>(x[row * W + h * hs + i]) * x[row * W + h * hs + i];
          after += static_cast<double>(y[row * W + h * hs + i]) * y[row * W + h * hs + i];
        }
        EXPECT_NEAR(after, before, 1e-5 * before);  // a rotation keeps each head's norm
      }
      for (int i = (NH + NKV) * hs; i < W; ++i)
        EXPECT_EQ(y[row * W + i], x[row * W + i]);  // v untouched
      if (t == 0) {
        for (int i = 0; i < W; ++i) EXPECT_EQ(y[row * W + i], x[row * W + i]);  // angle 0
      }
    }
  }
}

TEST(LlamaKernels, RopeBackwardIsTheTransposeAndMatchesFiniteDifferences) {
  const int B = 1, T = 5, NH = 2, NKV = 1, hs = 4, W = (NH + 2 * NKV) * hs;
  const float theta = 500.0f;  // larger angles than 10000 gives at these small sizes
  auto x = randn(static_cast<std::size_t>(B) * T * W, 1.0f, 9);
  const auto wout = randn(x.size(), 1.0f, 10);
  // <rope(x), w> = <x, rope_backward(w)>.
  auto rx = x;
  rope_forward(rx.data(), B, T, NH, NKV, hs, theta);
  auto rw = wout;
  rope_backward(rw.data(), B, T, NH, NKV, hs, theta);
  EXPECT_NEAR(dot(rx, wout), dot(x, rw), 1e-5);
  // Forward then backward is the identity (to rounding).
  auto back = rx;
  rope_backward(back.data(), B, T, NH, NKV, hs, theta);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-6);
  std::vector<float> out(x.size());
  auto objective = [&] {
    out = x;
    rope_forward(out.data(), B, T, NH, NKV, hs, theta);
    return dot(out, wout);
  };
  EXPECT_LT(max_fd_error(x, rw, objective), kTol);
}

// Grouped-query attention equals multi-head attention on the key/value heads repeated over each
// group; its key/value gradients are the sums of the repeated heads' gradients.
void check_gqa_against_repeated_mha(int NH, int NKV) {
  const int B = 2, T = 9, C = NH * 4, hs = C / NH, group = NH / NKV;
  const int Wg = C + 2 * NKV * hs, Wm = 3 * C;
  const auto g = randn(static_cast<std::size_t>(B) * T * Wg, 1.0f, 11);
  std::vector<float> m(static_cast<std::size_t>(B) * T * Wm);
  for (int r = 0; r < B * T; ++r) {
    for (int i = 0; i < C; ++i) m[r * Wm + i] = g[r * Wg + i];
    for (int h = 0; h < NH; ++h) {
      for (int i = 0; i < hs; ++i) {
        m[r * Wm + C + h * hs + i] = g[r * Wg + C + (h / group) * hs + i];
        m[r * Wm + 2 * C + h * hs + i] = g[r * Wg + C + (NKV + h / group) * hs + i];
      }
    }
  }
  const std::size_t n_out = static_cast<std::size_t>(B) * T * C,
                    n_att = static_cast<std::size_t>(B) * NH * T * T;
  std::vector<float> og(n_out), om(n_out), ag(n_att), am(n_att);
  attention_forward(og.data(), ag.data(), g.data(), B, T, C, NH, NKV);
  attention_forward(om.data(), am.data(), m.data(), B, T, C, NH, NH);
  for (std::size_t i = 0; i < n_out; ++i) EXPECT_NEAR(og[i], om[i], 1e-6) << "out " << i;
  for (std::size_t i = 0; i < n_att; ++i) EXPECT_NEAR(ag[i], am[i], 1e-6) << "att " << i;
  const auto dout = randn(n_out, 1.0f, 12);
  std::vector<float> dg(g.size(), 0.0f), dm(m.size(), 0.0f), scratch(n_att);
  attention_backward(dg.data(), scratch.data(), dout.data(), g.data(), ag.data(), B, T, C, NH, NKV);
  attention_backward(dm.data(), scratch.data(), dout.data(), m.data(), am.data(), B, T, C, NH, NH);
  for (int r = 0; r < B * T; ++r) {
    for (int i = 0; i < C; ++i) EXPECT_NEAR(dg[r * Wg + i], dm[r * Wm + i], 1e-5);
    for (int kv = 0; kv < NKV; ++kv) {
      for (int i = 0; i < hs; ++i) {
        double dk = 0.0, dv = 0.0;
        for (int h = kv * group; h < (kv + 1) * group; ++h) {
          dk += dm[r * Wm + C + h * hs + i];
          dv += dm[r * Wm + 2 * C + h * hs + i];
        }
        EXPECT_NEAR(dg[r * Wg + C + kv * hs + i], dk, 1e-5);
        EXPECT_NEAR(dg[r * Wg + C + (NKV + kv) * hs + i], dv, 1e-5);
      }
    }
  }
}

TEST(LlamaKernels, GroupedQueryAttentionIsMultiHeadOnRepeatedKv) {
  check_gqa_against_repeated_mha(4, 2);
}
TEST(LlamaKernels, MultiQueryAttentionIsMultiHeadOnRepeatedKv) {
  check_gqa_against_repeated_mha(4, 1);
}

// Two threads split a group's query heads' shared k/v gradient the same way as one thread.
TEST(LlamaKernels, GroupedQueryBackwardDoesNotDependOnThreads) {
  const int B = 3, T = 17, NH = 8, NKV = 2, C = 64, W = C + 2 * NKV * (C / NH);
  const auto x = randn(static_cast<std::size_t>(B) * T * W, 1.0f, 13);
  const auto dout = randn(static_cast<std::size_t>(B) * T * C, 1.0f, 14);
  auto run = [&](int threads) {
    set_compute_threads(threads);
    std::vector<float> out(dout.size()), att(static_cast<std::size_t>(B) * NH * T * T),
        dx(x.size(), 0.0f);
    attention_forward(out.data(), att.data(), x.data(), B, T, C, NH, NKV);
    std::vector<float> scratch(att.size());
    attention_backward(dx.data(), scratch.data(), dout.data(), x.data(), att.data(), B, T, C, NH,
                       NKV);
    return dx;
  };
  const auto one = run(1), two = run(2);
  set_compute_threads(1);
  EXPECT_EQ(one, two);
}

TEST(LlamaKernels, AttentionRefusesHeadsThatDoNotGroup) {
  std::vector<float> buf(1024);
  EXPECT_THROW(attention_forward(buf.data(), buf.data(), buf.data(), 1, 2, 12, 4, 3),
               std::invalid_argument);
}

TEST(LlamaKernels, LayerNormWithoutShiftIsLayerNormWithZeroShift) {
  const int B = 2, T = 3, C = 8;
  const auto x = randn(B * T * C, 1.5f, 15), w = randn(C, 1.0f, 16),
             dout = randn(B * T * C, 1.0f, 17);
  const std::vector<float> zero(C, 0.0f);
  std::vector<float> a(B * T * C), b(B * T * C), m1(B * T), r1(B * T), m2(B * T), r2(B * T);
  layernorm_forward(a.data(), m1.data(), r1.data(), x.data(), w.data(), nullptr, B, T, C);
  layernorm_forward(b.data(), m2.data(), r2.data(), x.data(), w.data(), zero.data(), B, T, C);
  EXPECT_EQ(a, b);
  std::vector<float> dx1(x.size(), 0.0f), dx2(x.size(), 0.0f), dw1(C, 0.0f), dw2(C, 0.0f),
      db(C, 0.0f);
  layernorm_backward(dx1.data(), dw1.data(), nullptr, dout.data(), x.data(), w.data(), m1.data(),
                     r1.data(), B, T, C);
  layernorm_backward(dx2.data(), dw2.data(), db.data(), dout.data(), x.data(), w.data(), m1.data(),
                     r1.data(), B, T, C);
  EXPECT_EQ(dx1, dx2);
  EXPECT_EQ(dw1, dw2);
}

TEST(LlamaKernels, EmbeddingWithoutPositions) {
  const int B = 2, T = 3, C = 4, V = 5;
  const auto wte = randn(V * C, 1.0f, 18);
  const std::vector<int32_t> inp = {1, 4, 1, 0, 2, 2};
  std::vector<float> out(B * T * C);
  encoder_forward(out.data(), inp.data(), wte.data(), nullptr, B, T, C);
  for (int i = 0; i < B * T; ++i) {
    for (int c = 0; c < C; ++c) EXPECT_EQ(out[i * C + c], wte[inp[i] * C + c]);
  }
  std::vector<float> dwte(wte.size(), 0.0f);
  const std::vector<float> dout(B * T * C, 1.0f);
  encoder_backward(dwte.data(), nullptr, dout.data(), inp.data(), B, T, C);
  EXPECT_EQ(dwte[1 * C], 2.0f);  // token 1 twice
  EXPECT_EQ(dwte[2 * C], 2.0f);
  EXPECT_EQ(dwte[3 * C], 0.0f);
}

}  // namespace
}  // namespace orrery::runtime
