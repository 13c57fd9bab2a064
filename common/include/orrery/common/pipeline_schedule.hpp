// The order in which one pipeline stage runs its micro-batches' forward and backward passes. One
// definition shared by the real runtime and the simulator, so both execute the same schedule.
#pragma once

#include <string>
#include <vector>

namespace orrery {

// Entries >= 0 are the forward of micro-batch i; entries < 0 are the backward of micro-batch
// -(entry)-1. "gpipe": all forwards, then all backwards. "1f1b" (PipeDream-Flush, Narayanan et al.
// 2021): stages-stage-1 warm-up forwards, then alternate one forward and one backward, then drain.
// Any other schedule throws InputError naming `who` (the component that lacks it).
std::vector<int> pipeline_schedule_order(const std::string& schedule, int stages, int stage, int m,
                                         const std::string& who);

}  // namespace orrery
