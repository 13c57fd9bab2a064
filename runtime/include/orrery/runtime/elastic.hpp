// Elastic restarts (`orrery run --max-restarts N [--min-nproc M]`, as torchrun's): the record of
// each attempt of a job, passed from the launcher to its ranks in the environment (ORRERY_ATTEMPTS,
// a JSON array, the current attempt last) and kept in the trace's run metadata (meta extra_json
// "attempts"); the checkpoint a restart continues from; the ranks a restart can have; the time
// lost to a failure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/runtime/checkpoint.hpp"

namespace orrery::runtime {

inline constexpr const char* kAttemptsEnv = "ORRERY_ATTEMPTS";

struct Attempt {
  int attempt = 1;  // 1, 2, ...
  int nproc = 0;
  int dp = 0;
  int resumed_from_step = 0;  // steps done when it started (0 from scratch)
  std::string resumed_from;   // the checkpoint it continued from; "" from scratch
  int64_t start_unix_ns = 0;  // when the launcher started it
  // Once it failed:
  bool failed = false;
  int64_t end_unix_ns = 0;  // when its mpirun ended
  int exit_status = 0;
  std::vector<int> lost_ranks;
  int failed_step = -1;  // the step it was in (-1: set-up, or unknown without a trace)
  std::string failure;   // what happened (salvage_failed_run's message)
  std::string trace;     // its merged remains; "" when none
  int64_t lost_ns = 0;   // time lost to this failure (time_lost_ns), known at the restart
};

// {"attempt": 1, "nproc": 2, ...} per attempt, the keys named as the fields.
std::string attempts_to_json(const std::vector<Attempt>& attempts);
// InputError naming `origin` when `text` is not such an array.
std::vector<Attempt> attempts_from_json(const std::string& text, const std::string& origin);
// The attempts the launcher told this rank (ORRERY_ATTEMPTS); empty when it is unset (a job
// started without --max-restarts).
std::vector<Attempt> attempts_from_env();

// Test-only faults (faults.*) fire on the first attempt of a job only, unless
// faults.every_attempt: clears them in `s` for a later attempt.
void faults_for_attempt(Scenario& s, int attempt);

// The checkpoint a restart continues from: the newest complete step-<k> checkpoint in `dir` whose
// manifest was written at or after `since_unix_ns` (this job's start, so a stale checkpoint of an
// earlier job in the same directory is not taken), verified; nullopt when there is none.
std::optional<ResumePoint> newest_checkpoint_since(const std::string& dir, int64_t since_unix_ns);
// When the checkpoint `step_dir` was complete: its manifest's modification time (0 when absent).
int64_t checkpoint_time_unix_ns(const std::string& step_dir);

// The slots of an Open MPI hostfile ("HOST [slots=N]" lines, '#' comments; a host without slots=
// counts one). InputError naming the file and line when it cannot be read or parsed.
int hostfile_slots(const std::string& path);

// The time lost to the failed attempt `a`, restarted at `restart_unix_ns` from a checkpoint
// complete at `checkpoint_unix_ns` (0: from scratch or from a checkpoint older than `a`): the time
// from that checkpoint (or from `a`'s start when it was not written during `a`) to the restart,
// which is the work redone plus the failure's detection and the teardown. The restarted job's own
// start-up (processes, model, checkpoint load) is in its trace.
int64_t time_lost_ns(const Attempt& a, int64_t checkpoint_unix_ns, int64_t restart_unix_ns);

int64_t unix_time_ns();

}  // namespace orrery::runtime
