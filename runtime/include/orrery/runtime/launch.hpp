// Launching a run: re-starting `orrery run` under mpirun when several ranks are asked for, and
// running this process's rank of a scenario with profiling (per-rank trace files merged by rank 0
// at the end).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/checkpoint.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime {

// The absolute path of `name` found on PATH (or `name` itself when it contains a '/' and is
// executable); "" when absent.
std::string find_executable(const std::string& name);
// This process's executable (/proc/self/exe).
std::string self_executable();

struct MpirunOptions {
  int nproc = 1;
  bool oversubscribe = false;  // needed when nproc exceeds the cores
  bool allow_run_as_root = false;
  std::string hostfile;                 // --hostfile FILE when not empty
  std::vector<std::string> export_env;  // -x NAME each: variables passed to ranks on other nodes
};
// mpirun -n N [--oversubscribe] [--allow-run-as-root] [--hostfile F] [-x NAME...] --bind-to none
// <program...>. Ranks run a compute thread pool and a communication thread each, so they are not
// pinned to one core.
std::vector<std::string> mpirun_command(const std::string& mpirun, const MpirunOptions& opt,
                                        const std::vector<std::string>& program);
// The options for this machine: oversubscribe when nproc > hardware threads, allow root as root.
MpirunOptions mpirun_options_for(int nproc);

// Runs argv[0] with argv (PATH lookup) and waits; returns its exit status, 128 + signal when
// killed. SIGINT/SIGTERM reaching this process are passed on to the child.
int run_and_wait(const std::vector<std::string>& argv);

// Per-rank trace file of a run whose merged trace is `out`: "<out>.rank<k>.db".
std::string rank_trace_path(const std::string& out, int rank);
// "out/<scenario>-<UTC yyyymmdd-hhmmss>.db".
std::string default_trace_path(const std::string& scenario_name);

struct RankRunOptions {
  std::string out;      // merged trace path (rank 0 writes it); "" = default_trace_path
  bool profile = true;  // record spans (per-rank files, merged at the end)
  // Called on every rank after each step with the step's result (rank 0 usually prints).
  std::function<void(const StepResult&)> on_step;
  // Continue from this checkpoint (a step directory, verified; checkpoint.hpp); "" = from scratch.
  std::string resume;
};

struct RankRunResult {
  int rank = 0;
  int world_size = 1;
  std::vector<StepResult> steps;         // this rank's
  std::vector<float> mean_loss;          // per step, averaged over the data-parallel replicas
  std::vector<int64_t> max_duration_ns;  // per step, the slowest rank's wall time
  std::string trace_path;  // the merged trace (written by rank 0; "" without profiling)
  int64_t tokens_per_step = 0;
  int64_t params = 0;
  int64_t loop_ns = 0;         // wall time of the training loop on this rank (checkpoints included)
  CheckpointStats checkpoint;  // scenario keys checkpoint.*
};

// What is left of a run whose mpirun ended with `exit_status` != 0, from its per-rank files
// "<out>.rank<k>.db": each rank's last status (profiler/flight_recorder.hpp) says which ranks were
// lost (no status, or still "running": killed without warning), failed (MPI_Abort) or stopped
// (SIGTERM from mpirun). The files are merged into `out` as after a finished run, flight records
// and statuses included, meta extra_json marked {"failed": true, "lost_ranks": [...],
// "failure": message}, and removed. Nothing happens without per-rank files (bad input,
// --no-profile).
struct FailedRun {
  // "rank 2 was lost (killed by signal 9) during step 2; ranks 0,1,3 stopped"; "" without files.
  std::string message;
  std::vector<int> lost_ranks;
  int step = -1;            // the step the run was in (the lost rank's), -1 in set-up or unknown
  std::string trace;        // the merged remains; "" when nothing was merged
  std::string merge_error;  // why the merge failed (the per-rank files are then kept)
};
FailedRun salvage_failed_run(const std::string& out, int nproc, int exit_status);

// The trainer of one rank on a device (`rec` may be null): the CPU Trainer, cuda::GpuTrainer.
using TrainerFactory = std::function<std::unique_ptr<RankTrainer>(
    const Scenario& s, Communicator& world, profiler::Recorder* rec)>;

// Runs this process's rank of `s` on `world` (which must have s.world_size() ranks), on any device:
// the trainer `make` builds (the CPU Trainer when empty), the recorder, the per-rank trace file
// with the run's metadata, the device's kernel tracing, checkpoints (checkpoint.*) and --resume,
// faults.*, the steps, the reports and the merge on rank 0. Call the device's check_supported(s)
// and validate inputs before creating `world`, so bad input fails before any MPI work.
RankRunResult run_rank(const Scenario& s, Communicator& world, const RankRunOptions& opt,
                       const TrainerFactory& make = {});

// --- the run of a scenario on its device (runtime.device). The CPU runtime runs "cpu"; a device
// backend built into this program registers its own (runtime/cuda registers "cuda"), so callers
// (`orrery run`) need not know which backends a build has.
struct DeviceRunner {
  // Refuses (InputError) what the backend cannot run, a missing device included.
  std::function<void(const Scenario&)> check_supported;
  // The backend's trainer (run_rank runs it).
  TrainerFactory make_trainer;
};
// At static initialisation, once per backend (runtime/cuda/src/device_runner.cpp).
void register_device_runner(Device device, DeviceRunner runner);
// Whether a backend registered `device`.
bool has_device_runner(Device device);
// The check of the backend registered for s.runtime.device, else the CPU runtime's
// check_supported (which names the devices this build lacks).
void check_supported_on_device(const Scenario& s);
// run_rank with the trainer of the backend registered for s.runtime.device, else the CPU Trainer.
RankRunResult run_rank_on_device(const Scenario& s, Communicator& world, const RankRunOptions& opt);

// --- pieces of run_rank.
// The merged trace's path: `requested`, or rank 0's default_trace_path told to every rank.
std::string agree_on_trace_path(Communicator& world, const Scenario& s,
                                const std::string& requested);
// This rank's trace file of a run whose merged trace is `out` (rank_trace_path; its folder
// created), with the flight recorder dumping into it, so the records survive an abort.
std::unique_ptr<traces::TraceWriter> open_rank_trace(const std::string& out, int rank);
// The trace metadata every real run carries (source, scenario, host, start time, grid, tokens and
// model FLOPs per step); the caller adds peak_flops_per_rank and extra_json.
traces::RunMeta real_run_meta(const Scenario& s, const Layout& lay, int world_size);
traces::RankInfo real_rank_info(const Layout& lay, int rank, const std::string& host,
                                const std::string& device);
// Fills result.mean_loss (averaged over `dp_group`) and result.max_duration_ns (max over `world`)
// from result.steps: one all-reduce each, after the training steps.
void reduce_step_reports(RankRunResult& result, Communicator& dp_group, Communicator& world);
// After every rank closed its per-rank file: a barrier, then rank 0 merges the files into `out` and
// removes them. Returns `out`.
std::string merge_rank_traces(Communicator& world, const std::string& out);

// What one rank's run holds around its trainer, on any device (run_rank): the
// agreed trace path, this rank's trace file and the recorder (flushed every 0.5 s, so a SIGKILL
// loses at most that; the process's current recorder; attached to `world`), and at the end the
// step reports, the flush, the close and the merge. Destroyed early (an exception), it detaches
// the recorder (the flight recorder keeps dumping into the trace file, so an abort leaves its
// records there).
class RankSession {
 public:
  RankSession(const Scenario& s, Communicator& world, const RankRunOptions& opt);
  ~RankSession();
  RankSession(const RankSession&) = delete;
  RankSession& operator=(const RankSession&) = delete;

  profiler::Recorder& recorder() { return *rec_; }
  bool profiling() const { return writer_ != nullptr; }
  RankRunResult& result() { return result_; }
  // Profiling only: the run's metadata, this rank's row and the compute and comm streams.
  void describe(const traces::RunMeta& meta, const traces::RankInfo& rank);
  // The training loop's bookkeeping, the same on every device. start_steps(): this rank's
  // progress (step `first`) on disk. before_step(i): the test-only fault faults.kill_rank (SIGKILL
  // at the start of step faults.step: no warning, no flush, like a crash). after_step(i, r): the
  // result kept, the step's spans and progress on disk (a rank killed later keeps them), on_step.
  void start_steps(int first);
  void before_step(int i) const;
  void after_step(int i, const StepResult& r);
  // After the steps: the step reports over the groups (reduce_step_reports).
  void reduce_reports(Communicator& dp_group);
  // Detaches the recorder from the world, synchronises it, then calls `before_close` (a device's
  // last flush of its kernel records).
  void end_steps(const std::function<void()>& before_close = {});
  // Closes this rank's file and merges every rank's (rank 0); returns the result.
  RankRunResult finish();

 private:
  const Scenario& s_;
  const RankRunOptions& opt_;
  Communicator& world_;
  std::string out_;
  std::unique_ptr<traces::TraceWriter> writer_;
  std::unique_ptr<profiler::Recorder> rec_;
  RankRunResult result_;
};

}  // namespace orrery::runtime
