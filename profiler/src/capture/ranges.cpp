// Named ranges (NVTX-style) recorded as Phase spans into Recorder::current().
#include "orrery/profiler/ranges.hpp"

#include <vector>

namespace orrery::profiler {
namespace {

struct OpenRange {
  Recorder* rec;
  traces::Span span;
};
thread_local std::vector<OpenRange> t_open;

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

}  // namespace

ScopedRange::ScopedRange(std::string_view name, traces::SpanKind kind) : rec_(Recorder::current()) {
  if (rec_ && !rec_->enabled()) rec_ = nullptr;
  if (rec_) span_ = begin_span(rec_, name, kind);
}

ScopedRange::~ScopedRange() {
  if (!rec_) return;
  span_.end_ns = steady_now_ns();
  rec_->record(span_);
}

int push_range(std::string_view name) {
  Recorder* rec = Recorder::current();
  if (!rec || !rec->enabled()) return 0;
  t_open.push_back(OpenRange{rec, begin_span(rec, name, traces::SpanKind::Phase)});
  return static_cast<int>(t_open.size());
}

bool pop_range() {
  if (t_open.empty()) return false;
  OpenRange r = t_open.back();
  t_open.pop_back();
  r.span.end_ns = steady_now_ns();
  // The recorder may have been replaced since the push; record only into the one still current.
  if (r.rec == Recorder::current()) r.rec->record(r.span);
  return true;
}

}  // namespace orrery::profiler
