// The training loop of one rank on CPUs: training_loop.hpp's TrainingLoop over the CPU backend
// (cpu_backend.hpp). What a step records, and every parallel strategy, is described there.
#pragma once

#include "orrery/runtime/cpu_backend.hpp"
#include "orrery/runtime/rank_trainer.hpp"
#include "orrery/runtime/training_loop.hpp"

namespace orrery::runtime {

extern template class TrainingLoop<CpuBackend>;

class Trainer final : public TrainingLoop<CpuBackend> {
 public:
  // `world` must have exactly s.world_size() ranks. `rec` may be nullptr (no profiling).
  Trainer(const Scenario& s, Communicator& world, profiler::Recorder* rec)
      : TrainingLoop<CpuBackend>(s, world, rec) {}
};

}  // namespace orrery::runtime
