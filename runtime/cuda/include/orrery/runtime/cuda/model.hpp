// The reference GPT on one CUDA device: the CPU model (runtime/model.hpp) with its parameters,
// gradients and activations in device memory and its pieces computed by the CUDA kernels.
//
// Same layout, same maths, same spans:
//  - GpuGpt keeps the host runtime::Gpt it was made from (`host`: tensors, segments, config, dims
//    and a host copy of the parameters); params/grads are one flat device array each with exactly
//    the host layout, so DDP buckets (make_ddp_buckets(host, ...)) are the CPU ones and initial
//    parameters are bit-identical to the CPU run's (copied from gpt_create's values).
//  - The pieces below mirror gpt_embed_forward ... gpt_embed_backward one for one: they call
//    GptHooks::observer with the same names, layers and FLOPs (model/flops.hpp) and fire on_grads_ready
//    in the same order, so the trainer's spans and DDP buckets are the CPU trainer's. The observer
//    is called on the host while the work is only queued: a GPU observer records CUDA events on
//    the compute stream (gpu_trainer's EventSpans), not host clock reads.
//  - Tensor parallelism (Megatron, model.hpp): a tp shard's host layout is kept as is (local heads
//    and MLP width, replicated LayerNorms, row-parallel biases, embedding and head), so a tp
//    rank's initial device parameters are bit-identical to the CPU shard's. Each block calls
//    GptHooks::tp_all_reduce with DEVICE pointers at the CPU model's four points (forward: attproj
//    and fcproj before their bias and residual; backward: dln before the ln2 and ln1 LayerNorm
//    backward) and splits its span into the CPU model's three pieces around them (same names,
//    layers and FLOPs: flops::block_attention_forward, block_mlp_forward, 0; backward 2x mlp,
//    2x attention, 0). The hook queues the sum on a device communicator; work queued after it on
//    the compute stream must see the sum (the trainer's Handle::wait orders the stream).
//  - Pipeline stages (GptShard::pipeline_stage): a stage holds the CPU shard's layout as is (blocks
//    [layer_begin, layer_end) at index layer - layer_begin, the embedding on the first stage, the
//    final LayerNorm and its own copy of the tied wte on the last), so its initial device
//    parameters are bit-identical to the CPU stage's. Stage boundaries as on the CPU: the received
//    activation goes to GpuActivations::stage_input() before gpu_forward on a stage without the
//    embedding, stage_output() is what is sent on; before gpu_backward on a stage without the head
//    GpuGradScratch::dres holds the received gradient, after it the gradient of stage_input().
//    Activations hold the head's buffers on the last stage only; a head-only stage's backward fires
//    on_grads_ready(kEmbedSegment) last (its wte copy), as gpt_backward.
//  - A host model padded for ZeRO (gpt_pad_storage) is moved as is: params/grads keep the padded
//    length (num_params() then counts the padding), zero-filled beyond the tensors.
//  - Mixture-of-experts blocks (model/moe.hpp): the CPU model's moe_pieces.hpp over the CUDA
//    kernels, the routers' and experts' tensors at the host layout's places (moe, dmoe). The routing
//    is decided on the host from the router probabilities downloaded per block (N·E floats; the
//    host waits for the stream there), the index tables uploaded; the rows and every matmul stay on
//    the device. In the backward the gates' gradient (N·K floats) comes down for the router's
//    (N, E) gradient maths, whose result goes up for the router's matmul backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "orrery/runtime/cuda/device.hpp"
#include "orrery/runtime/cuda/kernels.hpp"
#include "orrery/runtime/model.hpp"

namespace orrery::runtime::cuda {

struct GpuGpt {
  Gpt host;                          // layout and a host copy of the parameters
  DeviceArray<float> params, grads;  // (num_params) each, host layout
  EmbedParams embed, dembed;         // device pointers into params / grads
  std::vector<BlockParams> blocks, dblocks;
  HeadParams head, dhead;
  std::vector<MoeParams> moe, dmoe;  // MoE blocks' routers and experts (empty entries: dense)

  const GptConfig& config() const { return host.config; }
  const BlockDims& dims() const { return host.dims; }
  std::size_t num_params() const { return host.num_params(); }
  // Copies the device parameters into host.params (synchronous) and returns them.
  const FloatArray& download_params();
};

// The host layout (gpt_pieces.hpp's layout_of).
inline const Gpt& layout_of(const GpuGpt& m) { return m.host; }

// Moves `host` (any pipeline stage and tp shard gpt_create makes; possibly padded for ZeRO) onto
// the current device, parameters copied. With device_storage false nothing is allocated on the
// device and every device pointer is null (ZeRO 3: GpuZero3Storage, cuda/zero3.hpp, uploads the
// shards and binds the pointers).
GpuGpt gpu_gpt_create(Gpt host, bool device_storage = true);
// Zeroes the gradients on ctx's stream.
void gpu_zero_grad(const Context& ctx, GpuGpt& model);

// The CPU model's activation and scratch layout (model.hpp) over device arrays; the MoE blocks'
// rows and index tables in device arrays too.
using GpuMoeBlockState = BasicMoeBlockState<DeviceArray<float>, DeviceArray<int64_t>>;
using GpuActivations = BasicActivations<DeviceArray<float>, DeviceArray<int32_t>, GpuMoeBlockState>;
GpuActivations gpu_activations(const GpuGpt& model, int B, int T,
                               Recompute recompute = Recompute::None);

using GpuGradScratch = BasicGradScratch<DeviceArray<float>>;
GpuGradScratch gpu_grad_scratch(const GpuGpt& model, int B, int T,
                                Recompute recompute = Recompute::None);

// --- pieces (see model.hpp). `inputs`/`targets` are HOST arrays of B*T token ids; they are
// copied to the device on ctx's stream. The embedding pieces need has_embed, the head pieces
// has_head (std::logic_error otherwise), a block piece a layer of the shard (std::out_of_range).
void gpu_embed_forward(const Context& ctx, const GpuGpt& m, GpuActivations& acts,
                       const int32_t* inputs, const GptHooks& hooks = {});
void gpu_block_forward(const Context& ctx, const GpuGpt& m, GpuActivations& acts, int layer,
                       const GptHooks& hooks = {});
// Returns the mean loss (waits for the stream: the loss is read back).
float gpu_head_forward(const Context& ctx, const GpuGpt& m, GpuActivations& acts,
                       const int32_t* targets, const GptHooks& hooks = {});
void gpu_head_backward(const Context& ctx, GpuGpt& m, GpuActivations& acts, GpuGradScratch& s,
                       float loss_scale, const GptHooks& hooks = {});
void gpu_block_backward(const Context& ctx, GpuGpt& m, GpuActivations& acts, GpuGradScratch& s,
                        int layer, const GptHooks& hooks = {});
void gpu_embed_backward(const Context& ctx, GpuGpt& m, GpuActivations& acts, GpuGradScratch& s,
                        const GptHooks& hooks = {});

// Whole stage: embedding (if held), blocks, head (if held); the mean loss, or 0 without the head.
float gpu_forward(const Context& ctx, const GpuGpt& m, GpuActivations& acts, const int32_t* inputs,
                  const int32_t* targets, const GptHooks& hooks = {});
void gpu_backward(const Context& ctx, GpuGpt& m, GpuActivations& acts, GpuGradScratch& s,
                  float loss_scale = 1.0f, const GptHooks& hooks = {});

}  // namespace orrery::runtime::cuda
