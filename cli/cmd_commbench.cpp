// `orrery commbench`: a collective sweep (all_reduce, reduce_scatter, all_gather, broadcast,
// send_recv over sizes and group sizes) on the real MPI communicator, recorded as a trace, with an
// nccl-tests-like table computed from that trace (what `orrery calibrate` sees).
//
// Launched like `orrery run`: without a launcher it checks the options and re-starts itself under
// `mpirun -n N` (launch.hpp's helpers); under mpirun/srun it is one rank: the sweep
// (runtime/commbench.hpp, which documents the trace's span names, steps and metadata), the merge of
// the per-rank traces into --out on rank 0, and rank 0 prints the table (or one JSON object).
// Bad options exit 2 before any MPI work; a rank that fails (wrong data, a watchdog) ends the job.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "command.hpp"
#include "orrery/common/error.hpp"
#include "orrery/common/format.hpp"

#if defined(ORRERY_RUNTIME_AVAILABLE)
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/commbench.hpp"
#include "orrery/runtime/launch.hpp"
#include "orrery/traces/store.hpp"
#endif

namespace orrery::cli {
namespace {

struct BenchArgs {
  int nproc = -1;  // -1: not given
  std::string min_bytes = "4K";
  std::string max_bytes = "16M";
  int iters = 5;
  int warmup = 1;
  std::string ops = "all_reduce,reduce_scatter,all_gather,broadcast,send_recv";
  std::string groups;  // "": 2,4,8 where they divide N (and N)
  std::string out;
  bool json = false;
  bool no_align = false;
};

#if defined(ORRERY_RUNTIME_AVAILABLE)
using nlohmann::json;
using runtime::BenchOp;

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    const auto b = item.find_first_not_of(" \t");
    const auto e = item.find_last_not_of(" \t");
    out.push_back(b == std::string::npos ? "" : item.substr(b, e - b + 1));
  }
  return out;
}

int64_t size_option(const char* name, const std::string& text) {
  try {
    return parse_size(text);
  } catch (const InputError& e) {
    throw InputError(std::string(name) + ": " + e.what());
  }
}

// The world size: the launcher's under mpirun/srun, else --nproc, else this machine's cores (>= 2).
int resolve_nproc(const BenchArgs& a) {
  if (runtime::started_by_launcher()) {
    const int n = runtime::launcher_world_size();
    if (a.nproc >= 0 && a.nproc != n) {
      throw InputError("--nproc " + std::to_string(a.nproc) + ", but the launcher started " +
                       std::to_string(n) + " ranks");
    }
    return n;
  }
  if (a.nproc >= 0) return a.nproc;
  return std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
}

// Everything that can be wrong with the options, checked before any process or MPI is started.
runtime::CommBenchOptions options_of(const BenchArgs& a, int nproc) {
  runtime::CommBenchOptions o;
  o.min_bytes = size_option("--min-bytes", a.min_bytes);
  o.max_bytes = size_option("--max-bytes", a.max_bytes);
  o.iters = a.iters;
  o.warmup = a.warmup;
  o.align_each_op = !a.no_align;
  o.ops.clear();
  for (const auto& name : split_list(a.ops)) {
    const auto op = runtime::bench_op_from_string(name);
    if (!op) {
      throw InputError(
          "--ops: unknown operation '" + name +
          "'; expected all_reduce, reduce_scatter, all_gather, broadcast or send_recv");
    }
    o.ops.push_back(*op);
  }
  if (!a.groups.empty()) {
    for (const auto& g : split_list(a.groups)) {
      size_t pos = 0;
      int v = 0;
      try {
        v = std::stoi(g, &pos);
      } catch (const std::exception&) {
        pos = 0;
      }
      if (g.empty() || pos != g.size())
        throw InputError("--groups: '" + g + "' is not a whole number");
      o.groups.push_back(v);
    }
  }
  // Test only: a rank that corrupts its all_reduce input (commbench.hpp), to see the data check
  // fail.
  if (const char* v = std::getenv("ORRERY_COMMBENCH_CORRUPT_RANK")) o.corrupt_rank = std::atoi(v);
  return runtime::checked_bench_options(o, nproc);
}

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

int relaunch(const BenchArgs& a, const runtime::CommBenchOptions& o, int nproc) {
  const std::string mpirun = runtime::find_executable("mpirun");
  if (mpirun.empty()) {
    throw InputError(
        "mpirun not found on PATH: commbench starts its " + std::to_string(nproc) +
        " ranks through Open MPI's mpirun (install openmpi-bin), or start `orrery commbench` "
        "under mpirun/srun yourself");
  }
  if (!runtime::mpi_available()) {
    throw InputError(
        "this orrery was built without MPI, so it cannot run commbench (install libopenmpi-dev "
        "and rebuild)");
  }
  const std::string out = a.out.empty() ? runtime::default_trace_path("commbench") : a.out;
  std::vector<std::string> program{runtime::self_executable(),
                                   "commbench",
                                   "--nproc",
                                   std::to_string(nproc),
                                   "--min-bytes",
                                   a.min_bytes,
                                   "--max-bytes",
                                   a.max_bytes,
                                   "--iters",
                                   std::to_string(a.iters),
                                   "--warmup",
                                   std::to_string(a.warmup),
                                   "--ops",
                                   a.ops,
                                   "--groups",
                                   join_ints(o.groups),
                                   "--out",
                                   out};
  if (a.json) program.push_back("--json");
  if (a.no_align) program.push_back("--no-align");
  const int rc = runtime::run_and_wait(
      runtime::mpirun_command(mpirun, runtime::mpirun_options_for(nproc), program));
  if (rc != 0) {
    const runtime::FailedRun f = runtime::salvage_failed_run(out, nproc, rc);
    if (!f.message.empty()) {
      const std::string where =
          f.trace.empty() ? "per-rank traces kept (" + f.merge_error + ")"
                          : "trace so far: " + f.trace + " (orrery doctor " + f.trace + ")";
      std::fprintf(stderr, "orrery commbench: %s; %s\n", f.message.c_str(), where.c_str());
    }
    return rc == 2 ? 2 : (rc > 128 ? rc : 1);
  }
  return 0;
}

void print_table(const std::vector<runtime::CommBenchRow>& rows, int nproc,
                 const runtime::CommBenchOptions& o, const std::string& trace, double sweep_s) {
  std::printf(
      "# orrery commbench: %d ranks, float32, %d timed iteration(s) after %d warm-up, trace %s\n",
      nproc, o.iters, o.warmup, trace.c_str());
  std::printf(
      "# time: median over timed iterations and groups of min(end) - max(start) across a "
      "collective's\n"
      "#       members (send_recv: recv end - max(send start, recv start)), as calibration "
      "measures;\n"
      "# span: median per-rank span duration; n: instances timed; skip: instances with min(end) <= "
      "max(start)\n");
  std::printf("# sweep %.1f s on rank 0\n", sweep_s);
  int last_op = -1, last_g = -1;
  for (const auto& r : rows) {
    if (static_cast<int>(r.op) != last_op || r.group_size != last_g) {
      last_op = static_cast<int>(r.op);
      last_g = r.group_size;
      std::printf("\n# %s, group size %d (%d concurrent group%s)\n",
                  std::string(runtime::to_string(r.op)).c_str(), r.group_size, r.groups,
                  r.groups == 1 ? "" : "s");
      std::printf("#%13s %11s %6s %11s %12s %12s %11s %5s %5s\n", "size(B)", "count", "type",
                  "time(us)", "algbw(GB/s)", "busbw(GB/s)", "span(us)", "n", "skip");
    }
    char time_buf[32];
    if (r.instances > 0) {
      std::snprintf(time_buf, sizeof time_buf, "%.1f", r.time_ns / 1e3);
    } else {
      std::snprintf(time_buf, sizeof time_buf, "n/a");
    }
    std::printf("%14lld %11lld %6s %11s %12.3f %12.3f %11.1f %5d %5d\n",
                static_cast<long long>(r.bytes), static_cast<long long>(r.count), "float", time_buf,
                r.algbw_gb_per_s, r.busbw_gb_per_s, r.span_median_ns / 1e3, r.instances, r.skipped);
  }
  std::fflush(stdout);
}

int run_here(const BenchArgs& a, const runtime::CommBenchOptions& o, int nproc) {
  runtime::WorldOptions wopt;
  wopt.watchdog_s = o.watchdog_s;
  auto world = runtime::make_world_communicator(wopt);
  if (world->size() != nproc) {
    throw InternalError("commbench: the world has " + std::to_string(world->size()) +
                        " ranks, expected " + std::to_string(nproc));
  }
  const int rank = world->rank();
  if (rank == 0) {
    std::fprintf(stderr, "orrery commbench: %d ranks, groups %s, %zu sizes, %zu op(s)\n", nproc,
                 join_ints(o.groups).c_str(), runtime::bench_sizes(o).size(), o.ops.size());
  }
  runtime::CommBenchRankResult res;
  try {
    res = runtime::run_commbench_rank(*world, o, a.out);
  } catch (const std::exception& e) {
    const bool input = dynamic_cast<const InputError*>(&e) != nullptr;
    std::fprintf(stderr, "orrery: rank %d: %s: %s\n", rank, input ? "error" : "internal error",
                 e.what());
    std::fflush(stderr);
    world->abort(input ? 2 : 1);
  }
  if (rank != 0) return 0;

  // The table from the merged trace: what calibration will read.
  const traces::Trace t = traces::load_trace(res.trace_path);
  const auto rows = runtime::commbench_table(t);
  const double sweep_s = static_cast<double>(res.sweep_ns) * 1e-9;
  if (a.json) {
    json j;
    j["ranks"] = nproc;
    j["trace"] = res.trace_path;
    j["kind"] = "commbench";
    j["dtype"] = "float32";
    j["iters"] = o.iters;
    j["warmup"] = o.warmup;
    j["align_each_op"] = o.align_each_op;
    j["groups"] = o.groups;
    j["sizes"] = runtime::bench_sizes(o);
    j["sweep_s"] = sweep_s;
    j["rank0_ops_issued"] = res.stats.ops_issued;
    j["rank0_elements_checked"] = res.stats.elements_checked;
    j["time_measure"] = "median over timed instances of min(end) - max(start) across members";
    j["rows"] = json::array();
    for (const auto& r : rows) {
      j["rows"].push_back({{"op", std::string(runtime::to_string(r.op))},
                           {"group_size", r.group_size},
                           {"groups", r.groups},
                           {"size_bytes", r.bytes},
                           {"count", r.count},
                           {"type", "float"},
                           {"time_us", r.time_ns / 1e3},
                           {"time_ns", r.time_ns},
                           {"algbw_gb_per_s", r.algbw_gb_per_s},
                           {"busbw_gb_per_s", r.busbw_gb_per_s},
                           {"span_median_us", r.span_median_ns / 1e3},
                           {"instances", r.instances},
                           {"skipped", r.skipped},
                           {"spans", r.spans}});
    }
    std::cout << j.dump() << std::endl;
  } else {
    print_table(rows, nproc, o, res.trace_path, sweep_s);
  }
  return 0;
}

int commbench_command(const BenchArgs& a) {
  const int nproc = resolve_nproc(a);
  const runtime::CommBenchOptions o = options_of(a, nproc);
  if (!runtime::started_by_launcher()) return relaunch(a, o, nproc);
  return run_here(a, o, nproc);
}
#endif

Command setup(CLI::App& root) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* app = root.add_subcommand("commbench",
                                      "Measure collectives over sizes and group sizes on the real "
                                      "MPI communicator, recorded as a trace");
  app->add_option(
      "--nproc,-n", a->nproc,
      "Ranks (default: the launcher's under mpirun, else this machine's cores, at least 2)");
  app->add_option("--min-bytes,-b", a->min_bytes,
                  "Smallest size (4K, 1M; sizes double up to --max-bytes)")
      ->capture_default_str();
  app->add_option("--max-bytes,-e", a->max_bytes, "Largest size")->capture_default_str();
  app->add_option("--iters", a->iters, "Timed iterations per size")->capture_default_str();
  app->add_option("--warmup", a->warmup,
                  "Warm-up iterations per size (span name bench.warmup, step -1)")
      ->capture_default_str();
  app->add_option("--ops", a->ops,
                  "Comma-separated: all_reduce, reduce_scatter, all_gather, broadcast, send_recv")
      ->capture_default_str();
  app->add_option(
      "--groups", a->groups,
      "Comma-separated group sizes, each dividing N (default: 2,4,8 where they divide N, and N)");
  app->add_option("--out,-o", a->out, "Merged trace file (default out/commbench-<time>.db)");
  app->add_flag("--json", a->json, "Print one JSON object with the rows");
  app->add_flag("--no-align", a->no_align,
                "Line the ranks up (a world barrier) only before each size's first operation, not "
                "before every one");
  auto run = [a]() -> int {
#if defined(ORRERY_RUNTIME_AVAILABLE)
    return commbench_command(*a);
#else
    throw InputError(
        "orrery commbench: this orrery was built without the CPU runtime (needs OpenBLAS and MPI)");
#endif
  };
  return Command{app, run};
}

const Registrar kRegistrar{setup};

}  // namespace
}  // namespace orrery::cli
