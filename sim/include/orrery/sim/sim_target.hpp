// Where `orrery sim` and `orrery sweep` simulate, chosen from their --cluster and --hw arguments:
// the cluster and the hardware profile; the precision a simulation uses; and the checks it must
// pass before it runs (its size on this machine, the model in device memory).
#pragma once

#include <optional>
#include <string>

#include "orrery/common/scenario.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/sim/sweep.hpp"

namespace orrery::sim {

// A --cluster argument: a path, or the name of a file in scenarios/clusters/ ("h100-1024").
// InputError naming `flag` when neither exists.
std::string find_cluster_file(const std::string& name_or_path,
                              const std::string& flag = "--cluster");

// The cluster a simulation runs on.
struct SimTarget {
  Cluster cluster;
  std::string cluster_path;  // the cluster file; "" when the cluster was not read from one
  // The --hw profile, when it was read to choose the cluster (target_profile reuses it).
  std::optional<HardwareProfile> hw_profile;
};

// `orrery sweep`: the cluster file named by `cluster` (find_cluster_file).
SimTarget load_target(const std::string& cluster);

// `orrery sim`: the --cluster file when given; else the machine that a calibrated --hw profile
// describes (its `cluster:` section), with at least the scenario's ranks; else default_cluster(s).
SimTarget sim_target(const Scenario& s, const std::string& cluster, const std::string& hw);

// Without --cluster: scenarios/clusters/cpu-local.yaml for a cpu scenario, or for a GPU scenario
// scenarios/clusters/h100-8.yaml's node (its NCCL model) widened to the world, when that file is
// found from the working directory; else one ideal crossbar node of the scenario's device (cpu, or
// H100-SXM otherwise, links at 100 %), whose name says the file was not found; then resized to
// the scenario's dp·tp·pp GPUs when its size differs.
Cluster default_cluster(const Scenario& s);

// The profile of a target: the --hw file `hw` when given, else the default of the cluster's device
// (profile_for, looked up in hardware_dir_for(cluster file)).
HardwareProfile target_profile(const SimTarget& t, const std::string& hw);

// The precision a simulation uses: `requested` (fp32 | mixed) when given, else the profile's
// (bf16 or fp16 -> mixed, anything else -> fp32).
std::string precision_name(const std::string& requested, const HardwareProfile& profile);

// The checks before simulate(), with the layout fitted to the cluster and opt.profile chosen:
// check_simulation_size (every rank simulated with opt.all_ranks or a profile with core sharing),
// then, unless `allow_oom`, an InputError for the first pipeline stage that does not fit device
// memory (its parameters, gradients, optimizer state and activations, the device, the remedies).
void check_simulation_fits(const Scenario& s, const Cluster& cluster, const SimOptions& opt,
                           bool allow_oom);

// Whether the collectives of symmetric groups (the replicas' dp all-reduces, the stages' pp
// transfers) contend on the fabric, so that one representative rank per stage would leave out time
// the real job spends (executor.hpp): the job spans more than one node of a fat-tree whose leaves
// are oversubscribed (leaf down-ports > up-ports), that is not rail-optimized (the nodes' NICs
// share leaf uplinks), or whose rails fill more than one leaf each (rail-optimized and non-blocking,
// but nodes > the leaf's down-ports: traffic between a rail's leaves crosses spine links that ECMP
// shares between groups), or of a ring or torus (links shared between neighbours' traffic). A
// crossbar, one node, or a rail-optimized non-blocking fat-tree whose rails each fit one leaf: no
// (their groups use disjoint links). `orrery sim` simulates every rank by default when this holds.
bool replica_contention_matters(const Scenario& s, const Cluster& cluster);

}  // namespace orrery::sim
