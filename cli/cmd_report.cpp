// `orrery report`: the first metrics a performance engineer asks for (profiler/metrics.hpp), as
// readable tables or one JSON object; --compare puts two traces' summaries side by side.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "orrery/common/error.hpp"
#include "orrery/common/format.hpp"
#include "orrery/common/slurm.hpp"
#include "orrery/model/names.hpp"
#include "orrery/profiler/compare.hpp"
#include "orrery/profiler/compression_metrics.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/profiler/moe_metrics.hpp"
#include "orrery/traces/meta_json.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::cli {
namespace {

using nlohmann::json;
using profiler::Metrics;
using profiler::TimeBreakdown;

struct ReportArgs {
  ReportArgs() { opt.skip_steps = -1; }  // -1: the trace's own warm-up (warmup_steps below)
  std::string trace;
  std::string compare;
  bool json = false;
  profiler::MetricsOptions opt;
  double peak_tflops = 0;
};

// The warm-up steps the producer of a trace left out of its own figures (meta extra_json
// "warmup_steps": `orrery run`'s training.warmup_steps, `orrery sim`'s first step when it simulates
// more than one), 0 when it does not say: the report's default, so `orrery report` of a run or a
// simulation counts the steps the run's or the simulation's own summary counted.
int warmup_steps_of(const traces::RunMeta& meta) {
  const json extra = json::parse(meta.extra_json.empty() ? "{}" : meta.extra_json, nullptr, false);
  if (!extra.is_object() || !extra.contains("warmup_steps") ||
      !extra["warmup_steps"].is_number_integer())
    return 0;
  return std::max(0, extra["warmup_steps"].get<int>());
}

// fp16 dynamic loss scaling, from rank 0's loss_scale and skipped_steps counters (model/names.hpp):
// empty (steps 0) for a run without it.
struct LossScaling {
  int64_t steps = 0;    // steps with a loss_scale sample
  int64_t skipped = 0;  // steps skipped for an inf / NaN gradient
  double first_scale = 0, last_scale = 0, min_scale = 0;
};

// `rank`: the lowest with counters (of any name: the header may hold only some).
LossScaling loss_scaling_of(const traces::Trace& t, int32_t rank) {
  LossScaling ls;
  const traces::NameId scale = t.strings.find(model::names::kLossScale);
  const traces::NameId skipped = t.strings.find(model::names::kSkippedSteps);
  int64_t last_ts = -1;
  for (const auto& c : t.counters) {
    if (c.rank != rank) continue;
    if (c.name == scale) {
      if (ls.steps == 0) ls.first_scale = ls.min_scale = c.value;
      ls.min_scale = std::min(ls.min_scale, c.value);
      if (c.ts_ns >= last_ts) {
        ls.last_scale = c.value;
        last_ts = c.ts_ns;
      }
      ++ls.steps;
    } else if (c.name == skipped) {
      ls.skipped = std::max(ls.skipped, static_cast<int64_t>(c.value));
    }
  }
  return ls;
}

struct Loaded {
  traces::Trace trace;  // without --compare only the header (no spans): the report streams them
  Metrics m;
  profiler::CompressionMetrics comp;  // empty without gradient compression
  profiler::MoeMetrics moe;           // empty without MoE blocks
  LossScaling scaling;                // steps 0 without fp16 loss scaling
  bool complete = true;  // false when the trace's writer never closed it (a run that died)
  int32_t first_counter_rank = 0;
};

// `streamed`: the metrics and the compression figures from two streaming passes over the span
// blocks (memory bounded by ranks and collectives, not spans); otherwise the whole trace is
// loaded (--compare needs the spans of both traces).
Loaded load_and_compute(const std::string& path, const profiler::MetricsOptions& opt,
                        bool streamed) {
  Loaded l;
  {
    traces::TraceReader reader(path);
    l.complete = reader.complete();
    // Streamed, the memory counters stay in the file (compute_metrics_streamed reads them).
    l.trace =
        streamed
            ? reader.load_header([](std::string_view name) { return name.rfind("mem.", 0) != 0; })
            : reader.load_all();
    l.first_counter_rank = reader.first_counter_rank().value_or(0);
    l.trace.path = path;
    profiler::MetricsOptions o = opt;
    if (o.skip_steps < 0) o.skip_steps = warmup_steps_of(l.trace.meta);
    if (streamed) {
      profiler::CompressionAccumulator comp(l.trace);
      profiler::MoeAccumulator moe(l.trace);
      l.m = profiler::compute_metrics_streamed(reader, l.trace, o,
                                               [&comp, &moe](std::span<const traces::Span> spans) {
                                                 for (const auto& s : spans) {
                                                   comp.add(s);
                                                   moe.add(s);
                                                 }
                                               });
      l.comp = comp.result();
      l.moe = moe.result();
    } else {
      l.m = profiler::compute_metrics(l.trace, o);
      l.comp = profiler::compression_metrics(l.trace);
      l.moe = profiler::moe_metrics(l.trace);
    }
  }
  l.scaling = loss_scaling_of(l.trace, l.first_counter_rank);  // counters: in the header too
  if (!l.complete) {
    std::cerr << "orrery: warning: " << path
              << " is incomplete (its writer never closed it); the figures cover what it holds\n";
  }
  return l;
}

// The failures of an elastic job (`orrery run --max-restarts`, meta extra_json "attempts"): one
// per failed attempt, with the step the next attempt resumed from and the time lost.
struct Restart {
  int attempt = 0;
  std::vector<int> lost_ranks;
  int failed_step = -1;
  int resumed_from_step = 0;  // of the attempt after it
  int nproc = 0, next_nproc = 0;
  int64_t lost_ns = 0;
  std::string failure, trace;
};

std::vector<Restart> restarts_of(const traces::RunMeta& meta) {
  std::vector<Restart> out;
  json extra;
  try {
    extra = json::parse(meta.extra_json.empty() ? "{}" : meta.extra_json);
  } catch (const json::exception&) {
    return out;
  }
  if (!extra.is_object() || !extra.contains("attempts") || !extra["attempts"].is_array())
    return out;
  const json& at = extra["attempts"];
  for (size_t i = 0; i + 1 < at.size(); ++i) {
    const json& a = at[i];
    if (!a.value("failed", false)) continue;
    Restart r;
    r.attempt = a.value("attempt", 0);
    r.lost_ranks = a.value("lost_ranks", std::vector<int>{});
    r.failed_step = a.value("failed_step", -1);
    r.nproc = a.value("nproc", 0);
    r.lost_ns = a.value("lost_ns", int64_t{0});
    r.failure = a.value("failure", std::string());
    r.trace = a.value("trace", std::string());
    r.resumed_from_step = at[i + 1].value("resumed_from_step", 0);
    r.next_nproc = at[i + 1].value("nproc", 0);
    out.push_back(std::move(r));
  }
  return out;
}

// The Slurm job a run ran in (meta extra_json "slurm", runtime/slurm.hpp); null when none.
json slurm_of(const traces::RunMeta& meta) {
  try {
    const json extra = json::parse(meta.extra_json.empty() ? "{}" : meta.extra_json);
    if (extra.is_object() && extra.contains("slurm") && extra["slurm"].is_object())
      return extra["slurm"];
  } catch (const json::exception&) {
  }
  return nullptr;
}

// The job's line as the run's own messages say it (slurm_text).
std::string slurm_line(const json& j) {
  SlurmJob job;
  job.job_id = j.value("job_id", std::string("?"));
  job.step_id = j.value("step_id", std::string());
  job.nodelist = j.value("nodelist", std::string());
  job.partition = j.value("partition", std::string());
  job.cluster = j.value("cluster", std::string());
  job.nodes = j.value("nodes", 0);
  job.tasks = j.value("tasks", 0);
  return slurm_text(job);
}

json breakdown_json(const TimeBreakdown& t) {
  return {{"window_ns", t.window_ns},
          {"compute_ns", t.compute_ns},
          {"comm_ns", t.comm_ns},
          {"memcpy_ns", t.memcpy_ns},
          {"overlap_ns", t.overlap_ns},
          {"exposed_comm_ns", t.exposed_comm_ns},
          {"idle_ns", t.idle_ns},
          {"overlap_pct", t.overlap_pct()},
          {"comm_comp_ratio", t.comm_comp_ratio()}};
}

json moe_json(const profiler::MoeMetrics& m) {
  json a2a = json::array();
  for (const auto& a : m.all_to_alls) {
    a2a.push_back({{"name", a.name},
                   {"calls", a.calls},
                   {"bytes", a.bytes},
                   {"time_ns", a.time_ns},
                   {"exposed_ns", a.exposed_ns},
                   {"group_size", a.group_size},
                   {"algbw_gbps", a.algbw_gbps()},
                   {"busbw_gbps", a.busbw_gbps()}});
  }
  json blocks = json::array();
  for (const auto& b : m.blocks) {
    blocks.push_back({{"layer", b.layer},
                      {"tokens_per_expert", b.tokens},
                      {"imbalance", b.imbalance()},
                      {"dropped", b.dropped},
                      {"dropped_fraction", b.dropped_fraction()}});
  }
  return {{"all_to_alls", std::move(a2a)},
          {"all_to_all_ns", m.all_to_all_ns},
          {"exposed_all_to_all_ns", m.exposed_ns},
          {"blocks", std::move(blocks)}};
}

json compression_json(const profiler::CompressionMetrics& c) {
  json colls = json::array();
  for (const auto& cc : c.collectives) {
    colls.push_back({{"name", cc.name},
                     {"calls", cc.calls},
                     {"wire_bytes", cc.wire_bytes},
                     {"raw_bytes", cc.raw_bytes},
                     {"saved_bytes", cc.saved_bytes()}});
  }
  return {{"collectives", std::move(colls)},
          {"buckets", c.buckets},
          {"raw_bytes", c.raw_bytes},
          {"wire_bytes", c.wire_bytes},
          {"saved_bytes", c.saved_bytes()},
          {"ratio", c.ratio()},
          {"compress_ns", c.compress_ns},
          {"decompress_ns", c.decompress_ns},
          {"ranks", c.ranks},
          {"steps", c.steps}};
}

// The mean step account over ranks and counted steps (profiler::account_step: what `orrery sim`
// prints as its breakdown, so a simulated trace's report shows the same figures).
profiler::StepAccount mean_step_account(const Metrics& m) {
  profiler::StepAccount sum;
  for (const auto& r : m.ranks) sum += r.counted;
  const int64_t n = int64_t(m.ranks.size()) * m.counted_steps;
  if (n <= 0) return {};
  return {sum.window_ns / n,     sum.compute_ns / n, sum.exposed_tp_ns / n,
          sum.exposed_dp_ns / n, sum.p2p_ns / n,     sum.rest_ns / n};
}

// The placeholder report_json puts for rank ri's by_step when write_report_json writes them.
std::string by_step_placeholder(size_t ri) { return "\x01by_step " + std::to_string(ri); }

json report_json(const Loaded& l, bool by_step_placeholders = false) {
  const Metrics& m = l.m;
  json j;
  j["trace"] = l.trace.path;
  j["source"] = std::string(traces::to_string(l.trace.meta.source));
  j["complete"] = l.complete;
  const traces::RunMeta& meta = l.trace.meta;
  j["origin"] = std::string(traces::to_string(meta.origin));
  j["layout"] = meta.layout;
  j["failure"] = meta.failure.failed ? json(meta.failure) : json(nullptr);
  j["span_count"] = m.span_count;
  j["start_ns"] = m.start_ns;
  j["end_ns"] = m.end_ns;
  j["summary"] = {{"steps", m.steps.size()},
                  {"counted_steps", m.counted_steps},
                  {"step_mean_ns", m.step_mean_ns},
                  {"step_p50_ns", m.step_p50_ns},
                  {"step_p90_ns", m.step_p90_ns},
                  {"tokens_per_s", m.tokens_per_s},
                  {"achieved_flops", m.achieved_flops},
                  {"model_flops_per_s", m.model_flops_per_s},
                  {"peak_flops_per_rank", m.peak_flops_per_rank},
                  {"mfu", m.mfu},
                  {"pipeline", m.pipeline},
                  {"bubble_pct", m.bubble_pct},
                  {"stragglers", m.stragglers},
                  {"total", breakdown_json(m.total)}};
  const profiler::StepAccount sa = mean_step_account(m);
  j["summary"]["step_breakdown_ns"] = {{"window", sa.window_ns},
                                       {"compute", sa.compute_ns},
                                       {"exposed_tp_comm", sa.exposed_tp_ns},
                                       {"exposed_dp_comm", sa.exposed_dp_ns},
                                       {"p2p_in_rest", sa.p2p_ns},
                                       {m.pipeline ? "bubble" : "idle", sa.rest_ns}};
  json ranks = json::array();
  for (const auto& r : m.ranks) {
    json jr = breakdown_json(r.total);
    jr["rank"] = r.rank;
    jr["bubble_ns"] = r.bubble_ns;
    jr["late_ns_mean"] = r.late_ns_mean;
    jr["collectives_checked"] = r.collectives_checked;
    jr["collectives_late"] = r.collectives_late;
    jr["peak_memory_bytes"] = r.peak_memory_bytes;
    jr["peak_memory_total_bytes"] = r.peak_memory_total_bytes;
    if (by_step_placeholders) {
      jr["by_step"] = by_step_placeholder(size_t(ranks.size()));
    } else {
      json steps = json::object();
      for (const auto& [s, tb] : r.by_step) steps[std::to_string(s)] = breakdown_json(tb);
      jr["by_step"] = std::move(steps);
    }
    ranks.push_back(std::move(jr));
  }
  j["ranks"] = std::move(ranks);
  json steps = json::array();
  for (const auto& s : m.steps) {
    steps.push_back({{"step", s.step},
                     {"start_ns", s.start_ns},
                     {"end_ns", s.end_ns},
                     {"duration_ns", s.duration_ns()},
                     {"warmup", s.warmup}});
  }
  j["steps"] = std::move(steps);
  json colls = json::array();
  for (const auto& c : m.collectives) {
    colls.push_back({{"op", c.op},
                     {"comm", c.comm},
                     {"comm_name", c.comm_name},
                     {"comm_size", c.comm_size},
                     {"count", c.count},
                     {"ops", c.ops},
                     {"bytes", c.bytes},
                     {"time_ns", c.time_ns},
                     {"algbw_gbps", c.algbw_gbps},
                     {"busbw_gbps", c.busbw_gbps}});
  }
  j["collectives"] = std::move(colls);
  if (!l.comp.empty()) j["compression"] = compression_json(l.comp);
  if (!l.moe.empty()) j["moe"] = moe_json(l.moe);
  if (l.scaling.steps > 0) {
    j["loss_scaling"] = {{"steps", l.scaling.steps},
                         {"skipped_steps", l.scaling.skipped},
                         {"first_scale", l.scaling.first_scale},
                         {"last_scale", l.scaling.last_scale},
                         {"min_scale", l.scaling.min_scale}};
  }
  json restarts = json::array();
  for (const auto& r : restarts_of(l.trace.meta)) {
    restarts.push_back({{"attempt", r.attempt},
                        {"lost_ranks", r.lost_ranks},
                        {"failed_step", r.failed_step},
                        {"resumed_from_step", r.resumed_from_step},
                        {"nproc", r.nproc},
                        {"restarted_nproc", r.next_nproc},
                        {"lost_ns", r.lost_ns},
                        {"failure", r.failure},
                        {"trace", r.trace}});
  }
  j["restarts"] = std::move(restarts);
  j["slurm"] = slurm_of(l.trace.meta);
  return j;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string pad(const std::string& s, size_t w, bool right = true) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

void print_report(const Loaded& l, std::ostream& os) {
  const Metrics& m = l.m;
  const auto& meta = l.trace.meta;
  os << "trace " << l.trace.path << " (" << traces::to_string(meta.source) << ", " << m.ranks.size()
     << " ranks, dp " << meta.dp << " tp " << meta.tp << " pp " << meta.pp << ", " << m.span_count
     << " spans, " << format_duration_ns(double(m.end_ns - m.start_ns)) << ")\n";
  if (const std::string lay = traces::describe(meta.layout); !lay.empty())
    os << "layout " << lay << "\n";
  if (meta.failure.failed)
    os << "FAILED RUN: "
       << (meta.failure.message.empty() ? std::string("the launcher marked it failed")
                                        : meta.failure.message)
       << "; the figures cover what the ranks recorded before it\n";
  os << "\n";

  os << "Summary\n";
  const int warm = int(m.steps.size()) - m.counted_steps;
  os << "  steps             " << m.steps.size() << " (" << warm << " warm-up skipped)\n";
  if (m.counted_steps > 0) {
    os << "  step time         mean " << format_duration_ns(m.step_mean_ns) << "   p50 "
       << format_duration_ns(m.step_p50_ns) << "   p90 " << format_duration_ns(m.step_p90_ns)
       << "\n";
  } else {
    os << "  step time         n/a (no steps in the trace or window)\n";
  }
  os << "  tokens/s          "
     << (m.tokens_per_s > 0 ? fmt("%.0f", m.tokens_per_s) : "n/a (tokens per step unknown)")
     << "\n";
  os << "  achieved          " << fmt("%.3f", m.achieved_flops / 1e12) << " TFLOP/s (span FLOPs, "
     << fmt("%.3f", m.ranks.empty() ? 0.0 : m.achieved_flops / 1e12 / double(m.ranks.size()))
     << " per rank)";
  if (m.model_flops_per_s > 0)
    os << ", model " << fmt("%.3f", m.model_flops_per_s / 1e12) << " TFLOP/s";
  os << "\n";
  if (m.peak_flops_per_rank > 0) {
    os << "  MFU               " << fmt("%.2f", 100 * m.mfu) << " % of "
       << fmt("%.1f", m.peak_flops_per_rank / 1e12) << " TFLOP/s per rank\n";
  } else {
    os << "  MFU               n/a (peak unknown: pass --peak-tflops)\n";
  }
  os << "  pipeline bubble   "
     << (m.pipeline ? fmt("%.2f", m.bubble_pct) + " %" : std::string("n/a (pp = 1)")) << "\n";
  if (const profiler::StepAccount sa = mean_step_account(m); sa.window_ns > 0) {
    auto pct = [&](int64_t v) { return fmt("%.1f %%", 100.0 * double(v) / double(sa.window_ns)); };
    os << "  step breakdown    compute " << pct(sa.compute_ns) << ", exposed tp "
       << pct(sa.exposed_tp_ns) << ", exposed dp " << pct(sa.exposed_dp_ns) << ", "
       << (m.pipeline ? "bubble " : "idle ") << pct(sa.rest_ns);
    if (m.pipeline) os << " (of it p2p " << pct(sa.p2p_ns) << ")";
    os << " of " << format_duration_ns(double(sa.window_ns)) << " (mean per rank and step)\n";
  }
  os << "  stragglers        ";
  if (m.stragglers.empty()) {
    os << "none";
  } else {
    for (size_t i = 0; i < m.stragglers.size(); ++i) {
      const int32_t r = m.stragglers[i];
      for (const auto& rm : m.ranks) {
        if (rm.rank != r) continue;
        os << (i ? "; " : "") << "rank " << r << " (late in " << rm.collectives_late << "/"
           << rm.collectives_checked << " collectives, mean " << (rm.late_ns_mean >= 0 ? "+" : "")
           << format_duration_ns(rm.late_ns_mean) << ")";
      }
    }
  }
  os << "\n";
  if (const json sl = slurm_of(meta); !sl.is_null())
    os << "  scheduler         " << slurm_line(sl) << "\n";
  const auto restarts = restarts_of(meta);
  if (!restarts.empty()) {
    int64_t total_ns = 0;
    for (const auto& r : restarts) total_ns += r.lost_ns;
    os << "  restarts          " << restarts.size() << " (" << format_duration_ns(double(total_ns))
       << " lost; this trace is the last attempt's)\n";
    for (const auto& r : restarts) {
      std::string who =
          r.lost_ranks.empty() ? "a rank" : (r.lost_ranks.size() == 1 ? "rank " : "ranks ");
      for (size_t i = 0; i < r.lost_ranks.size(); ++i)
        who += (i ? "," : "") + std::to_string(r.lost_ranks[i]);
      os << "    attempt " << r.attempt << "       " << who << " lost "
         << (r.failed_step >= 0 ? "during step " + std::to_string(r.failed_step)
                                : std::string("in set-up"))
         << "; resumed from step " << r.resumed_from_step;
      if (r.next_nproc != r.nproc) os << " on " << r.next_nproc << " ranks (was " << r.nproc << ")";
      os << "; " << format_duration_ns(double(r.lost_ns)) << " lost";
      if (!r.trace.empty()) os << " (" << r.trace << ")";
      os << "\n";
    }
  }
  os << "\n";

  os << "Per rank (whole window)\n";
  os << pad("rank", 6) << pad("compute", 12) << pad("comm", 12) << pad("overlap", 9)
     << pad("exposed", 12) << pad("idle", 12) << pad("memcpy", 11) << pad("comm/comp", 11)
     << pad("late", 11) << pad("peak mem", 12) << "\n";
  for (const auto& r : m.ranks) {
    const TimeBreakdown& t = r.total;
    os << pad(std::to_string(r.rank), 6) << pad(format_duration_ns(double(t.compute_ns)), 12)
       << pad(format_duration_ns(double(t.comm_ns)), 12) << pad(fmt("%.1f %%", t.overlap_pct()), 9)
       << pad(format_duration_ns(double(t.exposed_comm_ns)), 12)
       << pad(format_duration_ns(double(t.idle_ns)), 12)
       << pad(format_duration_ns(double(t.memcpy_ns)), 11)
       << pad(fmt("%.3f", t.comm_comp_ratio()), 11)
       << pad(r.collectives_checked ? format_duration_ns(r.late_ns_mean) : "-", 11)
       << pad(r.peak_memory_total_bytes > 0 ? format_bytes(r.peak_memory_total_bytes) : "-", 12)
       << "\n";
  }
  os << "\n";

  os << "Collectives (bytes per call as nccl-tests' size; time summed over ranks' calls)\n";
  if (m.collectives.empty()) {
    os << "  none\n";
    return;
  }
  os << pad("op", 16, false) << pad("communicator", 16, false) << pad("size", 5) << pad("calls", 9)
     << pad("ops", 8) << pad("bytes", 12) << pad("time", 12) << pad("algbw", 13) << pad("busbw", 13)
     << "\n";
  for (const auto& c : m.collectives) {
    const std::string comm = c.comm_name.empty() ? std::to_string(c.comm) : c.comm_name;
    os << pad(c.op, 16, false) << pad(comm, 16, false) << pad(std::to_string(c.comm_size), 5)
       << pad(std::to_string(c.count), 9) << pad(std::to_string(c.ops), 8)
       << pad(format_bytes(double(c.bytes)), 12) << pad(format_duration_ns(double(c.time_ns)), 12)
       << pad(fmt("%.2f GB/s", c.algbw_gbps), 13) << pad(fmt("%.2f GB/s", c.busbw_gbps), 13)
       << "\n";
  }
}

// Gradient compression: per compressed collective the bytes each rank put on the wire and, where
// the collective alone carried its buckets (int8, top-k), the fp32 bytes of those buckets and the
// saving; then all buckets together and the compression compute per rank and step.
void print_compression(const profiler::CompressionMetrics& c, std::ostream& os) {
  if (c.empty()) return;
  os << "\nGradient compression (bytes each rank sent, summed over ranks and steps; fp32 = the "
        "buckets' uncompressed all-reduce size)\n";
  os << pad("collective", 24, false) << pad("calls", 8) << pad("wire", 12) << pad("fp32", 12)
     << pad("saved", 12) << pad("ratio", 8) << "\n";
  for (const auto& cc : c.collectives) {
    const bool alone = cc.raw_bytes > 0;
    os << pad(cc.name, 24, false) << pad(std::to_string(cc.calls), 8)
       << pad(format_bytes(double(cc.wire_bytes)), 12)
       << pad(alone ? format_bytes(double(cc.raw_bytes)) : "-", 12)
       << pad(alone ? format_bytes(double(cc.saved_bytes())) : "-", 12)
       << pad(alone && cc.wire_bytes > 0 ? fmt("%.2fx", double(cc.raw_bytes) / cc.wire_bytes) : "-",
              8)
       << "\n";
  }
  os << pad("all buckets (" + std::to_string(c.buckets) + ")", 24, false) << pad("", 8)
     << pad(format_bytes(double(c.wire_bytes)), 12) << pad(format_bytes(double(c.raw_bytes)), 12)
     << pad(format_bytes(double(c.saved_bytes())), 12) << pad(fmt("%.2fx", c.ratio()), 8) << "\n";
  const double per = c.ranks > 0 && c.steps > 0 ? 1.0 / (double(c.ranks) * c.steps) : 0.0;
  os << "compression compute per rank and compressed step: compress "
     << format_duration_ns(double(c.compress_ns) * per) << ", decompress "
     << format_duration_ns(double(c.decompress_ns) * per) << " (" << c.steps << " steps, "
     << c.ranks << " ranks)\n";
}

// Mixture of experts: the all-to-alls (busbw with nccl-tests' (n-1)/n factor, the time no compute
// covered) and the router's load per MoE block from the token counters.
void print_moe(const profiler::MoeMetrics& m, std::ostream& os) {
  if (m.empty()) return;
  if (!m.all_to_alls.empty()) {
    os << "\nMoE all-to-all (summed over ranks and steps; busbw = algbw x (n-1)/n)\n";
    os << pad("collective", 20, false) << pad("calls", 8) << pad("bytes", 12) << pad("time", 12)
       << pad("exposed", 12) << pad("n", 4) << pad("algbw GB/s", 12) << pad("busbw GB/s", 12)
       << "\n";
    for (const auto& a : m.all_to_alls) {
      os << pad(a.name, 20, false) << pad(std::to_string(a.calls), 8)
         << pad(format_bytes(double(a.bytes)), 12) << pad(format_duration_ns(double(a.time_ns)), 12)
         << pad(format_duration_ns(double(a.exposed_ns)), 12)
         << pad(std::to_string(a.group_size), 4) << pad(fmt("%.3f", a.algbw_gbps()), 12)
         << pad(fmt("%.3f", a.busbw_gbps()), 12) << "\n";
    }
    os << "exposed all-to-all " << format_duration_ns(double(m.exposed_ns)) << " of "
       << format_duration_ns(double(m.all_to_all_ns)) << "\n";
  }
  if (!m.blocks.empty()) {
    os << "\nMoE load (assignments per expert before the capacity drop, summed over ranks and "
          "steps)\n";
    os << pad("block", 8, false) << pad("experts", 8) << pad("min", 10) << pad("max", 10)
       << pad("max/mean", 10) << pad("dropped", 10) << pad("dropped %", 10) << "\n";
    for (const auto& b : m.blocks) {
      const auto [lo, hi] = std::minmax_element(b.tokens.begin(), b.tokens.end());
      os << pad(std::to_string(b.layer), 8, false) << pad(std::to_string(b.tokens.size()), 8)
         << pad(b.tokens.empty() ? "-" : fmt("%.0f", *lo), 10)
         << pad(b.tokens.empty() ? "-" : fmt("%.0f", *hi), 10)
         << pad(fmt("%.3f", b.imbalance()), 10) << pad(fmt("%.0f", b.dropped), 10)
         << pad(fmt("%.2f", 100.0 * b.dropped_fraction()), 10) << "\n";
    }
  }
}

void print_loss_scaling(const LossScaling& ls, std::ostream& os) {
  if (ls.steps == 0) return;
  os << "\nfp16 loss scaling: skipped steps " << ls.skipped << " of " << ls.steps
     << " (gradient inf/NaN: no optimizer update, scale halved); loss scale "
     << fmt("%g", ls.first_scale) << " at the first step, " << fmt("%g", ls.last_scale)
     << " at the last, " << fmt("%g", ls.min_scale) << " at the lowest\n";
}

// Mean over ranks of a breakdown field per counted step (per rank over the window without steps),
// so traces with different step counts compare.
double per_rank_step(const Metrics& m, int64_t TimeBreakdown::*field) {
  if (m.ranks.empty()) return 0;
  double sum = 0;
  for (const auto& r : m.ranks) {
    if (m.counted_steps > 0) {
      double s = 0;
      for (const auto& st : m.steps) {
        if (!st.warmup) s += double(r.by_step.at(st.step).*field);
      }
      sum += s / m.counted_steps;
    } else {
      sum += double(r.total.*field);
    }
  }
  return sum / double(m.ranks.size());
}

struct Row {
  std::string name;
  double a, b;
  bool time;  // format as a duration
};

std::vector<Row> compare_rows(const Metrics& a, const Metrics& b) {
  const auto ov = [](const Metrics& m) { return m.total.overlap_pct(); };
  return {
      {"step time mean", a.step_mean_ns, b.step_mean_ns, true},
      {"step time p90", a.step_p90_ns, b.step_p90_ns, true},
      {"compute", per_rank_step(a, &TimeBreakdown::compute_ns),
       per_rank_step(b, &TimeBreakdown::compute_ns), true},
      {"comm", per_rank_step(a, &TimeBreakdown::comm_ns), per_rank_step(b, &TimeBreakdown::comm_ns),
       true},
      {"exposed comm", per_rank_step(a, &TimeBreakdown::exposed_comm_ns),
       per_rank_step(b, &TimeBreakdown::exposed_comm_ns), true},
      {"idle", per_rank_step(a, &TimeBreakdown::idle_ns), per_rank_step(b, &TimeBreakdown::idle_ns),
       true},
      {"overlap %", ov(a), ov(b), false},
      {"tokens/s", a.tokens_per_s, b.tokens_per_s, false},
      {"TFLOP/s", a.achieved_flops / 1e12, b.achieved_flops / 1e12, false},
      {"bubble %", a.bubble_pct, b.bubble_pct, false},
  };
}

double diff_pct(double a, double b) { return a != 0 ? 100.0 * (b - a) / a : 0.0; }

json span_compare_json(const profiler::SpanComparison& c) {
  auto rows = [](const std::vector<profiler::CompareRow>& v) {
    json a = json::array();
    for (const auto& r : v)
      a.push_back({{"key", r.key},
                   {"pairs", r.pairs},
                   {"a_ns", r.a_ns},
                   {"b_ns", r.b_ns},
                   {"error_pct", r.error_pct()},
                   {"mean_abs_error_pct", r.mean_abs_error_pct()}});
    return a;
  };
  return {{"matched", c.matched},         {"only_a", c.only_a},        {"only_b", c.only_b},
          {"steps", c.steps_compared},    {"step_a_ns", c.step_a_ns},  {"step_b_ns", c.step_b_ns},
          {"by_class", rows(c.by_class)}, {"by_name", rows(c.by_name)}};
}

// breakdown_json(t).dump(2) with every line after the first indented by `indent` more, written
// field by field (nlohmann's key order and number format) instead of built.
void write_breakdown(const TimeBreakdown& t, const std::string& indent, std::string& out) {
  const std::string in = indent + "  ";
  const auto field = [&](const char* key, int64_t v, const char* end) {
    char digits[24];
    const auto r = std::to_chars(digits, digits + sizeof digits, v);
    out.append(in).append(key).append(digits, r.ptr).append(end);
  };
  const auto real = [&](const char* key, double v, const char* end) {
    out.append(in).append(key).append(json(v).dump()).append(end);
  };
  out.append("{\n");
  real("\"comm_comp_ratio\": ", t.comm_comp_ratio(), ",\n");
  field("\"comm_ns\": ", t.comm_ns, ",\n");
  field("\"compute_ns\": ", t.compute_ns, ",\n");
  field("\"exposed_comm_ns\": ", t.exposed_comm_ns, ",\n");
  field("\"idle_ns\": ", t.idle_ns, ",\n");
  field("\"memcpy_ns\": ", t.memcpy_ns, ",\n");
  field("\"overlap_ns\": ", t.overlap_ns, ",\n");
  real("\"overlap_pct\": ", t.overlap_pct(), ",\n");
  field("\"window_ns\": ", t.window_ns, "\n");
  out.append(indent).append("}");
}

// A rank's by_step object as dump(2) writes it at `indent`, keys in its (string) order, written
// to `os` a megabyte at a time.
void write_by_step(const std::map<int32_t, TimeBreakdown>& by_step, const std::string& indent,
                   std::ostream& os) {
  if (by_step.empty()) {
    os << "{}";
    return;
  }
  std::vector<std::pair<std::string, const TimeBreakdown*>> keyed;
  keyed.reserve(by_step.size());
  for (const auto& [step, tb] : by_step) keyed.emplace_back(std::to_string(step), &tb);
  std::sort(keyed.begin(), keyed.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  const std::string in = indent + "  ";
  std::string buf = "{\n";
  for (size_t k = 0; k < keyed.size(); ++k) {
    buf.append(in).append("\"").append(keyed[k].first).append("\": ");
    write_breakdown(*keyed[k].second, in, buf);
    buf.append(k + 1 < keyed.size() ? ",\n" : "\n");
    if (buf.size() > (1 << 20)) {
      os.write(buf.data(), std::streamsize(buf.size()));
      buf.clear();
    }
  }
  buf.append(indent).append("}");
  os.write(buf.data(), std::streamsize(buf.size()));
}

// report_json(l).dump(2), byte for byte, without building the per-step breakdowns of every rank
// (the bulk of a long trace's report): the rest is built and dumped with placeholders, and each
// rank's by_step object is written in their place.
void write_report_json(const Loaded& l, std::ostream& os) {
  const std::string text = report_json(l, true).dump(2);
  size_t at = 0;
  for (size_t ri = 0; ri < l.m.ranks.size(); ++ri) {
    const std::string mark = "\"by_step\": " + json(by_step_placeholder(ri)).dump();
    const size_t hit = text.find(mark, at);
    if (hit == std::string::npos)
      throw InternalError("report JSON: a by_step placeholder is missing");
    const size_t line = text.rfind('\n', hit) + 1;
    os.write(text.data() + at, std::streamsize(hit - at));
    os << "\"by_step\": ";
    write_by_step(l.m.ranks[ri].by_step, std::string(hit - line, ' '), os);
    at = hit + mark.size();
  }
  os.write(text.data() + at, std::streamsize(text.size() - at));
}

int run_report(const ReportArgs& args) {
  if (args.peak_tflops < 0) throw InputError("--peak-tflops: expected a value >= 0");
  profiler::MetricsOptions opt = args.opt;
  opt.peak_flops_per_rank = args.peak_tflops * 1e12;
  const bool streamed = args.compare.empty();
  const Loaded a = load_and_compute(args.trace, opt, streamed);
  if (args.compare.empty()) {
    if (args.json) {
      write_report_json(a, std::cout);
      std::cout << "\n";
    } else {
      print_report(a, std::cout);
      print_compression(a.comp, std::cout);
      print_moe(a.moe, std::cout);
      print_loss_scaling(a.scaling, std::cout);
    }
    return 0;
  }
  const Loaded b = load_and_compute(args.compare, opt, false);
  const auto rows = compare_rows(a.m, b.m);
  const int compare_skip =
      args.opt.skip_steps >= 0 ? args.opt.skip_steps : warmup_steps_of(a.trace.meta);
  if (args.json) {
    json j;
    j["a"] = report_json(a);
    j["b"] = report_json(b);
    json d = json::object();
    for (const auto& r : rows)
      d[r.name] = {{"a", r.a}, {"b", r.b}, {"diff_pct", diff_pct(r.a, r.b)}};
    j["compare"] = std::move(d);
    j["span_compare"] =
        span_compare_json(profiler::compare_spans(a.trace, b.trace, {compare_skip}));
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "A: " << a.trace.path << " (" << traces::to_string(a.trace.meta.source) << ", "
            << a.m.ranks.size() << " ranks, " << a.m.counted_steps << " steps)\n"
            << "B: " << b.trace.path << " (" << traces::to_string(b.trace.meta.source) << ", "
            << b.m.ranks.size() << " ranks, " << b.m.counted_steps << " steps)\n"
            << "(compute, comm, exposed comm, idle: mean per rank and step)\n\n";
  std::cout << pad("", 16, false) << pad("A", 14) << pad("B", 14) << pad("B vs A", 11) << "\n";
  for (const auto& r : rows) {
    const auto show = [&](double v) { return r.time ? format_duration_ns(v) : fmt("%.2f", v); };
    std::cout << pad(r.name, 16, false) << pad(show(r.a), 14) << pad(show(r.b), 14)
              << pad(r.a != 0 ? fmt("%+.1f %%", diff_pct(r.a, r.b)) : "-", 11) << "\n";
  }
  // Span by span (profiler/compare.hpp): error per op class and per op name.
  std::cout << "\n"
            << profiler::format_comparison(
                   profiler::compare_spans(a.trace, b.trace, {compare_skip}));
  return 0;
}

Command setup(CLI::App& root) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* app = root.add_subcommand(
      "report", "Metrics of a trace: per-rank compute/comm/overlap, steps, collectives");
  app->add_option("TRACE", args->trace, "Trace file")->required();
  app->add_flag("--json", args->json, "Print one JSON object");
  app->add_option("--skip-steps", args->opt.skip_steps,
                  "Warm-up steps left out of step statistics (default: the trace's own, as its "
                  "run or simulation counted them; 0 when it does not say)");
  app->add_option("--peak-tflops", args->peak_tflops,
                  "Peak TFLOP/s per rank for MFU (overrides the trace's)");
  app->add_option("--compare", args->compare, "A second trace to compare against");
  app->add_option("--window-start-ns", args->opt.window_start_ns, "Analyse only from this time");
  app->add_option("--window-end-ns", args->opt.window_end_ns, "Analyse only up to this time");
  app->add_option("--straggler-threshold-ns", args->opt.straggler_threshold_ns,
                  "Lateness at a collective that counts as late")
      ->capture_default_str();
  return {app, [args]() { return run_report(*args); }};
}

const Registrar kRegistrar{setup};

}  // namespace
}  // namespace orrery::cli
