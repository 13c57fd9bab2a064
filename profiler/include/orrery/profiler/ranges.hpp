// Named ranges for user code, NVTX-style: a range appears in the trace as a Phase span on the
// calling thread's stream, with the recorder's current step and micro-batch.
//
//   void load_shard() {
//     ORRERY_RANGE("load_shard");      // scoped: ends at the closing brace
//     ...
//   }
//   orrery::profiler::push_range("warmup");   // explicit, per thread, must nest
//   ...
//   orrery::profiler::pop_range();
//
// Ranges go to Recorder::current(); with no current recorder (or profiling off) they cost one
// branch. The runtime's own phases ("step", "forward", "backward", "optimizer") use the same API.
#pragma once

#include <cstdint>
#include <string_view>

#include "orrery/profiler/recorder.hpp"
#include "orrery/traces/span.hpp"

namespace orrery::profiler {

class ScopedRange {
 public:
  explicit ScopedRange(std::string_view name, traces::SpanKind kind = traces::SpanKind::Phase);
  ~ScopedRange();
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;

 private:
  Recorder* rec_;
  traces::Span span_;
};

// Opens a range on the calling thread; pop_range() closes the most recent open one. Returns the
// nesting depth after the push (0 when nothing is recorded).
int push_range(std::string_view name);
// Closes the innermost range of the calling thread; returns false when none was open.
bool pop_range();

}  // namespace orrery::profiler

#define ORRERY_RANGE_CONCAT2(a, b) a##b
#define ORRERY_RANGE_CONCAT(a, b) ORRERY_RANGE_CONCAT2(a, b)
#define ORRERY_RANGE(name) \
  ::orrery::profiler::ScopedRange ORRERY_RANGE_CONCAT(orrery_range_, __LINE__)(name)
