// Navigation aids of the timeline, without widgets: the time window of each training step (for
// the step numbers on the axis and "go to step N") and the user's markers (times to jump between).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "orrery/traces/trace.hpp"

namespace orrery::gui {

// A step across ranks: from the earliest start to the latest end of the spans of that step.
struct StepWindow {
  int32_t step = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};
// One window per step number present (spans with step >= 0), sorted by step.
std::vector<StepWindow> step_windows(const traces::Trace& t);
// The window of `step`, or none when the trace has no such step.
std::optional<StepWindow> find_step(const std::vector<StepWindow>& steps, int32_t step);

// Marked times (trace time), kept sorted and distinct.
class Markers {
 public:
  // Adds a marker at t; false when one is already there.
  bool add(int64_t t_ns);
  // Removes the marker nearest to t if it is within tolerance_ns; false when none is.
  bool remove_near(int64_t t_ns, int64_t tolerance_ns);
  void clear() { times_.clear(); }
  // The first marker after t (strictly), or the first one when none is (wrapping); none if empty.
  std::optional<int64_t> next_after(int64_t t_ns) const;
  // The last marker before t (strictly), or the last one when none is (wrapping); none if empty.
  std::optional<int64_t> previous_before(int64_t t_ns) const;
  const std::vector<int64_t>& times() const { return times_; }
  size_t size() const { return times_.size(); }

 private:
  std::vector<int64_t> times_;
};

}  // namespace orrery::gui
