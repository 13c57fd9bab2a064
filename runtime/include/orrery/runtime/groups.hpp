// The communicators of one rank's dp, tp and pp groups and of the tied-embedding pair, split from
// the world in one order on every rank (every rank must call split in the same sequence). Both
// trainers (CPU and CUDA) take their host groups from here.
#pragma once

#include <memory>

#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/trainer.hpp"

namespace orrery::runtime {

struct RankGroups {
  std::unique_ptr<Communicator> dp;  // same (tp, pp)
  std::unique_ptr<Communicator> tp;  // same (dp, pp)
  std::unique_ptr<Communicator> pp;  // same (dp, tp)
  // pp > 1: the first and last stage of one pipeline (the other stages alone).
  std::unique_ptr<Communicator> embed;
};

RankGroups split_rank_groups(Communicator& world, const Layout& layout);

}  // namespace orrery::runtime
