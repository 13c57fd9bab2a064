// The core-sharing law (see core_sharing.hpp for its maths and where it is fitted).
#include "orrery/sim/core_sharing.hpp"

#include <algorithm>
#include <cmath>

namespace orrery::sim {

double compute_slowdown(const CoreSharing& s, int ranks_on_node) {
  if (s.cores <= 0 || ranks_on_node <= 0) return 1.0;
  return busy_slowdown(s, double(ranks_on_node) * std::max(1, s.threads_per_rank));
}

double busy_slowdown(const CoreSharing& s, double busy) {
  if (s.cores <= 0 || busy <= 0) return 1.0;
  const double u = busy / s.cores;
  if (u <= 1.0) {
    if (s.cores <= 1) return 1.0;
    return 1.0 + (s.contention_at_full - 1.0) * (busy - 1.0) / double(s.cores - 1);
  }
  return s.contention_at_full * std::pow(u, s.oversubscription_exponent);
}

double comm_slowdown(const CoreSharing& s, int ranks_on_node) {
  if (s.cores <= 0 || ranks_on_node <= 0) return 1.0;
  const double u = double(ranks_on_node) * std::max(1, s.threads_per_rank) / s.cores;
  return u <= 1.0 ? 1.0 : std::pow(u, s.comm_exponent);
}

}  // namespace orrery::sim
