// Registers the CUDA backend as the runner of runtime.device "cuda" (runtime/launch.hpp), so that
// `orrery run` reaches the GPU trainer without naming it: the math mode and communication backend
// come from the scenario (runtime.precision, parallel.comm_backend).
#include "orrery/runtime/cuda/gpu_run.hpp"
#include "orrery/runtime/cuda/kernels.hpp"
#include "orrery/runtime/cuda/trainer.hpp"
#include "orrery/runtime/launch.hpp"

// Nothing calls into this file, and a linker leaves such an object of a static library out, its
// registration with it: runtime/cuda/CMakeLists.txt makes every program that links the backend
// require this symbol.
extern "C" {
extern const int orrery_runtime_cuda_device_runner;
const int orrery_runtime_cuda_device_runner = 1;
}

namespace orrery::runtime::cuda {
namespace {

std::unique_ptr<RankTrainer> make_cuda_trainer(const Scenario& s, Communicator& world,
                                               profiler::Recorder* rec) {
  CudaRunOptions copt;
  copt.math = math_mode_of(precision_of(s.runtime));
  copt.comm = parse_comm_backend(s.parallel.comm_backend);
  return gpu_trainer_factory(copt)(s, world, rec);
}

struct Registrar {
  Registrar() {
    register_device_runner(orrery::Device::Cuda, {check_supported_cuda, make_cuda_trainer});
  }
};
const Registrar kRegistrar;

}  // namespace
}  // namespace orrery::runtime::cuda
