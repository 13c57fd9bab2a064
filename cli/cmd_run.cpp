// `orrery run SCENARIO`: trains a scenario for real on CPUs with profiling, one process per rank.
//
// Started without a launcher and asked for N > 1 ranks, it validates the scenario and re-launches
// itself through `mpirun -n N`; then prints the report of the merged trace (`orrery report`).
// Started under mpirun/srun, it is one rank: it checks the world size, trains, writes its per-rank
// trace, and rank 0 merges the traces and prints a summary (or, with --json, one object); the
// parent (or a single process) then prints the full report.
// Bad input fails before any MPI work, on every rank alike, with exit 2; a failure on one rank
// after MPI is up ends the whole job (MPI_Abort) rather than leaving the others waiting.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "orrery/common/error.hpp"
#include "orrery/common/format.hpp"
#include "orrery/common/scenario.hpp"
#include "orrery/common/stats.hpp"

#if defined(ORRERY_RUNTIME_AVAILABLE)
#include "orrery/common/slurm.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/runtime/checkpoint.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/elastic.hpp"
#include "orrery/runtime/launch.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/traces/store.hpp"
#endif

namespace orrery::cli {
namespace {

struct RunArgs {
  std::string scenario;
  int nproc = 0;  // 0: the scenario's dp*tp*pp
  std::string device;
  std::string out;
  std::vector<std::string> sets;
  bool json = false;
  bool no_profile = false;
  std::string resume;    // --resume DIR: a checkpoint directory (or one checkpoint)
  int max_restarts = 0;  // --max-restarts N: restarts of a job whose rank died
  int min_nproc = 0;     // --min-nproc M: the fewest ranks a restart may run on (0: nproc)
  std::string hostfile;  // --hostfile FILE: passed to mpirun; its slots re-read at each restart
};

#if defined(ORRERY_RUNTIME_AVAILABLE)
using nlohmann::json;

std::vector<std::string> overrides_of(const RunArgs& a) {
  std::vector<std::string> o = a.sets;
  if (!a.device.empty()) o.push_back("runtime.device=" + a.device);
  if (a.no_profile) o.push_back("profile.enabled=false");
  return o;
}

// --resume DIR: the checkpoint to continue from (verified), checked against the scenario;
// none without --resume.
runtime::ResumePoint resolve_resume(const RunArgs& a, const Scenario& s) {
  if (a.resume.empty()) return {};
  runtime::ResumePoint rp = runtime::find_resume_point(a.resume);
  runtime::check_resume_compatible(rp.manifest, s, a.scenario);
  return rp;
}

// Everything that can be wrong with the input, checked before any process or MPI is started.
Scenario load_and_check(const RunArgs& a) {
  Scenario s = load_scenario(a.scenario, overrides_of(a));
  runtime::check_supported_on_device(s);  // a device backend also checks its device is present
  if (s.data.source == "text" && !std::filesystem::is_regular_file(s.data.path)) {
    throw InputError(a.scenario + ": key 'data.path': no such file '" + s.data.path +
                     "' (paths are relative to the working directory)");
  }
  const int nproc = a.nproc > 0 ? a.nproc : s.world_size();
  if (nproc != s.world_size()) {
    throw InputError(a.scenario + ": key 'parallel.dp': --nproc " + std::to_string(nproc) +
                     " ranks, but parallel.dp * tp * pp = " + std::to_string(s.parallel.dp) +
                     " * " + std::to_string(s.parallel.tp) + " * " + std::to_string(s.parallel.pp) +
                     " = " + std::to_string(s.world_size()) + " (set --set parallel.dp=" +
                     std::to_string(nproc / std::max(1, s.parallel.tp * s.parallel.pp)) +
                     ", keeping training.global_batch a multiple of dp * micro_batch)");
  }
  if (runtime::started_by_launcher() && runtime::launcher_world_size() != s.world_size()) {
    const auto job = slurm_job();
    const std::string who =
        job && !job->step_id.empty()
            ? "srun (" + slurm_text(*job) + ") started " +
                  std::to_string(runtime::launcher_world_size()) + " tasks"
            : "the launcher started " + std::to_string(runtime::launcher_world_size()) + " ranks";
    throw InputError(a.scenario + ": key 'parallel.dp': " + who +
                     ", but parallel.dp * tp * pp = " + std::to_string(s.world_size()) +
                     (job ? " (ask srun/sbatch for --ntasks=" + std::to_string(s.world_size()) + ")"
                          : std::string()));
  }
  return s;
}

// mpirun and MPI, which starting ranks from here needs.
std::string check_launcher(int nproc) {
  // Inside a batch script or an salloc shell mpirun takes the allocation's slots; a layout larger
  // than the allocation is said now, not oversubscribed onto its nodes.
  if (const std::string why = slurm_allocation_problem(nproc); !why.empty()) throw InputError(why);
  const std::string mpirun = runtime::find_executable("mpirun");
  if (mpirun.empty()) {
    throw InputError("mpirun not found on PATH: --nproc " + std::to_string(nproc) +
                     " starts ranks through Open MPI's mpirun (install openmpi-bin), or start "
                     "`orrery run` under mpirun/srun yourself");
  }
  if (!runtime::mpi_available()) {
    throw InputError("this orrery was built without MPI, so it cannot run " +
                     std::to_string(nproc) + " ranks (install libopenmpi-dev and rebuild)");
  }
  return mpirun;
}

struct Launch {
  int rc = 0;
  runtime::FailedRun failed;  // when rc != 0
};

// One mpirun of the job's s.world_size() ranks, writing `out`; a failure's remains are salvaged
// into `out` and said.
Launch launch_once(const std::string& mpirun, const RunArgs& a, const Scenario& s,
                   const std::string& out, const std::string& resume_step_dir) {
  const int nproc = s.world_size();
  std::vector<std::string> program{runtime::self_executable(), "run",   a.scenario, "--nproc",
                                   std::to_string(nproc),      "--out", out};
  if (!a.device.empty()) program.insert(program.end(), {"--device", a.device});
  for (const auto& kv : a.sets) program.insert(program.end(), {"--set", kv});
  if (a.json) program.push_back("--json");
  if (a.no_profile) program.push_back("--no-profile");
  // The ranks continue from the checkpoint chosen here (they verify it again, not choose anew).
  if (!resume_step_dir.empty()) {
    program.insert(program.end(), {"--resume", resume_step_dir});
    ::setenv("ORRERY_RESUME_REPORTED", "1", 1);
  }
  runtime::MpirunOptions mo = runtime::mpirun_options_for(nproc);
  mo.hostfile = a.hostfile;
  if (!resume_step_dir.empty()) mo.export_env.push_back("ORRERY_RESUME_REPORTED");
  if (std::getenv(runtime::kAttemptsEnv)) mo.export_env.push_back(runtime::kAttemptsEnv);
  Launch l;
  l.rc = runtime::run_and_wait(runtime::mpirun_command(mpirun, mo, program));
  if (l.rc != 0) {
    // Which rank was lost, and the spans recorded before the failure merged into `out`.
    l.failed = runtime::salvage_failed_run(out, nproc, l.rc);
    if (!l.failed.message.empty()) {
      const std::string where =
          l.failed.trace.empty()
              ? "per-rank traces kept (" + l.failed.merge_error + ")"
              : "trace so far: " + l.failed.trace + " (orrery doctor " + l.failed.trace + ")";
      std::fprintf(stderr, "orrery: %s; %s\n", l.failed.message.c_str(), where.c_str());
    }
  }
  return l;
}

int exit_code_of(int rc) { return rc == 2 ? 2 : (rc > 128 ? rc : 1); }

// The remains of attempt k of an elastic job, kept beside the final trace: OUT.attempt<k>.db.
std::string attempt_trace_path(const std::string& out, int k) {
  std::filesystem::path p(out);
  return (p.parent_path() / (p.stem().string() + ".attempt" + std::to_string(k) + ".db")).string();
}

std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

std::string seconds_text(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", static_cast<double>(ns) * 1e-9);
  return buf;
}

// The layout a restart runs on: the job's, or with fewer data-parallel replicas when the hostfile
// (re-read now) has fewer slots, down to --min-nproc. The scenario with that dp must validate and
// the checkpoint must map onto it. Throws InputError when no layout fits.
struct RestartLayout {
  RunArgs args;
  Scenario s;
  std::string why;  // "" on the job's layout
};
RestartLayout restart_layout(const RunArgs& a, const Scenario& s, const runtime::ResumePoint* rp) {
  const int tp_pp = s.parallel.tp * s.parallel.pp;
  int slots = s.world_size();
  if (!a.hostfile.empty()) slots = std::min(slots, runtime::hostfile_slots(a.hostfile));
  const int min_nproc = a.min_nproc > 0 ? a.min_nproc : s.world_size();
  std::string tried;
  for (int dp = slots / tp_pp; dp * tp_pp >= min_nproc && dp >= 1; --dp) {
    RestartLayout l{a, s, ""};
    if (dp != s.parallel.dp) {
      l.args.sets.push_back("parallel.dp=" + std::to_string(dp));
      l.args.nproc = dp * tp_pp;
      try {
        l.s = load_scenario(a.scenario, overrides_of(l.args));
        if (rp) runtime::check_resume_compatible(rp->manifest, l.s, rp->step_dir);
      } catch (const InputError& e) {
        tried += std::string("\n  dp=") + std::to_string(dp) + ": " + e.what();
        continue;
      }
      l.why = "only " + std::to_string(slots) + " slot(s) in " + a.hostfile + ": dp " +
              std::to_string(s.parallel.dp) + " -> " + std::to_string(dp) +
              " (training.global_batch kept: each replica accumulates more micro-batches)";
    }
    return l;
  }
  throw InputError("orrery run: cannot restart: " + std::to_string(slots) + " slot(s) in " +
                   (a.hostfile.empty() ? std::string("this job") : a.hostfile) +
                   ", and no layout of at least --min-nproc " + std::to_string(min_nproc) +
                   " ranks (tp*pp = " + std::to_string(tp_pp) + ") fits" + tried);
}

// --max-restarts N: attempt after attempt until one finishes or N restarts are spent. Each restart
// continues from the newest complete checkpoint this job wrote (else where the job started).
int run_elastic(const std::string& mpirun, const RunArgs& a, const Scenario& s,
                const std::string& out, const runtime::ResumePoint& first) {
  const int64_t job_start_ns = runtime::unix_time_ns();
  const std::string ckpt_dir = !s.checkpoint.dir.empty() ? s.checkpoint.dir
                               : first.step_dir.empty()
                                   ? std::string("checkpoints")
                                   : std::filesystem::path(first.step_dir).parent_path().string();
  std::vector<runtime::Attempt> attempts;
  RestartLayout cur{a, s, ""};
  runtime::ResumePoint resume = first;
  for (int k = 1;; ++k) {
    runtime::Attempt at;
    at.attempt = k;
    at.nproc = cur.s.world_size();
    at.dp = cur.s.parallel.dp;
    at.resumed_from = resume.step_dir;
    at.resumed_from_step = resume.step_dir.empty() ? 0 : resume.manifest.step;
    at.start_unix_ns = runtime::unix_time_ns();
    if (!attempts.empty()) {
      runtime::Attempt& prev = attempts.back();
      const int64_t ckpt_ns =
          resume.step_dir.empty() ? 0 : runtime::checkpoint_time_unix_ns(resume.step_dir);
      prev.lost_ns = runtime::time_lost_ns(prev, ckpt_ns, at.start_unix_ns);
      const std::string who =
          prev.lost_ranks.empty()
              ? std::string("a rank (which one is unknown without a trace)")
              : (prev.lost_ranks.size() == 1 ? "rank " : "ranks ") + join_ints(prev.lost_ranks);
      const std::string from = resume.step_dir.empty()
                                   ? std::string("the start (no checkpoint of this job)")
                                   : resume.step_dir + " (step " +
                                         std::to_string(at.resumed_from_step) + " of " +
                                         std::to_string(s.training.steps) + ")";
      const std::string when = prev.failed_step >= 0
                                   ? "during step " + std::to_string(prev.failed_step)
                                   : std::string("in set-up");
      std::fprintf(stderr,
                   "orrery run: restart %d of %d (attempt %d): %s lost %s; resuming from %s on "
                   "%d rank(s) (dp=%d); %s lost\n",
                   k - 1, a.max_restarts, k, who.c_str(), when.c_str(), from.c_str(), at.nproc,
                   at.dp, seconds_text(prev.lost_ns).c_str());
      if (!cur.why.empty()) std::fprintf(stderr, "orrery run: %s\n", cur.why.c_str());
    }
    attempts.push_back(at);
    ::setenv(runtime::kAttemptsEnv, runtime::attempts_to_json(attempts).c_str(), 1);
    const Launch l = launch_once(mpirun, cur.args, cur.s, out, resume.step_dir);
    if (l.rc == 0) return 0;
    runtime::Attempt& f = attempts.back();
    f.failed = true;
    f.end_unix_ns = runtime::unix_time_ns();
    f.exit_status = l.rc;
    f.lost_ranks = l.failed.lost_ranks;
    f.failed_step = l.failed.step;
    f.failure = l.failed.message.empty() ? "mpirun exited with status " + std::to_string(l.rc)
                                         : l.failed.message;
    f.trace = l.failed.trace;
    // Bad input on the ranks fails the same way every time: no restart.
    if (l.rc == 2) return 2;
    if (k > a.max_restarts) {
      std::string why;
      for (const auto& x : attempts)
        why += "\n  attempt " + std::to_string(x.attempt) + ": " + x.failure;
      std::fprintf(stderr,
                   "orrery: error: restart limit reached: %d attempt(s) failed (--max-restarts "
                   "%d)%s\n",
                   k, a.max_restarts, why.c_str());
      return 2;
    }
    // This attempt's remains kept beside the trace the next one writes.
    if (!f.trace.empty()) {
      const std::string kept = attempt_trace_path(out, k);
      std::error_code ec;
      std::filesystem::rename(f.trace, kept, ec);
      if (!ec) f.trace = kept;
    }
    if (auto rp = runtime::newest_checkpoint_since(ckpt_dir, job_start_ns)) {
      for (const auto& why : rp->skipped)
        std::fprintf(stderr, "orrery run: skipped %s\n", why.c_str());
      resume = *rp;
    } else {
      resume = first;
    }
    cur = restart_layout(a, s, resume.step_dir.empty() ? nullptr : &resume);
  }
}

int relaunch(const RunArgs& a, const Scenario& s, const runtime::ResumePoint& rp) {
  const std::string mpirun = check_launcher(s.world_size());
  const std::string out = a.out.empty() ? runtime::default_trace_path(s.name) : a.out;
  if (a.max_restarts > 0) {
    const int rc = run_elastic(mpirun, a, s, out, rp);
    if (rc != 0) return rc;
  } else {
    const Launch l = launch_once(mpirun, a, s, out, rp.step_dir);
    if (l.rc != 0) return exit_code_of(l.rc);
  }
  if (!a.json && s.profile.enabled) {
    std::cout << std::flush;
    return runtime::run_and_wait({runtime::self_executable(), "report", out});
  }
  return 0;
}

void print_progress(const Scenario& s, const runtime::StepResult& r) {
  static const bool tty = ::isatty(STDERR_FILENO) != 0;
  const int width = 24;
  const int done = (r.step + 1) * width / std::max(1, s.training.steps);
  std::string bar(static_cast<size_t>(done), '#');
  bar.resize(width, '.');
  char line[256];
  // MoE: this rank's load-balancing loss apart from the LM loss (model/moe.hpp).
  char aux[48] = "";
  if (s.model.moe.enabled()) std::snprintf(aux, sizeof aux, "  aux %.4f", r.aux_loss);
  std::snprintf(line, sizeof line, "step %*d/%d  loss %.4f%s  %s  [%s]%s",
                static_cast<int>(std::to_string(s.training.steps).size()), r.step + 1,
                s.training.steps, r.loss, aux,
                format_duration_ns(static_cast<double>(r.duration_ns)).c_str(), bar.c_str(),
                r.skipped ? "  skipped (fp16 overflow)" : "");
  if (tty) {
    std::fprintf(stderr, "\r%s", line);
    if (r.step + 1 == s.training.steps) std::fprintf(stderr, "\n");
  } else {
    std::fprintf(stderr, "%s\n", line);
  }
  std::fflush(stderr);
}

int run_here(const RunArgs& a, const Scenario& s, const std::string& resume_step_dir) {
  runtime::WorldOptions wopt;
  wopt.watchdog_s = s.runtime.watchdog_s;
  wopt.faults.step = s.faults.step;
  wopt.faults.skip_collective_rank = s.faults.skip_collective_rank;
  wopt.faults.size_mismatch_rank = s.faults.size_mismatch_rank;
  wopt.faults.wrong_op_rank = s.faults.wrong_op_rank;
  wopt.faults.sleep_rank = s.faults.sleep_rank;
  wopt.faults.sleep_ms = s.faults.sleep_ms;
  auto world = runtime::make_world_communicator(wopt);
  const int rank = world->rank();
  runtime::RankRunResult res;
  try {
    runtime::RankRunOptions ro;
    ro.out = a.out;
    ro.profile = s.profile.enabled;
    ro.resume = resume_step_dir;
    if (rank == 0) ro.on_step = [&s](const runtime::StepResult& r) { print_progress(s, r); };
    res = runtime::run_rank_on_device(s, *world, ro);
  } catch (const std::exception& e) {
    if (world->size() <= 1) throw;
    const bool input = dynamic_cast<const InputError*>(&e) != nullptr;
    std::fprintf(stderr, "orrery: rank %d: %s: %s\n", rank, input ? "error" : "internal error",
                 e.what());
    std::fflush(stderr);
    world->abort(input ? 2 : 1);
  }
  if (rank != 0) return 0;

  // Rank 0: the figures of the run.
  const int skip = std::min(s.training.warmup_steps, static_cast<int>(res.steps.size()) - 1);
  std::vector<double> step_ns;
  for (size_t i = static_cast<size_t>(std::max(0, skip)); i < res.max_duration_ns.size(); ++i) {
    step_ns.push_back(static_cast<double>(res.max_duration_ns[i]));
  }
  const double median_ns = median(step_ns);
  const double tokens_per_s = median_ns > 0 ? res.tokens_per_step / (median_ns * 1e-9) : 0;
  const double final_loss = res.mean_loss.empty() ? 0.0 : res.mean_loss.back();
  json j;
  j["scenario"] = s.name;
  j["ranks"] = res.world_size;
  j["dp"] = s.parallel.dp;
  j["tp"] = s.parallel.tp;
  j["pp"] = s.parallel.pp;
  j["params"] = res.params;
  j["steps"] = static_cast<int>(res.steps.size());
  j["warmup_steps"] = std::max(0, skip);
  j["final_loss"] = final_loss;
  j["median_step_ms"] = median_ns * 1e-6;
  j["tokens_per_s"] = tokens_per_s;
  j["loss"] = res.mean_loss;
  j["first_step"] =
      res.steps.empty() ? s.training.steps : res.steps.front().step;  // 0 unless resumed
  j["resumed_from"] = resume_step_dir.empty() ? json(nullptr) : json(resume_step_dir);
  j["loop_ms"] = static_cast<double>(res.loop_ns) * 1e-6;
  if (s.checkpoint.every > 0) {
    const auto& c = res.checkpoint;
    j["checkpoint"] = {{"saves", c.saves},
                       {"written", c.written},
                       {"bytes", c.bytes},
                       {"background", s.checkpoint.background},
                       {"blocking_ms", static_cast<double>(c.blocking_ns) * 1e-6},
                       {"rank0_write_ms", static_cast<double>(c.write_ns) * 1e-6}};
  }
  std::vector<double> step_ms;
  for (auto d : res.max_duration_ns) step_ms.push_back(static_cast<double>(d) * 1e-6);
  j["step_ms"] = step_ms;
  j["comm_comp_ratio"] = nullptr;
  j["overlap_pct"] = nullptr;
  j["trace"] = nullptr;
  if (!res.trace_path.empty()) {
    profiler::MetricsOptions mo;
    mo.skip_steps = std::max(0, skip);
    const traces::Trace t = traces::load_trace(res.trace_path);
    const profiler::Metrics m = profiler::compute_metrics(t, mo);
    j["comm_comp_ratio"] = m.total.comm_comp_ratio();
    j["overlap_pct"] = m.total.overlap_pct();
    j["exposed_comm_ms"] = static_cast<double>(m.total.exposed_comm_ns) * 1e-6;
    j["spans"] = m.span_count;
    j["trace"] = res.trace_path;
  }
  if (a.json) {
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::cout << "orrery run: " << s.name << ", " << res.world_size
            << " rank(s) (dp=" << s.parallel.dp << " tp=" << s.parallel.tp
            << " pp=" << s.parallel.pp << "), " << res.steps.size() << " steps, " << res.params
            << " parameters\n";
  char buf[128];
  std::snprintf(buf, sizeof buf, "%.4f", final_loss);
  std::cout << "  final loss        " << buf << "\n";
  std::cout << "  median step       " << format_duration_ns(median_ns) << " (after "
            << std::max(0, skip) << " warm-up step(s); slowest rank per step)\n";
  std::snprintf(buf, sizeof buf, "%.0f", tokens_per_s);
  std::cout << "  tokens/s          " << buf << "\n";
  if (!res.trace_path.empty()) {
    std::snprintf(buf, sizeof buf, "%.3f", j["comm_comp_ratio"].get<double>());
    std::cout << "  comm/comp ratio   " << buf << "\n";
    std::snprintf(buf, sizeof buf, "%.1f %%", j["overlap_pct"].get<double>());
    std::cout << "  overlap           " << buf << "\n";
    std::cout << "  trace             " << res.trace_path << "  (orrery report " << res.trace_path
              << ")\n";
  }
  return 0;
}

// The elastic flags, against the job they restart.
void check_elastic_args(const RunArgs& a, const Scenario& s) {
  if (a.max_restarts < 0) {
    throw InputError("--max-restarts " + std::to_string(a.max_restarts) +
                     ": expected a whole number >= 0 (the restarts allowed after a rank dies)");
  }
  if (a.min_nproc != 0 || !a.hostfile.empty()) {
    if (a.min_nproc < 0) {
      throw InputError("--min-nproc " + std::to_string(a.min_nproc) + ": expected a number >= 1");
    }
    if (a.min_nproc > s.world_size()) {
      throw InputError("--min-nproc " + std::to_string(a.min_nproc) + ": more than the job's " +
                       std::to_string(s.world_size()) +
                       " ranks (a restart runs on the same number of ranks or fewer)");
    }
    const int tp_pp = s.parallel.tp * s.parallel.pp;
    if (a.min_nproc > 0 && a.min_nproc < tp_pp) {
      throw InputError("--min-nproc " + std::to_string(a.min_nproc) + ": below tp*pp = " +
                       std::to_string(tp_pp) + ", the fewest ranks of one data-parallel replica");
    }
    if (a.min_nproc > 0 && a.max_restarts == 0) {
      throw InputError("--min-nproc " + std::to_string(a.min_nproc) +
                       ": only a restart shrinks a job; give --max-restarts N too");
    }
    if (!a.hostfile.empty()) runtime::hostfile_slots(a.hostfile);  // readable, parseable
  }
  if (a.max_restarts > 0 && runtime::started_by_launcher()) {
    throw InputError("--max-restarts " + std::to_string(a.max_restarts) +
                     ": orrery run restarts only a job it starts itself (--nproc N, without "
                     "mpirun/srun around it); under a launcher, that launcher restarts the job");
  }
}

int run_command(const RunArgs& a) {
  Scenario s = load_and_check(a);
  check_elastic_args(a, s);
  // A rank of an elastic job: the test-only faults fire on its first attempt only (unless
  // faults.every_attempt).
  if (runtime::started_by_launcher()) {
    const auto attempts = runtime::attempts_from_env();
    if (!attempts.empty()) runtime::faults_for_attempt(s, attempts.back().attempt);
  }
  const runtime::ResumePoint rp = resolve_resume(a, s);
  // Said once: by the process the user started, or by rank 0 when the user started mpirun (the
  // re-launch marks its ranks with ORRERY_RESUME_REPORTED).
  if (!rp.step_dir.empty() &&
      (!runtime::started_by_launcher() ||
       (runtime::launcher_world_rank() == 0 && !std::getenv("ORRERY_RESUME_REPORTED")))) {
    for (const auto& why : rp.skipped)
      std::fprintf(stderr, "orrery run: skipped %s\n", why.c_str());
    std::fprintf(
        stderr,
        "orrery run: resuming from %s (step %d of %d, written with dp=%d tp=%d pp=%d zero=%d)\n",
        rp.step_dir.c_str(), rp.manifest.step, s.training.steps, rp.manifest.dp, rp.manifest.tp,
        rp.manifest.pp, rp.manifest.zero);
  }
  // Restarts need a launcher to restart, so an elastic job of one rank goes through mpirun too.
  if (!runtime::started_by_launcher() && (s.world_size() > 1 || a.max_restarts > 0))
    return relaunch(a, s, rp);
  RunArgs here = a;
  // Without a launcher the trace needs a fixed name now, for the report below.
  if (here.out.empty() && !runtime::started_by_launcher()) {
    here.out = runtime::default_trace_path(s.name);
  }
  const int rc = run_here(here, s, rp.step_dir);
  // A single process started by hand: add the full report, as the mpirun parent does. (Under a
  // launcher the rank must not fork; its summary stands.)
  if (rc == 0 && !runtime::started_by_launcher() && !a.json && s.profile.enabled) {
    std::cout << std::flush;
    return runtime::run_and_wait({runtime::self_executable(), "report", here.out});
  }
  return rc;
}
#endif

std::string device_help() {
#if defined(ORRERY_RUNTIME_AVAILABLE)
  if (runtime::has_device_runner(orrery::Device::Cuda))
    return "cpu, or cuda (needs a GPU; dp, ZeRO 1/2/3, tp and pp)";
#endif
  return "cpu (cuda: not in this build)";
}

Command setup(CLI::App& root) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* app = root.add_subcommand(
      "run", "Train a scenario for real on CPUs with profiling (N ranks through mpirun)");
  app->add_option("scenario", args->scenario, "Scenario YAML file")->required();
  app->add_option("--nproc,-n", args->nproc,
                  "Ranks to run (default: the scenario's parallel.dp*tp*pp); must equal dp*tp*pp");
  app->add_option("--device", args->device, device_help())->check(CLI::IsMember({"cpu", "cuda"}));
  app->add_option("--out,-o", args->out, "Merged trace file (default out/<scenario>-<time>.db)");
  app->add_option("--set", args->sets, "Override a scenario key, e.g. --set training.steps=20")
      ->allow_extra_args(false);
  app->add_flag("--json", args->json, "Print one JSON object at the end");
  app->add_flag("--no-profile", args->no_profile, "Do not record a trace");
  app->add_option(
      "--resume", args->resume,
      "Continue from the latest complete checkpoint in DIR (or from the checkpoint DIR); "
      "dp and parallel.zero may differ from the run that wrote it");
  app->add_option("--max-restarts", args->max_restarts,
                  "Restart the job this many times when a rank dies, each time from the newest "
                  "complete checkpoint it wrote (as torchrun's --max-restarts; default 0)");
  app->add_option("--min-nproc", args->min_nproc,
                  "With --max-restarts: a restart that cannot have all ranks (--hostfile slots) "
                  "runs on fewer, down to this many (dp shrinks)");
  app->add_option("--hostfile", args->hostfile,
                  "Open MPI hostfile passed to mpirun; its slots are read again at each restart");
  auto run = [args]() -> int {
#if defined(ORRERY_RUNTIME_AVAILABLE)
    return run_command(*args);
#else
    throw InputError(
        "orrery run: this orrery was built without the CPU runtime (needs OpenBLAS: "
        "install libopenblas-dev and rebuild)");
#endif
  };
  return Command{app, run};
}

const Registrar kRegistrar{setup};

}  // namespace
}  // namespace orrery::cli
