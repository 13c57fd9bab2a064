// ZeRO 3 on one CUDA device: runtime/zero.hpp's Zero3Storage scheme with device buffers.
//
// Same segments (the embedding, each block, the final LayerNorm, each partitioned on its own over
// the dp group, k_g = ceil(c_g / N)), same shard layout (segments in memory order), same working
// buffers (0/1 blocks by layer parity from layer_begin, 2 the embedding, 3 the final LayerNorm):
// a rank holds only its shards of parameters and gradients on the device (16 Ψ/N bytes with the
// trainer's AdamW moments) plus the working buffers. The model's named device pointers (GpuGpt's
// embed/blocks/head and their gradients) are rebound to the working buffers by Zero3Segment::bind;
// the trainer gathers into them ("zero.fetch_layer") and reduce-scatters out of them, on a device
// communicator ordered against the compute stream (nccl_comm.hpp), so a buffer is never written
// while queued kernels still read it.
#pragma once

#include <cstddef>
#include <vector>

#include "orrery/runtime/cuda/device.hpp"
#include "orrery/runtime/cuda/model.hpp"
#include "orrery/runtime/zero.hpp"

namespace orrery::runtime::cuda {

class GpuZero3Storage : public BasicZero3Storage<DeviceArray<float>> {
 public:
  // `model` from gpu_gpt_create(host, /*device_storage=*/false): its host copy holds the initial
  // parameters and its device pointers are unbound. Uploads this rank's shard of each segment, then
  // frees the host copy's flat arrays (the layout, tensors and dims stay); full device arrays, if
  // the model has them, are freed too. MoE: the routed experts' segments over the edp group of
  // `ep` (runtime/zero.hpp), bound to the experts' working buffers as on the CPU.
  GpuZero3Storage(GpuGpt& model, int dp_rank, int dp_size, int ep = 1);
};

}  // namespace orrery::runtime::cuda
