// ZeRO 3's device storage (see cuda/zero3.hpp).
#include "orrery/runtime/cuda/zero3.hpp"

namespace orrery::runtime::cuda {

GpuZero3Storage::GpuZero3Storage(GpuGpt& m, int dp_rank, int dp_size)
    : segments_(zero3_segments(m.host, dp_rank, dp_size,
                               GptPointers{m.embed, m.dembed, m.blocks, m.dblocks, m.head, m.dhead})) {
  const int L = m.config().n_layer;
  std::size_t total_shard = 0;
  for (const auto& sg : segments_) total_shard += sg.part.shard;
  params_.resize(total_shard);  // zero-filled: the padding of each shard stays 0
  grads_.resize(total_shard);
  for (const auto& sg : segments_) {
    const std::size_t n = sg.part.count();
    if (n == 0) continue;
    ORRERY_CUDA_CHECK(cudaMemcpy(params_.data() + sg.shard_offset,
                                 m.host.params.data() + sg.range.offset + sg.part.begin(), n * sizeof(float),
                                 cudaMemcpyHostToDevice));
  }
  const std::size_t max_block = zero3_max_block(segments_, L);
  for (int slot = 0; slot < 2; ++slot) {
    pbuf_[slot].resize(max_block);
    gbuf_[slot].resize(max_block);
  }
  for (const auto& sg : segments_) {
    if (sg.id != kEmbedSegment && sg.id != L) continue;
    const int slot = sg.id == kEmbedSegment ? 2 : 3;
    pbuf_[slot].resize(sg.part.padded());
    gbuf_[slot].resize(sg.part.padded());
  }
  m.host.params = FloatArray();
  m.host.grads = FloatArray();
  m.params = DeviceArray<float>();
  m.grads = DeviceArray<float>();
}

Zero3Segment& GpuZero3Storage::segment(int id) { return zero3_segment(segments_, id); }

std::size_t GpuZero3Storage::buffer_bytes() const {
  std::size_t b = 0;
  for (const auto& a : pbuf_) b += a.size_bytes();
  for (const auto& a : gbuf_) b += a.size_bytes();
  return b;
}

}  // namespace orrery::runtime::cuda
