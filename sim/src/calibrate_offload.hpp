// ZeRO-Offload's two host rates measured from traces (private to sim/; calibrate.hpp, steps 2b and
// 5, says where the CPU and GPU fits use them): the host link from the runs' offload.d2h /
// offload.h2d spans and the host's AdamW bandwidth from offload.adamw spans, or from a CPU run's own
// adamw spans (the runtime's adamw_update, the very function a GPU run's host step calls).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "orrery/sim/calibrate.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::sim::detail {

// A rate pooled over runs: each run's bytes over its busy time, times the ranks that ran at once
// (`scale`: 1 for a GPU's own link, the run's ranks on a node for the node's memory), weighted by
// the run's bytes.
struct PooledRate {
  double bytes = 0;
  double weighted = 0;  // Σ bytes · rate
  int64_t spans = 0;
  std::set<std::string> traces;
  void add_run(double run_bytes, double run_ns, double scale, int64_t run_spans,
               const std::string& label);
  double bytes_per_s() const { return bytes > 0 ? weighted / bytes : 0.0; }
  bool any() const { return bytes > 0; }
};

struct HostOffloadFit {
  PooledRate link;   // per GPU, per direction: offload.d2h and offload.h2d
  PooledRate adamw;  // per node, bytes of state traffic: offload.adamw (28 bytes per element)
};

// The counted steps of a trace: its first step plus `skip_steps` and later.
int first_counted_step(const traces::Trace& t, int skip_steps);
// Ranks that shared a node in the run (the most on one host; the world size when hosts are unknown).
int ranks_on_one_node(const traces::Trace& t);

// The offload.d2h / offload.h2d / offload.adamw spans of the counted steps.
HostOffloadFit fit_host_offload(const std::vector<traces::Trace>& ts, int skip_steps);
// The traces with the adamw spans of offload runs (offload.read or offload.d2h spans) dropped: those
// include the waits for the disk or the copies, which are fitted apart, not as optimizer compute.
std::vector<traces::Trace> without_offload_adamw(const std::vector<traces::Trace>& in);
// Writes what `f` measured into `p.offload` and says so: GPU fits as rows (`rows` not null), CPU
// fits as notes.
void apply_host_offload(const HostOffloadFit& f, HardwareProfile& p, std::vector<GpuFitRow>* rows,
                        std::vector<std::string>& notes);

}  // namespace orrery::sim::detail
