// Cluster files and topologies: presets, the shipped cluster files, bad files (file:line:key
// messages), structural routes against breadth-first search, ECMP.
#include <gtest/gtest.h>

#include <set>

#include "orrery/common/error.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/sweep.hpp"

using namespace orrery::sim;

namespace {

std::string cluster_path(const std::string& name) {
  return std::string(ORRERY_SOURCE_DIR) + "/scenarios/clusters/" + name;
}

// The route must be a chain of links from src to dst.
void expect_chain(const Topology& t, int src, int dst, const std::vector<int32_t>& path) {
  ASSERT_FALSE(path.empty());
  int v = src;
  for (int32_t l : path) {
    ASSERT_EQ(t.links()[l].src, v);
    v = t.links()[l].dst;
  }
  EXPECT_EQ(v, dst);
}

void check_routes_are_shortest(const Cluster& c, int stride = 1) {
  const Topology& t = *c.topology;
  for (int a = 0; a < t.num_gpus(); a += stride)
    for (int b = 0; b < t.num_gpus(); b += stride) {
      if (a == b) continue;
      std::vector<int32_t> p, q;
      t.route(a, b, 12345u * a + b, p);
      t.route_bfs(a, b, 0, q);
      expect_chain(t, a, b, p);
      expect_chain(t, a, b, q);
      const bool pxn = c.topo.kind == TopologyKind::FatTree && c.topo.rail_optimized &&
                       c.node_of(a) != c.node_of(b) && c.local_of(a) != c.local_of(b);
      if (pxn) {
        // NCCL's PXN: over NVLink to the NIC on the destination's rail, then a shortest path.
        q.clear();
        const int nic = t.links()[p[1]].dst;
        t.route_bfs(nic, b, 0, q);
        EXPECT_EQ(p.size(), q.size() + 2) << t.vertex_name(a) << " -> " << t.vertex_name(b);
      } else {
        EXPECT_EQ(p.size(), q.size()) << t.vertex_name(a) << " -> " << t.vertex_name(b);
      }
    }
}

Cluster fat_tree(int nodes, int gpn, int tiers, int radix, bool rail, double os = 1) {
  Cluster c;
  c.device = *device_preset("H100-SXM");
  c.nodes = nodes;
  c.gpus_per_node = gpn;
  c.topo.kind = TopologyKind::FatTree;
  c.topo.tiers = tiers;
  c.topo.radix = radix;
  c.topo.rail_optimized = rail;
  c.topo.oversubscription = os;
  build_topology(c);
  return c;
}

}  // namespace

TEST(Devices, PresetsFromTheDatasheets) {
  const Device h = *device_preset("H100-SXM");
  EXPECT_DOUBLE_EQ(h.peak_flops(Precision::BF16), 989e12);
  EXPECT_DOUBLE_EQ(h.peak_flops(Precision::TF32), 495e12);
  EXPECT_DOUBLE_EQ(h.mem_bandwidth_bytes_per_s, 3.35e12);
  const Device a = *device_preset("a100-sxm-80gb");
  EXPECT_DOUBLE_EQ(a.peak_flops(Precision::BF16), 312e12);
  EXPECT_EQ(device_preset("H200")->mem_capacity_bytes, 141'000'000'000LL);
  EXPECT_TRUE(device_preset("cpu").has_value());
  EXPECT_FALSE(device_preset("tpu-v5").has_value());
}

TEST(ClusterFiles, ShippedFilesLoad) {
  const Cluster a = load_cluster(cluster_path("h100-8.yaml"));
  EXPECT_EQ(a.num_gpus(), 8);
  EXPECT_EQ(a.topo.kind, TopologyKind::Crossbar);
  const Cluster b = load_cluster(cluster_path("h100-1024.yaml"));
  EXPECT_EQ(b.num_gpus(), 1024);
  EXPECT_EQ(b.device.name, "H100-SXM");
  const Cluster c = load_cluster(cluster_path("h100-16384.yaml"));
  EXPECT_EQ(c.num_gpus(), 16384);
  EXPECT_EQ(c.topo.tiers, 3);
  const Cluster d = load_cluster(cluster_path("selene-a100.yaml"));
  EXPECT_DOUBLE_EQ(d.topo.nvlink_gb_per_s, 300);
  EXPECT_DOUBLE_EQ(d.topo.nic_gb_per_s, 25);
  const Cluster e = load_cluster(cluster_path("cpu-local.yaml"));
  EXPECT_EQ(e.device.name, "cpu-2core");
  EXPECT_DOUBLE_EQ(e.device.peak_fp32_flops, 0.16e12);
  // A device based on the cpu preset is a CPU whatever its name: its default profile is the CPU's
  // (fp32, no host link), not a GPU's bf16 one.
  EXPECT_FALSE(e.device.gpu);
  EXPECT_TRUE(b.device.gpu);
  const HardwareProfile cpu = profile_for(e);
  EXPECT_EQ(cpu.precision, Precision::FP32);
  EXPECT_EQ(cpu.offload.host_link_bytes_per_s, 0);
  EXPECT_DOUBLE_EQ(cpu.cost(OpClass::Gemm).flops_efficiency, 0.5);
  EXPECT_EQ(profile_for(b).precision, Precision::BF16);
}

TEST(ClusterFiles, BadFilesNameFileLineAndKey) {
  auto error_of = [](const std::string& text) {
    try {
      parse_cluster(text, "bad.yaml");
    } catch (const orrery::InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string unknown_key =
      error_of("device: H100-SXM\nnodes: 1\ntopology:\n  kind: crossbar\n  bandwith: 5\n");
  EXPECT_NE(unknown_key.find("bad.yaml:5"), std::string::npos) << unknown_key;
  EXPECT_NE(unknown_key.find("topology.bandwith"), std::string::npos) << unknown_key;
  const std::string unknown_dev = error_of("device: B300\ntopology: {kind: crossbar}\n");
  EXPECT_NE(unknown_dev.find("bad.yaml:1"), std::string::npos) << unknown_dev;
  EXPECT_NE(unknown_dev.find("unknown device 'B300'"), std::string::npos) << unknown_dev;
  const std::string unknown_topo = error_of("device: H200\ntopology:\n  kind: dragonfly\n");
  EXPECT_NE(unknown_topo.find("bad.yaml:3"), std::string::npos) << unknown_topo;
  EXPECT_NE(unknown_topo.find("dragonfly"), std::string::npos) << unknown_topo;
  const std::string top_key = error_of("device: H200\ngpus: 8\ntopology: {kind: crossbar}\n");
  EXPECT_NE(top_key.find("bad.yaml:2: gpus"), std::string::npos) << top_key;
  const std::string wrong_type =
      error_of("device: H200\nnodes: many\ntopology: {kind: crossbar}\n");
  EXPECT_NE(wrong_type.find("nodes"), std::string::npos) << wrong_type;
  EXPECT_NE(error_of("device: H200\nnodes: 2\ntopology: {kind: crossbar}\n").find("one node"),
            std::string::npos);
  EXPECT_NE(
      error_of("device: H200\nnodes: 4\ngpus_per_node: 1\ntopology: {kind: torus, dims: [3, 2]}\n")
          .find("multiply"),
      std::string::npos);
  EXPECT_NE(error_of("device: H200\nnodes: 64\ntopology: {kind: fat-tree, radix: 8, tiers: 2}\n")
                .find("tiers: 3"),
            std::string::npos);
  EXPECT_THROW(load_cluster("/nonexistent/cluster.yaml"), orrery::InputError);
}

TEST(Topology, FatTreeRoutesAreShortestPaths) {
  check_routes_are_shortest(fat_tree(8, 4, 2, 8, true));      // rail-optimized, 2 tiers
  check_routes_are_shortest(fat_tree(8, 4, 2, 8, false, 3));  // plain, oversubscribed 3:1
  check_routes_are_shortest(fat_tree(16, 4, 3, 8, true), 3);  // 3 tiers, several pods
  check_routes_are_shortest(fat_tree(8, 2, 3, 4, false));
}

TEST(Topology, RingAndTorusRoutesAreShortestPaths) {
  for (int n : {2, 5, 8}) {
    Cluster c;
    c.device = *device_preset("H100-SXM");
    c.nodes = n;
    c.gpus_per_node = 1;
    c.topo.kind = TopologyKind::Ring;
    build_topology(c);
    check_routes_are_shortest(c);
  }
  for (std::vector<int> dims :
       {std::vector<int>{4, 3}, std::vector<int>{3, 2, 4}, std::vector<int>{2, 2, 2}}) {
    Cluster c;
    c.device = *device_preset("H100-SXM");
    c.nodes = dims[0] * dims[1] * (dims.size() > 2 ? dims[2] : 1);
    c.gpus_per_node = 1;
    c.topo.kind = TopologyKind::Torus;
    c.topo.dims = dims;
    build_topology(c);
    check_routes_are_shortest(c);
  }
}

TEST(Topology, EcmpSpreadsFlowsOverSpines) {
  const Cluster c = fat_tree(16, 8, 2, 16, false);
  std::set<std::vector<int32_t>> paths;
  for (uint64_t h = 0; h < 64; ++h) {
    std::vector<int32_t> p;
    c.topology->route(0, 127, h, p);
    paths.insert(p);
  }
  EXPECT_EQ(paths.size(), 8u);  // 16-port leaves, non-blocking: 8 spines
  std::vector<int32_t> p1, p2;
  c.topology->route(0, 127, 7, p1);
  c.topology->route(0, 127, 7, p2);
  EXPECT_EQ(p1, p2);
}

TEST(Topology, RailOptimizedKeepsSameRailTrafficUnderOneLeaf) {
  // GPU 3 of node 0 to GPU 3 of node 5: NIC -> rail-3 leaf -> NIC, no spine.
  const Cluster c = fat_tree(16, 8, 2, 64, true);
  std::vector<int32_t> p;
  c.topology->route(3, 5 * 8 + 3, 0, p);
  EXPECT_EQ(p.size(), 4u);
  // Cross-rail goes over NVLink to the destination's rail first (PXN): 5 links.
  p.clear();
  c.topology->route(3, 5 * 8 + 6, 0, p);
  EXPECT_EQ(p.size(), 5u);
}

TEST(Topology, LargeFatTreeIsCheapToBuild) {
  const Cluster c = load_cluster(cluster_path("h100-16384.yaml"));
  EXPECT_EQ(c.topology->num_gpus(), 16384);
  std::vector<int32_t> p;
  c.topology->route(0, 16383, 99, p);
  expect_chain(*c.topology, 0, 16383, p);
  EXPECT_EQ(p.size(), 9u);  // GPU-NVS-NIC-leaf-agg-core-agg-leaf-NIC-GPU
}

TEST(Topology, ResizeForSweeps) {
  const Cluster c = load_cluster(cluster_path("h100-1024.yaml"));
  const Cluster small = resize_cluster(c, 4);
  EXPECT_EQ(small.num_gpus(), 4);
  EXPECT_EQ(small.nodes, 1);
  const Cluster big = resize_cluster(c, 16384);
  EXPECT_EQ(big.num_gpus(), 16384);
  EXPECT_EQ(big.topo.tiers, 3);  // 2 tiers of radix 64 no longer fit
  EXPECT_EQ(big.device.name, c.device.name);
}

// Inputs found by fuzz/fuzz_cluster (fuzz/README.md): each was an uncaught YAML exception.
TEST(ClusterFile, FuzzFindingsAreInputErrors) {
  auto error_of = [](const std::string& text) -> std::string {
    try {
      parse_cluster(text, "c.yaml");
    } catch (const orrery::InputError& e) {
      return e.what();
    }
    return "";
  };
  // A key that is a list (was YAML::TypedBadConversion).
  EXPECT_NE(error_of("device: H200\ntopology:\n  kind: crossbar\n  ? [a]\n  : 5\n")
                .find("a key must be a name"),
            std::string::npos);
  // An empty tagged scalar as the device (was YAML::BadSubscript).
  EXPECT_NE(error_of("device: !x\ntopology: {kind: crossbar}\n")
                .find("c.yaml:1: device: without a preset"),
            std::string::npos);
}
