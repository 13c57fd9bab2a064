// The CPU trainer: the rank grid, the CPU runtime's check, and the training loop
// (training_loop_impl.hpp) instantiated over the CPU backend.
#include "orrery/runtime/trainer.hpp"

#include <algorithm>
#include <sstream>
#include <unordered_map>

#include "orrery/common/error.hpp"
#include "orrery/model/grid.hpp"
#include "orrery/model/names.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/groups.hpp"
#include "orrery/runtime/kernels.hpp"
#include "orrery/runtime/pipeline.hpp"
#include "orrery/runtime/tensor_parallel.hpp"
#include "orrery/runtime/training_loop_impl.hpp"

namespace orrery::runtime {

Layout Layout::of(const Scenario& s, int world_rank) {
  const model::RankGrid grid = model::RankGrid::from(s);
  const model::RankGrid::Coord c = grid.coord(world_rank);
  Layout l;
  l.dp = grid.dp;
  l.tp = grid.tp;
  l.pp = grid.pp;
  l.dp_rank = c.dp;
  l.tp_rank = c.tp;
  l.pp_rank = c.pp;
  l.ep = s.model.moe.enabled() ? std::max(1, s.parallel.ep) : 1;
  return l;
}

namespace {
// What the CPU runtime's MoE blocks (moe_block.hpp) do not take yet; common/scenario.cpp has
// refused bad values, sequence parallelism and full recomputation already.
void check_supported_moe(const Scenario& s, const std::string& origin) {
  const std::string moe = "model.moe.experts = " + std::to_string(s.model.moe.experts);
  // Compression runs on DDP's dense buckets (the experts' edp.all_reduce stays uncompressed);
  // under ZeRO 1 it replaces the reduce-scatter of the whole array, experts included: not there.
  if (s.parallel.grad_compression != "none" && s.parallel.zero != 0) {
    throw InputError(origin + ": key 'parallel.grad_compression': '" + s.parallel.grad_compression +
                     "' with " + moe + " and parallel.zero = " + std::to_string(s.parallel.zero) +
                     " is not implemented in the runtime; expected none, or parallel.zero = 0");
  }
}
}  // namespace

void check_supported(const Scenario& s) {
  const std::string origin = s.path.empty() ? std::string("scenario") : s.path;
  try {
    validate_layout(s);
  } catch (const InputError& e) {
    const std::string what = e.what();
    throw InputError(what.rfind(origin, 0) == 0 ? what : origin + ": " + what);
  }
  if (s.parallel.zero < 0 || s.parallel.zero > 3) {
    throw InputError(origin + ": key 'parallel.zero': expected a ZeRO stage 0-3, got " +
                     std::to_string(s.parallel.zero));
  }
  if (s.parallel.pp > 1 && schedule_of(s.parallel) == Schedule::Interleaved) {
    throw InputError(origin + ": key 'parallel.schedule': '" + s.parallel.schedule +
                     "' is not available in the CPU runtime; expected gpipe or 1f1b");
  }
  if (device_of(s.runtime) != Device::Cpu) {
    // Device cuda goes to the CUDA runtime (runtime/cuda, check_supported_cuda) when it is built.
    throw InputError(
        origin + ": key 'runtime.device': '" + s.runtime.device +
        "' is not available in the CPU runtime; expected cpu (device cuda needs a build "
        "with the CUDA toolkit)");
  }
  check_nvme_path(s);  // zero.nvme_path: an existing directory the run can create its files in
  if (s.model.moe.enabled()) check_supported_moe(s, origin);
  if (s.runtime.threads < 1) {
    throw InputError(origin + ": key 'runtime.threads': expected at least 1, got " +
                     std::to_string(s.runtime.threads));
  }
}

template class TrainingLoop<CpuBackend>;

}  // namespace orrery::runtime
