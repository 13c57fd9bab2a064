// `orrery export TRACE --format chrome --out FILE.json`: Chrome trace JSON for Perfetto UI
// (ui.perfetto.dev) and chrome://tracing. The JSON is streamed out, written beside FILE.json and
// renamed when whole. `--format sqlite --out FILE.db`: a copy of the trace with the per-span SQL
// table `spans` (one row per span, every attribute a column, indexed), for SQL users.
// `--format chakra --out PREFIX`: Chakra execution traces for ASTRA-sim, PREFIX.<rank>.et per
// rank and PREFIX.comm_groups.json (traces/chakra.hpp), all renamed into place when all are whole,
// read a rank at a time.
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "command.hpp"
#include "orrery/common/error.hpp"
#include "orrery/common/format.hpp"
#include "orrery/traces/chakra.hpp"
#include "orrery/traces/chrome_export.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::cli {
namespace {

struct ExportArgs {
  std::string trace;
  std::string format = "chrome";
  std::string out;
  bool json = false;
};

int run_chakra(const ExportArgs& a) {
  if (!traces::chakra_available()) traces::export_chakra({}, a.out);  // says why, exit 2
  // Streamed from the file: one rank's spans and counters in memory at a time.
  traces::TraceReader r(a.trace);
  const traces::ChakraExportSummary s = traces::export_chakra_file(r, a.out);
  if (a.json) {
    nlohmann::json j;
    j["trace"] = a.trace;
    j["format"] = a.format;
    j["out"] = a.out;
    j["files"] = s.files;
    j["ranks"] = s.ranks;
    j["nodes"] = s.nodes;
    nlohmann::json per_rank = nlohmann::json::object();
    for (const auto& [rank, n] : s.nodes_by_rank) per_rank[std::to_string(rank)] = n;
    j["nodes_by_rank"] = per_rank;
    j["data_deps"] = s.data_deps;
    j["comm_nodes"] = s.comm_nodes;
    j["metadata_nodes"] = s.phase_nodes;
    j["spans"] = s.nodes;  // one node per span
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << "wrote " << s.ranks << " Chakra execution trace" << (s.ranks == 1 ? "" : "s")
              << " " << a.out << ".<rank>.et: " << s.nodes << " nodes (" << s.comm_nodes
              << " communication, " << s.phase_nodes << " metadata) with " << s.data_deps
              << " dependencies, and " << a.out << ".comm_groups.json; ASTRA-sim reads them with "
              << "--workload-configuration=" << a.out << "\n";
  }
  return 0;
}

int run_export(const ExportArgs& a) {
  if (a.format == "chakra") return run_chakra(a);
  if (a.format != "chrome" && a.format != "sqlite") {
    throw InputError("--format " + a.format +
                     ": unknown export format, expected chrome, sqlite or chakra");
  }
  int64_t spans = 0, counters = 0;
  if (a.format == "sqlite") {
    traces::export_sqlite(a.trace, a.out);
    traces::TraceReader r(a.out);
    spans = r.span_count();
    counters = r.counter_count();
  } else {
    // Streamed from the file: memory bounded by a window of spans and the counters, not the trace.
    traces::TraceReader r(a.trace);
    traces::export_chrome_json_file(r, a.out);
    spans = r.span_count();
    counters = r.counter_count();
  }
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(a.out, ec);
  if (a.json) {
    nlohmann::json j;
    j["trace"] = a.trace;
    j["format"] = a.format;
    j["out"] = a.out;
    j["spans"] = spans;
    j["counters"] = counters;
    j["bytes"] = ec ? 0 : bytes;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << "wrote " << a.out << ": " << spans << " spans and " << counters
              << " counter samples as "
              << (a.format == "sqlite" ? "SQLite with the per-span table `spans`"
                                       : "Chrome trace JSON")
              << " (" << format_bytes(double(ec ? 0 : bytes)) << ")"
              << (a.format == "sqlite" ? "" : "; open it in ui.perfetto.dev or chrome://tracing")
              << "\n";
  }
  return 0;
}

Command setup(CLI::App& root) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* app = root.add_subcommand(
      "export",
      "Export a trace for other viewers (Chrome JSON), for SQL (SQLite with a spans table) or for "
      "ASTRA-sim (Chakra execution traces, one per rank)");
  app->add_option("trace", args->trace, "Trace file (.db)")->required();
  app->add_option("--format", args->format, "Output format: chrome, sqlite or chakra")
      ->capture_default_str();
  app->add_option(
         "--out", args->out,
         "Output file (.json, or .db for sqlite; for chakra the prefix of PREFIX.<rank>.et)")
      ->required();
  app->add_flag("--json", args->json, "Print one JSON object");
  return {app, [args]() { return run_export(*args); }};
}

const Registrar kRegistrar{setup};

}  // namespace
}  // namespace orrery::cli
