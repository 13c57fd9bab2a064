// ZeRO-Offload's device half on CUDA (zero.offload_optimizer host or nvme on device cuda; the
// pipeline and host step are runtime/offload_pipeline.hpp's): the master weights of the range this
// rank updates, with host also its AdamW moments, in pinned host memory (cudaHostAlloc), two pinned
// gradient staging buffers, and a copy stream of its own for the chunks' downloads and uploads.
//
// Ordering: begin() makes the copy stream wait for everything queued on the compute stream (the
// gradients are final); downloads record an event per staging buffer, which downloaded() waits for
// on the host; end() makes the compute stream wait for the range's last upload, so whatever it
// queues next (the ZeRO all-gather, the next forward) reads the updated parameters. The copy
// stream runs the downloads and uploads in the host's issue order, so a host step that writes a
// master chunk again (the next step) only starts after its previous upload (its download waited
// for everything queued before it).
//
// Spans: "offload.d2h" / "offload.h2d" (Memcpy, stream "offload", the chunk's bytes), timed by CUDA
// events on the copy stream (EventSpans, anchored at begin() and resolved at end()).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "orrery/runtime/cuda/device.hpp"
#include "orrery/runtime/offload_pipeline.hpp"

namespace orrery::profiler {
class Recorder;
}

namespace orrery::runtime::cuda {

class EventSpans;

// Page-locked host floats (cudaHostAlloc), zeroed: copies to and from them run asynchronously on a
// stream (from pageable memory cudaMemcpyAsync is synchronous).
class PinnedArray {
 public:
  PinnedArray() = default;
  explicit PinnedArray(std::size_t count);
  ~PinnedArray();
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  PinnedArray(PinnedArray&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  PinnedArray& operator=(PinnedArray&& o) noexcept;

  float* data() { return data_; }
  const float* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t size_bytes() const { return size_ * sizeof(float); }

 private:
  float* data_ = nullptr;
  std::size_t size_ = 0;
};

class HostOffload final : public OffloadTransfers {
 public:
  // `elems`: this rank's optimizer range in the moment arrays' layout; `moments`: AdamW's m and v
  // pinned here too (offload_optimizer host; with nvme the store holds them); `chunk`: elements per
  // chunk (the staging buffers' size, clamped to [1, elems]).
  HostOffload(std::size_t elems, bool moments, std::size_t chunk, cudaStream_t compute,
              profiler::Recorder* rec);
  ~HostOffload() override;
  HostOffload(const HostOffload&) = delete;
  HostOffload& operator=(const HostOffload&) = delete;

  float* master() { return master_.data(); }
  float* m() { return m_.data(); }  // null with nvme
  float* v() { return v_.data(); }
  std::size_t chunk() const { return chunk_; }
  // Pinned bytes held: master weights, moments (host), staging buffers.
  std::size_t pinned_bytes() const;

  // One range: its device parameters and gradients and its master weights, each at the range's
  // first element; `step` labels the spans.
  void begin(float* params, const float* grads, float* master, int32_t step);
  void end();
  void download(std::size_t first, std::size_t n, int buffer) override;
  const float* downloaded(int buffer) override;
  void upload(std::size_t first, std::size_t n) override;
  // Waits for the copy stream without throwing (the owner going away).
  void drain() noexcept;

 private:
  cudaStream_t compute_;
  std::size_t chunk_;
  PinnedArray master_, m_, v_;
  PinnedArray staging_[kOffloadStagingBuffers];
  Stream copy_;
  Event ready_{false}, done_{false};
  Event staged_[kOffloadStagingBuffers] = {Event(false), Event(false)};
  std::unique_ptr<EventSpans> spans_;
  profiler::Recorder* rec_;
  float* params_ = nullptr;
  const float* grads_ = nullptr;
  float* host_ = nullptr;
  int32_t step_ = -1;
};

}  // namespace orrery::runtime::cuda
