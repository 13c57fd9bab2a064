// Pipeline parallelism: the order in which one stage runs the forward and backward passes of the
// step's micro-batches, for GPipe and 1F1B (PipeDream-Flush). The simulator's sim::schedule_order
// builds the same sequence (sim/src/workload.cpp); the runtime cannot link the simulator, so the
// rule lives here too and both are tested against the textbook orders.
#pragma once

#include <string>
#include <vector>

#include "orrery/common/scenario.hpp"

namespace orrery::runtime {

// Passes of stage `stage` (0-based) of `stages`, for `micro_batches` micro-batches: mb >= 0 is the
// forward of micro-batch mb, -(mb+1) its backward.
//   gpipe: F0 .. F(m-1), B0 .. B(m-1)
//   1f1b:  min(p-s-1, m) warm-up forwards, then alternately one forward and one backward, then the
//          remaining backwards (cool-down). At most p-s micro-batches are in flight on stage s.
// Throws InputError for another schedule (interleaved has its own order: pipeline_interleaved_order).
std::vector<int> pipeline_order(Schedule schedule, int stages, int stage, int micro_batches);

// How many micro-batches' activations stage `stage` must hold at once under the schedule.
int pipeline_in_flight(Schedule schedule, int stages, int stage, int micro_batches);

// The ideal bubble fraction of GPipe and 1F1B with equal stage costs: (p-1)/(m+p-1).
double pipeline_bubble_fraction(int stages, int micro_batches);

}  // namespace orrery::runtime
