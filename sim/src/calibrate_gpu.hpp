// What calibrate.cpp and calibrate_gpu.cpp share (private to sim/): the observations a GPU fit
// takes, one per operator and shape, and the two functions that produce and fit them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orrery/sim/calibrate.hpp"
#include "orrery/sim/cost_model.hpp"

namespace orrery::sim::detail {

// One operator at one shape, as measured: the simulator's kernels for it (with shapes), the
// kernels the GPU launched for one instance (each pays the per-kernel overhead), and the median
// time of an instance (the sum of its kernels' durations).
struct GpuItem {
  std::string name;   // "aten::mm", "fwd.block"
  std::string shape;  // "2048x4608x12288 bf16"
  std::vector<Kernel> kernels;
  double launched = 1;     // kernels per instance
  double measured_ns = 0;  // median over instances
  int64_t count = 0;       // instances
  int32_t elem_bytes = 0;  // operands' element size (gemm and attention), 0 unknown
  bool tf32 = false;       // 4-byte operands on TF32 tensor-core kernels (tf32_tensor_core_kernel)
  size_t trace = 0;        // index of the trace it came from
};

// The op spans of Orrery's own CUDA traces (fwd.block, bwd.head, adamw, ...: each with the cost
// model's kernels, as the CPU fit reads them), medians per op and shape over the counted steps.
// Defined in calibrate.cpp, which owns the runs' reading.
std::vector<GpuItem> orrery_gpu_items(const traces::Trace& t, size_t trace_index, int skip_steps,
                                      std::vector<std::string>& notes);

// The GPU fit (calibrate.hpp says what it fits); `calibrate` calls it for GPU traces.
CalibrationResult calibrate_gpu(const std::vector<traces::Trace>& traces,
                                const CalibrationOptions& opt);

}  // namespace orrery::sim::detail
