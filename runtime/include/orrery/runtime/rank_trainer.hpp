// What one rank's run (launch.hpp: run_rank) and checkpoints (checkpoint.hpp) need of a trainer, on
// any device: RankTrainer, implemented once by TrainingLoop<Backend> (training_loop.hpp) for every
// backend (the CPU's Trainer, trainer.hpp; the CUDA GpuTrainer, cuda/trainer.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/data.hpp"
#include "orrery/runtime/ddp.hpp"
#include "orrery/runtime/loss_scaler.hpp"
#include "orrery/runtime/model.hpp"

namespace orrery::profiler {
class Recorder;
}

namespace orrery::runtime {

// A rank's coordinates in the dp/tp/pp grid. parallel.placement lists the axes fastest-varying
// first ("tp,dp,pp", Megatron's default: tp neighbours are adjacent ranks).
struct Layout {
  int dp = 1, tp = 1, pp = 1;
  int dp_rank = 0, tp_rank = 0, pp_rank = 0;
  int ep = 1;  // parallel.ep (model/moe.hpp): ep rank dp_rank % ep
  static Layout of(const Scenario& s, int world_rank);
};

// Throws InputError, before any rank starts work, for a layout the model cannot take
// (validate_layout: heads or layers that do not divide, ZeRO without dp, more stages than layers)
// and for what the CPU runtime cannot run (the interleaved schedule, a device it lacks). A device
// backend's check (cuda: check_supported_cuda) calls it for everything but the device.
void check_supported(const Scenario& s);

struct StepResult {
  int32_t step = 0;
  float loss = 0;           // mean over this rank's micro-batches of the step
  int64_t duration_ns = 0;  // wall time of the step on this rank
  int64_t tokens = 0;       // global tokens of the step (all dp replicas)
  bool skipped = false;     // fp16: gradients overflowed, no optimizer update (loss_scaler.hpp)
  double loss_scale = 1.0;  // fp16: the loss scale the step's backward used (1 otherwise)
  // MoE (model/moe.hpp): the load-balancing losses of this rank's MoE blocks, mean over the
  // step's micro-batches (not in `loss`, which stays the LM loss; the gradients include both).
  double aux_loss = 0;
};

// Persistent bytes per category, as recorded in the mem.* counters.
struct MemoryBytes {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0, comm_buffers = 0;
  double offload_nvme = 0;  // bytes in the NVMe offload file (zero.offload_optimizer nvme)
  // pinned host bytes of ZeRO-Offload on a device (zero.offload_optimizer host, or nvme on cuda)
  double offload_host = 0;
};

// A stretch [offset, offset + count) of this rank's flat array (unpadded, the model's layout)
// with HOST pointers to its parameters and AdamW moments; a null pointer: that field is not part
// of the stretch.
struct StateRange {
  std::size_t offset = 0, count = 0;
  float* params = nullptr;
  float* m = nullptr;
  float* v = nullptr;
};

// The DDP compression hook's state a checkpoint keeps (ddp_compression.hpp: get_state).
struct CompressionState {
  std::vector<float> residuals;  // every bucket's error-feedback residual, in bucket order
  std::vector<float> q;          // PowerSGD's warm-started Q of every compressed matrix
};

class RankTrainer {
 public:
  using MemoryBytes = runtime::MemoryBytes;
  using StateRange = runtime::StateRange;
  virtual ~RankTrainer() = default;

  // Broadcasts rank 0's parameters over the dp group and lines the ranks up (barrier).
  virtual void prepare() = 0;
  // One optimizer step over M micro-batches.
  virtual StepResult step() = 0;
  // Waits for the device and its communicators and detaches the recorder from the latter, so every
  // span is in the recorder before the trace is closed. Training may not continue after it.
  virtual void finish() = 0;
  virtual int32_t steps_done() const = 0;

  virtual const Layout& layout() const = 0;
  virtual int micro_batches() const = 0;
  virtual Communicator& dp_group() = 0;  // host communicator of the dp group
  virtual const std::vector<DdpBucket>& buckets() const = 0;
  // Elements of this rank's flat array (its (tp, pp) shard of the model), without ZeRO padding.
  virtual std::size_t flat_elems() const = 0;
  virtual MemoryBytes memory() const = 0;
  // This rank's parameters in the model's flat layout (unpadded); under ZeRO 3 gathered over the
  // dp group (a collective: every dp rank must call it).
  virtual std::vector<float> parameters() = 0;

  // Checkpoints (checkpoint.hpp). What this rank saves: everything it owns (ZeRO: its shard of
  // every field; without ZeRO dp rank 0 of each (tp, pp) saves the whole array, the others
  // nothing, except under MoE with ep > 1, where dp ranks 1..ep-1 save their own experts). Valid until the next call of a state_* function or step().
  virtual std::vector<StateRange> state_to_save() = 0;
  // What it must read back to continue: the parameters it holds (all of them, unless ZeRO 3) and
  // the moments of the range its optimizer updates. Fill them, then call commit_loaded_state()
  // (a device copies them in), then restore_counters().
  virtual std::vector<StateRange> state_to_load() = 0;
  virtual void commit_loaded_state() = 0;
  // The checkpoint's global coordinates of this rank's flat array (model.hpp global_flat_runs:
  // the experts where ep = 1 holds them) and the global array's elements.
  virtual std::vector<FlatRun> checkpoint_runs() const = 0;
  virtual std::size_t checkpoint_elems() const = 0;
  virtual int64_t adamw_steps() const = 0;
  virtual const DataLoader& loader() const = 0;
  // Continues from a checkpoint: steps done, AdamW's step count, the loader's position (calls).
  // Call after the parameters and moments are in place and before prepare().
  virtual void restore_counters(int32_t steps_done, int64_t adamw_steps, int64_t data_calls) = 0;
  // The gradient compression hook's state (nullopt: no hook, parallel.grad_compression none or a
  // dp group of one) and the fp16 loss scaler's (nullopt: not fp16): copies, taken between steps.
  virtual std::optional<CompressionState> compression_state() const = 0;
  virtual std::optional<LossScalerState> loss_scaler_state() const = 0;
  // Continue from a checkpoint's state (before prepare()); the sizes are compression_state()'s.
  virtual void restore_compression_state(const CompressionState& st) = 0;
  virtual void restore_loss_scaler(const LossScalerState& st) = 0;

  // The run's description in the trace (launch.hpp: run_rank): the device of this rank
  // (RankInfo::device), its peak FLOP/s (0: not known) and the backend's fields of the run
  // metadata's extra_json object.
  virtual std::string device_description() const = 0;
  virtual double peak_flops_per_rank() const = 0;
  virtual nlohmann::json meta_fields() const = 0;
  // Kernel-level tracing of a device (CUPTI on CUDA) around the steps; nothing on CPUs.
  virtual void start_device_tracing(profiler::Recorder& rec) = 0;
  virtual void stop_device_tracing() = 0;
};

}  // namespace orrery::runtime
