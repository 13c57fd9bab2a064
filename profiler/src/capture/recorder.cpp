// The per-rank span recorder: per-thread buffers handed to the TraceWriter when full or on flush,
// the optional periodic flush, and the registry of live recorders for the failure paths.
#include "orrery/profiler/recorder.hpp"

#include <algorithm>
#include <chrono>

namespace orrery::profiler {
namespace {

std::atomic<Recorder*> g_current{nullptr};
std::atomic<uint64_t> g_next_instance{1};
thread_local int32_t t_stream = kComputeStream;

// One-entry cache per thread: the buffer of the recorder this thread used last, so the common
// path takes no map lookup and no shared lock.
struct TlsCache {
  uint64_t instance = 0;
  void* buffer = nullptr;
};
thread_local TlsCache t_cache;

// Recorders with a writer, for flush_live(). Never destroyed: a signal's thread may flush while
// the process exits.
std::mutex& live_mu() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<Recorder*>& live() {
  static auto* v = new std::vector<Recorder*>;
  return *v;
}

}  // namespace

std::mutex& trace_file_mutex() {
  static auto* m = new std::mutex;  // never destroyed: failure paths write while the process exits
  return *m;
}

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Recorder::Recorder(traces::TraceWriter* writer, int32_t rank, size_t thread_buffer_spans)
    : writer_(writer),
      rank_(rank),
      capacity_(thread_buffer_spans ? thread_buffer_spans : 1),
      instance_id_(g_next_instance.fetch_add(1)) {
  if (writer_) {
    std::lock_guard lock(live_mu());
    live().push_back(this);
  }
}

Recorder::~Recorder() {
  if (current() == this) set_current(nullptr);
  stop_periodic_flush();
  // The last flush under the registry's lock: a failure path's flush_live() (which then ends the
  // process) waits for it rather than finding the recorder gone with its spans unwritten.
  std::lock_guard lock(live_mu());
  try {
    flush();
  } catch (...) {
    // Destructors must not throw; an explicit flush() reports errors.
  }
  auto& v = live();
  v.erase(std::remove(v.begin(), v.end(), this), v.end());
}

void Recorder::start_periodic_flush(std::chrono::milliseconds period) {
  stop_periodic_flush();
  if (!writer_ || period.count() <= 0) return;
  periodic_stop_ = false;
  periodic_ = std::thread([this, period] {
    std::unique_lock lock(periodic_mu_);
    while (!periodic_cv_.wait_for(lock, period, [&] { return periodic_stop_; })) {
      lock.unlock();
      try {
        flush();
      } catch (...) {
        // A failed periodic flush is retried at the next; flush() at the end reports errors.
      }
      lock.lock();
    }
  });
}

void Recorder::stop_periodic_flush() {
  if (!periodic_.joinable()) return;
  {
    std::lock_guard lock(periodic_mu_);
    periodic_stop_ = true;
  }
  periodic_cv_.notify_all();
  periodic_.join();
}

void Recorder::flush_live() {
  std::lock_guard lock(live_mu());
  for (Recorder* r : live()) {
    try {
      r->flush();
    } catch (...) {
      // Failure path: flush what can be flushed.
    }
  }
}

Recorder* Recorder::current() { return g_current.load(std::memory_order_acquire); }
void Recorder::set_current(Recorder* r) { g_current.store(r, std::memory_order_release); }
int32_t Recorder::thread_stream() { return t_stream; }
void Recorder::set_thread_stream(int32_t stream) { t_stream = stream; }

traces::NameId Recorder::intern(std::string_view name) {
  std::lock_guard lock(names_mu_);
  auto it = names_.find(std::string(name));
  if (it != names_.end()) return it->second;
  traces::NameId id = traces::NameId(names_.size());
  if (writer_) {
    std::lock_guard file(trace_file_mutex());
    id = writer_->intern(name);
  }
  names_.emplace(std::string(name), id);
  return id;
}

void Recorder::add_stream(int32_t stream, const std::string& name) {
  if (!writer_) return;
  {
    std::lock_guard lock(names_mu_);
    if (std::find(streams_.begin(), streams_.end(), stream) == streams_.end())
      streams_.push_back(stream);
  }
  std::lock_guard file(trace_file_mutex());
  writer_->add_stream(traces::StreamInfo{rank_, stream, name});
}

void Recorder::ensure_stream(int32_t stream, std::string_view name) {
  if (!writer_) return;
  {
    std::lock_guard lock(names_mu_);
    if (std::find(streams_.begin(), streams_.end(), stream) != streams_.end()) return;
    streams_.push_back(stream);
  }
  std::lock_guard file(trace_file_mutex());
  writer_->add_stream(traces::StreamInfo{rank_, stream, std::string(name)});
}
void Recorder::add_communicator(const traces::CommunicatorInfo& c) {
  if (!writer_) return;
  std::lock_guard file(trace_file_mutex());
  writer_->add_communicator(c);
}
void Recorder::add_rank(const traces::RankInfo& r) {
  if (!writer_) return;
  std::lock_guard file(trace_file_mutex());
  writer_->add_rank(r);
}

Recorder::ThreadBuffer& Recorder::local_buffer() {
  if (t_cache.instance == instance_id_) return *static_cast<ThreadBuffer*>(t_cache.buffer);
  std::lock_guard lock(buffers_mu_);
  auto& slot = buffers_[std::this_thread::get_id()];
  if (!slot) {
    slot = std::make_unique<ThreadBuffer>();
    slot->spans.reserve(capacity_);
  }
  t_cache.instance = instance_id_;
  t_cache.buffer = slot.get();
  return *slot;
}

void Recorder::drain(ThreadBuffer& b) {
  std::lock_guard file(trace_file_mutex());
  if (!b.spans.empty()) {
    writer_->add_spans(b.spans);
    b.spans.clear();
  }
  for (const auto& c : b.counters) writer_->add_counter(c);
  b.counters.clear();
}

void Recorder::record(traces::Span s) {
  if (!writer_) return;
  s.rank = rank_;
  ThreadBuffer& b = local_buffer();
  std::lock_guard lock(b.mu);
  b.spans.push_back(s);
  span_count_.fetch_add(1, std::memory_order_relaxed);
  if (b.spans.size() >= capacity_) drain(b);
}

void Recorder::counter(traces::NameId name, double value, int64_t ts_ns) {
  if (!writer_) return;
  ThreadBuffer& b = local_buffer();
  std::lock_guard lock(b.mu);
  b.counters.push_back(
      traces::CounterSample{rank_, name, ts_ns < 0 ? steady_now_ns() : ts_ns, value});
  if (b.counters.size() >= capacity_) drain(b);
}

void Recorder::counter(std::string_view name, double value, int64_t ts_ns) {
  if (!writer_) return;
  counter(intern(name), value, ts_ns);
}

void Recorder::flush() {
  if (!writer_) return;
  std::lock_guard lock(buffers_mu_);
  for (auto& [id, b] : buffers_) {
    std::lock_guard block(b->mu);
    drain(*b);
  }
  std::lock_guard file(trace_file_mutex());
  writer_->flush();
}

}  // namespace orrery::profiler
