// Gradient compression kernels (runtime/include/orrery/runtime/compression.hpp, issue 18 item 1):
// bytes on the wire against the closed form, error feedback conserving the gradient, PowerSGD
// reproducing a rank-r matrix. One process; the kernels are not yet wired into DDP.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "orrery/runtime/compression.hpp"

namespace orrery::runtime::compression {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST(Compression, ClosedFormBytes) {
  // 1000 entries in chunks of 256: 1000 codes + 4 scales.
  EXPECT_EQ(int8_payload_bytes(1000, 256), 1000u + 4u * 4u);
  EXPECT_EQ(int8_payload_bytes(1024, 256), 1024u + 4u * 4u);
  EXPECT_EQ(int8_payload_bytes(1025, 256), 1025u + 5u * 4u);
  EXPECT_EQ(topk_count(1000, 0.01), 10u);
  EXPECT_EQ(topk_count(10, 0.01), 1u);  // at least one
  EXPECT_EQ(topk_count(10, 1.0), 10u);
  EXPECT_EQ(topk_payload_bytes(1000, 0.01), 80u);
  // 768 x 3072 at rank 4: (768 + 3072) x 4 floats.
  EXPECT_EQ(powersgd_payload_bytes(768, 3072, 4), 4u * 4u * (768u + 3072u));
  EXPECT_EQ(powersgd_payload_bytes(3, 100, 8), 4u * 3u * 103u);  // rank clamped to 3
}

TEST(Compression, Int8ErrorFeedbackConservesTheGradientBitwise) {
  const size_t n = 1000, chunk = 256;
  std::vector<float> residual(n, 0.0f), sent(n), out(n), scales(4);
  std::vector<int8_t> codes(n);
  for (uint32_t step = 0; step < 5; ++step) {
    const auto g = random_vector(n, 10 + step);
    std::vector<float> e(n);
    for (size_t i = 0; i < n; ++i) e[i] = residual[i] + g[i];
    int8_compress(g.data(), residual.data(), n, chunk, codes.data(), scales.data(), sent.data());
    int8_decompress(codes.data(), scales.data(), n, chunk, out.data());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(same_bits(out[i], sent[i])) << i;
      ASSERT_TRUE(same_bits(sent[i] + residual[i], e[i])) << "step " << step << " entry " << i;
      ASSERT_LE(std::fabs(residual[i]), scales[i / chunk] * 0.5f * (1 + 1e-6f)) << i;
    }
  }
  // An all-zero chunk: scale 0, codes 0, nothing lost.
  std::vector<float> z(chunk, 0.0f), zr(chunk, 0.0f), zs(chunk);
  float zscale = -1;
  int8_compress(z.data(), zr.data(), chunk, chunk, codes.data(), &zscale, zs.data());
  EXPECT_EQ(zscale, 0.0f);
  EXPECT_EQ(codes[0], 0);
}

TEST(Compression, TopkSendsTheLargestAndConservesExactly) {
  const std::vector<float> g = {0.5f, -3.0f, 0.1f, 2.0f, -0.2f, 3.0f, 0.0f, 1.0f, -1.5f, 0.3f};
  std::vector<float> residual(g.size(), 0.0f);
  std::vector<uint32_t> idx;
  std::vector<float> val;
  topk_compress(g.data(), residual.data(), g.size(), 0.3, idx, val);  // k = 3
  EXPECT_EQ(idx, (std::vector<uint32_t>{1, 3, 5}));
  EXPECT_EQ(val, (std::vector<float>{-3.0f, 2.0f, 3.0f}));
  std::vector<float> out(g.size(), 0.0f);
  topk_scatter_add(idx, val, out.data());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(same_bits(out[i] + residual[i], g[i])) << i;
  // Next step, k = 2: the residual is fed back, e = {1, -3, 0.2, 2, -0.4, 3, 0, 2, -3, 0.6}; three
  // entries tie at |3|, the two lower indices go, index 8 waits in the residual.
  topk_compress(g.data(), residual.data(), g.size(), 0.2, idx, val);
  EXPECT_EQ(idx, (std::vector<uint32_t>{1, 5}));
  EXPECT_EQ(val, (std::vector<float>{-3.0f, 3.0f}));
  EXPECT_EQ(residual[8], -3.0f);
  EXPECT_EQ(residual[7], 2.0f);
  EXPECT_EQ(residual[0], 1.0f);
  EXPECT_EQ(residual[1], 0.0f);
}

TEST(Compression, PowerSgdReproducesARankRMatrix) {
  const size_t rows = 64, cols = 32;
  const int r = 4;
  const auto a = random_vector(rows * r, 1), b = random_vector(cols * r, 2);
  std::vector<float> m(rows * cols, 0.0f);
  for (size_t i = 0; i < rows; ++i)
    for (size_t k = 0; k < cols; ++k)
      for (int j = 0; j < r; ++j) m[i * cols + k] += a[i * r + j] * b[k * r + j];
  std::vector<float> residual(m.size(), 0.0f), out(m.size());
  std::vector<float> q = random_vector(cols * r, 3);
  size_t reduced = 0;
  powersgd_step(
      m.data(), residual.data(), rows, cols, r, q,
      [&](float*, size_t count) { reduced += count * sizeof(float); }, out.data());
  EXPECT_EQ(reduced, powersgd_payload_bytes(rows, cols, r));
  float max_abs = 0, max_err = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(m[i]));
    max_err = std::max(max_err, std::fabs(out[i] - m[i]));
    // Error feedback: approx + residual equals e to one rounding of the subtraction.
    ASSERT_LE(std::fabs(out[i] + residual[i] - m[i]), std::ldexp(std::fabs(m[i]), -23) + 1e-30f);
  }
  EXPECT_GT(max_abs, 1.0f);
  EXPECT_LE(max_err, 1e-4f * max_abs);  // fp32: exact up to rounding
  // A rank-r matrix approximated at rank r - 1 is not reproduced (the test can fail).
  std::vector<float> res2(m.size(), 0.0f), q2 = random_vector(cols * (r - 1), 3);
  powersgd_step(
      m.data(), res2.data(), rows, cols, r - 1, q2, [](float*, size_t) {}, out.data());
  float err2 = 0;
  for (size_t i = 0; i < m.size(); ++i) err2 = std::max(err2, std::fabs(out[i] - m[i]));
  EXPECT_GT(err2, 1e-2f * max_abs);
  std::vector<float> bad_q(3);
  EXPECT_THROW(powersgd_step(
                   m.data(), res2.data(), rows, cols, r, bad_q, [](float*, size_t) {}, out.data()),
               std::invalid_argument);
}

TEST(Compression, OrthonormaliseColumns) {
  std::vector<float> p = {3, 1, 4, 2, 0, 5};  // 3 x 2 row-major
  orthonormalise_columns(p.data(), 3, 2);
  double d00 = 0, d11 = 0, d01 = 0;
  for (int k = 0; k < 3; ++k) {
    d00 += p[k * 2] * p[k * 2];
    d11 += p[k * 2 + 1] * p[k * 2 + 1];
    d01 += p[k * 2] * p[k * 2 + 1];
  }
  EXPECT_NEAR(d00, 1.0, 1e-6);
  EXPECT_NEAR(d11, 1.0, 1e-6);
  EXPECT_NEAR(d01, 0.0, 1e-6);
  EXPECT_NEAR(p[0], 3.0 / 5.0, 1e-6);  // first column (3, 4, 0) / 5
}

}  // namespace orrery::runtime::compression
