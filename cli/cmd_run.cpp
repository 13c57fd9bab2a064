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
#include "orrery/profiler/metrics.hpp"
#include "orrery/runtime/checkpoint.hpp"
#include "orrery/runtime/comm.hpp"
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
  std::string resume;  // --resume DIR: a checkpoint directory (or one checkpoint)
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
    throw InputError(a.scenario + ": key 'parallel.dp': the launcher started " +
                     std::to_string(runtime::launcher_world_size()) +
                     " ranks, but parallel.dp * tp * pp = " + std::to_string(s.world_size()));
  }
  return s;
}

int relaunch(const RunArgs& a, const Scenario& s, const std::string& resume_step_dir) {
  const int nproc = s.world_size();
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
  const std::string out = a.out.empty() ? runtime::default_trace_path(s.name) : a.out;
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
  const auto cmd = runtime::mpirun_command(mpirun, runtime::mpirun_options_for(nproc), program);
  const int rc = runtime::run_and_wait(cmd);
  if (rc != 0) {
    // Which rank was lost, and the spans recorded before the failure merged into `out`.
    const runtime::FailedRun f = runtime::salvage_failed_run(out, nproc, rc);
    if (!f.message.empty()) {
      const std::string where =
          f.trace.empty() ? "per-rank traces kept (" + f.merge_error + ")"
                          : "trace so far: " + f.trace + " (orrery doctor " + f.trace + ")";
      std::fprintf(stderr, "orrery: %s; %s\n", f.message.c_str(), where.c_str());
    }
    return rc == 2 ? 2 : (rc > 128 ? rc : 1);
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
  std::snprintf(line, sizeof line, "step %*d/%d  loss %.4f  %s  [%s]",
                static_cast<int>(std::to_string(s.training.steps).size()), r.step + 1,
                s.training.steps, r.loss,
                format_duration_ns(static_cast<double>(r.duration_ns)).c_str(), bar.c_str());
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

int run_command(const RunArgs& a) {
  const Scenario s = load_and_check(a);
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
  if (!runtime::started_by_launcher() && s.world_size() > 1) return relaunch(a, s, rp.step_dir);
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
  if (runtime::has_device_runner("cuda"))
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
