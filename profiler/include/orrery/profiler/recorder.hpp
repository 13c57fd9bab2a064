// The per-rank span recorder of a real run: steady-clock timestamps, per-thread buffers of spans
// and counter samples, flushed to a traces::TraceWriter.
//
// Recording a span costs a clock read and an append to the calling thread's buffer (one
// uncontended lock); the SQLite writer is only touched when a thread's buffer fills or on flush().
// A Recorder constructed without a writer is disabled: every call returns at once, so code can
// record unconditionally and `--no-profile` costs one branch per span.
//
// Losing no spans when a job fails: what is buffered is on disk after each flush(); a run flushes at
// every step end and, with start_periodic_flush(), every period from a background thread, so a rank
// killed without warning (SIGKILL) loses at most the spans recorded since the later of the two.
// Failure paths that do get control (SIGTERM from mpirun, MPI_Abort) call flush_live() first.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "orrery/traces/span.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::profiler {

// Nanoseconds on the steady clock (CLOCK_MONOTONIC on Linux). Ranks on one host share it; across
// hosts the merged trace relies on the ranks' first barrier to line steps up (see the launcher).
int64_t steady_now_ns();

// Stream ids of a CPU rank (model/names.hpp has the full table). The communicator runs collectives on
// its own thread, whose default stream is kCommStream; each operation is recorded on its group's stream.
inline constexpr int32_t kComputeStream = 0;
inline constexpr int32_t kCommStream = 1;

// Serialises this process's writes to its trace file over different SQLite connections: the
// TraceWriter's (every Recorder call that reaches the writer takes it) and the flight recorder's.
// SQLite allows one writer at a time and the TraceWriter fails at once on a busy file.
std::mutex& trace_file_mutex();

class Recorder {
 public:
  // `writer` may be nullptr (profiling off). The recorder does not own the writer; the writer must
  // outlive the recorder's last flush().
  Recorder(traces::TraceWriter* writer, int32_t rank, size_t thread_buffer_spans = 4096);
  ~Recorder();  // flush()es, swallowing errors
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  bool enabled() const { return writer_ != nullptr; }
  int32_t rank() const { return rank_; }
  traces::TraceWriter* writer() const { return writer_; }

  // Interns a span or counter name (thread-safe; cached, so repeated names cost one hash lookup).
  traces::NameId intern(std::string_view name);

  // Metadata forwarded to the writer (no-ops when disabled).
  void add_stream(int32_t stream, const std::string& name);
  // add_stream unless the stream was added already (by either call); thread-safe.
  void ensure_stream(int32_t stream, std::string_view name);
  void add_communicator(const traces::CommunicatorInfo& c);
  void add_rank(const traces::RankInfo& r);

  // Appends a span; its rank is set to this recorder's rank.
  void record(traces::Span s);
  // A counter sample (e.g. "mem.activations" in bytes) at `ts_ns` (now when < 0).
  void counter(traces::NameId name, double value, int64_t ts_ns = -1);
  void counter(std::string_view name, double value, int64_t ts_ns = -1);

  // Step context: ranges opened while it is set carry it (phases, user ranges).
  void set_step(int32_t step, int32_t micro_batch = -1) {
    step_.store(step, std::memory_order_relaxed);
    micro_batch_.store(micro_batch, std::memory_order_relaxed);
  }
  int32_t step() const { return step_.load(std::memory_order_relaxed); }
  int32_t micro_batch() const { return micro_batch_.load(std::memory_order_relaxed); }

  // Moves every thread's buffered spans and counters to the writer and flushes it.
  void flush();

  // flush()es every `period` on a background thread until destruction (or the next call; a zero
  // period stops it). The writer must then outlive the recorder, as for any flush().
  void start_periodic_flush(std::chrono::milliseconds period);

  // flush()es every live recorder that has a writer (errors swallowed): the failure paths' call,
  // from any thread but the ones recording. Serialised with recorders' destruction, so a recorder
  // being torn down on another thread is either flushed whole or already gone.
  static void flush_live();

  // Spans and counters recorded so far (buffered or handed to the writer), for tests and summaries.
  int64_t span_count() const { return span_count_.load(std::memory_order_relaxed); }

  // The process-wide recorder that ScopedRange / ORRERY_RANGE write to (nullptr: ranges do nothing).
  static Recorder* current();
  static void set_current(Recorder* r);

  // The stream the calling thread's spans go to (kComputeStream unless the thread says otherwise).
  static int32_t thread_stream();
  static void set_thread_stream(int32_t stream);

 private:
  struct ThreadBuffer {
    std::mutex mu;
    std::vector<traces::Span> spans;
    std::vector<traces::CounterSample> counters;
  };
  ThreadBuffer& local_buffer();
  void drain(ThreadBuffer& b);  // b.mu held by the caller

  traces::TraceWriter* writer_;
  int32_t rank_;
  size_t capacity_;
  uint64_t instance_id_;  // distinguishes recorders in the threads' buffer caches
  std::atomic<int32_t> step_{-1};
  std::atomic<int32_t> micro_batch_{-1};
  std::atomic<int64_t> span_count_{0};

  std::mutex names_mu_;
  std::unordered_map<std::string, traces::NameId> names_;
  std::vector<int32_t> streams_;  // added so far (names_mu_)

  std::mutex buffers_mu_;
  std::unordered_map<std::thread::id, std::unique_ptr<ThreadBuffer>> buffers_;

  void stop_periodic_flush();
  std::mutex periodic_mu_;
  std::condition_variable periodic_cv_;
  bool periodic_stop_ = false;
  std::thread periodic_;
};

// Name ids of span names passed as string literals (the model's names): the pointer is the key,
// the text the fallback, so a hot path interns each literal once. Used by the trainers' observers.
class LiteralNames {
 public:
  explicit LiteralNames(Recorder* rec) : rec_(rec) {}
  traces::NameId id(const char* name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const traces::NameId id = rec_->intern(name);
    ids_.emplace(name, id);
    return id;
  }

 private:
  Recorder* rec_;
  std::unordered_map<const char*, traces::NameId> ids_;
};

// Records one span from construction to destruction (used by the runtime for its own work).
// `proto` carries kind, name and attributes; start, end and the stream (the calling thread's) are
// filled in. Does nothing when `rec` is nullptr or disabled.
class ScopedSpan {
 public:
  ScopedSpan(Recorder* rec, const traces::Span& proto)
      : rec_(rec && rec->enabled() ? rec : nullptr), span_(proto) {
    if (rec_) span_.start_ns = steady_now_ns();
  }
  ~ScopedSpan() { end(); }
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;
  traces::Span& span() { return span_; }
  // Ends the span early (idempotent).
  void end() {
    if (!rec_) return;
    span_.end_ns = steady_now_ns();
    span_.stream = Recorder::thread_stream();
    rec_->record(span_);
    rec_ = nullptr;
  }

 private:
  Recorder* rec_;
  traces::Span span_;
};

}  // namespace orrery::profiler
