// ZeRO 3's device storage (see cuda/zero3.hpp).
#include "orrery/runtime/cuda/zero3.hpp"

namespace orrery::runtime::cuda {

GpuZero3Storage::GpuZero3Storage(GpuGpt& m, int dp_rank, int dp_size) {
  allocate(zero3_segments(m.host, dp_rank, dp_size,
                          GptPointers{m.embed, m.dembed, m.blocks, m.dblocks, m.head, m.dhead}),
           m.config().n_layer);
  for (const auto& sg : segments_) {
    const std::size_t n = sg.part.count();
    if (n == 0) continue;
    ORRERY_CUDA_CHECK(cudaMemcpy(params_.data() + sg.shard_offset,
                                 m.host.params.data() + sg.range.offset + sg.part.begin(),
                                 n * sizeof(float), cudaMemcpyHostToDevice));
  }
  m.host.params = FloatArray();
  m.host.grads = FloatArray();
  m.params = DeviceArray<float>();
  m.grads = DeviceArray<float>();
}

}  // namespace orrery::runtime::cuda
