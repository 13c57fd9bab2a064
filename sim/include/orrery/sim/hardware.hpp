// Hardware profiles: how fast a device really runs each class of kernel, and how it communicates, on
// top of the datasheet peaks that the cluster file gives. One YAML file per profile
// (scenarios/hardware/<device>.yaml holds the default of each device preset; `orrery calibrate`
// writes calibrated ones measured from real traces). Every key is documented in scenarios/README.md
// and in the shipped files themselves.
//
//   name: H100-SXM-default
//   device: H100-SXM            # device preset the profile describes (informational check)
//   precision: bf16             # bf16 | fp16 | tf32 | fp32: which peak of the device the efficiencies refer to
//   peak_flops: 0               # optional: overrides the cluster device's peak (FLOP/s), 0 = keep
//   memory_bandwidth_gbps: 0    # optional: overrides the device's memory bandwidth (GB/s), 0 = keep
//   data_load_us: 20            # time of one micro-batch's data load on the rank
//   kernels:                    # per op class: roofline efficiencies and per-kernel launch overhead
//     gemm:        {flops_efficiency: 0.75, bandwidth_efficiency: 0.9, overhead_us: 4}
//     attention:   {...}
//     elementwise: {...}
//     layernorm:   {...}
//     softmax_loss: {...}
//     optimizer:   {...}
//   collectives:                # optional alpha-beta overrides of the network model, per op and scope
//     - {op: all_reduce, scope: intra_node, latency_us: 8, bus_bandwidth_gbps: 360}
//   machine:                    # the machine the profile was measured on (free-form strings)
//     host: ..., cpu: ..., gpus: ..., driver: ..., date: ..., source: ...
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "orrery/traces/span.hpp"

namespace orrery::sim {

// Classes of kernels with their own efficiency: dense matrix products, fused attention, elementwise
// maps (GELU, bias, residual, embedding gather/scatter), LayerNorm, softmax + cross-entropy, and
// the optimizer update.
enum class OpClass : uint8_t { Gemm = 0, Attention, Elementwise, LayerNorm, SoftmaxLoss, Optimizer };
inline constexpr int kOpClassCount = 6;
std::string_view to_string(OpClass c);  // "gemm", "attention", ...

struct ClassCost {
  double flops_efficiency = 1.0;      // achieved / peak FLOP/s when compute-bound, (0, 1]
  double bandwidth_efficiency = 1.0;  // achieved / peak memory bandwidth when memory-bound, (0, 1]
  int64_t overhead_ns = 0;            // per kernel (launch, synchronisation, host work)
};

// Where a collective override applies: within one node, across nodes, or any group.
enum class CollectiveScope : uint8_t { Any = 0, IntraNode = 1, InterNode = 2 };

// An alpha-beta replacement for the network model's time of one collective op:
// time = latency + bytes · busbw_factor(op, n) / bus_bandwidth.
struct CollectiveOverride {
  traces::CollOp op = traces::CollOp::AllReduce;
  CollectiveScope scope = CollectiveScope::Any;
  int64_t latency_ns = 0;
  double bus_bandwidth_bytes_per_s = 0;
};

struct HardwareProfile {
  std::string name;
  std::string path;       // file it was read from ("" for built-in defaults)
  std::string device;     // device preset name it describes
  std::string precision;  // bf16 | fp16 | tf32 | fp32
  double peak_flops = 0;                    // 0: the cluster device's peak for `precision`
  double memory_bandwidth_bytes_per_s = 0;  // 0: the cluster device's
  int64_t data_load_ns = 0;
  std::array<ClassCost, kOpClassCount> classes{};
  std::vector<CollectiveOverride> collectives;
  std::map<std::string, std::string> machine;  // the `machine:` section

  const ClassCost& cost(OpClass c) const { return classes[static_cast<int>(c)]; }
  // The override for `op` over a group that is (or is not) inside one node, or null.
  const CollectiveOverride* find_override(traces::CollOp op, bool intra_node) const;
};

// Reads a profile file; throws InputError naming the file and key on unknown keys, wrong types,
// efficiencies outside (0, 1], negative times.
HardwareProfile load_hardware_profile(const std::string& path);
HardwareProfile parse_hardware_profile(const std::string& yaml_text, const std::string& origin);
std::string to_yaml(const HardwareProfile& p);

// Built-in uncalibrated defaults for a device preset (the same numbers as the shipped
// scenarios/hardware/<device>.yaml): GPUs use bf16 with gemm efficiency 0.7, CPUs fp32 with 0.5.
// `is_gpu` picks the family for names not known here.
HardwareProfile default_hardware_profile(const std::string& device, bool is_gpu);

}  // namespace orrery::sim
