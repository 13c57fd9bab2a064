// Tensor parallelism (Megatron): which slice of a full-model tensor a tp rank holds. The maths of
// the column/row-parallel block lives in the model (model.hpp: local heads and MLP width, and the
// four GptHooks::tp_all_reduce points, Megatron's f/g operators); the trainer routes those sums to
// the tp group as Collective spans named "tp.all_reduce" (the simulator's names::kTpAllReduce).
#pragma once

#include <vector>

#include "orrery/runtime/model.hpp"

namespace orrery::runtime {

inline constexpr const char* kTpAllReduceName = model::names::kTpAllReduce.data();

// The values of `local` (a tensor of a tp shard, rank tp_rank of tp_size) cut from the full,
// unsharded model `full` (tp_size 1, holding the same layer), by the parameter table's slicing
// rule (ParamTensor::slice): qkvw/qkvb rows of the held heads in each of q, k, v; fcw/fcb rows of
// the held MLP width (in each of gate and up for SwiGLU); projw/fcprojw the matching columns;
// everything else whole (replicated). Used to compare a tensor-parallel run with a serial one.
std::vector<float> tp_slice_of_full(const Gpt& full, const ParamTensor& local, int tp_rank,
                                    int tp_size);

}  // namespace orrery::runtime
