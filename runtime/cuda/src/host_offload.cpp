// ZeRO-Offload's device half on CUDA (cuda/host_offload.hpp): pinned arrays, the copy stream and
// the chunks' copies; ZeRO 3's parameter shards staged for their gathers (offload_params).
#include "orrery/runtime/cuda/host_offload.hpp"

#include <algorithm>

#include "orrery/common/error.hpp"
#include "orrery/model/names.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/cuda/backend.hpp"

namespace orrery::runtime::cuda {

// ------------------------------------------------------------------------------------ PinnedArray

PinnedArray::PinnedArray(std::size_t count) {
  if (count == 0) return;
  const std::size_t bytes = count * sizeof(float);
  void* p = nullptr;
  cuda_check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc", bytes);
  data_ = static_cast<float*>(p);
  size_ = count;
  std::fill(data_, data_ + size_, 0.0f);
}

PinnedArray::~PinnedArray() {
  if (data_ != nullptr) cudaFreeHost(data_);  // errors cannot be reported from a destructor
}

PinnedArray& PinnedArray::operator=(PinnedArray&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

// ------------------------------------------------------------------------------------ HostOffload

HostOffload::HostOffload(std::size_t elems, bool moments, std::size_t chunk, bool master,
                         cudaStream_t compute, profiler::Recorder* rec)
    : compute_(compute),
      chunk_(std::max<std::size_t>(1, std::min(chunk, elems))),
      master_(master ? elems : 0),
      m_(moments ? elems : 0),
      v_(moments ? elems : 0),
      rec_(rec != nullptr && rec->enabled() ? rec : nullptr) {
  for (auto& s : staging_) s = PinnedArray(chunk_);
  if (rec_ != nullptr) {
    rec_->ensure_stream(model::names::kStreamOffload,
                        model::names::stream_name(model::names::kStreamOffload));
  }
  spans_ = std::make_unique<EventSpans>(rec_, copy_.get(), model::names::kStreamOffload);
}

HostOffload::~HostOffload() { drain(); }

std::size_t HostOffload::pinned_bytes() const {
  std::size_t b = master_.size_bytes() + m_.size_bytes() + v_.size_bytes();
  for (const auto& s : staging_) b += s.size_bytes();
  return b;
}

void HostOffload::begin(float* params, const float* grads, float* master, int32_t step) {
  params_ = params;
  grads_ = grads;
  host_ = master;
  step_ = step;
  spans_->anchor();  // the copy stream is idle: end() resolved the previous range
  ready_.record(compute_);
  ORRERY_CUDA_CHECK(cudaStreamWaitEvent(copy_.get(), ready_.get(), 0));
}

void HostOffload::end() {
  done_.record(copy_.get());
  ORRERY_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_.get(), 0));
  spans_->resolve();
}

namespace {
traces::Span copy_span(profiler::Recorder* rec, std::string_view name, std::size_t n,
                       int32_t step) {
  traces::Span s;
  s.kind = traces::SpanKind::Memcpy;
  if (rec != nullptr) s.name = rec->intern(name);
  s.step = step;
  s.bytes = static_cast<int64_t>(n * sizeof(float));
  return s;
}
}  // namespace

void HostOffload::download(std::size_t first, std::size_t n, int buffer) {
  const auto b = static_cast<std::size_t>(buffer);
  const int span = spans_->open(copy_span(rec_, model::names::kOffloadD2H, n, step_));
  ORRERY_CUDA_CHECK(cudaMemcpyAsync(staging_[b].data(), grads_ + first, n * sizeof(float),
                                    cudaMemcpyDeviceToHost, copy_.get()));
  spans_->close(span);
  staged_[b].record(copy_.get());
}

const float* HostOffload::downloaded(int buffer) {
  const auto b = static_cast<std::size_t>(buffer);
  staged_[b].synchronize();
  return staging_[b].data();
}

void HostOffload::upload(std::size_t first, std::size_t n) {
  if (params_ == nullptr) return;  // offload_params: the file holds the updated shard
  const int span = spans_->open(copy_span(rec_, model::names::kOffloadH2D, n, step_));
  ORRERY_CUDA_CHECK(cudaMemcpyAsync(params_ + first, host_ + first, n * sizeof(float),
                                    cudaMemcpyHostToDevice, copy_.get()));
  spans_->close(span);
}

void HostOffload::drain() noexcept { cudaStreamSynchronize(copy_.get()); }

// ------------------------------------------------------------------------------- CudaShardStaging

CudaShardStaging::CudaShardStaging(int slots, std::size_t elems, cudaStream_t compute,
                                   profiler::Recorder* rec)
    : compute_(compute),
      rec_(rec != nullptr && rec->enabled() ? rec : nullptr),
      slots_(static_cast<std::size_t>(std::max(slots, 0))) {
  for (Slot& s : slots_) {
    s.host = PinnedArray(elems);
    s.device.resize(elems);
  }
  if (rec_ != nullptr) {
    rec_->ensure_stream(model::names::kStreamOffload,
                        model::names::stream_name(model::names::kStreamOffload));
  }
  spans_ = std::make_unique<EventSpans>(rec_, copy_.get(), model::names::kStreamOffload);
}

CudaShardStaging::~CudaShardStaging() { drain(); }

CudaShardStaging::Slot& CudaShardStaging::at(int slot) {
  return slots_.at(static_cast<std::size_t>(slot));
}

float* CudaShardStaging::host(int slot) {
  Slot& s = at(slot);
  if (s.used) s.uploaded.synchronize();  // the last copy out of the pinned buffer is done
  return s.host.data();
}

const float* CudaShardStaging::upload(int slot, std::size_t n, int32_t step, int layer) {
  Slot& s = at(slot);
  if (n > s.host.size()) throw InternalError("shard staging: upload beyond the slot's buffer");
  if (!s.released) s.free.record(compute_);  // conservative: after everything queued so far
  ORRERY_CUDA_CHECK(cudaStreamWaitEvent(copy_.get(), s.free.get(), 0));
  traces::Span proto = copy_span(rec_, model::names::kOffloadH2D, n, step);
  proto.layer = layer;
  const int span = spans_->open(proto);
  ORRERY_CUDA_CHECK(cudaMemcpyAsync(s.device.data(), s.host.data(), n * sizeof(float),
                                    cudaMemcpyHostToDevice, copy_.get()));
  spans_->close(span);
  s.uploaded.record(copy_.get());
  ORRERY_CUDA_CHECK(cudaStreamWaitEvent(compute_, s.uploaded.get(), 0));
  s.released = false;
  s.used = true;
  return s.device.data();
}

void CudaShardStaging::released(int slot) {
  Slot& s = at(slot);
  s.free.record(compute_);
  s.released = true;
}

std::size_t CudaShardStaging::host_bytes() const {
  std::size_t b = 0;
  for (const Slot& s : slots_) b += s.host.size_bytes();
  return b;
}

std::size_t CudaShardStaging::device_bytes() const {
  std::size_t b = 0;
  for (const Slot& s : slots_) b += s.device.size_bytes();
  return b;
}

void CudaShardStaging::anchor() { spans_->anchor(); }

void CudaShardStaging::resolve() { spans_->resolve(); }

void CudaShardStaging::drain() noexcept { cudaStreamSynchronize(copy_.get()); }

}  // namespace orrery::runtime::cuda
