// ZeRO's partition of an array over the data-parallel group (Rajbhandari et al., SC20), shared by
// the runtime (zero.hpp: stages 1-3) and the simulator (collective sizes, memory).
//
// n elements are padded to N·k, k = ceil(n / N), and dp rank r owns [r·k, r·k + k) (the last
// owners' tail is padding). Collectives move the padded total.
#pragma once

#include <cstddef>
#include <stdexcept>

namespace orrery::model {

struct ZeroPartition {
  std::size_t total = 0;  // n: elements of the array
  std::size_t shard = 0;  // k = ceil(n / ranks)
  int rank = 0;
  int ranks = 1;
  std::size_t padded() const { return shard * static_cast<std::size_t>(ranks); }
  std::size_t begin() const { return shard * static_cast<std::size_t>(rank); }
  // Real (unpadded) elements owned by this rank.
  std::size_t count() const {
    const std::size_t b = begin();
    return b >= total ? 0 : (total - b < shard ? total - b : shard);
  }
};

// Throws std::invalid_argument unless 0 <= rank < ranks.
inline ZeroPartition zero_partition(std::size_t total, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw std::invalid_argument("zero_partition: bad rank");
  ZeroPartition p;
  p.total = total;
  p.rank = rank;
  p.ranks = ranks;
  p.shard = (total + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
  return p;
}

}  // namespace orrery::model
