// The flight recorder: a per-process ring buffer of the last N collectives and transfers (state
// scheduled -> started -> completed, with timestamps), kept so that a hung or failed job can say
// what every rank was doing. `orrery doctor` matches the records across ranks.
//
// Persistence (chosen so that ranks killed by another rank's MPI_Abort keep their records): once a
// dump path is set, a background thread rewrites the records into the table `flight_records` of
// the rank's trace file every 200 ms when they changed, and the watchdog path dumps at once (to
// the file and to stderr) before the job is aborted. The table is optional in schema version 1:
// older traces simply lack it.
//
// Next to the records each rank keeps its status (table `rank_status`, one row per rank): running
// (with the step it is in, saved at every step end), stopped (ended by SIGTERM/SIGINT, e.g. by
// mpirun after another rank died) or failed (it called MPI_Abort). A rank whose last status is
// still "running" after the job ended was lost: killed without a chance to say so (SIGKILL, a
// crash). The launcher reads these rows to name the lost rank.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "orrery/traces/span.hpp"

namespace orrery::profiler {

enum class FlightState : int32_t { Scheduled = 0, Started = 1, Completed = 2 };
inline std::string_view to_string(FlightState s) {
  switch (s) {
    case FlightState::Scheduled:
      return "scheduled";
    case FlightState::Started:
      return "started";
    case FlightState::Completed:
      return "completed";
  }
  return "?";
}

enum class RankState : int32_t { Running = 0, Stopped = 1, Failed = 2 };
inline std::string_view to_string(RankState s) {
  switch (s) {
    case RankState::Running:
      return "running";
    case RankState::Stopped:
      return "stopped";
    case RankState::Failed:
      return "failed";
  }
  return "?";
}

struct RankStatus {
  int32_t rank = 0;
  RankState state = RankState::Running;
  int32_t step = -1;   // the step the rank was in (-1: set-up, before the first step)
  std::string detail;  // "SIGTERM", "exit 1", ...
};

struct FlightRecord {
  int32_t rank = 0;  // global rank that recorded it
  int32_t comm = -1;
  int64_t seq = -1;  // sequence number within the communicator
  traces::CollOp op = traces::CollOp::None;
  int64_t bytes = 0;
  int32_t dtype = 0;  // runtime::DType value
  int32_t peer = -1;  // global peer rank (send/recv), root (broadcast), -1 otherwise
  int32_t step = -1;
  FlightState state = FlightState::Scheduled;
  int64_t scheduled_ns = 0;  // steady clock
  int64_t started_ns = 0;    // 0 while not started
  int64_t completed_ns = 0;  // 0 while not completed
};

class FlightRecorder {
 public:
  static constexpr size_t kDefaultCapacity = 256;
  explicit FlightRecorder(size_t capacity = kDefaultCapacity);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // The process's recorder (used by the MPI communicator).
  static FlightRecorder& instance();

  void set_rank(int32_t rank) { rank_ = rank; }
  // Returns an id for started()/completed(); the oldest record is overwritten when full.
  uint64_t scheduled(FlightRecord r);
  void started(uint64_t id, int64_t now_ns);
  void completed(uint64_t id, int64_t now_ns);

  // Records oldest first.
  std::vector<FlightRecord> snapshot() const;

  // Starts (or, with "", stops) the periodic writes into `trace_path`'s flight_records table.
  void set_dump_path(const std::string& trace_path);
  // Writes the records into the dump path (if set) and, when `to_stderr`, prints them. Safe to call
  // from any thread; errors are swallowed (this runs on failure paths).
  void dump(const std::string& reason, bool to_stderr);

  // This rank's status, written with the records. Once stopped or failed it no longer changes (a
  // rank that called MPI_Abort and is then sent SIGTERM stays "failed").
  void set_status(RankState state, int32_t step, const std::string& detail = "");
  RankStatus status() const;
  // Writes records and status into the dump path now (if set), on the calling thread.
  void save() { dump("", false); }

 private:
  void flusher_loop();
  void write_now();
  mutable std::mutex mu_;
  std::vector<FlightRecord> ring_;
  std::vector<uint64_t> ids_;  // id held by each slot
  uint64_t next_id_ = 1;
  std::atomic<uint64_t> version_{0};
  uint64_t written_version_ = 0;
  std::atomic<int32_t> rank_{0};
  RankStatus status_;  // guarded by mu_ (its rank is filled in when written)
  std::mutex io_mu_;   // serialises file writes
  std::string path_;
  std::thread flusher_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
};

// Replaces the flight records of `rank` in the trace file at `trace_path` (creating the table).
// (orrery_capture)
void write_flight_records(const std::string& trace_path, int32_t rank,
                          const std::vector<FlightRecord>& records);
// The flight records of a trace file; empty when the file has no flight_records table.
// (orrery_analysis, doctor.cpp)
std::vector<FlightRecord> read_flight_records(const std::string& trace_path);

// Replaces the status row of `status.rank` in `trace_path` (creating the table). (orrery_capture)
void write_rank_status(const std::string& trace_path, const RankStatus& status);
// The status rows of a trace file (a per-rank file or a merged trace); empty without the table.
// (orrery_capture)
std::vector<RankStatus> read_rank_status(const std::string& trace_path);
// Marks the trace at `trace_path` as the remains of a failed run: its meta (traces::RunFailure)
// becomes failed, with `lost_ranks`, `message` and the step in progress (-1: set-up).
// (orrery_capture)
void mark_trace_failed(const std::string& trace_path, const std::vector<int32_t>& lost_ranks,
                       const std::string& message, int32_t step);

// One line per record, for stderr: "rank 1 world#12 all_reduce 4096 bytes step 3 started".
inline std::string format_flight_record(const FlightRecord& r) {
  return "rank " + std::to_string(r.rank) + " comm " + std::to_string(r.comm) + " #" +
         std::to_string(r.seq) + " " + std::string(traces::to_string(r.op)) + " " +
         std::to_string(r.bytes) + " bytes step " + std::to_string(r.step) + " " +
         std::string(to_string(r.state));
}

}  // namespace orrery::profiler
