// GPU tracing with the CUPTI Activity API (built as orrery_cupti when CUPTI was found):
// kernels (CONCURRENT_KERNEL), copies (MEMCPY), memsets (MEMSET), runtime and driver API calls
// (RUNTIME, DRIVER: only for the external correlations they carry; NCCL launches its kernels
// with the driver's cuLaunchKernelEx) and external correlations (EXTERNAL_CORRELATION), recorded
// as spans into a Recorder (see gpu_activity.hpp for the mapping: kernels Compute, NCCL kernels
// Collective/P2P, copies and memsets Memcpy, one trace stream "cuda stream N" per CUDA stream).
//
// Off the hot path: CUPTI fills 8 MiB buffers on its own; they are turned into spans when CUPTI
// hands them back (on its thread), or at flush(). The only per-launch cost is CUPTI's own record.
// Each named range (ranges.hpp) pushes an external correlation id while open (range hooks, kind
// CUSTOM0), so a kernel carries the step and micro-batch of the range that launched it. Each
// communication operation of the NCCL communicator pushes one of kind CUSTOM1 around its launching
// call (collective hooks, range_hooks.hpp), so its NCCL kernel becomes the operation's
// Collective/P2P span with its communicator id, sequence number, op and bytes; the communicator's
// CUDA-event span of that operation is then recorded as kind Other and not counted twice (the
// rules, and the cases where the communicator's span counts instead, are in range_hooks.hpp).
//
// Clock: CUPTI timestamps are on CUPTI's clock (cuptiGetTimestamp). At start() the offset to the
// recorder's steady clock is measured once: 16 samples of (steady, cuptiGetTimestamp, steady), the
// one with the shortest bracket wins, offset = bracket midpoint - CUPTI time (uncertainty: half the
// bracket, reported by clock_offset_uncertainty_ns()). Drift between the clocks over a run is not
// corrected (CUPTI's clock follows the host's; both are kept by the same kernel).
#pragma once

#include <cstdint>
#include <memory>

#include "orrery/profiler/gpu_activity.hpp"
#include "orrery/profiler/recorder.hpp"

namespace orrery::profiler {

class CuptiTracer {
 public:
  // Starts tracing into `rec` (which must outlive the tracer). One tracer per process at a time.
  // Throws InternalError naming the cause: no CUDA device or driver, CUPTI refusing (insufficient
  // privileges for profiling, another profiler already attached), a tracer already running.
  static std::unique_ptr<CuptiTracer> start(Recorder& rec);
  // Stops tracing, drains CUPTI's buffers and records what they hold.
  ~CuptiTracer();
  CuptiTracer(const CuptiTracer&) = delete;
  CuptiTracer& operator=(const CuptiTracer&) = delete;

  // Makes CUPTI hand over every buffer (complete records only: work still running on the GPU is
  // recorded by a later flush) and records them. Call after synchronising the device to get all.
  void flush();

  int64_t clock_offset_ns() const { return mapper_.clock_offset_ns(); }
  int64_t clock_offset_uncertainty_ns() const { return offset_uncertainty_ns_; }
  int64_t spans_recorded() const { return mapper_.spans_recorded(); }
  // Records CUPTI dropped because its buffers were full (0 when none).
  uint64_t dropped_records() const;

 private:
  CuptiTracer(Recorder& rec, int64_t offset_ns, int64_t uncertainty_ns);
  friend struct CuptiTracerAccess;
  GpuActivityMapper mapper_;
  int64_t offset_uncertainty_ns_;
};

}  // namespace orrery::profiler
