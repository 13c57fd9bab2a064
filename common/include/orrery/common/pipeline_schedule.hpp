// The order in which one pipeline stage runs its micro-batches' forward and backward passes. One
// definition shared by the real runtime and the simulator, so both execute the same schedule.
#pragma once

#include <string>
#include <vector>

#include "orrery/common/scenario.hpp"

namespace orrery {

// Entries >= 0 are the forward of micro-batch i; entries < 0 are the backward of micro-batch
// -(entry)-1. "gpipe": all forwards, then all backwards. "1f1b" (PipeDream-Flush, Narayanan et al.
// 2021): stages-stage-1 warm-up forwards, then alternate one forward and one backward, then drain.
// Any other schedule throws InputError naming `who` (the component that lacks it).
std::vector<int> pipeline_schedule_order(Schedule schedule, int stages, int stage, int m,
                                         const std::string& who);

// One pass of the interleaved schedule: the forward or the backward of model chunk `chunk` of the
// stage (chunk c of stage s of p holds the layers of virtual stage c·p + s) on `micro_batch`.
struct PipelinePass {
  int chunk = 0;
  int micro_batch = 0;
  bool forward = true;
  bool operator==(const PipelinePass& o) const {
    return chunk == o.chunk && micro_batch == o.micro_batch && forward == o.forward;
  }
};

// Megatron-LM's interleaved 1F1B (Narayanan et al., SC21, section 2.2.2) for stage `stage` of
// `stages`, `m` micro-batches and `chunks` model chunks per stage. Virtual micro-batch k = 0..m·v-1
// (v = chunks) is, forward, chunk (k / p) % v on micro-batch (k / (p·v))·p + k % p, and, backward,
// chunk v-1-((k / p) % v) on the same micro-batch. Stage s runs min((p-s-1)·2 + (v-1)·p, m·v)
// warm-up forwards, then alternates the next forward and the next backward, then the remaining
// backwards. m must be a multiple of p (Megatron's condition); InputError otherwise or when an
// argument is < 1. (With chunks = 1 the warm-up is 2·(p-s-1), not 1f1b's p-s-1.)
std::vector<PipelinePass> pipeline_interleaved_order(int stages, int stage, int m, int chunks);

}  // namespace orrery
