// Hooks called when a named range (ranges.hpp: ScopedRange, push_range/pop_range) opens and closes,
// so that a GPU tracer can tag the CUDA work launched inside a range (the CUPTI tracer pushes an
// external correlation id per range; cupti_tracer.hpp). Without hooks installed a range costs one
// atomic load more.
#pragma once

#include <cstdint>
#include <string_view>

namespace orrery::profiler {

struct RangeHooks {
  // `name` is not null-terminated beyond `name_len`; step/micro_batch are the range's context.
  void (*open)(const char* name, uint64_t name_len, int32_t step, int32_t micro_batch) = nullptr;
  void (*close)() = nullptr;
};

// Installs `hooks` (nullptr: none). `hooks` must stay valid while installed. Opens and closes are
// called on the thread of the range, balanced per thread as long as the hooks stay installed.
void set_range_hooks(const RangeHooks* hooks);
const RangeHooks* range_hooks();

// For code that records its spans another way (the GPU trainer's CUDA-event spans): opens an NVTX
// range (when built with NVTX) and calls the hooks (so the CUPTI tracer attributes the kernels
// launched inside to `step`/`micro_batch`), without recording a span. end_annotation() closes the
// innermost one; calls must nest per thread.
void begin_annotation(std::string_view name, int32_t step = -1, int32_t micro_batch = -1);
void end_annotation();

}  // namespace orrery::profiler
