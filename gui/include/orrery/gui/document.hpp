// A trace opened in the GUI: the in-memory trace, its timeline index and derived per-step figures.
// Loading (SQLite read + indexing) is plain C++ so the GUI runs it on a worker thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "orrery/gui/counter_tracks.hpp"
#include "orrery/gui/flows.hpp"
#include "orrery/gui/navigation.hpp"
#include "orrery/gui/trace_index.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/trace.hpp"
#include "orrery/traces/zoom.hpp"

namespace orrery::gui {

struct TraceDocument {
  std::string path;
  traces::Trace trace;
  TraceIndex index;  // all kinds; the timeline rebuilds its own when kinds are filtered
  FlowIndex flows;   // send -> receive, and the members of each collective instance
  std::vector<CounterTrack> counters;  // per (rank, counter name)
  std::vector<StepWindow> steps;       // per step, across ranks
  // A trace opened through its zoom levels (more spans than LoadOptions::zoom_above_spans):
  // `trace` holds everything but the spans, `index` the lanes and their rows without spans, and
  // the timeline draws from `zoom` zoomed out and from load_window() zoomed in. Null otherwise.
  std::shared_ptr<const traces::TraceReader> reader;
  std::shared_ptr<const traces::ZoomIndex> zoom;
  bool zoomed() const { return zoom != nullptr; }
};

struct LoadOptions {
  // Traces with more spans than this open through their zoom levels instead of loading every
  // span (about 150 bytes each in memory).
  int64_t zoom_above_spans = 2'000'000;
};

// Reads `path` with traces::load_trace and indexes it. Throws InputError (the reader's message)
// for a missing, corrupt or foreign file.
std::shared_ptr<TraceDocument> load_document(const std::string& path);
std::shared_ptr<TraceDocument> load_document(const std::string& path, const LoadOptions& o);
// The spans of a zoomed document that overlap [t0, t1), every lane, as a document of their own
// (its own span indices, flows and steps), its lanes padded to the zoom levels' rows.
std::shared_ptr<TraceDocument> load_window(const TraceDocument& doc, int64_t t0_ns, int64_t t1_ns);
// Wraps an in-memory trace (tests, benchmarks, generated traces).
std::shared_ptr<TraceDocument> make_document(traces::Trace t, std::string path = {});

// Names that tell open files apart, as editors label tabs: for each path, its last components
// ('/'-separated), as few as make it differ from every other path's (at least the file name); a
// path that needs all its components is shown whole. Equal paths get equal names.
std::vector<std::string> distinct_names(const std::vector<std::string>& paths);

// Per rank and step: where the step's time went. Compute and exposed communication come from the
// metrics' per-step breakdown; the idle time of a rank in a pipeline-parallel run (pp > 1) is the
// pipeline bubble, as the metrics define it, and is reported as bubble instead of idle.
struct StepBreakdown {
  int32_t rank = 0;
  int32_t step = 0;
  int64_t compute_ns = 0;
  int64_t exposed_comm_ns = 0;
  int64_t bubble_ns = 0;
  int64_t idle_ns = 0;
  int64_t window_ns = 0;
};
std::vector<StepBreakdown> step_breakdowns(const profiler::Metrics& m, const traces::Trace& t);
// Mean over the steps of each rank (one entry per rank, step = -1).
std::vector<StepBreakdown> mean_per_rank(const std::vector<StepBreakdown>& per_step);

// Per-step comparison of two runs, aligned by step number (steps present in both).
struct StepDiff {
  int32_t step = 0;
  int64_t a_ns = 0, b_ns = 0;                  // step durations (earliest start to latest end)
  int64_t a_compute_ns = 0, b_compute_ns = 0;  // mean over ranks
  int64_t a_exposed_ns = 0, b_exposed_ns = 0;  // mean over ranks
  int64_t diff_ns() const { return b_ns - a_ns; }
  double diff_pct() const { return a_ns ? 100.0 * static_cast<double>(b_ns - a_ns) / a_ns : 0.0; }
};
std::vector<StepDiff> diff_steps(const profiler::Metrics& a, const profiler::Metrics& b);

// Per op name, two runs side by side (a real run and its simulation, say): the time of the spans
// of that name per rank and step, the mean over the trace's (rank, step) pairs, so that a
// simulation of one representative rank and step compares with a run of many. A trace's
// rank-steps: the distinct (rank, step >= 0) of its spans (1 when none). Names in only one run
// count zero in the other.
struct OpDiff {
  std::string name;
  int64_t a_count = 0, b_count = 0;        // spans
  int64_t a_total_ns = 0, b_total_ns = 0;  // over all ranks and steps
  int64_t a_rank_steps = 1, b_rank_steps = 1;
  int64_t a_ns = 0, b_ns = 0;  // per rank and step: total / rank-steps, rounded
  int64_t diff_ns() const { return b_ns - a_ns; }
  // B / A; infinity when only B has it (and 1 when neither has time).
  double ratio() const;
};
// Every name of either trace, the largest |B - A| first (ties: by name).
std::vector<OpDiff> diff_ops(const traces::Trace& a, const traces::Trace& b);

// Start time of a step (earliest over ranks), or INT64_MIN when the metrics have no such step.
int64_t step_start_ns(const profiler::Metrics& m, int32_t step);

}  // namespace orrery::gui
