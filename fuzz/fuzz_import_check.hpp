// What the importer harnesses (fuzz_import_kineto, fuzz_import_nsys) check of an imported trace, as
// `orrery import` + `orrery report` would use it: the summary agrees with the spans, every span ends
// after it starts and names a string that exists, and the metrics can be computed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/traces/import.hpp"

namespace orrery::fuzz {

inline void check_imported(const traces::Trace& t, traces::ImportFormat format,
                           const std::vector<std::string>& names) {
  const auto summary = traces::summarize_import(t, format, names);
  if (summary.spans != static_cast<int64_t>(t.spans.size())) fail("summary span count differs");
  for (const auto& s : t.spans) {
    if (s.end_ns < s.start_ns) fail("imported span ends before it starts");
    if (s.name >= t.strings.size()) fail("imported span names a string out of range");
  }
  profiler::MetricsOptions opt;
  opt.threads = 1;
  (void)profiler::compute_metrics(t, opt);
}

}  // namespace orrery::fuzz
