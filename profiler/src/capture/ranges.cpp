// Named ranges (NVTX-style) recorded as Phase spans into Recorder::current(), and emitted as NVTX
// ranges too when built with NVTX (ORRERY_HAVE_NVTX, the header-only nvtx3), so Nsight Systems shows
// the runtime's phases. Range hooks (range_hooks.hpp) let a GPU tracer tag the work of a range.
#include "orrery/profiler/ranges.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "orrery/profiler/range_hooks.hpp"

#ifdef ORRERY_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace orrery::profiler {
namespace {

struct OpenRange {
  Recorder* rec;
  traces::Span span;
};
thread_local std::vector<OpenRange> t_open;

std::atomic<const RangeHooks*> g_hooks{nullptr};

traces::Span begin_span(Recorder* rec, std::string_view name, traces::SpanKind kind) {
  traces::Span s;
  s.kind = kind;
  s.name = rec->intern(name);
  s.stream = Recorder::thread_stream();
  s.step = rec->step();
  s.micro_batch = rec->micro_batch();
  s.start_ns = steady_now_ns();
  return s;
}

// NVTX wants a null-terminated name; ranges pass views.
void nvtx_push(std::string_view name) {
#ifdef ORRERY_HAVE_NVTX
  thread_local char buf[256];
  const size_t n = std::min(name.size(), sizeof(buf) - 1);
  std::memcpy(buf, name.data(), n);
  buf[n] = '\0';
  nvtxRangePushA(buf);
#else
  (void)name;
#endif
}

void nvtx_pop() {
#ifdef ORRERY_HAVE_NVTX
  nvtxRangePop();
#endif
}

// A range that is recorded also opens/closes NVTX and the hooks (so both stay balanced per thread).
void on_open(std::string_view name, const traces::Span& s) {
  nvtx_push(name);
  if (const RangeHooks* h = g_hooks.load(std::memory_order_acquire); h && h->open) {
    h->open(name.data(), name.size(), s.step, s.micro_batch);
  }
}

void on_close() {
  if (const RangeHooks* h = g_hooks.load(std::memory_order_acquire); h && h->close) h->close();
  nvtx_pop();
}

}  // namespace

void set_range_hooks(const RangeHooks* hooks) { g_hooks.store(hooks, std::memory_order_release); }
const RangeHooks* range_hooks() { return g_hooks.load(std::memory_order_acquire); }

void begin_annotation(std::string_view name, int32_t step, int32_t micro_batch) {
  traces::Span s;
  s.step = step;
  s.micro_batch = micro_batch;
  on_open(name, s);
}

void end_annotation() { on_close(); }

ScopedRange::ScopedRange(std::string_view name, traces::SpanKind kind) : rec_(Recorder::current()) {
  if (rec_ && !rec_->enabled()) rec_ = nullptr;
  if (rec_) {
    span_ = begin_span(rec_, name, kind);
    on_open(name, span_);
  }
}

ScopedRange::~ScopedRange() {
  if (!rec_) return;
  span_.end_ns = steady_now_ns();
  on_close();
  rec_->record(span_);
}

int push_range(std::string_view name) {
  Recorder* rec = Recorder::current();
  if (!rec || !rec->enabled()) return 0;
  t_open.push_back(OpenRange{rec, begin_span(rec, name, traces::SpanKind::Phase)});
  on_open(name, t_open.back().span);
  return static_cast<int>(t_open.size());
}

bool pop_range() {
  if (t_open.empty()) return false;
  OpenRange r = t_open.back();
  t_open.pop_back();
  r.span.end_ns = steady_now_ns();
  on_close();
  // The recorder may have been replaced since the push; record only into the one still current.
  if (r.rec == Recorder::current()) r.rec->record(r.span);
  return true;
}

}  // namespace orrery::profiler
