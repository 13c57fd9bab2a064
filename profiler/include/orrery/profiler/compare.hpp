// Span-level comparison of two traces of the same run, typically a real trace (A) and its simulated
// twin (B): "measure here, predict there", checked op by op.
//
// Alignment: a span is identified by (rank, step, name, occurrence), occurrence being its ordinal
// among the spans of that rank, step and name in start order. Steps are renumbered per trace from
// its first counted step (a trace with more than one step skips its first `skip_steps`; a
// one-step trace, such as `orrery sim`'s default, keeps its step), so step 1 of a real run lines up
// with step 0 of a one-step simulation. Spans present in only one trace are counted, not compared.
//
// Per matched pair, error = (B − A) / A of the durations. Rows per op class and per op name give:
// pairs, the summed durations of A and B, the error of the sums (B − A) / A, and the mean absolute
// per-span error. Op classes: "forward" (compute spans named fwd.*), "backward" (bwd.*), "compute"
// (other compute), "optimizer", "data", "collective.<op>" (all_reduce, ...), "p2p", "memcpy",
// "phase.<name>" (step, forward, backward, optimizer ranges), "other".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orrery/traces/trace.hpp"

namespace orrery::profiler {

struct CompareOptions {
  int skip_steps = 1;  // warm-up steps left out of a trace with more than one step
};

struct CompareRow {
  std::string key;        // op class or op name
  int64_t pairs = 0;
  double a_ns = 0;        // summed durations of the matched spans
  double b_ns = 0;
  double abs_error_sum = 0;  // Σ |B − A| / A over pairs (for the mean)
  double error_pct() const { return a_ns > 0 ? 100.0 * (b_ns - a_ns) / a_ns : 0.0; }
  double mean_abs_error_pct() const { return pairs ? 100.0 * abs_error_sum / double(pairs) : 0.0; }
};

struct SpanComparison {
  std::vector<CompareRow> by_class;  // sorted by key
  std::vector<CompareRow> by_name;   // sorted by key ("<class> name" would be redundant: plain names)
  int64_t matched = 0;
  int64_t only_a = 0;                // spans of A with no twin in B (in steps both traces have)
  int64_t only_b = 0;
  int64_t steps_compared = 0;
  double step_a_ns = 0;              // mean step time over the compared steps (max end − min start)
  double step_b_ns = 0;
};

// The op class of a span (see the header comment).
std::string op_class(const traces::Trace& t, const traces::Span& s);

SpanComparison compare_spans(const traces::Trace& a, const traces::Trace& b, const CompareOptions& opt = {});

// A plain-text table of the comparison (classes, then names).
std::string format_comparison(const SpanComparison& c);

}  // namespace orrery::profiler
