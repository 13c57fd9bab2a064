// Gradient compression's closed forms (issue 18), shared by the runtime's DDP hooks
// (runtime/ddp_compression.hpp) and the simulator's workload, so both put the same bytes on the dp
// group: the bytes one rank contributes to a bucket's collectives under each scheme.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace orrery::model {

// int8: one fp32 max-abs scale per chunk of this many entries.
inline constexpr std::size_t kInt8ChunkElems = 256;

// int8: n one-byte codes plus one fp32 scale per chunk of `chunk` entries (all-gathered).
inline std::size_t int8_payload_bytes(std::size_t n, std::size_t chunk = kInt8ChunkElems) {
  return n + sizeof(float) * ((n + chunk - 1) / chunk);
}

// top-k: k = clamp(round(ratio * n), 1, n) entries (0 for n = 0).
inline std::size_t topk_count(std::size_t n, double ratio) {
  if (n == 0) return 0;
  const double k = std::nearbyint(ratio * static_cast<double>(n));
  return std::clamp<std::size_t>(k < 1 ? 1 : static_cast<std::size_t>(k), 1, n);
}
// top-k: k (uint32 index, fp32 value) pairs (all-gathered).
inline std::size_t topk_payload_bytes(std::size_t n, double ratio) {
  return topk_count(n, ratio) * (sizeof(uint32_t) + sizeof(float));
}

// PowerSGD's rank on a rows x cols matrix: `rank` clamped to min(rows, cols).
inline std::size_t powersgd_effective_rank(std::size_t rows, std::size_t cols, int rank) {
  return std::min<std::size_t>(static_cast<std::size_t>(rank), std::min(rows, cols));
}
// P (rows x r) and Q (cols x r) in fp32, each all-reduced.
inline std::size_t powersgd_payload_bytes(std::size_t rows, std::size_t cols, int rank) {
  return sizeof(float) * powersgd_effective_rank(rows, cols, rank) * (rows + cols);
}
// Whether PowerSGD compresses a rows x cols gradient: a matrix whose P and Q are smaller than it;
// everything else (vectors, small matrices) goes uncompressed in the bucket's fp32 all-reduce.
inline bool powersgd_compresses(std::size_t rows, std::size_t cols, int rank) {
  return rows > 1 && cols > 1 &&
         powersgd_effective_rank(rows, cols, rank) * (rows + cols) < rows * cols;
}

}  // namespace orrery::model
