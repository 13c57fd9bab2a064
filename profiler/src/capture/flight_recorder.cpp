// The flight recorder's ring buffer, its periodic writer and the watchdog dump (see
// flight_recorder.hpp for why records are written both periodically and on the failure path).
#include "orrery/profiler/flight_recorder.hpp"

#include <sqlite3.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>

namespace orrery::profiler {

FlightRecorder::FlightRecorder(size_t capacity)
    : ring_(capacity == 0 ? 1 : capacity), ids_(capacity == 0 ? 1 : capacity, 0) {}

FlightRecorder::~FlightRecorder() { set_dump_path(""); }

FlightRecorder& FlightRecorder::instance() {
  // Never destroyed: the watchdog may dump while the process exits.
  static auto* r = new FlightRecorder();
  return *r;
}

uint64_t FlightRecorder::scheduled(FlightRecord r) {
  r.rank = rank_.load(std::memory_order_relaxed);
  r.state = FlightState::Scheduled;
  std::lock_guard lock(mu_);
  const uint64_t id = next_id_++;
  const size_t slot = id % ring_.size();
  ring_[slot] = r;
  ids_[slot] = id;
  version_.fetch_add(1, std::memory_order_relaxed);
  return id;
}

void FlightRecorder::started(uint64_t id, int64_t now_ns) {
  std::lock_guard lock(mu_);
  const size_t slot = id % ring_.size();
  if (ids_[slot] != id) return;  // overwritten
  ring_[slot].state = FlightState::Started;
  ring_[slot].started_ns = now_ns;
  version_.fetch_add(1, std::memory_order_relaxed);
}

void FlightRecorder::completed(uint64_t id, int64_t now_ns) {
  std::lock_guard lock(mu_);
  const size_t slot = id % ring_.size();
  if (ids_[slot] != id) return;
  ring_[slot].state = FlightState::Completed;
  if (ring_[slot].started_ns == 0) ring_[slot].started_ns = now_ns;
  ring_[slot].completed_ns = now_ns;
  version_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<FlightRecord> FlightRecorder::snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<FlightRecord> out;
  const size_t n = ring_.size();
  const uint64_t first = next_id_ > n ? next_id_ - n : 1;
  for (uint64_t id = first; id < next_id_; ++id) {
    const size_t slot = id % n;
    if (ids_[slot] == id) out.push_back(ring_[slot]);
  }
  return out;
}

void FlightRecorder::set_dump_path(const std::string& trace_path) {
  if (flusher_.joinable()) {
    {
      std::lock_guard lock(io_mu_);
      stop_ = true;
    }
    stop_cv_.notify_all();
    flusher_.join();
  }
  std::lock_guard lock(io_mu_);
  path_ = trace_path;
  stop_ = false;
  written_version_ = 0;
  if (!path_.empty()) flusher_ = std::thread([this] { flusher_loop(); });
}

void FlightRecorder::flusher_loop() {
  std::unique_lock lock(io_mu_);
  while (!stop_) {
    stop_cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stop_; });
    if (version_.load(std::memory_order_relaxed) != written_version_) write_now();
  }
  if (version_.load(std::memory_order_relaxed) != written_version_) write_now();
}

void FlightRecorder::write_now() {  // io_mu_ held
  if (path_.empty()) return;
  const uint64_t v = version_.load(std::memory_order_relaxed);
  try {
    write_flight_records(path_, rank_.load(), snapshot());
    written_version_ = v;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "orrery: flight recorder: %s\n", e.what());
  }
}

void FlightRecorder::dump(const std::string& reason, bool to_stderr) {
  if (to_stderr) {
    const auto recs = snapshot();
    std::string text = "orrery: rank " + std::to_string(rank_.load()) + ": " + reason +
                       "; flight records (oldest first, " + std::to_string(recs.size()) + "):\n";
    for (const auto& r : recs) text += "  " + format_flight_record(r) + "\n";
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
  }
  std::lock_guard lock(io_mu_);
  write_now();
}

namespace {
void check(int rc, sqlite3* db, const std::string& path) {
  if (rc != SQLITE_OK && rc != SQLITE_DONE && rc != SQLITE_ROW) {
    throw std::runtime_error(path + ": " + (db ? sqlite3_errmsg(db) : sqlite3_errstr(rc)));
  }
}
}  // namespace

void write_flight_records(const std::string& trace_path, int32_t rank,
                          const std::vector<FlightRecord>& records) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(trace_path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                           nullptr);
  struct Close {
    sqlite3* d;
    ~Close() { sqlite3_close(d); }
  } closer{db};
  check(rc, db, trace_path);
  sqlite3_busy_timeout(db, 2000);
  check(sqlite3_exec(db,
                     "CREATE TABLE IF NOT EXISTS flight_records (rank INTEGER, comm INTEGER, seq "
                     "INTEGER, op INTEGER, bytes INTEGER, dtype INTEGER, peer INTEGER, step "
                     "INTEGER, state INTEGER, scheduled_ns INTEGER, started_ns INTEGER, "
                     "completed_ns INTEGER);"
                     "BEGIN IMMEDIATE;",
                     nullptr, nullptr, nullptr),
        db, trace_path);
  sqlite3_stmt* del = nullptr;
  check(sqlite3_prepare_v2(db, "DELETE FROM flight_records WHERE rank = ?", -1, &del, nullptr), db,
        trace_path);
  sqlite3_bind_int(del, 1, rank);
  rc = sqlite3_step(del);
  sqlite3_finalize(del);
  check(rc, db, trace_path);
  sqlite3_stmt* ins = nullptr;
  check(sqlite3_prepare_v2(db, "INSERT INTO flight_records VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", -1,
                           &ins, nullptr),
        db, trace_path);
  for (const auto& r : records) {
    sqlite3_bind_int(ins, 1, r.rank);
    sqlite3_bind_int(ins, 2, r.comm);
    sqlite3_bind_int64(ins, 3, r.seq);
    sqlite3_bind_int(ins, 4, static_cast<int>(r.op));
    sqlite3_bind_int64(ins, 5, r.bytes);
    sqlite3_bind_int(ins, 6, r.dtype);
    sqlite3_bind_int(ins, 7, r.peer);
    sqlite3_bind_int(ins, 8, r.step);
    sqlite3_bind_int(ins, 9, static_cast<int>(r.state));
    sqlite3_bind_int64(ins, 10, r.scheduled_ns);
    sqlite3_bind_int64(ins, 11, r.started_ns);
    sqlite3_bind_int64(ins, 12, r.completed_ns);
    rc = sqlite3_step(ins);
    sqlite3_reset(ins);
    if (rc != SQLITE_DONE) break;
  }
  sqlite3_finalize(ins);
  check(rc == SQLITE_DONE || records.empty() ? SQLITE_OK : rc, db, trace_path);
  check(sqlite3_exec(db, "COMMIT;", nullptr, nullptr, nullptr), db, trace_path);
}

}  // namespace orrery::profiler
