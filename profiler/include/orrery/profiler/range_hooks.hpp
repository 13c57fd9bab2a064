// Hooks called when a named range (ranges.hpp: ScopedRange, push_range/pop_range) opens and closes,
// so that a GPU tracer can tag the CUDA work launched inside a range (the CUPTI tracer pushes an
// external correlation id per range; cupti_tracer.hpp). Without hooks installed a range costs one
// atomic load more.
//
// Collectives: a device communicator (runtime/cuda/src/nccl_comm.cpp) brackets the library call
// that launches one operation's kernels (ncclAllReduce, ncclSend, ...) with
// begin_collective_annotation / end_collective_annotation, giving the operation's identity
// (communicator id, sequence number, op, bytes, peer, step). The CUPTI tracer pushes an external
// correlation id of its own kind for it (CUSTOM1; ranges use CUSTOM0, so a kernel carries both),
// and the kernels launched on this thread inside the bracket become spans with that identity
// (GpuActivityMapper, gpu_activity.hpp). Which span then counts the operation:
//   - the tracer took the annotation and the kernels were launched inside the bracket: the kernel
//     span is the Collective/P2P span (device-exact times, comm and seq for grouping across ranks);
//     the communicator records its own CUDA-event span of the operation as kind Other, so
//     `orrery report`, calibration and the straggler grouping count the operation once;
//   - otherwise (no tracer, or the library launched the kernels on a thread of its own, as NCCL
//     does for an operation that first sets up connections and returns ncclInProgress): the
//     communicator's span is the Collective span, and the tracer records NCCL kernels that carry no
//     annotation as Other once annotations are in use (see GpuActivityMapper).
// A communicator of one rank does not annotate (NCCL launches no kernel for an in-place operation
// on one rank): its own span counts the operation.
#pragma once

#include <cstdint>
#include <string_view>

#include "orrery/traces/span.hpp"

namespace orrery::profiler {

// The identity of one communication operation, as its Collective/P2P span carries it.
struct CollectiveAnnotation {
  traces::SpanKind kind = traces::SpanKind::Collective;  // Collective or P2P
  traces::CollOp op = traces::CollOp::None;
  int32_t comm = -1;  // CommunicatorInfo::id
  int64_t seq = -1;   // sequence number within the communicator
  int64_t bytes = 0;  // as the span's bytes (per-rank buffer size)
  int32_t peer = -1;  // global rank of the peer (send/recv) or root (broadcast), -1 otherwise
  int32_t step = -1, micro_batch = -1, layer = -1;
};

struct RangeHooks {
  // `name` is not null-terminated beyond `name_len`; step/micro_batch are the range's context.
  void (*open)(const char* name, uint64_t name_len, int32_t step, int32_t micro_batch) = nullptr;
  void (*close)() = nullptr;
  // Around one operation's launching call (see the top). Returns true when the tracer takes the
  // annotation, and only then is collective_close called (on the same thread).
  bool (*collective_open)(const CollectiveAnnotation& a) = nullptr;
  void (*collective_close)() = nullptr;
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

// Brackets the call that launches one communication operation's kernels on this thread (see the
// top). Returns true when an installed tracer took the annotation: the kernels launched until
// end_collective_annotation() will carry `a`. Call end_collective_annotation() exactly when it
// returned true, on the same thread, before any other annotation of this thread closes.
bool begin_collective_annotation(const CollectiveAnnotation& a);
void end_collective_annotation();

}  // namespace orrery::profiler
