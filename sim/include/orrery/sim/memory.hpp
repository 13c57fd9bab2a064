// Memory estimate per rank (per pipeline stage: every dp × tp rank of a stage holds the same).
//
// Model states (ZeRO, Rajbhandari et al. SC20), Ψ = parameters of the rank's tp slice of its stage,
// N = dp, bytes per parameter p/g/o from the precision (fp32 Adam 4/4/8; mixed bf16 2/2/12 with the
// fp32 master copy and moments in o):
//   stage 0: (p + g + o)·Ψ     stage 1: (p + g)·Ψ + o·Ψ/N
//   stage 2: p·Ψ + (g + o)·Ψ/N  stage 3: (p + g + o)·Ψ/N
// Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
// Models", Table 2), per layer per micro-batch, in 16-bit, t = tp, with training.recompute:
//   none       s·b·h·(10 + 24/t + 5·a·s/(h·t))   with sequence parallelism s·b·h·(34 + 5·a·s/h)/t
//   selective  s·b·h·(10 + 24/t)                 with sequence parallelism 34·s·b·h/t
//   full       2·s·b·h (the block's input)       with sequence parallelism 2·s·b·h/t
// (plain tensor parallelism keeps the LayerNorm and dropout regions' 10·s·b·h replicated). Those are
// the GPT block's; other blocks (model.kv_heads, ffn_hidden, activation) by the same derivation,
// term by term (memory.cpp's layer_terms): grouped-query attention keeps k and v at kv_heads/heads,
// the MLP's terms scale with ffn_hidden/d_model, SwiGLU keeps gate and up, and SwiGLU blocks have
// no dropout (Llama-2 7B, h 4096, F 11008, no GQA, no recomputation: s·b·h·(8 + 24.125/t +
// 2·a·s/(h·t))). fp32
// activations double it. Recomputation adds, once per rank, the workspace it runs in: one layer's
// activations without recomputation (full) or its attention core's 5·a·s/(h·t)·s·b·h (selective).
// Each stage counts its own blocks (parallel.pp_layers, or layers / pp). Micro-batches in flight
// on stage s: 1F1B min(p - s, m), GPipe m; interleaved 1F1B (v chunks of a
// v-th of the stage's layers) the peak of chunk passes between forward and backward over the
// stage's order, i.e. its warm-up plus one, min(2(p-s-1) + (v-1)p + 1, m·v)
// (micro_batches_in_flight: that / v, rounded up). The last stage adds its logits and their
// gradient, b·s·V·4·2 bytes for one micro-batch (fp32 loss); stage 0 adds the embedding output
// s·b·h·2.
// NVMe offload (zero.offload_optimizer nvme, workload.hpp's offload model): the optimizer state of
// the updated elements u (Ψ/N under ZeRO >= 1, else Ψ) moves to the file, offload_nvme_bytes =
// o·u (+ p·u with offload_params), and memory keeps three chunk buffers of each plane, 3·c·(o [+ p])
// with c the chunk's elements; with offload_params the parameters are four staging buffers of the
// largest segment's shard, 4·p·max_seg/N.
// Host offload (zero.offload_optimizer host, ZeRO-Offload on a GPU; workload.hpp): the device holds
// no optimizer state (optimizer_bytes 0) and the rank's pinned host memory, offload_host_bytes,
// holds the runtime's arrays: fp32 master weights and both fp32 moments of the updated elements
// (12·u, at either precision: under fp32 the host keeps its own master copy) and two staging
// buffers of one chunk's gradients, 2·c·g with c = min(zero.offload_chunk_mb · 2^20 / 4, u) (the
// runtime's chunk, not the simulator's op cap) and g the gradient bytes: 12u + 8c at fp32, as the
// CUDA runtime's mem.offload_host counts it.
// NVMe offload on a device (workload.hpp device_nvme_offload; the CUDA runtime's path): the device
// holds no optimizer state either (optimizer_bytes 0), the file the two fp32 moments,
// offload_nvme_bytes = 8·u, and pinned host memory the fp32 master weights, the two gradient
// staging buffers and the store's three chunk buffers of both moments: offload_host_bytes =
// 4·u + 2·c·g + 3·2·c·4 (c as host offload's), 4u + 32c at fp32, as the CUDA runtime's
// mem.offload_nvme and mem.offload_host count them. With zero.offload_params (ZeRO 3; workload.hpp
// device_offload_params) the file holds the fp32 shards too, offload_nvme_bytes = 12·u; no master
// weights are pinned; the parameters are the runtime's device staging, k slots (4, 6 on a stage with
// MoE experts) of the largest shard s (the segments' ceil(n / dp), the experts' ceil(e / edp)) in
// fp32, parameters_bytes = 4·k·s; offload_host_bytes = 2·c·g + 3·3·c·4 + 4·k·s (the staging's
// pinned twins), as tests/runtime/mpi/test_offload_mpi.cpp DeviceOffloadParams counts them.
// Mixture of experts (model/moe.hpp, sim/moe_cost.hpp): Ψ is the dense parameters (the router and
// shared experts in, the dense MLP of the MoE blocks out) under the formulas above over dp, plus
// the local experts' Ψe = (E/ep) · one expert's tp slice per MoE block: parameters and gradients
// whole (all-reduced over edp), optimizer state o·Ψe/(dp/ep) under ZeRO 1/2. An MoE block's
// activations replace the dense act and fc2 terms by moe_activation_bytes (router probabilities,
// the busiest ep rank's received rows through its experts, the returned rows, shared experts);
// a stage with MoE blocks adds one dispatch's send and receive buffers.
// Not counted: other communication buffers, allocator fragmentation, workspace (cuBLAS, NCCL).
#pragma once

#include <cstdint>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/sim/workload.hpp"

namespace orrery::sim {

struct MemoryEstimate {
  int stage = 0;
  int layers = 0;           // blocks the stage holds (parallel.pp_layers, or layers / pp)
  int64_t param_count = 0;  // Ψ of one rank (tp slice, unsharded)
  double parameters_bytes = 0;
  double gradients_bytes = 0;
  double optimizer_bytes = 0;
  double offload_nvme_bytes = 0;  // in the NVMe file, not in total_bytes
  double offload_host_bytes = 0;  // pinned host memory (host offload), not in total_bytes
  double activations_bytes = 0;
  int micro_batches_in_flight = 0;
  double total_bytes = 0;
  int64_t capacity_bytes = 0;  // the device's memory (0: unknown, always fits)
  bool fits = true;
};

// Model-state bytes of one rank: {parameters, gradients, optimizer}, by the formulas above.
struct ModelStateBytes {
  double parameters = 0, gradients = 0, optimizer = 0;
};
ModelStateBytes model_state_bytes(double params, int zero_stage, int dp, const PrecisionConfig& p);

// Activation bytes of one layer for one micro-batch on one rank (16-bit formula × act_bytes/2).
double activation_bytes_per_layer(const Scenario& s, const PrecisionConfig& p);
// The recomputation's workspace, once per rank (0 without recomputation).
double recompute_workspace_bytes(const Scenario& s, const PrecisionConfig& p);

// One estimate per pipeline stage. `device_nvme`: NVMe offload runs the device's path
// (workload.hpp device_nvme_offload: the profile has a host link), its memory as above.
std::vector<MemoryEstimate> estimate_memory(const Scenario& s, const PrecisionConfig& p,
                                            int64_t capacity_bytes, bool device_nvme = false);

}  // namespace orrery::sim
