// The rank grid (grid.hpp).
#include "orrery/model/grid.hpp"

#include "orrery/common/error.hpp"

namespace orrery::model {

int RankGrid::rank_of(int d, int t, int p) const {
  const int coord[3] = {d, t, p};
  const int size[3] = {dp, tp, pp};
  int r = 0;
  for (int i = 2; i >= 0; --i) r = r * size[order[i]] + coord[order[i]];
  return r;
}

RankGrid::Coord RankGrid::coord(int rank) const {
  const int size[3] = {dp, tp, pp};
  int c[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    c[order[i]] = rank % size[order[i]];
    rank /= size[order[i]];
  }
  return {c[0], c[1], c[2]};
}

RankGrid RankGrid::from(const Scenario& s) {
  RankGrid g;
  g.dp = s.parallel.dp;
  g.tp = s.parallel.tp;
  g.pp = s.parallel.pp;
  const auto axes = parse_placement(s.parallel.placement);
  if (!axes) {
    throw InputError(
        (s.path.empty() ? std::string("scenario") : s.path) +
        ": key 'parallel.placement': expected a permutation of tp,dp,pp (fastest-varying "
        "first), got '" +
        s.parallel.placement + "'");
  }
  g.order = *axes;
  return g;
}

}  // namespace orrery::model
