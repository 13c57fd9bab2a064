// A backend for tests that runs the training loop's device paths on the CPU: the CPU backend with
// kHostMemory false (so the loop stages checkpoint state through download / upload, and takes
// ZeRO-Offload's device path) and a HostOffload and a shard staging (zero.offload_params) whose
// copies are memcpy. It checks the loop's part of ZeRO-Offload on a device (master weights,
// moments, the shards' staging before each gather, checkpoints, memory counters) without a GPU;
// the CUDA copies themselves run only on one (tests/runtime/cuda/test_cuda_offload.cpp,
// test_cuda_parallel.cpp).
// A test binary instantiates the loop once: template class TrainingLoop<HostDeviceBackend>;
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "orrery/runtime/cpu_backend.hpp"
#include "orrery/runtime/offload_pipeline.hpp"
#include "orrery/runtime/training_loop.hpp"

namespace orrery::runtime::testing {

// cuda::HostOffload's interface over host vectors ("pinned" in name only).
class MemcpyHostOffload final : public OffloadTransfers {
 public:
  MemcpyHostOffload(std::size_t elems, bool moments, std::size_t chunk, bool master)
      : chunk_(std::max<std::size_t>(1, std::min(chunk, elems))),
        master_(master ? elems : 0),
        m_(moments ? elems : 0),
        v_(moments ? elems : 0),
        staging_{std::vector<float>(chunk_), std::vector<float>(chunk_)} {}
  float* master() { return master_.empty() ? nullptr : master_.data(); }
  bool has_master() const { return !master_.empty(); }
  float* m() { return m_.empty() ? nullptr : m_.data(); }
  float* v() { return v_.empty() ? nullptr : v_.data(); }
  std::size_t chunk() const { return chunk_; }
  std::size_t pinned_bytes() const {
    return (master_.size() + m_.size() + v_.size() + 2 * chunk_) * sizeof(float);
  }
  void begin(float* params, const float* grads, float* master, int32_t) {
    params_ = params;
    grads_ = grads;
    host_ = master;
    ++ranges;
  }
  void end() {}
  void download(std::size_t first, std::size_t n, int buffer) override {
    std::memcpy(staging_[buffer].data(), grads_ + first, n * sizeof(float));
  }
  const float* downloaded(int buffer) override { return staging_[buffer].data(); }
  void upload(std::size_t first, std::size_t n) override {
    if (params_ == nullptr) return;  // offload_params: no shard on the device
    std::memcpy(params_ + first, host_ + first, n * sizeof(float));
  }
  int ranges = 0;  // begin() calls: the ranges stepped through the pipeline

 private:
  std::size_t chunk_;
  std::vector<float> master_, m_, v_;
  std::vector<float> staging_[2];
  float* params_ = nullptr;
  const float* grads_ = nullptr;
  float* host_ = nullptr;
};

// cuda::CudaShardStaging's interface over host vectors: the "device" buffer is a second array the
// upload copies into, and the test counts the calls and checks their order: each upload into a
// slot after the slot's release (but the first), each host() of a slot not while a copy is in
// flight (never here: memcpy is synchronous).
class MemcpyShardStaging final : public ShardStaging {
 public:
  MemcpyShardStaging(int slots, std::size_t elems)
      : host_(std::size_t(slots), std::vector<float>(elems)),
        device_(std::size_t(slots), std::vector<float>(elems)),
        released_(std::size_t(slots), true) {}
  int slots() const override { return static_cast<int>(host_.size()); }
  float* host(int slot) override { return host_.at(std::size_t(slot)).data(); }
  const float* upload(int slot, std::size_t n, int32_t, int) override {
    auto& d = device_.at(std::size_t(slot));
    if (n > d.size()) throw std::out_of_range("MemcpyShardStaging: upload beyond the slot");
    if (!released_[std::size_t(slot)]) ++unreleased_uploads;
    released_[std::size_t(slot)] = false;
    std::memcpy(d.data(), host_[std::size_t(slot)].data(), n * sizeof(float));
    ++uploads;
    return d.data();
  }
  void released(int slot) override { released_.at(std::size_t(slot)) = true; }
  std::size_t host_bytes() const override { return bytes(host_); }
  std::size_t device_bytes() const override { return bytes(device_); }
  int uploads = 0;             // upload() calls
  int unreleased_uploads = 0;  // of them into a slot not released since its last upload

 private:
  static std::size_t bytes(const std::vector<std::vector<float>>& v) {
    std::size_t b = 0;
    for (const auto& a : v) b += a.size() * sizeof(float);
    return b;
  }
  std::vector<std::vector<float>> host_, device_;
  std::vector<bool> released_;
};

class HostDeviceBackend : public CpuBackend {
 public:
  static constexpr bool kHostMemory = false;
  using CpuBackend::CpuBackend;
  MemcpyHostOffload* make_host_offload(std::size_t elems, bool moments, std::size_t chunk,
                                       bool master) {
    offload_ = std::make_unique<MemcpyHostOffload>(elems, moments, chunk, master);
    return offload_.get();
  }
  MemcpyHostOffload* host_offload() const { return offload_.get(); }
  MemcpyShardStaging* make_shard_staging(int slots, std::size_t elems) {
    shards_ = std::make_unique<MemcpyShardStaging>(slots, elems);
    return shards_.get();
  }
  MemcpyShardStaging* shard_staging() const { return shards_.get(); }

 private:
  std::unique_ptr<MemcpyHostOffload> offload_;
  std::unique_ptr<MemcpyShardStaging> shards_;
};

using HostDeviceLoop = TrainingLoop<HostDeviceBackend>;

}  // namespace orrery::runtime::testing
