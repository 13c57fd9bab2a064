// ZeRO 3's device storage (see cuda/zero3.hpp).
#include "orrery/runtime/cuda/zero3.hpp"

namespace orrery::runtime::cuda {

GpuZero3Storage::GpuZero3Storage(GpuGpt& m, int dp_rank, int dp_size, int ep) {
  allocate(zero3_segments(m.host, dp_rank, dp_size,
                          GptPointers{m.embed, m.dembed, m.blocks, m.dblocks, m.head, m.dhead,
                                      &m.moe, &m.dmoe},
                          ep),
           m.config().n_layer);
  for (const auto& sg : segments_) {
    const std::size_t n = sg.part.count();
    if (n == 0) continue;
    ORRERY_CUDA_CHECK(cudaMemcpy(params_.data() + sg.shard_offset,
                                 m.host.params.data() + sg.range.offset + sg.part.begin(),
                                 n * sizeof(float), cudaMemcpyHostToDevice));
  }
  // cudaMemcpy from pageable memory returns once the bytes are staged, not when they land, and on
  // the legacy stream, which the trainer's non-blocking streams do not wait for: the shards must
  // be on the device before the first gather reads them.
  ORRERY_CUDA_CHECK(cudaDeviceSynchronize());
  m.host.params = FloatArray();
  m.host.grads = FloatArray();
  m.params = DeviceArray<float>();
  m.grads = DeviceArray<float>();
}

}  // namespace orrery::runtime::cuda
