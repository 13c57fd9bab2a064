// What the importer harnesses (fuzz_import_kineto, fuzz_import_nsys) check of an imported trace, as
// `orrery import` + `orrery report` would use it: the summary agrees with the spans, every span ends
// after it starts and names a string that exists, every kernel-work row names a span, and the
// metrics can be computed.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "fuzz_util.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/traces/import.hpp"
#include "orrery/traces/kernel_work.hpp"

namespace orrery::fuzz {

inline void check_imported(const traces::Trace& t, traces::ImportFormat format,
                           const std::vector<std::string>& names) {
  const auto summary = traces::summarize_import(t, format, names);
  if (summary.spans != static_cast<int64_t>(t.spans.size())) fail("summary span count differs");
  for (const auto& s : t.spans) {
    if (s.end_ns < s.start_ns) fail("imported span ends before it starts");
    if (s.name >= t.strings.size()) fail("imported span names a string out of range");
  }
  // Kernel work (traces/kernel_work.hpp): every row names a span of the trace, with work >= 0.
  std::set<std::tuple<int32_t, int32_t, int64_t, int64_t>> spans;
  for (const auto& s : t.spans) spans.insert({s.rank, s.stream, s.start_ns, s.end_ns});
  for (const auto& k : traces::read_kernel_work(t)) {
    if (!spans.count({k.rank, k.stream, k.start_ns, k.end_ns})) fail("kernel work names no span");
    if (!(k.work.flops >= 0 && k.work.bytes >= 0)) fail("kernel work is negative or NaN");
  }
  profiler::MetricsOptions opt;
  opt.threads = 1;
  (void)profiler::compute_metrics(t, opt);
}

}  // namespace orrery::fuzz
