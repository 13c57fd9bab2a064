// GPU activity -> spans (see gpu_activity.hpp): names, NCCL kernel classification, clock offset,
// per-CUDA-stream trace streams, and attribution to the enclosing range through correlation ids.
#include "orrery/profiler/gpu_activity.hpp"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace orrery::profiler {

std::string kernel_display_name(std::string_view mangled) {
  std::string name(mangled);
  int status = -1;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), std::free);
  if (status == 0 && demangled) name = demangled.get();
  // Drop the argument list: the first '(' outside template brackets.
  int depth = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (c == '<') ++depth;
    if (c == '>') --depth;
    if (c == '(' && depth == 0 && i > 0) {
      name.resize(i);
      break;
    }
  }
  // Templates demangle with their return type: "void foo<float>".
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);
  return name;
}

void classify_kernel(std::string_view name, traces::SpanKind& kind, traces::CollOp& op) {
  kind = traces::SpanKind::Compute;
  op = traces::CollOp::None;
  if (name.find("nccl") == std::string_view::npos) return;
  auto has = [&](std::string_view s) { return name.find(s) != std::string_view::npos; };
  kind = traces::SpanKind::Collective;
  if (has("AllReduce")) {
    op = traces::CollOp::AllReduce;
  } else if (has("ReduceScatter")) {
    op = traces::CollOp::ReduceScatter;
  } else if (has("AllGather")) {
    op = traces::CollOp::AllGather;
  } else if (has("Broadcast")) {
    op = traces::CollOp::Broadcast;
  } else if (has("AllToAll")) {
    op = traces::CollOp::AllToAll;
  } else if (has("SendRecv") || has("Send") || has("Recv")) {
    kind = traces::SpanKind::P2P;
  } else if (has("Reduce")) {
    op = traces::CollOp::Reduce;
  }
}

void apply_collective(traces::Span& s, const CollectiveAnnotation& a, bool first) {
  s.kind = a.kind;
  s.op = a.op;
  s.comm = a.comm;
  s.peer = a.peer;
  s.seq = first ? a.seq : -1;
  s.bytes = first ? a.bytes : 0;
  if (a.step >= 0) s.step = a.step;
  if (a.micro_batch >= 0) s.micro_batch = a.micro_batch;
  if (a.layer >= 0) s.layer = a.layer;
}

GpuActivityMapper::GpuActivityMapper(Recorder& rec, int64_t clock_offset_ns)
    : rec_(rec), offset_ns_(clock_offset_ns) {}

void GpuActivityMapper::range_opened(uint64_t external_id, int32_t step, int32_t micro_batch) {
  std::lock_guard lock(mu_);
  ranges_[external_id] = RangeContext{step, micro_batch};
  // Ranges are few (phases, layers), but a long run opens millions: keep the newest.
  if (ranges_.size() > (1u << 20)) ranges_.erase(ranges_.begin());
}

void GpuActivityMapper::correlate(uint32_t correlation_id, uint64_t external_id) {
  std::lock_guard lock(mu_);
  correlation_[correlation_id] = external_id;
}

void GpuActivityMapper::collective_issued(uint64_t external_id, const CollectiveAnnotation& a) {
  std::lock_guard lock(mu_);
  collectives_[external_id] = IssuedCollective{a, 0};
  annotated_ = true;
  // The newest 65536 operations are kept: their kernels are recorded at the next flush (every step
  // in a profiled run), long before that many more operations are issued.
  if (collectives_.size() > (1u << 16)) collectives_.erase(collectives_.begin());
}

void GpuActivityMapper::correlate_collective(uint32_t correlation_id, uint64_t external_id) {
  std::lock_guard lock(mu_);
  coll_correlation_[correlation_id] = external_id;
}

traces::NameId GpuActivityMapper::name_id_locked(const GpuActivity& a) {
  std::string key;
  switch (a.kind) {
    case GpuActivity::Kind::Kernel: key = std::string(a.name); break;
    case GpuActivity::Kind::Memcpy: key = "memcpy " + std::string(a.name); break;
    case GpuActivity::Kind::Memset: key = "memset"; break;
  }
  auto it = names_.find(key);
  if (it != names_.end()) return it->second;
  const traces::NameId id =
      rec_.intern(a.kind == GpuActivity::Kind::Kernel ? kernel_display_name(a.name) : key);
  names_.emplace(std::move(key), id);
  return id;
}

void GpuActivityMapper::add(const GpuActivity& a) {
  if (!rec_.enabled()) return;
  std::lock_guard lock(mu_);
  traces::Span s;
  s.stream = kCudaStreamBase + static_cast<int32_t>(a.stream_id);
  s.name = name_id_locked(a);
  s.start_ns = static_cast<int64_t>(a.start_ns) + offset_ns_;
  s.end_ns = static_cast<int64_t>(a.end_ns) + offset_ns_;
  s.bytes = static_cast<int64_t>(a.bytes);
  if (a.kind == GpuActivity::Kind::Kernel) {
    classify_kernel(a.name, s.kind, s.op);
  } else {
    s.kind = traces::SpanKind::Memcpy;
  }
  if (streams_.insert(a.stream_id).second) {
    rec_.add_stream(s.stream, "cuda stream " + std::to_string(a.stream_id));
  }
  held_.push_back(Held{s, a.correlation_id});
  if (held_.size() >= kMaxHeld) emit_locked(held_.size() / 2);
}

void GpuActivityMapper::emit_locked(size_t count) {
  count = std::min(count, held_.size());
  for (size_t i = 0; i < count; ++i) {
    Held& h = held_[i];
    auto c = correlation_.find(h.correlation_id);
    if (c != correlation_.end()) {
      auto r = ranges_.find(c->second);
      if (r != ranges_.end()) {
        h.span.step = r->second.step;
        h.span.micro_batch = r->second.micro_batch;
      }
      correlation_.erase(c);
    }
    // Kernels (Compute, or Collective/P2P by name) launched inside a collective annotation.
    const bool kernel = h.span.kind != traces::SpanKind::Memcpy;
    bool attributed = false;
    if (auto cc = coll_correlation_.find(h.correlation_id); cc != coll_correlation_.end()) {
      auto op = collectives_.find(cc->second);
      if (kernel && op != collectives_.end()) {
        apply_collective(h.span, op->second.a, op->second.kernels++ == 0);
        attributed = true;
      }
      coll_correlation_.erase(cc);
    }
    if (!attributed && annotated_ &&
        (h.span.kind == traces::SpanKind::Collective || h.span.kind == traces::SpanKind::P2P)) {
      // An NCCL kernel launched outside any annotation (on NCCL's own thread): its operation is
      // counted by the communicator's span (range_hooks.hpp).
      h.span.kind = traces::SpanKind::Other;
    }
    rec_.record(h.span);
    ++recorded_;
  }
  held_.erase(held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(count));
}

void GpuActivityMapper::flush() {
  std::lock_guard lock(mu_);
  emit_locked(held_.size());
  // Correlations of API calls without GPU work (event records, queries) are never used; they are
  // kept (a kernel still running may need its own) up to a bound.
  if (correlation_.size() > (1u << 20)) correlation_.clear();
  if (coll_correlation_.size() > (1u << 20)) coll_correlation_.clear();
}

int64_t GpuActivityMapper::spans_recorded() const {
  std::lock_guard lock(mu_);
  return recorded_;
}

}  // namespace orrery::profiler
