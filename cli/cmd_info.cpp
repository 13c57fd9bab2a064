// `orrery info TRACE`: what a trace file holds (source, scenario, layout, ranks, streams, span
// count, time range, schema version, whether its blocks carry checksums, whether its writer
// finished) without loading its spans. `orrery info --verify TRACE`: checks every block (CRC32C,
// decoding, index columns) and every zoom chunk; exit 0 when all are whole, 2 when any is damaged. `orrery info --index
// TRACE`: (re)writes the trace's zoom levels (traces/zoom.hpp).
#include <ctime>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "command.hpp"
#include "orrery/common/error.hpp"
#include "orrery/common/format.hpp"
#include "orrery/traces/meta_json.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/zoom.hpp"

namespace orrery::cli {
namespace {

using nlohmann::json;

struct InfoArgs {
  std::string trace;
  bool json = false;
  bool verify = false;
  bool index = false;
};

const char* kNoChecksums =
    "none (schema version 2, written before block checksums: bit flips in it "
    "cannot be detected)";

int run_verify(const InfoArgs& a) {
  const traces::TraceReader r(a.trace);
  const traces::TraceReader::Verification v = r.verify();
  const traces::ZoomVerification zv = traces::verify_zoom_levels(a.trace);
  const bool clean = v.damaged.empty() && zv.damaged.empty();
  if (a.json) {
    json j;
    j["path"] = a.trace;
    j["schema_version"] = r.schema_version();
    j["checksums"] = v.checksums;
    j["span_blocks"] = v.span_blocks;
    j["spans"] = v.spans;
    j["counter_blocks"] = v.counter_blocks;
    j["counter_samples"] = v.counter_samples;
    j["damaged"] = v.damaged;
    j["zoom_chunks"] = zv.chunks;
    j["zoom_unused"] = zv.unused;
    j["zoom_damaged"] = zv.damaged;
    j["ok"] = clean;
    std::cout << j.dump(2) << "\n";
    return clean ? 0 : 2;
  }
  std::printf("%s: checked %lld span blocks (%lld spans) and %lld counter blocks (%lld samples)\n",
              a.trace.c_str(), static_cast<long long>(v.span_blocks),
              static_cast<long long>(v.spans), static_cast<long long>(v.counter_blocks),
              static_cast<long long>(v.counter_samples));
  if (!v.checksums) std::printf("  checksums: %s; the blocks were decoded only\n", kNoChecksums);
  if (zv.unused.empty()) {
    std::printf("  zoom levels: %lld chunks checked\n", static_cast<long long>(zv.chunks));
  } else {
    std::printf("  zoom levels: not used (%s; `orrery info --index` rewrites them)\n",
                zv.unused.c_str());
  }
  for (const auto& d : zv.damaged) std::fprintf(stderr, "  %s\n", d.c_str());
  if (!zv.damaged.empty() && v.damaged.empty()) {
    std::fprintf(stderr, "%s: %zu of %lld zoom chunks damaged (the blocks are whole)\n",
                 a.trace.c_str(), zv.damaged.size(), static_cast<long long>(zv.chunks));
    return 2;
  }
  if (clean) {
    std::printf("  ok: %s\n",
                v.checksums ? "every block matches its CRC32C and decodes" : "every block decodes");
    return 0;
  }
  std::fprintf(stderr, "%s: %zu of %lld blocks damaged:\n", a.trace.c_str(), v.damaged.size(),
               static_cast<long long>(v.span_blocks + v.counter_blocks));
  for (const auto& d : v.damaged) std::fprintf(stderr, "  %s\n", d.c_str());
  return 2;
}

std::string utc_time(int64_t unix_ns) {
  if (unix_ns <= 0) return "unknown";
  const std::time_t secs = static_cast<std::time_t>(unix_ns / 1000000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

json parse_extra(const std::string& text) {
  try {
    return json::parse(text.empty() ? "{}" : text);
  } catch (const json::exception&) {
    return text;  // not JSON: shown as the text it is
  }
}

// What `orrery info` reads of a trace: its tables without its spans.
struct InfoData {
  explicit InfoData(const std::string& path)
      : r(path),
        m(r.meta()),
        ranks(r.ranks()),
        streams(r.streams()),
        comms(r.communicators()),
        range(r.time_range()),
        spans(r.span_count()),
        counters(r.counter_count()),
        complete(r.complete()) {
    for (const auto& b : r.stream_bounds()) per_stream[{b.rank, b.stream}] = b.count;
  }
  const traces::TraceReader r;
  const traces::RunMeta m;
  const std::vector<traces::RankInfo> ranks;
  const std::vector<traces::StreamInfo> streams;
  const std::vector<traces::CommunicatorInfo> comms;
  const decltype(std::declval<traces::TraceReader>().time_range()) range;
  const int64_t spans, counters;
  const bool complete;
  std::map<std::pair<int32_t, int32_t>, int64_t> per_stream;  // (rank, stream) -> spans
};

void print_info_json(const InfoArgs& a, const InfoData& d) {
  const traces::TraceReader& r = d.r;
  const traces::RunMeta& m = d.m;
  const auto& [ranks, streams, comms, range, spans, counters, complete, per_stream] =
      std::tie(d.ranks, d.streams, d.comms, d.range, d.spans, d.counters, d.complete, d.per_stream);
  json j;
  j["path"] = a.trace;
  j["schema_version"] = r.schema_version();
  j["block_checksums"] = r.checksums();
  j["complete"] = complete;
  j["source"] = std::string(traces::to_string(m.source));
  j["scenario_name"] = m.scenario_name;
  j["host"] = m.host;
  j["start_time_unix_ns"] = m.start_time_unix_ns;
  j["world_size"] = m.world_size;
  j["origin"] = std::string(traces::to_string(m.origin));
  j["layout"] = m.layout;
  j["layout"]["dp"] = m.dp;
  j["layout"]["tp"] = m.tp;
  j["layout"]["pp"] = m.pp;
  j["failure"] = m.failure.failed ? nlohmann::json(m.failure) : nlohmann::json(nullptr);
  j["tokens_per_step"] = m.tokens_per_step;
  j["model_flops_per_step"] = m.model_flops_per_step;
  j["peak_flops_per_rank"] = m.peak_flops_per_rank;
  j["span_count"] = spans;
  j["counter_count"] = counters;
  if (range) {
    j["time_range"] = {{"start_ns", range->start_ns},
                       {"end_ns", range->end_ns},
                       {"duration_ns", range->end_ns - range->start_ns}};
  } else {
    j["time_range"] = nullptr;
  }
  j["ranks"] = json::array();
  for (const auto& rk : ranks) {
    j["ranks"].push_back({{"rank", rk.rank},
                          {"host", rk.host},
                          {"device", rk.device},
                          {"dp", rk.dp},
                          {"tp", rk.tp},
                          {"pp", rk.pp}});
  }
  j["streams"] = json::array();
  for (const auto& s : streams) {
    auto it = per_stream.find({s.rank, s.stream});
    j["streams"].push_back({{"rank", s.rank},
                            {"stream", s.stream},
                            {"name", s.name},
                            {"spans", it == per_stream.end() ? 0 : it->second}});
  }
  j["communicators"] = json::array();
  for (const auto& c : comms) {
    j["communicators"].push_back({{"id", c.id},
                                  {"kind", std::string(traces::to_string(c.kind))},
                                  {"name", c.name},
                                  {"ranks", c.ranks}});
  }
  j["extra"] = parse_extra(m.extra_json);
  std::cout << j.dump(2) << "\n";
}

void print_info_text(const InfoArgs& a, const InfoData& d) {
  const traces::TraceReader& r = d.r;
  const traces::RunMeta& m = d.m;
  const auto& [ranks, streams, comms, range, spans, counters, complete, per_stream] =
      std::tie(d.ranks, d.streams, d.comms, d.range, d.spans, d.counters, d.complete, d.per_stream);
  auto row = [](const char* key, const std::string& value) {
    std::printf("  %-16s %s\n", key, value.c_str());
  };
  std::printf("%s\n", a.trace.c_str());
  row("schema version", std::to_string(r.schema_version()));
  row("checksums", r.checksums() ? "CRC32C on every span and counter block (orrery info --verify "
                                   "checks them all)"
                                 : kNoChecksums);
  row("zoom levels", traces::zoom_summary(a.trace));
  row("complete",
      complete ? "yes" : "no (its writer never closed it: the run died or is still running)");
  row("source", std::string(traces::to_string(m.source)) + " (origin " +
                    std::string(traces::to_string(m.origin)) + ")");
  row("scenario", m.scenario_name.empty() ? "(none)" : m.scenario_name);
  row("host", m.host.empty() ? "(unknown)" : m.host);
  row("started", utc_time(m.start_time_unix_ns));
  row("world size", std::to_string(m.world_size) + " (dp=" + std::to_string(m.dp) +
                        " tp=" + std::to_string(m.tp) + " pp=" + std::to_string(m.pp) + ")");
  if (const std::string l = traces::describe(m.layout); !l.empty()) row("layout", l);
  if (m.failure.failed)
    row("FAILED", m.failure.message.empty() ? "(no account)" : m.failure.message);
  row("spans", std::to_string(spans));
  row("counter samples", std::to_string(counters));
  if (range) {
    row("time range", std::to_string(range->start_ns) + " .. " + std::to_string(range->end_ns) +
                          " ns (" + format_duration_ns(double(range->end_ns - range->start_ns)) +
                          ")");
  } else {
    row("time range", "(no spans)");
  }
  if (m.tokens_per_step > 0) row("tokens/step", std::to_string(m.tokens_per_step));
  if (m.model_flops_per_step > 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4g", m.model_flops_per_step);
    row("model FLOPs/step", buf);
  }
  if (m.peak_flops_per_rank > 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4g TFLOP/s", m.peak_flops_per_rank / 1e12);
    row("peak per rank", buf);
  }
  row("ranks", std::to_string(ranks.size()));
  for (const auto& rk : ranks) {
    std::printf("    rank %-4d %-12s %-8s dp=%d tp=%d pp=%d\n", rk.rank, rk.host.c_str(),
                rk.device.c_str(), rk.dp, rk.tp, rk.pp);
  }
  row("streams", std::to_string(streams.size()));
  for (const auto& s : streams) {
    auto it = per_stream.find({s.rank, s.stream});
    std::printf("    rank %-4d stream %-3d %-20s %lld spans\n", s.rank, s.stream, s.name.c_str(),
                static_cast<long long>(it == per_stream.end() ? 0 : it->second));
  }
  row("communicators", std::to_string(comms.size()));
  for (const auto& c : comms) {
    std::string members;
    for (size_t i = 0; i < c.ranks.size(); ++i) {
      if (i == 8) {
        members += ", ... (" + std::to_string(c.ranks.size()) + " ranks)";
        break;
      }
      members += (i ? "," : "") + std::to_string(c.ranks[i]);
    }
    std::printf("    %-4d %-6s %-20s [%s]\n", c.id, std::string(traces::to_string(c.kind)).c_str(),
                c.name.c_str(), members.c_str());
  }
  if (!m.extra_json.empty() && m.extra_json != "{}") row("extra", m.extra_json);
}

int run_info(const InfoArgs& a) {
  if (a.verify) return run_verify(a);
  if (a.index) {
    const auto z = traces::build_zoom_levels(a.trace);
    std::printf("%s: zoom levels written (%s; %zu chunks)\n", a.trace.c_str(),
                traces::zoom_summary(a.trace).c_str(), z.chunks.size());
    return 0;
  }
  const InfoData d(a.trace);
  if (a.json) {
    print_info_json(a, d);
  } else {
    print_info_text(a, d);
  }
  return 0;
}

Command setup(CLI::App& root) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* app = root.add_subcommand("info", "Show what a trace file holds (without loading it)");
  app->add_option("trace", args->trace, "Trace file (.db)")->required();
  app->add_flag("--json", args->json, "Print one JSON object");
  app->add_flag("--verify", args->verify,
                "Check every span and counter block (CRC32C, decoding, index columns); exit 2 if "
                "any is damaged");
  app->add_flag("--index", args->index,
                "Compute the zoom levels the GUI reads (a file written before them, or stale "
                "ones) and store them in the trace");
  return {app, [args]() { return run_info(*args); }};
}

const Registrar kRegistrar{setup};

}  // namespace
}  // namespace orrery::cli
