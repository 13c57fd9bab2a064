// The flight recorder's ring buffer, its periodic writer and the watchdog dump (see
// flight_recorder.hpp for why records are written both periodically and on the failure path), the
// rank's status row, and the failure tables' copy into a merged trace.
#include "orrery/profiler/flight_recorder.hpp"

#include <sqlite3.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>

#include "orrery/profiler/recorder.hpp"

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

void FlightRecorder::set_status(RankState state, int32_t step, const std::string& detail) {
  std::lock_guard lock(mu_);
  if (status_.state != RankState::Running) return;  // stopped/failed is final
  status_.state = state;
  status_.step = step;
  status_.detail = detail;
  version_.fetch_add(1, std::memory_order_relaxed);
}

RankStatus FlightRecorder::status() const {
  std::lock_guard lock(mu_);
  RankStatus s = status_;
  s.rank = rank_.load(std::memory_order_relaxed);
  return s;
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
    std::lock_guard file(trace_file_mutex());  // the TraceWriter fails on a busy file
    write_flight_records(path_, rank_.load(), snapshot());
    write_rank_status(path_, status());
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

// A connection to a trace file, closed on scope exit.
struct Db {
  sqlite3* db = nullptr;
  Db(const std::string& path, int flags) {
    const int rc = sqlite3_open_v2(path.c_str(), &db, flags, nullptr);
    if (rc != SQLITE_OK) {
      const std::string msg = path + ": " + (db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
      sqlite3_close(db);
      throw std::runtime_error(msg);
    }
    sqlite3_busy_timeout(db, 2000);
  }
  ~Db() { sqlite3_close(db); }
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;
};

constexpr const char* kCreateFlightRecords =
    "CREATE TABLE IF NOT EXISTS flight_records (rank INTEGER, comm INTEGER, seq INTEGER, op "
    "INTEGER, bytes INTEGER, dtype INTEGER, peer INTEGER, step INTEGER, state INTEGER, "
    "scheduled_ns INTEGER, started_ns INTEGER, completed_ns INTEGER);";
constexpr const char* kCreateRankStatus =
    "CREATE TABLE IF NOT EXISTS rank_status (rank INTEGER PRIMARY KEY, state INTEGER, step "
    "INTEGER, detail TEXT);";

}  // namespace

void write_flight_records(const std::string& trace_path, int32_t rank,
                          const std::vector<FlightRecord>& records) {
  Db conn(trace_path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  sqlite3* db = conn.db;
  int rc = SQLITE_OK;
  check(sqlite3_exec(db, kCreateFlightRecords, nullptr, nullptr, nullptr), db, trace_path);
  check(sqlite3_exec(db, "BEGIN IMMEDIATE;", nullptr, nullptr, nullptr), db, trace_path);
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

void write_rank_status(const std::string& trace_path, const RankStatus& status) {
  Db conn(trace_path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  check(sqlite3_exec(conn.db, kCreateRankStatus, nullptr, nullptr, nullptr), conn.db, trace_path);
  sqlite3_stmt* st = nullptr;
  check(sqlite3_prepare_v2(conn.db, "INSERT OR REPLACE INTO rank_status VALUES (?,?,?,?)", -1, &st,
                           nullptr),
        conn.db, trace_path);
  sqlite3_bind_int(st, 1, status.rank);
  sqlite3_bind_int(st, 2, static_cast<int>(status.state));
  sqlite3_bind_int(st, 3, status.step);
  sqlite3_bind_text(st, 4, status.detail.c_str(), -1, SQLITE_TRANSIENT);
  const int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  check(rc, conn.db, trace_path);
}

std::vector<RankStatus> read_rank_status(const std::string& trace_path) {
  std::vector<RankStatus> out;
  Db conn(trace_path, SQLITE_OPEN_READONLY);
  sqlite3_stmt* st = nullptr;
  // No table (a file written before any status, or an older trace): no rows.
  if (sqlite3_prepare_v2(conn.db, "SELECT rank, state, step, detail FROM rank_status ORDER BY rank",
                         -1, &st, nullptr) != SQLITE_OK) {
    sqlite3_finalize(st);
    return out;
  }
  while (sqlite3_step(st) == SQLITE_ROW) {
    RankStatus r;
    r.rank = sqlite3_column_int(st, 0);
    r.state = static_cast<RankState>(sqlite3_column_int(st, 1));
    r.step = sqlite3_column_int(st, 2);
    const auto* text = sqlite3_column_text(st, 3);
    r.detail = text ? reinterpret_cast<const char*>(text) : "";
    out.push_back(std::move(r));
  }
  sqlite3_finalize(st);
  return out;
}

void mark_trace_failed(const std::string& trace_path, const std::vector<int32_t>& lost_ranks,
                       const std::string& message, int32_t step) {
  std::string lost = "[";
  for (size_t i = 0; i < lost_ranks.size(); ++i) {
    lost += (i ? "," : "") + std::to_string(lost_ranks[i]);
  }
  lost += "]";
  Db conn(trace_path, SQLITE_OPEN_READWRITE);
  // The typed meta keys of traces::RunFailure (traces/store.cpp), in one transaction.
  check(sqlite3_exec(conn.db, "BEGIN", nullptr, nullptr, nullptr), conn.db, trace_path);
  sqlite3_stmt* st = nullptr;
  check(sqlite3_prepare_v2(conn.db, "INSERT OR REPLACE INTO meta(key, value) VALUES(?1, ?2)", -1,
                           &st, nullptr),
        conn.db, trace_path);
  auto put = [&](const char* key, auto bind) {
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    bind();
    const int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
      sqlite3_finalize(st);
      check(rc, conn.db, trace_path);
    }
  };
  put("failed", [&] { sqlite3_bind_int64(st, 2, 1); });
  put("lost_ranks", [&] { sqlite3_bind_text(st, 2, lost.c_str(), -1, SQLITE_TRANSIENT); });
  put("failed_step", [&] { sqlite3_bind_int64(st, 2, step); });
  put("failure", [&] { sqlite3_bind_text(st, 2, message.c_str(), -1, SQLITE_TRANSIENT); });
  sqlite3_finalize(st);
  check(sqlite3_exec(conn.db, "COMMIT", nullptr, nullptr, nullptr), conn.db, trace_path);
}

}  // namespace orrery::profiler
