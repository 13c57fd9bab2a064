// Counter tracks: the trace's counters (memory per category, loss, tokens per expert, ...) as one
// step function per (rank, counter name), drawn under each rank's lanes. A sample's value holds
// until the next sample of its track.
//
// Drawing folds the samples into pixel columns (the range of values the step function takes
// within each column), so a frame costs the columns plus the samples on screen.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "orrery/gui/time_mapping.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::gui {

struct CounterTrack {
  int32_t rank = 0;
  std::string name;
  std::vector<int64_t> ts_ns;  // sorted (ties keep the trace's order: the last one wins)
  std::vector<double> value;
  double min = 0, max = 0;  // over the samples
};

// One track per (rank, name), sorted by (rank, name).
std::vector<CounterTrack> counter_tracks(const traces::Trace& t);

// The value in effect at t (the last sample at or before t), none before the first sample.
std::optional<double> counter_value_at(const CounterTrack& c, int64_t t_ns);

// The values the step function takes within pixel column x (covering [x, x+1) under m): lo and
// hi, and the value at the column's right edge.
struct CounterColumn {
  int x = 0;
  double lo = 0, hi = 0, last = 0;
};
// Columns 0 .. width_px-1 where the track has a value (none before its first sample or, past
// its last sample, beyond the track's end time end_ns). Appends to out.
void fold_counter(const CounterTrack& c, const TimeMapping& m, int width_px, int64_t end_ns,
                  std::vector<CounterColumn>& out);

// A counter value as text: bytes for "mem.*" counters, else a plain number.
std::string format_counter(const std::string& name, double v);

}  // namespace orrery::gui
