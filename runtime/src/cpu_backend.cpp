// The CPU backend of the training loop (cpu_backend.hpp).
#include "orrery/runtime/cpu_backend.hpp"

#include <algorithm>

#include "orrery/common/error.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/kernels.hpp"
#include "orrery/runtime/rank_trainer.hpp"

namespace orrery::runtime {

void CpuBackend::check_supported(const Scenario& s) { runtime::check_supported(s); }

CpuBackend::CpuBackend(const Scenario& s, profiler::Recorder* rec, const Options&)
    : rec_(rec), threads_(s.runtime.threads) {
  set_compute_threads(threads_);
  set_matmul_precision(precision_of(s.runtime));
}

void CpuBackend::add(float* acc, const float* in, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] += in[i];
}

void CpuBackend::scale(float* p, float s, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) p[i] *= s;
}

void CpuBackend::copy(float* dst, const float* src, std::size_t n) {
  if (n > 0) std::copy(src, src + n, dst);
}

int CpuBackend::open(const traces::Span& proto, const char*) {
  if (rec_ == nullptr) return -1;
  open_.push_back(proto);
  open_.back().start_ns = profiler::steady_now_ns();
  return static_cast<int>(open_.size()) - 1;
}

void CpuBackend::close(int handle) {
  if (rec_ == nullptr || handle < 0) return;
  if (handle != static_cast<int>(open_.size()) - 1) {
    throw InternalError("cpu backend: span " + std::to_string(handle) +
                        " closed while a later one is open");
  }
  traces::Span& sp = open_.back();
  sp.end_ns = profiler::steady_now_ns();
  sp.stream = profiler::Recorder::thread_stream();
  rec_->record(sp);
  open_.pop_back();
}

nlohmann::json CpuBackend::meta_fields() const { return {{"threads", threads_}}; }

}  // namespace orrery::runtime
