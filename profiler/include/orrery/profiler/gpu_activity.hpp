// GPU activity (kernels, copies, memsets, as a tracer such as CUPTI reports them) turned into trace
// spans: the GPU clock mapped onto the recorder's steady clock by a fixed offset, one trace stream per
// CUDA stream ("cuda stream N", id kCudaStreamBase + N), NCCL kernels as Collective/P2P spans, and
// each activity attributed to the step and micro-batch of the range that enclosed its launch (via
// external correlation ids: range -> id at launch time, id -> activity by correlation id).
//
// Communication operations: a kernel launched inside a collective annotation (range_hooks.hpp:
// collective id -> annotation at launch time, collective id -> activity by correlation id) gets the
// operation's identity (apply_collective). Once any annotation has been seen, an NCCL kernel
// without one is recorded as kind Other: its operation is counted by the communicator's own span
// (see range_hooks.hpp for who counts what).
//
// Kept free of CUPTI so that the mapping and correlation logic is tested without a GPU; the CUPTI
// tracer (cupti_tracer.hpp) feeds it.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "orrery/profiler/range_hooks.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/traces/span.hpp"

namespace orrery::profiler {

// Trace stream id of CUDA stream N is kCudaStreamBase + N.
inline constexpr int32_t kCudaStreamBase = 16;

struct GpuActivity {
  enum class Kind { Kernel, Memcpy, Memset };
  Kind kind = Kind::Kernel;
  std::string_view name;       // kernel name (mangled or not); for copies the direction, e.g. "HtoD"
  uint64_t start_ns = 0;       // tracer clock
  uint64_t end_ns = 0;
  uint32_t stream_id = 0;      // CUDA stream id
  uint32_t correlation_id = 0; // of the API call that launched it (0: none)
  uint64_t bytes = 0;          // copies and memsets
};

// "void foo<float>(float*, int)" -> "foo<float>": demangled, without return type and arguments.
std::string kernel_display_name(std::string_view mangled);
// NCCL kernels ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclKernel_SendRecv_...") map to
// Collective with their op, or P2P for send/recv; every other kernel is Compute / None.
void classify_kernel(std::string_view name, traces::SpanKind& kind, traces::CollOp& op);

// Gives kernel span `s` the identity of the operation whose call launched it: kind, op, comm, seq,
// bytes, peer, and step/micro_batch/layer where the annotation has them (>= 0). `first`: the first
// kernel attributed to that operation. NCCL launches one kernel per operation, but should one
// launch more, the later ones keep kind, op, comm and step but get seq -1 and bytes 0, so the
// operation is still grouped across ranks by one span and its bytes counted once.
void apply_collective(traces::Span& s, const CollectiveAnnotation& a, bool first);

class GpuActivityMapper {
 public:
  // Activities are held until flush() (or until kMaxHeld are held), because the correlation records
  // that attribute them to ranges may arrive in a later buffer than the activities themselves.
  static constexpr size_t kMaxHeld = 1 << 18;

  // `clock_offset_ns` is added to tracer timestamps to get the recorder's steady clock.
  GpuActivityMapper(Recorder& rec, int64_t clock_offset_ns);

  // A range opened with `external_id`, in `step` / `micro_batch` (from the range hooks).
  void range_opened(uint64_t external_id, int32_t step, int32_t micro_batch);
  // The API call `correlation_id` was made inside the range `external_id`.
  void correlate(uint32_t correlation_id, uint64_t external_id);
  // A communication operation's launching call opened with `external_id` (collective hooks).
  void collective_issued(uint64_t external_id, const CollectiveAnnotation& a);
  // The API call `correlation_id` was made inside the collective annotation `external_id`.
  void correlate_collective(uint32_t correlation_id, uint64_t external_id);
  void add(const GpuActivity& a);
  // Records everything held (attributed when its range is known) and forgets used correlations.
  void flush();

  int64_t spans_recorded() const;
  int64_t clock_offset_ns() const { return offset_ns_; }

 private:
  struct Held {
    traces::Span span;
    uint32_t correlation_id;
  };
  struct RangeContext {
    int32_t step, micro_batch;
  };
  struct IssuedCollective {
    CollectiveAnnotation a;
    int64_t kernels = 0;  // kernels attributed to it so far
  };
  void emit_locked(size_t count);
  traces::NameId name_id_locked(const GpuActivity& a);

  Recorder& rec_;
  const int64_t offset_ns_;
  mutable std::mutex mu_;
  std::vector<Held> held_;
  std::unordered_map<uint32_t, uint64_t> correlation_;  // correlation id -> external id
  std::map<uint64_t, RangeContext> ranges_;              // external id -> context
  std::unordered_map<uint32_t, uint64_t> coll_correlation_;  // correlation id -> collective id
  std::map<uint64_t, IssuedCollective> collectives_;         // collective id -> operation
  bool annotated_ = false;  // a collective annotation was seen
  std::unordered_map<std::string, traces::NameId> names_;
  std::unordered_set<uint32_t> streams_;  // CUDA streams announced to the recorder
  int64_t recorded_ = 0;
};

}  // namespace orrery::profiler
