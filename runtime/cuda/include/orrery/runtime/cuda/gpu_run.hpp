// One rank's run of a scenario on a CUDA device: runtime::run_rank (launch.hpp) with the GPU
// trainer, so the same contract (recorder, per-rank trace file, checkpoints, --resume, faults.*,
// merge on rank 0) and the same result. `orrery run --device cuda` (or runtime.device: cuda) reaches it through
// runtime::run_rank_on_device (launch.hpp; registered in src/device_runner.cpp).
#pragma once

#include "orrery/common/scenario.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/cuda/trainer.hpp"
#include "orrery/runtime/launch.hpp"

namespace orrery::runtime::cuda {

// Call check_supported_cuda(s) before creating `world`, so that bad input and a missing device
// fail (InputError, exit 2) before any MPI work. Selects the device from the launcher's local
// rank. `world` is the host communicator (MPI or local): it carries the run's own host-side
// operations (output path, loss and step-time reports, barriers) and bootstraps the device
// communicators of the dp, tp, pp and embedding groups (NCCL or staged, CudaRunOptions::comm).
// Trace: RankInfo.device "cuda:<index> <name>", streams compute (0, GPU event times) and each
// group's communication stream as the CPU runtime and the simulator name them (model/names.hpp:
// comm.dp, comm.tp, comm.pp.send, comm.pp.recv; NCCL's GPU event times or the staged host MPI's);
// meta extra_json adds device, precision and comm_backend;
// peak_flops_per_rank is set for A100 (cc 8.0) and H100/H200 (cc 9.0) in the run's precision.
RankRunResult run_rank_cuda(const Scenario& s, Communicator& world, const RankRunOptions& opt,
                            const CudaRunOptions& copt = {});
// run_rank's trainer for device cuda with these options.
TrainerFactory gpu_trainer_factory(const CudaRunOptions& copt);

// Dense peak FLOP/s of one device for a math mode, from its compute capability: A100 SXM (8.0)
// 19.5/156/312 TFLOP/s for fp32/tf32/bf16, H100 SXM and H200 (9.0) 67/495/989; 0 when unknown.
double peak_flops(const DeviceInfo& d, MathMode m);

}  // namespace orrery::runtime::cuda
