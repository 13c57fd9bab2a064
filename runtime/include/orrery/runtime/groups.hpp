// The communicators of one rank's dp, tp and pp groups and of the tied-embedding pair, split from
// the world in one order on every rank (every rank must call split in the same sequence). Both
// backends (CPU and CUDA) of the training loop take their host groups from here.
#pragma once

#include <memory>

#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/rank_trainer.hpp"

namespace orrery::runtime {

struct RankGroups {
  std::unique_ptr<Communicator> dp;  // same (tp, pp)
  std::unique_ptr<Communicator> tp;  // same (dp, pp)
  std::unique_ptr<Communicator> pp;  // same (dp, tp)
  // pp > 1: the first and last stage of one pipeline (the other stages alone).
  std::unique_ptr<Communicator> embed;
  // Expert parallelism (layout.ep > 1, model/moe.hpp): the ep consecutive dp ranks that exchange
  // tokens (kind Other: its all-to-alls are on comm.ep), and the dp ranks of the same ep rank
  // (kind DP) that sum the experts' gradients.
  std::unique_ptr<Communicator> ep;
  std::unique_ptr<Communicator> edp;
};

RankGroups split_rank_groups(Communicator& world, const Layout& layout);

// The communicators a backend moves its buffers over, one per host group of more than one rank
// (null for a group of one, and for the embedding pair unless this rank is its first or last
// stage): on CPUs the host groups themselves, on a device its own (training_loop.hpp).
struct DeviceGroups {
  Communicator* dp = nullptr;
  Communicator* tp = nullptr;
  Communicator* pp = nullptr;
  Communicator* embed = nullptr;
  Communicator* ep = nullptr;
  Communicator* edp = nullptr;
};
// The host groups of more than one rank as they are (the CPU backend's connect).
DeviceGroups host_device_groups(const RankGroups& groups);

}  // namespace orrery::runtime
