// ZeRO-Offload's host rates from traces (calibrate_offload.hpp).
#include "calibrate_offload.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>

#include "orrery/model/names.hpp"

namespace orrery::sim::detail {

namespace names = ::orrery::model::names;

void PooledRate::add_run(double run_bytes, double run_ns, double scale, int64_t run_spans,
                         const std::string& label) {
  if (run_bytes <= 0 || run_ns <= 0) return;
  bytes += run_bytes;
  weighted += run_bytes * (run_bytes / run_ns * 1e9 * scale);
  spans += run_spans;
  traces.insert(label);
}

int first_counted_step(const traces::Trace& t, int skip_steps) {
  int min_step = INT_MAX;
  for (const auto& sp : t.spans)
    if (sp.step >= 0) min_step = std::min(min_step, sp.step);
  return (min_step == INT_MAX ? 0 : min_step) + skip_steps;
}

int ranks_on_one_node(const traces::Trace& t) {
  std::map<std::string, int> per_host;
  for (const auto& r : t.ranks) per_host[r.host]++;
  int most = 0;
  for (const auto& [host, n] : per_host) most = std::max(most, n);
  return per_host.size() > 1 ? most : std::max(1, t.meta.world_size);
}

namespace {
std::string label_of(const traces::Trace& t) {
  return t.path.empty() ? t.meta.scenario_name : t.path;
}
}  // namespace

HostOffloadFit fit_host_offload(const std::vector<traces::Trace>& ts, int skip_steps) {
  HostOffloadFit f;
  for (const auto& t : ts) {
    const int first = first_counted_step(t, skip_steps);
    double link_bytes = 0, link_ns = 0, step_bytes = 0, step_ns = 0;
    int64_t copies = 0, steps = 0;
    for (const auto& sp : t.spans) {
      if (sp.step < first) continue;
      const std::string& n = t.name_of(sp);
      if (n == names::kOffloadD2H || n == names::kOffloadH2D) {
        link_bytes += double(sp.bytes), link_ns += double(sp.duration_ns()), ++copies;
      } else if (n == names::kOffloadAdamW) {
        // The span's bytes are 4 per element (fp32); the step moves kHostAdamWBytesPerParam each.
        step_bytes += double(sp.bytes) / 4.0 * kHostAdamWBytesPerParam;
        step_ns += double(sp.duration_ns()), ++steps;
      }
    }
    f.link.add_run(link_bytes, link_ns, 1.0, copies, label_of(t));
    f.adamw.add_run(step_bytes, step_ns, double(ranks_on_one_node(t)), steps, label_of(t));
  }
  return f;
}

std::vector<traces::Trace> without_offload_adamw(const std::vector<traces::Trace>& in) {
  std::vector<traces::Trace> out = in;
  for (auto& t : out) {
    const bool offload = std::any_of(t.spans.begin(), t.spans.end(), [&](const traces::Span& sp) {
      const std::string& n = t.name_of(sp);
      return n == names::kOffloadRead || n == names::kOffloadD2H;
    });
    if (!offload) continue;
    std::erase_if(t.spans,
                  [&](const traces::Span& sp) { return t.name_of(sp) == names::kOptimizerStep; });
  }
  return out;
}

namespace {
std::string joined(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ", ") + x;
  return out;
}

void report(const char* parameter, const char* what, const PooledRate& r,
            std::vector<GpuFitRow>* rows, std::vector<std::string>& notes) {
  if (rows != nullptr) {
    GpuFitRow row;
    row.parameter = parameter;
    row.value = r.bytes_per_s() / 1e9;
    row.fitted = true;
    row.kernels = r.spans;
    row.traces.assign(r.traces.begin(), r.traces.end());
    rows->push_back(std::move(row));
    return;
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %.3f GB/s from %lld %s spans of ", parameter,
                r.bytes_per_s() / 1e9, static_cast<long long>(r.spans), what);
  notes.push_back(buf + joined(r.traces));
}
}  // namespace

void apply_host_offload(const HostOffloadFit& f, HardwareProfile& p, std::vector<GpuFitRow>* rows,
                        std::vector<std::string>& notes) {
  if (f.link.any()) {
    p.offload.host_link_bytes_per_s = f.link.bytes_per_s();
    p.offload.host_link_shared_by = 1;  // measured per GPU, as the run shared its links
    report("offload.host_link_gbps", "offload.d2h/h2d", f.link, rows, notes);
  }
  if (f.adamw.any()) {
    p.offload.host_adamw_bytes_per_s = f.adamw.bytes_per_s();
    report("offload.host_adamw_gbps", "adamw", f.adamw, rows, notes);
  }
}

}  // namespace orrery::sim::detail
