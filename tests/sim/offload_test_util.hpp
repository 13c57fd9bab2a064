// Helpers shared by the offload tests of the simulator (host offload, NVMe offload on a device):
// parameter counts, exact chunk sizes, the workload at fp32 on an H100 profile, closed-form times,
// dependencies and the counters of a simulated trace.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>

#include "orrery/sim/hardware.hpp"
#include "orrery/sim/sweep.hpp"
#include "orrery/sim/workload.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim::testing {

// Parameters of one rank of stage 0 (tp slice, unsharded).
inline int64_t stage_params(const Scenario& s) {
  int64_t n = 0;
  for (const auto& t : stage_parameters(s, 0)) n += t.count;
  return n;
}

// chunk_mb giving chunks of exactly `elems` elements (a power-of-two division: exact in double).
inline double chunk_mb_of(int64_t elems) { return double(elems) / 262144.0; }

// The workload of one step at fp32 on an H100 with profile `p`, `ranks_per_node` sharing the node.
inline Workload build_fp32(const Scenario& s, const HardwareProfile& p, int ranks_per_node) {
  const Device d = *device_preset("H100-SXM");
  const CostModel cost(p, d.peak_bf16_flops, d.mem_bandwidth_bytes_per_s);
  return build_workload(s, cost, {1, precision_config("fp32"), ranks_per_node});
}

// The simulator's time of moving `bytes` at `bytes_per_s` (offload_io_ns: ceil, ns).
inline int64_t ceil_ns(double bytes, double bytes_per_s) {
  return int64_t(std::ceil(bytes / bytes_per_s * 1e9));
}

// Whether `op` lists `dep` among its dependencies.
inline bool depends_on(const StageProgram& p, uint32_t op, uint32_t dep) {
  for (uint32_t k = 0; k < p.ops[op].dep_count; ++k)
    if (p.deps[p.ops[op].dep_begin + k] == dep) return true;
  return false;
}

// `s` simulated at fp32 on `c` with the default H100 profile, its trace kept; its counters by name.
inline std::map<std::string, double> simulated_counters(const Scenario& s, const Cluster& c,
                                                        SimResult* out = nullptr) {
  SimOptions opt;
  opt.profile = default_hardware_profile("H100-SXM", true);
  opt.precision = "fp32";
  opt.network = NetworkModel::Analytical;
  opt.keep_trace = true;
  SimResult r = simulate(s, c, opt);
  std::map<std::string, double> k;
  for (const auto& x : r.trace->counters) k[std::string(r.trace->strings.str(x.name))] = x.value;
  if (out != nullptr) *out = std::move(r);
  return k;
}

// The makespan of a 3-chunk optimizer pipeline on one rank and its chunks' elements.
struct Makespan {
  int64_t measured = 0;
  std::vector<int64_t> n;
};

}  // namespace orrery::sim::testing
