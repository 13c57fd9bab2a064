// One rank's run on a CUDA device (see gpu_run.hpp): runtime::run_rank (launch.cpp) with the GPU
// trainer.
#include "orrery/runtime/cuda/gpu_run.hpp"

#include <array>
#include <memory>

#include "orrery/profiler/recorder.hpp"

namespace orrery::runtime::cuda {

double peak_flops(const DeviceInfo& d, MathMode m) {
  const int i = m == MathMode::kFp32 ? 0 : m == MathMode::kTf32 ? 1 : 2;
  if (d.cc_major == 8 && d.cc_minor == 0) return std::array<double, 3>{19.5e12, 156e12, 312e12}[i];
  if (d.cc_major == 9 && d.cc_minor == 0)
    return std::array<double, 3>{67e12, 494.7e12, 989.4e12}[i];
  return 0.0;
}

TrainerFactory gpu_trainer_factory(const CudaRunOptions& copt) {
  return [copt](const Scenario& s, Communicator& world, profiler::Recorder* rec) {
    return std::unique_ptr<RankTrainer>(std::make_unique<GpuTrainer>(s, world, rec, copt));
  };
}

RankRunResult run_rank_cuda(const Scenario& s, Communicator& world, const RankRunOptions& opt,
                            const CudaRunOptions& copt) {
  check_supported_cuda(s);
  return run_rank(s, world, opt, gpu_trainer_factory(copt));
}

}  // namespace orrery::runtime::cuda
