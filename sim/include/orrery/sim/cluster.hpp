// Clusters: devices (peak FLOP/s per precision, memory), how many nodes and GPUs per node, and the
// topology that connects them, read from scenarios/clusters/*.yaml (keys documented in
// scenarios/clusters/README.md). Topologies are built from parameters and route structurally, so a
// 16,384-GPU fat-tree costs no all-pairs search.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "orrery/common/scenario.hpp"

namespace orrery::sim {

// The number formats are common's (orrery/common/scenario.hpp: one parser for scenarios, profiles
// and device peaks).
using orrery::Precision;
using orrery::precision_from_string;  // fp32, tf32, bf16, fp16 (any case)
using orrery::to_string;

struct Device {
  std::string name;            // "H100-SXM"
  double peak_fp32_flops = 0;  // FLOP/s, dense, non-tensor-core FP32
  double peak_tf32_flops = 0;  // FLOP/s, dense
  double peak_bf16_flops = 0;  // FLOP/s, dense (FP16 the same)
  double mem_bandwidth_bytes_per_s = 0;
  int64_t mem_capacity_bytes = 0;
  // A GPU (its default profile bf16 with GPU kernel efficiencies), or a CPU: the `cpu` preset and
  // every device a cluster file bases on it, whatever its name (fp32, CPU defaults).
  bool gpu = true;
  double peak_flops(Precision p) const;
};

// Presets: "A100-SXM-80GB", "H100-SXM", "H200", "cpu" (rough; scenarios/clusters/cpu-local.yaml
// overrides it with the calibrated machine's figures). Lookup is case-insensitive.
std::optional<Device> device_preset(std::string_view name);
std::vector<std::string> device_preset_names();

enum class TopologyKind {
  Crossbar,  // each node: GPUs on an NVSwitch-like crossbar; nodes must be 1
  FatTree,   // DGX-style nodes (crossbar inside, one NIC per GPU) on a 2- or 3-tier fat-tree
  Ring,      // GPUs on a bidirectional ring
  Torus,     // GPUs on a 2D or 3D torus (dims)
};
std::string_view to_string(TopologyKind k);

// Topology parameters as read from the cluster file. Bandwidths in GB/s (1e9 bytes/s, which is also
// bytes per ns) per direction; latencies per link traversal.
struct TopologyConfig {
  TopologyKind kind = TopologyKind::Crossbar;
  // Crossbar and the intra-node part of FatTree: GPU<->switch links.
  double nvlink_gb_per_s = 450;
  int64_t nvlink_latency_ns = 500;
  // FatTree: NIC<->leaf and switch<->switch links.
  double nic_gb_per_s = 50;
  int64_t nic_latency_ns = 1000;    // GPU<->NIC<->leaf hop
  int64_t switch_latency_ns = 500;  // each switch<->switch hop
  bool rail_optimized = true;       // NIC i of every node on the leaves of rail i
  int tiers = 2;                    // 2 (leaf, spine) or 3 (leaf, aggregation, core)
  int radix = 64;                   // switch ports
  double oversubscription = 1.0;    // leaf down-ports : up-ports
  // Ring and Torus: GPU<->GPU links.
  double link_gb_per_s = 50;
  int64_t link_latency_ns = 1000;
  std::vector<int> dims;  // Torus: 2 or 3 sizes whose product is the GPU count
};

// A directed link between two vertices of the topology graph (GPUs are vertices 0..gpus-1).
struct Link {
  int32_t src = 0;
  int32_t dst = 0;
  double gb_per_s = 0;  // capacity, GB/s == bytes/ns
  int64_t latency_ns = 0;
};

class Topology {
 public:
  virtual ~Topology() = default;
  int num_gpus() const { return gpus_; }
  int num_vertices() const { return static_cast<int>(vertex_names_.size()); }
  const std::vector<Link>& links() const { return links_; }
  const std::string& vertex_name(int v) const { return vertex_names_.at(v); }
  // Appends to `out` the link ids of one shortest path from GPU `src` to GPU `dst` (src != dst).
  // Among equal-cost paths `hash` chooses (ECMP): the same hash always gives the same path. One
  // policy on top: on a rail-optimized fat-tree a transfer between nodes and rails first crosses
  // NVLink to the source node's NIC on the destination's rail (NCCL's PXN), then takes a shortest path.
  virtual void route(int32_t src, int32_t dst, uint64_t hash, std::vector<int32_t>& out) const = 0;
  // The endpoints that key a flow's ECMP hash (network.cpp): the flow's own, except on a
  // rail-optimized fat-tree, where a flow between two nodes on one rail (GPUs of the same local
  // index) is keyed by the local-0 GPUs of those nodes: every rail picks the spines rail 0 picks.
  virtual std::pair<int32_t, int32_t> ecmp_endpoints(int32_t src, int32_t dst) const {
    return {src, dst};
  }
  // Whether the rails of this fabric are exact copies of each other: a rail-optimized fat-tree
  // whose rails share no link (their leaves are their own; with 3 tiers a rail's pods hold no other
  // rail's leaves, or each rail stays inside one pod) and route alike (ecmp_endpoints). Traffic
  // between the nodes on rail t then meets exactly the contention the same traffic on rail 0 meets
  // (the executor's rail symmetry, executor.hpp).
  virtual bool rails_are_copies() const { return false; }
  // A shortest path between any two vertices by breadth-first search (small topologies; tests check
  // route() with it).
  void route_bfs(int32_t src, int32_t dst, uint64_t hash, std::vector<int32_t>& out) const;
  int64_t path_latency_ns(const std::vector<int32_t>& path) const;
  // Minimum capacity along a path.
  double path_gb_per_s(const std::vector<int32_t>& path) const;
  std::string describe() const { return description_; }

 protected:
  int add_vertex(std::string name);
  int add_link(int src, int dst, double gb_per_s, int64_t latency_ns);
  int gpus_ = 0;
  std::vector<std::string> vertex_names_;
  std::vector<Link> links_;
  std::vector<std::vector<int32_t>> out_links_;  // per vertex
  std::string description_;
};

// Per-algorithm-step software/protocol latency and the NCCL-like channel count.
struct CollectiveConfig {
  int64_t step_latency_ns = 0;  // added to the path latency in every algorithm step (alpha)
  int channels = 0;  // 0: automatic (gpus_per_node for multi-node rings, else 1... see README)
};

// NCCL's protocols (NVIDIA/nccl, src/device/prims_*.h): LL sends 8-byte lines of 4 data and 4 flag
// bytes, LL128 128-byte lines of 120 data and 8 flag bytes, Simple bulk copies with a memory fence per
// chunk; the lower the latency, the lower the bandwidth.
enum class Protocol { Auto, LL, LL128, Simple };
std::string_view to_string(Protocol p);
std::optional<Protocol> protocol_from_string(std::string_view s);  // auto, ll, ll128, simple

// One protocol's costs, in the structure of NCCL's tuning model (src/graph/tuning.cc): a collective of
// S bytes takes base + intra_steps * nvlink_step + inter_steps * net_step (us) plus its link time at
// `efficiency` times the links' effective capacity.
struct NcclProtocolParams {
  double efficiency =
      1.0;  // of NVLink copies; between nodes the protocol's wire format (network.cpp)
  double base_latency_us = 0;
  double nvlink_step_latency_us = 0;
  double net_step_latency_us = 0;
  // NCCL's tree all-reduce has latency constants of its own (tuning.cc baseLat / hwLat Tree).
  double tree_base_latency_us = 0;
  double tree_nvlink_step_latency_us = 0;
  double tree_net_step_latency_us = 0;
};

// The NCCL model (cluster file section `nccl:`, scenarios/clusters/README.md). Off unless the cluster
// has the section: the alpha-beta model of `collective:` then runs links at 100 %.
struct NcclModel {
  bool enabled = false;
  // Share of a link's line rate NCCL's copies reach (NCCL's topology model: SM80 20 GB/s of NVLink
  // 3's 25 GB/s per link, SM90 20.6 GB/s of NVLink 4's 25 GB/s; see load_cluster's defaults).
  double nvlink_efficiency = 1.0;
  double nic_efficiency = 1.0;
  // Defaults: NCCL's tuning constants (tuning.cc: baseLat, hwLat ring NVLINK/NET, LL at .5 and LL128 at
  // 120/128 of the bandwidth); cluster files override them with fitted values.
  NcclProtocolParams ll{0.5, 6.6, 0.6, 2.7, 6.8, 0.6, 5.0};
  NcclProtocolParams ll128{120.0 / 128.0, 14.0, 1.9, 4.0, 14.0, 1.25, 8.5};
  NcclProtocolParams simple{1.0, 8.4, 3.4, 14.0, 8.4, 4.0, 14.0};
  // LL between nodes: NCCL's llMaxBws busbw ceiling for 2 nodes and for more (tuning.cc, Hopper 45 and
  // 35 GB/s, Ampere 22.5 and 19); 0 = none.
  double ll_max_busbw_2_nodes_gb_per_s = 0;
  double ll_max_busbw_gb_per_s = 0;
  // A ring across nodes pays at least this per intra-node step (3x for Simple): NCCL's network
  // overhead (tuning.cc getNetOverhead: 1 us on Intel x86, 2 us on AMD).
  double net_overhead_us = 1.0;
  // NVLink SHARP all-reduce inside one NVSwitch node (H100/H200): each GPU moves (n-1)/n of the
  // buffer each way, half of a ring's, at nvls_efficiency of its links; NCCL's latency is 25 us.
  bool nvls = false;
  double nvls_efficiency = 0.85;  // NCCL's nvlsEfficiency (Hopper)
  double nvls_latency_us = 25.0;  // NCCL's hwLat NVLS Simple
  // NVLS tree between nodes (NCCL's NVLSTree): nvls_tree_latency_us (NCCL's hwLat NVLink NVLSTree) plus
  // 2 log2(nodes) network steps of nvls_tree_net_step_latency_us (hwLat NET NVLSTree Simple).
  double nvls_tree_latency_us = 25.0;
  double nvls_tree_net_step_latency_us = 20.9;
  int max_channels = 0;  // channels NCCL starts from (0: the `collective:` channels)
};

struct Cluster {
  std::string name;
  std::string path;  // file it came from, "" when built in code
  Device device;
  int nodes = 1;
  int gpus_per_node = 8;
  TopologyConfig topo;
  CollectiveConfig coll;
  NcclModel nccl;
  std::shared_ptr<const Topology> topology;  // built by build_topology()

  int num_gpus() const { return nodes * gpus_per_node; }
  int node_of(int gpu) const { return gpu / gpus_per_node; }
  int local_of(int gpu) const { return gpu % gpus_per_node; }
};

// Builds (or rebuilds) cluster.topology from cluster.topo, nodes and gpus_per_node. Throws InputError
// when the parameters cannot describe a topology (e.g. a crossbar with several nodes, torus dims that
// do not multiply to the GPU count, a 2-tier fat-tree too large for the radix).
void build_topology(Cluster& cluster);

// A fat-tree leaf's ports down to NICs: round(radix · o / (1 + o)) for oversubscription o, within
// [1, radix − 1] (the rest go up). On a rail-optimized fat-tree a rail's NICs fill
// ceil(nodes / down ports) leaves.
int fat_tree_leaf_down_ports(const TopologyConfig& t);

// Reads a cluster file. Unknown keys, devices or topologies throw InputError naming the file, the
// line and the key.
Cluster load_cluster(const std::string& path);
Cluster parse_cluster(const std::string& yaml_text, const std::string& origin);

// The same cluster design with `gpus` GPUs (for sweeps): nodes = ceil(gpus / gpus_per_node) (a single
// partial node when gpus < gpus_per_node), a fat-tree grows to 3 tiers if 2 no longer fit, a ring
// resizes, a torus needs explicit dims (InputError). Rebuilds the topology.
Cluster resize_cluster(const Cluster& c, int gpus);

}  // namespace orrery::sim
