// ZeRO-Offload's device half on CUDA (zero.offload_optimizer host or nvme on device cuda; the
// pipeline and host step are runtime/offload_pipeline.hpp's): the master weights of the range this
// rank updates, with host also its AdamW moments, in pinned host memory (cudaHostAlloc), two pinned
// gradient staging buffers, and a copy stream of its own for the chunks' downloads and uploads.
// With zero.offload_params (ZeRO 3) the offload file holds the master weights, so no pinned master
// array is made and nothing is uploaded after the host step (the device holds no shard: begin()
// gets null parameters); the shards reach the device for each gather through CudaShardStaging.
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
#include <vector>

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
  // pinned here too (offload_optimizer host; with nvme the store holds them); `master`: the master
  // weights pinned here (not with offload_params: the store's plane 2); `chunk`: elements per
  // chunk (the staging buffers' size, clamped to [1, elems]).
  HostOffload(std::size_t elems, bool moments, std::size_t chunk, bool master, cudaStream_t compute,
              profiler::Recorder* rec);
  ~HostOffload() override;
  HostOffload(const HostOffload&) = delete;
  HostOffload& operator=(const HostOffload&) = delete;

  float* master() { return master_.data(); }  // null with offload_params
  float* m() { return m_.data(); }            // null with nvme
  float* v() { return v_.data(); }
  std::size_t chunk() const { return chunk_; }
  // Pinned bytes held: master weights, moments (host), staging buffers.
  std::size_t pinned_bytes() const;

  // One range: its device parameters and gradients and its master weights, each at the range's
  // first element (parameters and master null with offload_params: no uploads); `step` labels
  // the spans.
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

// ZeRO 3 with zero.offload_params on CUDA (runtime's ShardStaging, offload_pipeline.hpp): per slot
// a pinned host buffer, which the offload file's read fills, and a device buffer, the gather's
// send buffer, of `elems` floats each, and a copy stream of its own for the uploads between them
// (the host buffer pinned, so cudaMemcpyAsync is asynchronous on that stream, never a pageable
// copy on the legacy stream).
//
// Ordering, by events:
//  - upload(slot) makes the copy stream wait for the slot's "free" event, then queues the copy,
//    records the slot's "uploaded" event after it and makes the compute stream wait for that: the
//    gather the loop issues next is ordered after the compute stream's work (the device
//    communicators record an event there at issue, nccl_comm.hpp), so it reads the uploaded shard;
//  - released(slot) records "free" on the compute stream: the loop calls it right after the slot's
//    gather was waited for (Handle::wait put the compute stream behind it), so the next upload into
//    the device buffer starts once that gather is done, overlapping the kernels queued after it.
//    An upload with no release since the slot's last one records "free" at upload time (after
//    everything queued on the compute stream so far), the conservative order;
//  - host(slot) waits on the host for the slot's "uploaded" event: the file's read never refills
//    pinned memory a copy still reads.
// Spans: "offload.h2d" (Memcpy, stream "offload", the shard's bytes, layer = the segment), timed by
// CUDA events on the copy stream, anchored and resolved with the step (the backend's begin_step /
// end_step: the loop uploads only inside a step).
class CudaShardStaging final : public ShardStaging {
 public:
  CudaShardStaging(int slots, std::size_t elems, cudaStream_t compute, profiler::Recorder* rec);
  ~CudaShardStaging() override;
  CudaShardStaging(const CudaShardStaging&) = delete;
  CudaShardStaging& operator=(const CudaShardStaging&) = delete;

  int slots() const override { return static_cast<int>(slots_.size()); }
  float* host(int slot) override;
  const float* upload(int slot, std::size_t n, int32_t step, int layer) override;
  void released(int slot) override;
  std::size_t host_bytes() const override;
  std::size_t device_bytes() const override;
  void anchor();   // at the start of a step (the copy stream idle)
  void resolve();  // at its end: the step's upload spans to the recorder
  // Waits for the copy stream without throwing (the owner going away).
  void drain() noexcept;

 private:
  struct Slot {
    PinnedArray host;
    DeviceArray<float> device;
    Event uploaded{false}, free{false};
    bool released = false;  // "free" recorded since the last upload
    bool used = false;      // uploaded at least once
  };
  Slot& at(int slot);

  cudaStream_t compute_;
  profiler::Recorder* rec_;
  Stream copy_;
  std::vector<Slot> slots_;
  std::unique_ptr<EventSpans> spans_;
};

}  // namespace orrery::runtime::cuda
