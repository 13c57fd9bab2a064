// `orrery doctor TRACE...`: what went wrong in a run, in a paragraph, from the flight records and
// collective spans of its trace(s). TRACE is a merged trace, per-rank files, or the --out path of a
// run that died before merging (then its TRACE.rank<N>.db files are read).
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "orrery/common/error.hpp"
#include "orrery/profiler/doctor.hpp"

namespace orrery::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct DoctorArgs {
  std::vector<std::string> traces;
  double straggler_ms = 200;
  bool json = false;
};

std::vector<std::string> expand(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const auto& t : given) {
    if (fs::exists(t)) {
      out.push_back(t);
      continue;
    }
    // The output path of a run that never merged: its per-rank files.
    bool any = false;
    for (int r = 0; fs::exists(t + ".rank" + std::to_string(r) + ".db"); ++r) {
      out.push_back(t + ".rank" + std::to_string(r) + ".db");
      any = true;
    }
    if (!any) throw InputError(t + ": no such trace file (nor " + t + ".rank0.db)");
  }
  return out;
}

int run_doctor(const DoctorArgs& a) {
  // At most 1e12 ms, so the value in ns fits int64 (UBSan: float-cast-overflow on 1e308).
  if (!(a.straggler_ms > 0 && a.straggler_ms <= 1e12))
    throw InputError("--straggler-ms: must be > 0 and at most 1e12");
  const auto files = expand(a.traces);
  profiler::DoctorOptions opt;
  opt.straggler_ns = static_cast<int64_t>(a.straggler_ms * 1e6);
  // Streamed: memory bounded by the collectives in flight, not the trace (profiler/doctor.hpp).
  const profiler::DoctorResult res = profiler::diagnose_traces(files, opt);
  const profiler::DoctorReport& rep = res.report;
  if (!res.streamed)
    std::cerr << "orrery doctor: a rank's collectives arrived out of seq order; diagnosed with "
                 "every record in memory ("
              << res.records << " records): the same answer, more memory" << std::endl;
  if (a.json) {
    json j;
    j["files"] = files;
    j["records"] = res.records;
    j["collectives_matched"] = rep.collectives_matched;
    j["diagnosis"] = rep.paragraph;
    j["findings"] = json::array();
    for (const auto& f : rep.findings) {
      j["findings"].push_back({{"kind", f.kind},
                               {"comm", f.comm},
                               {"seq", f.seq},
                               {"step", f.step},
                               {"ranks", f.ranks},
                               {"text", f.text}});
    }
    std::cout << j.dump() << std::endl;
  } else {
    std::cout << rep.paragraph << std::endl;
  }
  return 0;
}

Command setup(CLI::App& root) {
  auto args = std::make_shared<DoctorArgs>();
  CLI::App* app = root.add_subcommand(
      "doctor", "Say what went wrong in a run (hang, mismatched collective, straggler)");
  app->add_option("trace", args->traces, "Trace file(s), or the --out path of a run that died")
      ->required();
  app->add_option("--straggler-ms", args->straggler_ms,
                  "Lateness at a collective that counts as straggling (default 200)");
  app->add_flag("--json", args->json, "Print one JSON object");
  return {app, [args]() { return run_doctor(*args); }};
}

const Registrar kRegistrar{setup};

}  // namespace
}  // namespace orrery::cli
