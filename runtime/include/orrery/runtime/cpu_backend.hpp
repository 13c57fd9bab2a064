// The CPU backend of the training loop (training_loop.hpp says what a backend provides): host
// arrays, the CPU kernels (kernels.hpp) on the calling thread and its pool, the host groups as
// they are (MPI or in-process communicators), spans timed by the steady clock on the thread that
// runs the loop (the compute stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/runtime/gpt_pieces.hpp"
#include "orrery/runtime/groups.hpp"
#include "orrery/runtime/model.hpp"
#include "orrery/runtime/optimizer.hpp"
#include "orrery/runtime/zero.hpp"
#include "orrery/traces/span.hpp"

namespace orrery::profiler {
class Recorder;
}

namespace orrery::runtime {

class CpuBackend {
 public:
  struct Options {};
  using Array = FloatArray;
  using Model = Gpt;
  using Activations = GptActivations;
  using Scratch = GptGradScratch;
  using Zero3 = Zero3Storage;
  static constexpr bool kHostMemory = true;

  static void check_supported(const Scenario& s);
  // Sets runtime.threads compute threads.
  CpuBackend(const Scenario& s, profiler::Recorder* rec, const Options& opt);

  DeviceGroups connect(const RankGroups& groups, const Layout&) {
    return host_device_groups(groups);
  }
  Model make_model(Gpt host, bool /*storage: the host's arrays serve*/) { return host; }
  std::unique_ptr<Zero3> make_zero3(Model& m, int dp_rank, int dp_size, int ep) {
    return std::make_unique<Zero3Storage>(m, dp_rank, dp_size, ep);
  }
  Activations activations(const Model& m, int B, int T, Recompute rc) {
    return gpt_activations(m, B, T, rc);
  }
  Scratch scratch(const Model& m, int B, int T, Recompute rc) {
    return gpt_grad_scratch(m, B, T, rc);
  }

  const CpuKernels& kernels() const { return kernels_; }
  void zero(float* p, std::size_t n) { kernels_.zero(p, n); }
  void add(float* acc, const float* in, std::size_t n);
  void scale(float* p, float s, std::size_t n);
  void copy(float* dst, const float* src, std::size_t n);
  void adamw(float* params, const float* grads, float* m, float* v, std::size_t offset,
             std::size_t n, std::span<const ParamRange> decay, int64_t step,
             const AdamWConfig& cfg) {
    adamw_update(params, grads, m, v, offset, n, decay, step, cfg);
  }
  void download(float* host, const float* src, std::size_t n) { copy(host, src, n); }
  void upload(float* dst, const float* host, std::size_t n) { copy(dst, host, n); }
  void synchronize() {}
  double scratch_bytes() const { return 0; }

  void begin_step() {}
  // A span from now until close(handle); spans close in the reverse order of opening.
  int open(const traces::Span& proto, const char* annotation);
  void close(int handle);
  void end_step() {}

  void finish() {}
  void drain() noexcept {}
  std::string device_description() const { return "cpu"; }
  double peak_flops_per_rank() const { return 0; }
  nlohmann::json meta_fields() const;
  void start_device_tracing(profiler::Recorder&) {}
  void stop_device_tracing() {}

 private:
  profiler::Recorder* rec_;
  int threads_ = 1;
  CpuKernels kernels_;
  std::vector<traces::Span> open_;  // a stack
};

}  // namespace orrery::runtime
