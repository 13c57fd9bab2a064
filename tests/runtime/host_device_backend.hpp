// A backend for tests that runs the training loop's device paths on the CPU: the CPU backend with
// kHostMemory false (so the loop stages checkpoint state through download / upload, and takes
// ZeRO-Offload's device path) and a HostOffload whose copies are memcpy. It checks the loop's part
// of ZeRO-Offload on a device (master weights, moments, checkpoints, memory counters) without a
// GPU; the CUDA copies themselves run only on one (tests/runtime/cuda/test_cuda_offload.cpp).
// A test binary instantiates the loop once: template class TrainingLoop<HostDeviceBackend>;
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "orrery/runtime/cpu_backend.hpp"
#include "orrery/runtime/offload_pipeline.hpp"
#include "orrery/runtime/training_loop.hpp"

namespace orrery::runtime::testing {

// cuda::HostOffload's interface over host vectors ("pinned" in name only).
class MemcpyHostOffload final : public OffloadTransfers {
 public:
  MemcpyHostOffload(std::size_t elems, bool moments, std::size_t chunk)
      : chunk_(std::max<std::size_t>(1, std::min(chunk, elems))),
        master_(elems),
        m_(moments ? elems : 0),
        v_(moments ? elems : 0),
        staging_{std::vector<float>(chunk_), std::vector<float>(chunk_)} {}
  float* master() { return master_.data(); }
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

class HostDeviceBackend : public CpuBackend {
 public:
  static constexpr bool kHostMemory = false;
  using CpuBackend::CpuBackend;
  MemcpyHostOffload* make_host_offload(std::size_t elems, bool moments, std::size_t chunk) {
    offload_ = std::make_unique<MemcpyHostOffload>(elems, moments, chunk);
    return offload_.get();
  }
  MemcpyHostOffload* host_offload() const { return offload_.get(); }

 private:
  std::unique_ptr<MemcpyHostOffload> offload_;
};

using HostDeviceLoop = TrainingLoop<HostDeviceBackend>;

}  // namespace orrery::runtime::testing
