// The training loop of one rank on one CUDA device: runtime/training_loop.hpp's TrainingLoop over
// the CUDA backend (cuda/backend.hpp), so the same spans in the same order as the CPU trainer, the
// same DDP buckets, ZeRO 1/2/3, tensor and pipeline parallelism (gpipe, 1f1b), memory counters,
// checkpoints, --resume and faults.*. What differs is the backend's: device buffers, spans timed
// by CUDA events, device communicators (NCCL or host-staged; backend.hpp) and CUPTI.
//
// Each rank holds the CPU trainer's shard (GptShard::pipeline_stage with its tp slice; same host
// layout, so the same initial values, copied to the device). ZeRO 3 needs dp >= 2
// (runtime::check_supported, as on CPUs). Not on GPUs in this version: the interleaved pipeline
// schedule (refused on CPUs too).
#pragma once

#include "orrery/runtime/cuda/backend.hpp"
#include "orrery/runtime/training_loop.hpp"

namespace orrery::runtime {
extern template class TrainingLoop<cuda::CudaBackend>;
}

namespace orrery::runtime::cuda {

class GpuTrainer final : public TrainingLoop<CudaBackend> {
 public:
  // Selects this process's device (launcher local rank), then builds everything on it. `world`
  // must have s.world_size() ranks; `rec` may be nullptr. Throws InputError for unsupported input.
  GpuTrainer(const Scenario& s, Communicator& world, profiler::Recorder* rec,
             const CudaRunOptions& opt = {})
      : TrainingLoop<CudaBackend>(s, world, rec, opt) {}

  const DeviceInfo& device() const { return backend().device(); }
  const CudaRunOptions& options() const { return backend().options(); }
  const std::string& comm_backend() const { return backend().comm_backend(); }
  cudaStream_t compute_stream() const { return backend().stream(); }
};

}  // namespace orrery::runtime::cuda
