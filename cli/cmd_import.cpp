// `orrery import kineto|nsys|chakra FILE... --out TRACE`: converts PyTorch profiler (Kineto)
// Chrome-trace JSON, Nsight Systems SQLite exports or Chakra execution traces (files, or the prefix
// P of P.<rank>.et) into an Orrery trace (meta source = import), and prints what it found: ranks,
// spans by kind, steps. The mapping rules are in traces/import.hpp and traces/chakra.hpp.
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "orrery/common/error.hpp"
#include "orrery/traces/import.hpp"
#include "orrery/traces/span.hpp"

namespace orrery::cli {
namespace {

struct ImportArgs {
  std::string format;
  std::vector<std::string> files;
  std::string out;
  bool json = false;
};

std::string steps_text(const std::vector<int32_t>& steps) {
  if (steps.empty()) return "none";
  std::string s = std::to_string(steps.size()) + " (";
  // Consecutive ids print as a range: "3 (2..4)".
  bool consecutive = true;
  for (size_t i = 1; i < steps.size(); ++i)
    consecutive = consecutive && steps[i] == steps[i - 1] + 1;
  if (consecutive && steps.size() > 1) {
    s += std::to_string(steps.front()) + ".." + std::to_string(steps.back());
  } else {
    for (size_t i = 0; i < steps.size(); ++i) s += (i ? "," : "") + std::to_string(steps[i]);
  }
  return s + ")";
}

Command setup(CLI::App& root) {
  auto args = std::make_shared<ImportArgs>();
  CLI::App* app = root.add_subcommand(
      "import",
      "Convert PyTorch profiler (Kineto) JSON, Nsight Systems SQLite exports or Chakra "
      "execution traces to a trace");
  app->add_option(
         "format", args->format,
         "kineto (Chrome-trace JSON), nsys (nsys export --type sqlite) or chakra (.et files)")
      ->required();
  app->add_option("files", args->files,
                  "Input files, one or more ranks of one job (chakra: files or their prefix P of "
                  "P.<rank>.et)")
      ->required();
  app->add_option("--out", args->out, "Output trace file")->required();
  app->add_flag("--json", args->json, "Print one JSON object");

  auto run = [args]() {
    const traces::ImportFormat format = traces::import_format_from_string(args->format);
    const traces::ImportSummary s = traces::import_to_file(format, args->files, args->out);
    if (args->json) {
      nlohmann::json j;
      j["out"] = args->out;
      j["format"] = std::string(traces::to_string(format));
      j["files"] = s.files;
      j["ranks"] = s.ranks;
      j["spans"] = s.spans;
      nlohmann::json kinds = nlohmann::json::object();
      for (int k = 0; k < traces::kSpanKindCount; ++k) {
        kinds[std::string(traces::to_string(static_cast<traces::SpanKind>(k)))] =
            s.spans_by_kind[static_cast<size_t>(k)];
      }
      j["spans_by_kind"] = kinds;
      j["steps"] = s.steps;
      j["collectives"] = s.collectives;
      j["communicators"] = s.communicators;
      j["counters"] = s.counters;
      j["skipped_events"] = s.skipped_events;
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << "imported " << s.files.size() << " " << traces::to_string(format) << " file"
                << (s.files.size() == 1 ? "" : "s") << " into " << args->out << ": " << s.ranks
                << " rank" << (s.ranks == 1 ? "" : "s") << ", " << s.spans << " spans, "
                << s.counters << " counter samples\n";
      std::cout << "spans by kind:";
      for (int k = 0; k < traces::kSpanKindCount; ++k) {
        const int64_t n = s.spans_by_kind[static_cast<size_t>(k)];
        if (n) std::cout << " " << traces::to_string(static_cast<traces::SpanKind>(k)) << " " << n;
      }
      std::cout << "\nsteps: " << steps_text(s.steps) << "; collectives: " << s.collectives
                << " on " << s.communicators << " communicator"
                << (s.communicators == 1 ? "" : "s");
      if (s.skipped_events) std::cout << "; events not mapped: " << s.skipped_events;
      std::cout << "\n";
    }
    return 0;
  };
  return {app, run};
}

const Registrar kRegistrar{setup};

}  // namespace
}  // namespace orrery::cli
