// The training loop of one rank: data, forward, backward with DDP's overlapped gradient
// all-reduce, AdamW; every piece recorded as spans, memory as counters.
//
// What one step records (the simulator reproduces these names in this order; M = micro-batches per
// step = global_batch / (dp * micro_batch), L = model.layers, K = DDP buckets):
//
//   compute stream (0)                                   comm stream (1)
//   Phase "step"                       step s
//     for mb in 0..M-1:
//       Data "data"                    mb                (the loader filling the micro-batch)
//       Phase "forward"                mb
//         Compute "fwd.embed"  layer -1
//         Compute "fwd.block"  layer 0 .. L-1
//         Compute "fwd.head"   layer L
//       Phase "backward"               mb
//         Compute "bwd.head"   layer L
//         Compute "bwd.block"  layer L-1 .. 0             Collective "ddp.all_reduce" bucket 0..K-1
//         Compute "bwd.embed"  layer -1                     (mb = M-1 only, when dp > 1; layer = the
//                                                            bucket's lowest layer; issued as each
//                                                            bucket's last segment is done, or all
//                                                            after "bwd.embed" with overlap off)
//         (the backward phase ends when the last all-reduce is complete)
//     Phase "optimizer"
//       Optimizer "adamw"
//
// Compute spans carry the model FLOPs of flops.hpp, step, micro-batch and layer. Before step 0 the
// comm stream holds "ddp.broadcast_parameters" (broadcast) and "barrier". Counters, sampled at
// the end of every step (bytes): mem.parameters, mem.gradients, mem.optimizer (AdamW moments),
// mem.activations (one micro-batch's saved activations plus the backward scratch), mem.comm_buffers
// (DDP's own buffers: 0, buckets are views of the gradient array).
//
// Only data parallelism exists so far: tp > 1, pp > 1 or zero > 0 are refused with an InputError
// (their groups are already derived from the layout, see Layout).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/data.hpp"
#include "orrery/runtime/ddp.hpp"
#include "orrery/runtime/model.hpp"
#include "orrery/runtime/optimizer.hpp"

namespace orrery::profiler {
class Recorder;
}

namespace orrery::runtime {

// A rank's coordinates in the dp/tp/pp grid. parallel.placement lists the axes fastest-varying
// first ("tp,dp,pp", Megatron's default: tp neighbours are adjacent ranks).
struct Layout {
  int dp = 1, tp = 1, pp = 1;
  int dp_rank = 0, tp_rank = 0, pp_rank = 0;
  static Layout of(const Scenario& s, int world_rank);
};

// Throws InputError for what this runtime cannot run yet (tp, pp, ZeRO, a device it lacks).
void check_supported(const Scenario& s);

struct StepResult {
  int32_t step = 0;
  float loss = 0;          // mean over this rank's micro-batches of the step
  int64_t duration_ns = 0; // wall time of the step on this rank
  int64_t tokens = 0;      // global tokens of the step (all dp replicas)
};

class Trainer {
 public:
  // `world` must have exactly s.world_size() ranks. `rec` may be nullptr (no profiling).
  Trainer(const Scenario& s, Communicator& world, profiler::Recorder* rec);
  ~Trainer();

  // Broadcasts rank 0's parameters over the dp group and lines the ranks up (barrier).
  void prepare();
  // One optimizer step over M micro-batches.
  StepResult step();
  int32_t steps_done() const { return step_; }

  const Layout& layout() const { return layout_; }
  Gpt& model() { return model_; }
  Communicator& dp_group() { return *dp_; }
  DataParallel& ddp() { return *ddp_; }
  const TokenSource& source() const { return *source_; }
  int micro_batches() const { return micro_batches_; }

 private:
  class SpanObserver;
  void record_memory();

  Scenario s_;
  Communicator& world_;
  profiler::Recorder* rec_;
  Layout layout_;
  std::unique_ptr<Communicator> dp_;
  Gpt model_;
  std::unique_ptr<TokenSource> source_;
  std::unique_ptr<DataLoader> loader_;
  std::unique_ptr<DataParallel> ddp_;
  std::unique_ptr<AdamW> optimizer_;
  GptActivations acts_;
  GptGradScratch scratch_;
  Batch batch_;
  std::unique_ptr<SpanObserver> observer_;
  int micro_batches_ = 1;
  int32_t step_ = 0;
};

}  // namespace orrery::runtime
