#include "orrery/runtime/compression.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "orrery/model/compression.hpp"

namespace orrery::runtime::compression {

// The closed forms are model/compression.hpp's (shared with the simulator).
size_t int8_payload_bytes(size_t n, size_t chunk) { return model::int8_payload_bytes(n, chunk); }

size_t topk_count(size_t n, double ratio) { return model::topk_count(n, ratio); }

size_t topk_payload_bytes(size_t n, double ratio) { return model::topk_payload_bytes(n, ratio); }

size_t powersgd_payload_bytes(size_t rows, size_t cols, int rank) {
  return model::powersgd_payload_bytes(rows, cols, rank);
}

void int8_compress(const float* g, float* residual, size_t n, size_t chunk, int8_t* codes,
                   float* scales, float* sent) {
  for (size_t c0 = 0, c = 0; c0 < n; c0 += chunk, ++c) {
    const size_t c1 = std::min(n, c0 + chunk);
    float amax = 0;
    for (size_t i = c0; i < c1; ++i) {
      residual[i] += g[i];  // residual now holds e
      amax = std::max(amax, std::fabs(residual[i]));
    }
    const float scale = amax / 127.0f;
    scales[c] = scale;
    for (size_t i = c0; i < c1; ++i) {
      const float e = residual[i];
      const float q = scale > 0 ? std::clamp(std::nearbyint(e / scale), -127.0f, 127.0f) : 0.0f;
      codes[i] = static_cast<int8_t>(q);
      sent[i] = static_cast<float>(codes[i]) * scale;  // +0 for a code of 0, as decompress
      residual[i] = e - sent[i];
    }
  }
}

void int8_decompress(const int8_t* codes, const float* scales, size_t n, size_t chunk, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(codes[i]) * scales[i / chunk];
}

void topk_compress(const float* g, float* residual, size_t n, double ratio,
                   std::vector<uint32_t>& index, std::vector<float>& value) {
  for (size_t i = 0; i < n; ++i) residual[i] += g[i];
  const size_t k = topk_count(n, ratio);
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  const auto larger = [&](uint32_t a, uint32_t b) {
    const float fa = std::fabs(residual[a]), fb = std::fabs(residual[b]);
    return fa != fb ? fa > fb : a < b;
  };
  std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                   larger);
  order.resize(k);
  std::sort(order.begin(), order.end());
  index = order;
  value.resize(k);
  for (size_t j = 0; j < k; ++j) {
    value[j] = residual[order[j]];
    residual[order[j]] = 0;
  }
}

void topk_scatter_add(const std::vector<uint32_t>& index, const std::vector<float>& value,
                      float* out) {
  for (size_t j = 0; j < index.size(); ++j) out[index[j]] += value[j];
}

void orthonormalise_columns(float* p, size_t rows, int r) {
  for (int j = 0; j < r; ++j) {
    for (int i = 0; i < j; ++i) {
      double dot = 0;
      for (size_t k = 0; k < rows; ++k) dot += double(p[k * r + i]) * p[k * r + j];
      for (size_t k = 0; k < rows; ++k) p[k * r + j] -= static_cast<float>(dot) * p[k * r + i];
    }
    double norm = 0;
    for (size_t k = 0; k < rows; ++k) norm += double(p[k * r + j]) * p[k * r + j];
    norm = std::sqrt(norm);
    const float inv = norm > 1e-30 ? static_cast<float>(1.0 / norm) : 0.0f;
    for (size_t k = 0; k < rows; ++k) p[k * r + j] *= inv;
  }
}

void powersgd_step(const float* g, float* residual, size_t rows, size_t cols, int rank,
                   std::vector<float>& q, const AllReduceMean& all_reduce, float* out) {
  const int r = static_cast<int>(std::min<size_t>(static_cast<size_t>(rank), std::min(rows, cols)));
  const size_t n = rows * cols;
  if (q.size() != cols * static_cast<size_t>(r)) {
    throw std::invalid_argument("powersgd_step: q must hold cols x min(rank, rows, cols) floats");
  }
  for (size_t i = 0; i < n; ++i) residual[i] += g[i];  // e
  const float* e = residual;
  std::vector<float> p(rows * r, 0.0f);
  for (size_t i = 0; i < rows; ++i)
    for (size_t k = 0; k < cols; ++k) {
      const float v = e[i * cols + k];
      for (int j = 0; j < r; ++j) p[i * r + j] += v * q[k * r + j];
    }
  all_reduce(p.data(), p.size());
  orthonormalise_columns(p.data(), rows, r);
  std::fill(q.begin(), q.end(), 0.0f);
  for (size_t i = 0; i < rows; ++i)
    for (size_t k = 0; k < cols; ++k) {
      const float v = e[i * cols + k];
      for (int j = 0; j < r; ++j) q[k * r + j] += v * p[i * r + j];
    }
  all_reduce(q.data(), q.size());
  for (size_t i = 0; i < rows; ++i)
    for (size_t k = 0; k < cols; ++k) {
      float a = 0;
      for (int j = 0; j < r; ++j) a += p[i * r + j] * q[k * r + j];
      out[i * cols + k] = a;
      residual[i * cols + k] = e[i * cols + k] - a;
    }
}

}  // namespace orrery::runtime::compression
