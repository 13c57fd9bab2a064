// The rank grid: dp x tp x pp ranks, placed with the axes of parallel.placement fastest-varying
// first (default "tp,dp,pp", Megatron's: the tp ranks of one replica's stage are adjacent ranks,
// so on one node). The runtime takes a rank's coordinates from it and the simulator its
// placement; the placement key is parsed once (common's parse_placement).
#pragma once

#include <array>

#include "orrery/common/scenario.hpp"

namespace orrery::model {

struct RankGrid {
  int dp = 1, tp = 1, pp = 1;
  std::array<int, 3> order{1, 0, 2};  // axes fastest first; axis ids 0 = dp, 1 = tp, 2 = pp
  struct Coord {
    int dp, tp, pp;
  };
  int world() const { return dp * tp * pp; }
  int rank_of(int d, int t, int p) const;
  Coord coord(int rank) const;
  // Throws InputError naming the key when parallel.placement is not a permutation of tp,dp,pp.
  static RankGrid from(const Scenario& s);
};

}  // namespace orrery::model
