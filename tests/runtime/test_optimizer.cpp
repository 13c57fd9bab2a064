// AdamW against a step computed by hand (PyTorch's AdamW formula, in double), decay only on the
// given ranges, and shard-by-shard updates (ZeRO) equal to the whole-array update.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "orrery/runtime/kernels.hpp"
#include "orrery/runtime/optimizer.hpp"

namespace orrery::runtime {
namespace {

TEST(AdamW, TwoStepsMatchTheFormula) {
  AdamWConfig cfg;  // lr 3e-4, betas 0.9/0.95, eps 1e-8, wd 0.1
  std::vector<float> p = {0.5f, -1.0f, 2.0f, 0.25f};
  const std::vector<std::vector<float>> grads = {{0.1f, -0.2f, 0.3f, 0.0f}, {-0.05f, 0.4f, 0.3f, 1.0f}};
  const std::vector<ParamRange> decay = {{1, 2}};  // elements 1 and 2 are "matrices"
  std::vector<float> m(4, 0.0f), v(4, 0.0f);
  std::vector<double> rp(p.begin(), p.end()), rm(4, 0.0), rv(4, 0.0);
  for (int step = 1; step <= 2; ++step) {
    const auto& g = grads[static_cast<std::size_t>(step - 1)];
    adamw_update(p.data(), g.data(), m.data(), v.data(), 0, 4, decay, step, cfg);
    for (int i = 0; i < 4; ++i) {
      const double wd = (i == 1 || i == 2) ? 0.1 : 0.0;
      rp[i] -= 3e-4 * wd * rp[i];
      rm[i] = 0.9 * rm[i] + 0.1 * g[i];
      rv[i] = 0.95 * rv[i] + 0.05 * g[i] * g[i];
      const double mhat = rm[i] / (1.0 - std::pow(0.9, step));
      const double vhat = rv[i] / (1.0 - std::pow(0.95, step));
      rp[i] -= 3e-4 * mhat / (std::sqrt(vhat) + 1e-8);
    }
    for (int i = 0; i < 4; ++i) {
      // A few fp32 ulps; the step itself is about lr = 3e-4, so this checks it to < 0.2 %.
      EXPECT_NEAR(p[i], rp[i], 5e-7) << "step " << step << " element " << i;
      EXPECT_NEAR(m[i], rm[i], 1e-6 * std::abs(rm[i]) + 1e-12);
      EXPECT_NEAR(v[i], rv[i], 1e-6 * std::abs(rv[i]) + 1e-12);
    }
  }
}

TEST(AdamW, ZeroGradientOnlyDecays) {
  AdamWConfig cfg;
  std::vector<float> p = {1.0f, 1.0f}, g = {0.0f, 0.0f}, m(2, 0.0f), v(2, 0.0f);
  const std::vector<ParamRange> decay = {{0, 1}};
  adamw_update(p.data(), g.data(), m.data(), v.data(), 0, 2, decay, 1, cfg);
  EXPECT_FLOAT_EQ(p[0], 1.0f - 3e-4f * 0.1f);
  EXPECT_FLOAT_EQ(p[1], 1.0f);
}

// Updating [0, 5) and [5, 13) separately with shard-local moments equals updating [0, 13).
TEST(AdamW, ShardedUpdateEqualsWholeUpdate) {
  const std::size_t n = 13;
  std::vector<float> p(n), g(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = 0.1f * static_cast<float>(i) - 0.5f;
    g[i] = std::sin(static_cast<float>(i));
  }
  const std::vector<ParamRange> decay = {{2, 4}, {9, 3}};
  std::vector<float> whole = p;
  AdamW all(0, n, decay);
  AdamW lo(0, 5, decay), hi(5, n - 5, decay);
  std::vector<float> sharded = p;
  for (int step = 0; step < 3; ++step) {
    all.step(whole.data(), g.data());
    lo.step(sharded.data(), g.data());
    hi.step(sharded.data() + 5, g.data() + 5);
  }
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(whole[i], sharded[i]) << i;
  EXPECT_EQ(all.steps(), 3);
}

// The update is elementwise: splitting it over two threads changes no bit.
TEST(AdamW, ThreadsDoNotChangeTheUpdate) {
  const std::size_t n = 100000;
  std::vector<float> p(n), g(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = std::cos(static_cast<float>(i));
    g[i] = std::sin(0.37f * static_cast<float>(i));
  }
  const std::vector<ParamRange> decay = {{100, 40000}, {60000, 100}};
  std::vector<float> one = p, two = p;
  AdamW a(0, n, decay), b(0, n, decay);
  set_compute_threads(1);
  a.step(one.data(), g.data());
  set_compute_threads(2);
  b.step(two.data(), g.data());
  set_compute_threads(1);
  EXPECT_EQ(one, two);
}

}  // namespace
}  // namespace orrery::runtime
