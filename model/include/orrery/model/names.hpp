// The one table of span, op, counter and communicator names of a training step. The runtime (CPU
// and CUDA) records spans under these names and the simulator builds its ops under them, so a real
// and a simulated trace of one scenario line up name by name (the test RealVsSimulated compares
// them). Change a name here and both follow; nothing else may spell them.
//
// Compute: "zero_grad" (once at the start of each step), "fwd.embed" (layer -1), "fwd.block"
// (layer l; with tp > 1 three pieces split by the two tensor-parallel all-reduces), "fwd.head"
// (layer L: final LayerNorm, LM head, loss), "bwd.head", "bwd.block", "bwd.embed", and under
// activation recomputation "recompute.block" / "recompute.attention" (layer l, before its "bwd.block"); optimizer
// "adamw"; data "data". Phases: "step", "forward", "backward", "optimizer". Collectives and
// transfers: see each constant.
#pragma once

#include <string>
#include <string_view>

namespace orrery::model::names {

// Phases.
inline constexpr std::string_view kStep = "step";
inline constexpr std::string_view kForward = "forward";
inline constexpr std::string_view kBackward = "backward";
inline constexpr std::string_view kOptimizer = "optimizer";

// Compute, optimizer and data.
inline constexpr std::string_view kDataLoad = "data";
inline constexpr std::string_view kZeroGrad = "zero_grad";
inline constexpr std::string_view kEmbedForward = "fwd.embed";
inline constexpr std::string_view kBlockForward = "fwd.block";
inline constexpr std::string_view kHeadForward = "fwd.head";  // final LayerNorm, LM head, loss
inline constexpr std::string_view kHeadBackward = "bwd.head";
inline constexpr std::string_view kBlockBackward = "bwd.block";
inline constexpr std::string_view kEmbedBackward = "bwd.embed";
// Activation recomputation (training.recompute), inside the backward, just before the block's
// "bwd.block": full recomputes the block's forward up to its GELU output (model/block.hpp:
// kRecomputePieces; with tp > 1 two pieces around the attention projection's tp all-reduce),
// selective the attention core (scores, softmax, weighted sum) of the block.
inline constexpr std::string_view kBlockRecompute = "recompute.block";
inline constexpr std::string_view kAttentionRecompute = "recompute.attention";
inline constexpr std::string_view kOptimizerStep = "adamw";
// NVMe offload (zero.offload_optimizer / offload_params nvme; runtime offload.hpp): Memcpy spans
// on the stream "offload", with the bytes each request moved between the file and memory.
inline constexpr std::string_view kOffloadRead = "offload.read";
inline constexpr std::string_view kOffloadWrite = "offload.write";
// ZeRO-Offload on a device (zero.offload_optimizer host or nvme on device cuda; runtime
// offload_pipeline.hpp): per chunk of the range a rank updates, its gradients copied to the host
// ("offload.d2h", Memcpy on the stream "offload"), AdamW stepped there ("offload.adamw", Optimizer,
// on the compute stream: the host thread that issues the device's work runs it) and its updated
// parameters copied back ("offload.h2d", Memcpy on "offload"); each carries the chunk's fp32 bytes.
inline constexpr std::string_view kOffloadD2H = "offload.d2h";
inline constexpr std::string_view kOffloadH2D = "offload.h2d";
inline constexpr std::string_view kOffloadAdamW = "offload.adamw";

// Collectives and point-to-point transfers.
inline constexpr std::string_view kDpAllReduce = "ddp.all_reduce";            // DDP bucket
inline constexpr std::string_view kDpBroadcast = "ddp.broadcast_parameters";  // before step 0
inline constexpr std::string_view kBarrier = "barrier";                       // before step 0
// Gradient compression on the dp group (parallel.grad_compression, runtime ddp_compression.hpp):
// the compressed collectives that replace "ddp.all_reduce" for a bucket, and the host compute
// around them (Compute spans; "ddp.compress" carries the bucket's uncompressed bytes).
inline constexpr std::string_view kDpInt8AllGather = "ddp.int8_all_gather";
inline constexpr std::string_view kDpTopkAllGather = "ddp.topk_all_gather";
inline constexpr std::string_view kDpPowerSgdP = "ddp.powersgd_p";
inline constexpr std::string_view kDpPowerSgdQ = "ddp.powersgd_q";
inline constexpr std::string_view kDpPowerSgdVectors = "ddp.powersgd_vectors";
inline constexpr std::string_view kDpCompress = "ddp.compress";
inline constexpr std::string_view kDpDecompress = "ddp.decompress";
inline constexpr std::string_view kTpAllReduce = "tp.all_reduce";
// Sequence parallelism (model/block.hpp): the tp all-reduces become a reduce-scatter onto the token
// shards and an all-gather of each LayerNorm output; the replicated LayerNorm and bias gradients,
// summed by each rank over its tokens, are all-reduced once per block and once for the head.
inline constexpr std::string_view kTpReduceScatter = "tp.reduce_scatter";
inline constexpr std::string_view kTpAllGather = "tp.all_gather";
inline constexpr std::string_view kTpGradAllReduce = "tp.grad_all_reduce";
// Fewer kv heads than tp ranks (each head replicated on tp / kv_heads ranks): the shared heads'
// gradients (k and v rows of qkv) summed over their ranks, one all-reduce over tp per block, with
// a slot per kv head (runtime training_loop_impl.hpp).
inline constexpr std::string_view kTpKvGradAllReduce = "tp.kv_grad_all_reduce";
// Mixture-of-experts blocks (model/moe.hpp: their span order). Compute spans and, over the ep
// group, the all-to-alls (ep > 1 only); the gate-gradient sum over tp (tp > 1 only).
inline constexpr std::string_view kMoeRouter = "moe.router";
inline constexpr std::string_view kMoeDispatch = "moe.dispatch";
inline constexpr std::string_view kMoeExperts = "moe.experts";
inline constexpr std::string_view kMoeCombine = "moe.combine";
inline constexpr std::string_view kMoeGatedSum = "moe.gated_sum";
inline constexpr std::string_view kMoeGatedSumBackward = "moe.gated_sum.bwd";
inline constexpr std::string_view kMoeCombineBackward = "moe.combine.bwd";
inline constexpr std::string_view kMoeExpertsBackward = "moe.experts.bwd";
inline constexpr std::string_view kMoeDispatchBackward = "moe.dispatch.bwd";
inline constexpr std::string_view kMoeRouterBackward = "moe.router.bwd";
inline constexpr std::string_view kTpMoeGateAllReduce = "tp.moe_gate_all_reduce";
// The expert parameters' gradient all-reduce over the expert-data-parallel group (DDP buckets of
// expert parameters; ZeRO 1/2 use zero.reduce_scatter / zero.all_gather on that group).
inline constexpr std::string_view kEdpAllReduce = "edp.all_reduce";
inline constexpr std::string_view kDpReduceScatter = "zero.reduce_scatter";
inline constexpr std::string_view kDpAllGather = "zero.all_gather";  // ZeRO 1/2: updated parameters
inline constexpr std::string_view kZeroAllGather =
    "zero.fetch_layer";  // ZeRO 3: one segment's parameters
inline constexpr std::string_view kEmbedAllReduce =
    "pp.embed_all_reduce";  // tied wte, first + last stage
inline constexpr std::string_view kSendActivation = "pp.send_act";
inline constexpr std::string_view kRecvActivation = "pp.recv_act";
inline constexpr std::string_view kSendGradient = "pp.send_grad";
inline constexpr std::string_view kRecvGradient = "pp.recv_grad";
inline constexpr std::string_view kPipelineLoss =
    "pp.loss";  // the last stage broadcasts the step's loss

// Trace streams of a rank, real and simulated alike: ids and names. The simulator runs each stream
// as its own queue (NCCL communicators run on their own CUDA streams; a pipeline stage receives
// while it sends). The CPU runtime's communication thread runs every group's operations in issue
// order but records each on its group's stream (runtime comm_stream_of), so a real CPU trace and
// the simulated trace of one scenario have the same lanes. The CUDA runtime keeps its own:
// compute and "nccl" (runtime/cuda nccl_comm.hpp).
inline constexpr int kStreamCompute = 0;
inline constexpr int kStreamDp = 1;          // dp group, world, tied-embedding pair
inline constexpr int kStreamTp = 2;          // tp group
inline constexpr int kStreamPpSend = 3;      // pp sends and the pp group's collectives
inline constexpr int kStreamPpRecv = 4;      // pp receives
inline constexpr int kStreamEp = 5;          // the ep group's all-to-alls (expert parallelism)
inline constexpr int kStreamOffload = 6;     // ZeRO offload reads and writes (NVMe, host)
inline constexpr int kStreamCount = 7;       // the streams of a training step
inline constexpr int kStreamCheckpoint = 7;  // a real run's checkpoint writes (none simulated)
inline constexpr std::string_view stream_name(int stream) {
  switch (stream) {
    case kStreamCompute:
      return "compute";
    case kStreamDp:
      return "comm.dp";
    case kStreamTp:
      return "comm.tp";
    case kStreamPpSend:
      return "comm.pp.send";
    case kStreamPpRecv:
      return "comm.pp.recv";
    case kStreamEp:
      return "comm.ep";
    case kStreamOffload:
      return "offload";
    case kStreamCheckpoint:
      return "checkpoint";
  }
  return "other";
}

// Memory counters (bytes), sampled at the end of every step.
inline constexpr std::string_view kMemParameters = "mem.parameters";
inline constexpr std::string_view kMemGradients = "mem.gradients";
inline constexpr std::string_view kMemOptimizer = "mem.optimizer";  // AdamW moments
inline constexpr std::string_view kMemActivations = "mem.activations";
inline constexpr std::string_view kMemCommBuffers = "mem.comm_buffers";
// Bytes this rank keeps in its NVMe offload file (zero.offload_optimizer nvme); mem.optimizer
// (and under offload_params mem.parameters) then count only the bounded buffers in memory.
inline constexpr std::string_view kMemOffloadNvme = "mem.offload_nvme";
// Pinned host memory that ZeRO-Offload on a device holds for this rank (zero.offload_optimizer host
// or nvme on device cuda): the master weights of the range it updates, with host the AdamW moments,
// the staging buffers (with nvme the store's chunk buffers too). mem.optimizer (device memory) is
// then 0.
inline constexpr std::string_view kMemOffloadHost = "mem.offload_host";

// fp16 dynamic loss scaling (runtime loss_scaler.hpp), sampled at the end of every step: the scale
// the step's backward used, and the steps skipped so far (gradients with an inf or NaN). The
// ranks' overflow flags are combined by a max all-reduce named kLossScaleOverflow.
inline constexpr std::string_view kLossScale = "loss_scale";
inline constexpr std::string_view kSkippedSteps = "skipped_steps";
inline constexpr std::string_view kLossScaleOverflow = "loss_scale.overflow";

// Communicator names of one rank's groups, from its grid coordinates: "dp[tp=T,pp=P]",
// "tp[dp=D,pp=P]", "pp[dp=D,tp=T]" and the tied-embedding pair "embed[dp=D,tp=T]".
inline std::string dp_group(int tp_rank, int pp_rank) {
  return "dp[tp=" + std::to_string(tp_rank) + ",pp=" + std::to_string(pp_rank) + "]";
}
inline std::string tp_group(int dp_rank, int pp_rank) {
  return "tp[dp=" + std::to_string(dp_rank) + ",pp=" + std::to_string(pp_rank) + "]";
}
inline std::string pp_group(int dp_rank, int tp_rank) {
  return "pp[dp=" + std::to_string(dp_rank) + ",tp=" + std::to_string(tp_rank) + "]";
}
// Expert parallelism (model/moe.hpp): the ep group of the ep consecutive dp ranks from
// ep_group_index · ep, "ep[g=G,tp=T,pp=P]", and the expert-data-parallel group of the dp ranks with
// ep rank R, "edp[ep=R,tp=T,pp=P]".
inline std::string ep_group(int group_index, int tp_rank, int pp_rank) {
  return "ep[g=" + std::to_string(group_index) + ",tp=" + std::to_string(tp_rank) +
         ",pp=" + std::to_string(pp_rank) + "]";
}
inline std::string edp_group(int ep_rank, int tp_rank, int pp_rank) {
  return "edp[ep=" + std::to_string(ep_rank) + ",tp=" + std::to_string(tp_rank) +
         ",pp=" + std::to_string(pp_rank) + "]";
}
inline std::string embed_group(int dp_rank, int tp_rank) {
  return "embed[dp=" + std::to_string(dp_rank) + ",tp=" + std::to_string(tp_rank) + "]";
}

}  // namespace orrery::model::names
