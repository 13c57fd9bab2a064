// The training loop of one rank: data, forward, backward with DDP's overlapped gradient
// all-reduce, AdamW; every piece recorded as spans, memory as counters.
//
// What one step records (the simulator reproduces these names in this order; M = micro-batches per
// step = global_batch / (dp * micro_batch), L = model.layers, K = DDP buckets):
//
//   compute stream (0)                                   comm stream (1)
//   Phase "step"                       step s
//     Compute "zero_grad"                (the gradients, and ZeRO's shard accumulators, set to 0)
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
// Compute spans carry the model FLOPs of model/flops.hpp, step, micro-batch and layer. Before step 0 the
// comm stream holds "ddp.broadcast_parameters" (broadcast) and "barrier". Counters, sampled at
// the end of every step (bytes): mem.parameters, mem.gradients, mem.optimizer (AdamW moments),
// mem.activations (the saved activations of every micro-batch in flight plus the backward scratch),
// mem.comm_buffers (pipeline gradient send buffers, ZeRO's reduce-scatter output; under ZeRO 2 also
// the full-size array the model writes one backward's gradients into before they are scattered).
//
// Parallel strategies (names from model/include/orrery/model/names.hpp, as the simulator's):
//  - tp > 1 (tensor_parallel.hpp): each block's three compute pieces are separated by the model's
//    tp sums, Collective "tp.all_reduce" on the tp group (layer l; two in forward, two in backward).
//  - pp > 1 (pipeline.hpp): passes in pipeline_order(schedule) instead of forward-then-backward per
//    micro-batch; a stage without the embedding receives "pp.recv_act" before its forward, one
//    without the head sends "pp.send_act" after it; backward "pp.recv_grad" / "pp.send_grad" (P2P,
//    layer -1). Only the first and last stages load data. After the step's gradient reduction the
//    first and last stage sum the tied wte gradient: "pp.embed_all_reduce" (Collective, Sum, on the
//    embedding group; under ZeRO it comes before each reduce-scatter instead). At the end of the
//    step the last stage broadcasts the step's loss over the pp group ("pp.loss", 4 bytes) so every
//    rank reports it.
//  - zero 1/2 (zero.hpp): "zero.reduce_scatter" instead of "ddp.all_reduce" (one per step for
//    zero 1, one per micro-batch for zero 2, after the backward pass), AdamW on the owned shard,
//    then "zero.all_gather" of the parameters (Phase "optimizer").
//  - zero 3 (zero.hpp, Zero3Storage): "zero.fetch_layer" all-gathers (a block before its forward and
//    before its backward, the next one prefetched; the embedding and final LayerNorm once per step),
//    "zero.reduce_scatter" per segment as its backward completes, every micro-batch; AdamW per
//    segment shard; no parameter all-gather after the optimizer.
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
#include "orrery/runtime/zero.hpp"

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

// Throws InputError, before any rank starts work, for a layout the model cannot take
// (validate_layout: heads or layers that do not divide, ZeRO without dp, more stages than layers)
// and for what this runtime cannot run (ZeRO 3, the interleaved schedule, a device it lacks).
void check_supported(const Scenario& s);

struct StepResult {
  int32_t step = 0;
  float loss = 0;           // mean over this rank's micro-batches of the step
  int64_t duration_ns = 0;  // wall time of the step on this rank
  int64_t tokens = 0;       // global tokens of the step (all dp replicas)
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
  Communicator& tp_group() { return *tp_; }
  Communicator& pp_group() { return *pp_; }
  // The ZeRO partition of this rank's flat array over dp (ranks 1 without ZeRO).
  const ZeroPartition& zero() const { return zero_; }
  // Persistent bytes per category, as recorded in the mem.* counters.
  struct MemoryBytes {
    double parameters = 0, gradients = 0, optimizer = 0, activations = 0, comm_buffers = 0;
  };
  MemoryBytes memory() const;
  // This rank's parameters in the model's flat layout (unpadded); under ZeRO 3 gathered over the
  // dp group (a collective: every dp rank must call it).
  std::vector<float> full_parameters();
  DataParallel& ddp() { return *ddp_; }
  const TokenSource& source() const { return *source_; }
  int micro_batches() const { return micro_batches_; }

  // Checkpoints (checkpoint.hpp). A stretch [offset, offset + count) of this rank's flat array
  // (unpadded, the model's layout) with pointers to its parameters and AdamW moments; a null
  // pointer: that field is not part of the stretch.
  struct StateRange {
    std::size_t offset = 0, count = 0;
    float* params = nullptr;
    float* m = nullptr;
    float* v = nullptr;
  };
  // What this rank saves: everything it owns (ZeRO: its shard of every field; without ZeRO dp rank
  // 0 of each (tp, pp) saves the whole array, the others nothing). Valid until the next step().
  std::vector<StateRange> state_to_save();
  // What it must read back to continue: the parameters it holds (all of them, unless ZeRO 3) and
  // the moments of the range its optimizer updates.
  std::vector<StateRange> state_to_load();
  // Elements of this rank's flat array (its (tp, pp) shard of the model), without ZeRO padding.
  std::size_t flat_elems() const;
  int64_t adamw_steps() const;
  const DataLoader& loader() const { return *loader_; }
  // Continues from a checkpoint: steps done, AdamW's step count, the loader's position (calls).
  // Call after the parameters and moments are in place and before prepare().
  void restore_counters(int32_t steps_done, int64_t adamw_steps, int64_t data_calls);

 private:
  class SpanObserver;
  void record_memory();
  void forward_pass(int mb, const GptHooks& hooks, double& loss_sum);
  void backward_pass(int mb, const GptHooks& hooks, float loss_scale);
  void reduce_gradients_zero(int mb);
  void embed_all_reduce(float* wte_grad);
  void z3_gather(int segment, int slot, int mb);
  void z3_bind_block(int layer, int next_layer, int mb);
  void z3_reduce_scatter(int segment, int slot, int mb);
  float z3_forward(int mb, GptActivations& acts, const GptHooks& hooks);
  void z3_backward(int mb, GptActivations& acts, const GptHooks& hooks, float loss_scale);
  void z3_finish_backward();

  Scenario s_;
  Communicator& world_;
  profiler::Recorder* rec_;
  Layout layout_;
  std::unique_ptr<Communicator> dp_, tp_, pp_, embed_;
  Gpt model_;
  std::unique_ptr<TokenSource> source_;
  std::unique_ptr<DataLoader> loader_;
  std::unique_ptr<DataParallel> ddp_;
  std::unique_ptr<AdamW> optimizer_;
  std::vector<GptActivations> acts_;   // one per micro-batch in flight (index mb % size)
  std::vector<FloatArray> grad_send_;  // pipeline: gradients sent back, one per mb in flight
  std::vector<Handle> act_send_h_, grad_send_h_;
  GptGradScratch scratch_;
  ZeroPartition zero_;
  FloatArray zero_grads_;  // (k) the owned shard of the averaged gradients
  FloatArray zero_recv_;   // (k) zero 2: one micro-batch's scattered shard
  int32_t cur_mb_ = -1;
  // ZeRO 3
  std::unique_ptr<Zero3Storage> z3_;
  std::vector<std::unique_ptr<AdamW>> z3_opt_;  // one per segment shard
  FloatArray z3_recv_;                          // reduce-scatter output, shard layout
  Handle z3_gather_h_[4], z3_rs_h_[4];
  int z3_gathered_[4] = {-99, -99, -99, -99};  // segment held by each working buffer
  Batch batch_;
  std::unique_ptr<SpanObserver> observer_;
  int micro_batches_ = 1;
  int32_t step_ = 0;
};

}  // namespace orrery::runtime
