// Gradient compression kernels for issue 18 item 1 (int8, top-k, PowerSGD), each with error
// feedback: the error-fed gradient e = g + residual is split into what is sent and the new residual,
// sent + residual == e. Host-side, single-buffer building blocks with the closed-form bytes each puts
// on the wire. DDP calls them through its communication hook (ddp_compression.hpp). The all-reduces
// PowerSGD needs are a callback, so the kernels are tested in one process and the DDP hook passes
// its dp-group all-reduce (mean).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace orrery::runtime::compression {

// ---- closed forms: bytes one rank contributes to the collective -------------------------------
// int8: n one-byte codes plus one fp32 scale per chunk of `chunk` entries (all-gathered).
size_t int8_payload_bytes(size_t n, size_t chunk);
// top-k: k (uint32 index, fp32 value) pairs, k = topk_count(n, ratio) (all-gathered).
size_t topk_count(size_t n, double ratio);  // clamp(round(ratio * n), 1, n)
size_t topk_payload_bytes(size_t n, double ratio);
// PowerSGD on a rows x cols matrix at rank r (clamped to min(rows, cols)): P (rows x r) and
// Q (cols x r) in fp32, each all-reduced.
size_t powersgd_payload_bytes(size_t rows, size_t cols, int rank);

// ---- int8 -------------------------------------------------------------------------------------
// e = g + residual; per chunk scale = max|e| / 127 (0 for an all-zero chunk); code = round-to-
// nearest-even(e / scale) in [-127, 127]; sent = code * scale; residual = e - sent. codes: n bytes,
// scales: ceil(n / chunk) floats. `sent` (n floats) receives the dequantised values.
void int8_compress(const float* g, float* residual, size_t n, size_t chunk, int8_t* codes,
                   float* scales, float* sent);
// out[i] = codes[i] * scales[i / chunk].
void int8_decompress(const int8_t* codes, const float* scales, size_t n, size_t chunk, float* out);

// ---- top-k ------------------------------------------------------------------------------------
// e = g + residual; the k = topk_count(n, ratio) entries of largest |e| (ties: the lower index)
// are sent as (index, value) in increasing index order; their residual becomes 0, the others' e.
void topk_compress(const float* g, float* residual, size_t n, double ratio,
                   std::vector<uint32_t>& index, std::vector<float>& value);
// out = 0, then out[index[j]] += value[j] (pairs of several ranks may be scattered in turn).
void topk_scatter_add(const std::vector<uint32_t>& index, const std::vector<float>& value,
                      float* out);

// ---- PowerSGD (Vogels et al. 2019) -------------------------------------------------------------
// Columns of a row-major rows x r matrix made orthonormal in place (modified Gram-Schmidt; a column
// that vanishes is left zero).
void orthonormalise_columns(float* p, size_t rows, int r);
// One PowerSGD step on the row-major rows x cols gradient g with its residual and the warm-started
// q (cols x min(r, rows, cols), kept between steps; std::invalid_argument otherwise): e = g + residual; p = e q; all_reduce(p); orthonormalise p;
// q = eᵀ p; all_reduce(q); approx = p qᵀ (rows x cols) written to `out`; residual = e - approx.
// all_reduce(data, count) must average over the group in place (identity in one process).
using AllReduceMean = std::function<void(float*, size_t)>;
void powersgd_step(const float* g, float* residual, size_t rows, size_t cols, int r,
                   std::vector<float>& q, const AllReduceMean& all_reduce, float* out);

}  // namespace orrery::runtime::compression
