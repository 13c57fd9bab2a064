// The target of `orrery sim` and `orrery sweep` (cluster, profile, precision) and the checks before
// a simulation runs (sim_target.hpp).
#include "orrery/sim/sim_target.hpp"

#include <cstdio>
#include <filesystem>

#include "orrery/common/error.hpp"
#include "orrery/sim/calibrate.hpp"
#include "orrery/sim/memory.hpp"
#include "orrery/sim/workload.hpp"

namespace orrery::sim {

std::string find_cluster_file(const std::string& name_or_path, const std::string& flag) {
  namespace fs = std::filesystem;
  if (fs::exists(name_or_path)) return name_or_path;
  for (const std::string& cand :
       {"scenarios/clusters/" + name_or_path + ".yaml", "scenarios/clusters/" + name_or_path}) {
    if (fs::exists(cand)) return cand;
  }
  throw InputError(flag + " '" + name_or_path +
                   "': no such file (give a path or a name in scenarios/clusters/)");
}

SimTarget load_target(const std::string& cluster) {
  SimTarget t;
  t.cluster_path = find_cluster_file(cluster);
  t.cluster = load_cluster(t.cluster_path);
  return t;
}

SimTarget sim_target(const Scenario& s, const std::string& cluster, const std::string& hw) {
  if (!cluster.empty()) return load_target(cluster);
  SimTarget t;
  if (!hw.empty()) {
    t.hw_profile = load_hardware_profile(hw);
    // A calibrated profile describes the machine its traces came from (sim/calibrate.hpp).
    if (t.hw_profile->cluster.nodes > 0) {
      t.cluster = cluster_from_profile(*t.hw_profile, s.world_size());
      return t;
    }
  }
  t.cluster = default_cluster(s);
  return t;
}

Cluster default_cluster(const Scenario& s) {
  Cluster c;
  const bool cpu = device_of(s.runtime) == orrery::Device::Cpu;
  if (cpu && std::filesystem::exists("scenarios/clusters/cpu-local.yaml")) {
    c = load_cluster("scenarios/clusters/cpu-local.yaml");
  } else if (!cpu && std::filesystem::exists("scenarios/clusters/h100-8.yaml")) {
    // The DGX H100 node whose NCCL model reproduces the published nccl-tests curves
    // (scenarios/clusters/README.md), widened to the scenario's world as one NVSwitch crossbar.
    c = load_cluster("scenarios/clusters/h100-8.yaml");
    c.name = "h100-node";
    c.gpus_per_node = s.world_size();
    build_topology(c);
  } else {
    // Not started from the source tree: an ideal crossbar, named so that the output says which
    // default ran (the files above give other figures).
    c.name = cpu ? "cpu-node (ideal links: scenarios/clusters/cpu-local.yaml not found)"
                 : "h100-node (ideal links: scenarios/clusters/h100-8.yaml not found)";
    c.device = *device_preset(cpu ? "cpu" : "H100-SXM");
    c.nodes = 1;
    c.gpus_per_node = s.world_size();
    c.topo.kind = TopologyKind::Crossbar;
    build_topology(c);
  }
  return c.num_gpus() == s.world_size() ? c : resize_cluster(c, s.world_size());
}

HardwareProfile target_profile(const SimTarget& t, const std::string& hw) {
  if (hw.empty()) return profile_for(t.cluster, hardware_dir_for(t.cluster_path));
  return t.hw_profile ? *t.hw_profile : load_hardware_profile(hw);
}

std::string precision_name(const std::string& requested, const HardwareProfile& profile) {
  if (!requested.empty()) return requested;
  return profile.precision == Precision::BF16 || profile.precision == Precision::FP16 ? "mixed"
                                                                                      : "fp32";
}

bool replica_contention_matters(const Scenario& s, const Cluster& c) {
  if (s.world_size() <= std::max(1, c.gpus_per_node) || c.nodes <= 1) return false;
  switch (c.topo.kind) {
    case TopologyKind::Crossbar:
      return false;
    case TopologyKind::FatTree:
      // Rail-optimized and non-blocking: a rail's traffic leaves its leaf once the rail's NICs
      // fill more than one leaf, and ECMP then puts flows of different groups on the same
      // leaf-to-spine links (16,384 GPUs of h100-1024's design: +14 % step time).
      return c.topo.oversubscription > 1.0 || !c.topo.rail_optimized ||
             c.nodes > fat_tree_leaf_down_ports(c.topo);
    case TopologyKind::Ring:
    case TopologyKind::Torus:
      return true;
  }
  return false;
}

void check_simulation_fits(const Scenario& s, const Cluster& cluster, const SimOptions& opt,
                           bool allow_oom) {
  std::optional<HardwareProfile> fallback;
  if (!opt.profile) fallback = profile_for(cluster);
  const HardwareProfile& profile = opt.profile ? *opt.profile : *fallback;
  check_simulation_size(s, opt.steps, opt.all_ranks || profile.sharing.cores > 0, opt.keep_trace, 0,
                        rail_copies(s, cluster, opt, profile));
  const auto mem =
      estimate_memory(s, precision_config(precision_name(opt.precision, profile)),
                      cluster.device.mem_capacity_bytes, device_nvme_offload(s, profile.offload));
  for (const auto& m : mem) {
    if (m.fits || allow_oom) continue;
    char buf[512];
    std::snprintf(
        buf, sizeof buf,
        "%s: the model does not fit device memory: pipeline stage %d needs %.1f GB per GPU "
        "(parameters %.1f + gradients %.1f + optimizer %.1f + activations %.1f GB) but %s has "
        "%.1f GB; use ZeRO (parallel.zero), more tp/pp, or a smaller micro-batch (or --allow-oom)",
        s.path.c_str(), m.stage, m.total_bytes / 1e9, m.parameters_bytes / 1e9,
        m.gradients_bytes / 1e9, m.optimizer_bytes / 1e9, m.activations_bytes / 1e9,
        cluster.device.name.c_str(), double(cluster.device.mem_capacity_bytes) / 1e9);
    throw InputError(buf);
  }
}

}  // namespace orrery::sim
