// The NCCL model (protocols, channels, NVLS, link efficiencies; NcclModel in cluster.hpp) against the
// published nccl-tests curves in tests/data/nccl_tests/ (each file's header cites its source), through
// the function `orrery sim-collective` calls (predict_nccl_table); and closed forms of the protocol
// choice, the latency and the channel count the model defines.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/collectives.hpp"
#include "orrery/sim/nccl_table.hpp"
#include "orrery/sim/network.hpp"

using namespace orrery::sim;
using orrery::traces::CollOp;

namespace {

const std::string kSrc = ORRERY_SOURCE_DIR;

struct Point {
  int64_t bytes = 0;
  double busbw = 0;  // GB/s, as published
};

std::vector<Point> load_curve(const std::string& name) {
  std::ifstream in(kSrc + "/tests/data/nccl_tests/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::vector<Point> pts;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    Point p;
    is >> p.bytes >> p.busbw;
    pts.push_back(p);
  }
  return pts;
}

Cluster cluster(const std::string& name) {
  return load_cluster(kSrc + "/scenarios/clusters/" + name + ".yaml");
}

// The prediction sim-collective prints for one size (all-reduce on the first `ranks` GPUs).
NcclRow predict(const Cluster& c, int ranks, int64_t bytes,
                NetworkModel model = NetworkModel::Flow) {
  NcclSweep s;
  s.op = CollOp::AllReduce;
  s.ranks = ranks;
  s.min_bytes = bytes;
  s.max_bytes = bytes;
  s.model = model;
  const auto rows = predict_nccl_table(c, s);
  EXPECT_EQ(rows.size(), 1u);
  return rows.front();
}

// Within 10 % at >= 64 MiB and 25 % from 64 KiB up (issue 17 item 2), in both network models; from
// `from_bytes` up where a curve is asserted only in part (the README says why).
void check_curve(const std::string& cluster_name, const std::string& curve, int ranks,
                 int64_t from_bytes = 64 << 10) {
  const Cluster c = cluster(cluster_name);
  const auto pts = load_curve(curve);
  ASSERT_FALSE(pts.empty());
  for (const Point& p : pts) {
    if (p.bytes < std::max<int64_t>(from_bytes, 64 << 10)) continue;
    const double tol = p.bytes >= (64LL << 20) ? 0.10 : 0.25;
    for (NetworkModel m : {NetworkModel::Flow, NetworkModel::Analytical}) {
      const NcclRow r = predict(c, ranks, p.bytes, m);
      const double err = r.busbw_gb_per_s / p.busbw - 1.0;
      EXPECT_LE(std::abs(err), tol)
          << curve << " " << p.bytes << " B: published " << p.busbw << " GB/s, predicted "
          << r.busbw_gb_per_s << " (" << to_string(r.algo) << "/" << to_string(r.protocol) << ", "
          << to_string(m) << ")";
    }
  }
}

}  // namespace

TEST(NcclCurves, A100EightGpuNvlinkAllReduce) { check_curve("a100-8", "a100_8gpu_nvlink.tsv", 8); }

TEST(NcclCurves, H100EightGpuNvlinkAllReduce) {
  check_curve("h100-8", "h100_8gpu_nvlink_dgx.tsv", 8);  // NVIDIA dgxc-benchmarking, 64 KiB-16 GiB
  check_curve("h100-8", "h100_8gpu_nvlink.tsv", 8);      // nccl-tests#290, 128 MiB-4 GiB
}

// The same 8 x H100 curve predicted on the first node of the multi-node cluster files: their
// single-node part must be the fitted one too.
TEST(NcclCurves, H100NodeOfTheLargeClustersMatchesTheOneNodeFit) {
  check_curve("h100-1024", "h100_8gpu_nvlink_dgx.tsv", 8);
  check_curve("h100-16384", "h100_8gpu_nvlink_dgx.tsv", 8);
}

// Between nodes: 2 x 8 H100 with 8 x 400 Gb/s InfiniBand per node (NVIDIA/nccl-tests#309, default
// NCCL), the development curves of the inter-node parameters of h100-1024.yaml: two clusters of the
// same thread, every published point (from 64 KiB, the second cluster publishes from 1 MiB). Its
// 1 MiB point took 93 us where the first cluster took 72 us; the fit sits between them. The same
// thread's 4-node curve (VMs) is asserted from 64 MiB (below, the model is up to 41 % off:
// scenarios/clusters/README.md).
TEST(NcclCurves, H100TwoNodesInfinibandAllReduce) {
  check_curve("h100-1024", "h100_2node_ib.tsv", 16);
  check_curve("h100-16384", "h100_2node_ib.tsv", 16);
}

TEST(NcclCurves, H100TwoNodesSecondClusterInfinibandAllReduce) {
  check_curve("h100-1024", "h100_2node_ib_b.tsv", 16);
  check_curve("h100-16384", "h100_2node_ib_b.tsv", 16);
}

TEST(NcclCurves, H100FourNodesInfinibandAllReduceFrom64MiB) {
  check_curve("h100-1024", "h100_4node_ib.tsv", 32, 64LL << 20);
}

TEST(NcclCurves, EveryCurveFileCitesItsSource) {
  for (const char* f : {"a100_8gpu_nvlink.tsv", "h100_8gpu_nvlink.tsv", "h100_8gpu_nvlink_dgx.tsv",
                        "h100_2node_ib_degraded.tsv", "h100_2node_ib.tsv", "h100_2node_ib_b.tsv",
                        "h100_4node_ib.tsv", "h100_2node_ib_ring.tsv", "h100_8node_ib.tsv",
                        "h100_8node_ib_default.tsv"}) {
    std::ifstream in(kSrc + "/tests/data/nccl_tests/" + f);
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_NE(ss.str().find("# Source:"), std::string::npos) << f;
  }
}

// Closed forms of the model on a100-8 (fitted parameters in scenarios/clusters/a100-8.yaml): the
// ring all-reduce on 8 GPUs takes base + 14 * step (us) + 2*7/8 * S / (300 * 0.8 * efficiency) (ns).
TEST(NcclModel, RingTimeIsTheProtocolsLatencyPlusLinkTimeAtItsEfficiency) {
  const Cluster c = cluster("a100-8");
  ASSERT_TRUE(c.nccl.enabled);
  CollectiveRequest r;
  r.op = CollOp::AllReduce;
  r.members.resize(8);
  std::iota(r.members.begin(), r.members.end(), 0);
  r.algo = Algorithm::Ring;
  r.bytes = 1LL << 30;
  const double link = 300 * 0.8;
  struct Case {
    Protocol p;
    double base_us, step_us, eff;
  };
  for (const Case& k : {Case{Protocol::LL, 6.6, 1.5, 0.365}, Case{Protocol::LL128, 14.0, 1.0, 0.7},
                        Case{Protocol::Simple, 8.4, 6.5, 0.96}}) {
    r.protocol = k.p;
    const double want =
        1000 * (k.base_us + 14 * k.step_us) + 1.75 * static_cast<double>(r.bytes) / (link * k.eff);
    for (NetworkModel m : {NetworkModel::Analytical, NetworkModel::Flow}) {
      EXPECT_NEAR(static_cast<double>(collective_time_ns(c, r, m)), want, want * 1e-3)
          << to_string(k.p);
    }
  }
}

TEST(NcclModel, ProtocolChoiceByMessageSize) {
  // a100-8: LL128 for small and medium messages, Simple from 32 MiB (where its 99.4 us latency pays
  // off: 28 + 1.75 S / 168 = 99.4 + 1.75 S / 230.4 at S = 25.4 MB).
  const Cluster a = cluster("a100-8");
  EXPECT_EQ(predict(a, 8, 64 << 10).protocol, Protocol::LL128);
  EXPECT_EQ(predict(a, 8, 1 << 20).protocol, Protocol::LL128);
  EXPECT_EQ(predict(a, 8, 16 << 20).protocol, Protocol::LL128);
  EXPECT_EQ(predict(a, 8, 32 << 20).protocol, Protocol::Simple);
  EXPECT_EQ(predict(a, 8, 1LL << 30).protocol, Protocol::Simple);
  EXPECT_EQ(predict(a, 8, 1LL << 30).algo, Algorithm::Ring);  // no NVLS on A100
  // h100-8 (scenarios/clusters/h100-8.yaml): LL up to 2 MiB, LL128 at 4-8 MiB, Simple at 16 MiB,
  // NVLS from 32 MiB (84 us + 7/8 S / 231.75 beats 51.8 us + 1.75 S / 350 above ~26 MB).
  const Cluster h = cluster("h100-8");
  EXPECT_EQ(predict(h, 8, 64 << 10).protocol, Protocol::LL);
  EXPECT_EQ(predict(h, 8, 2 << 20).protocol, Protocol::LL);
  const NcclRow mid = predict(h, 8, 4 << 20);
  EXPECT_EQ(mid.algo, Algorithm::Ring);
  EXPECT_EQ(mid.protocol, Protocol::LL128);
  const NcclRow simple = predict(h, 8, 16 << 20);
  EXPECT_EQ(simple.algo, Algorithm::Ring);
  EXPECT_EQ(simple.protocol, Protocol::Simple);
  for (int64_t b : {32LL << 20, 1LL << 30}) {
    const NcclRow big = predict(h, 8, b);
    EXPECT_EQ(big.algo, Algorithm::Nvls) << b;
    EXPECT_EQ(big.protocol, Protocol::Simple);
  }
  // NVLS is an all-reduce of one node: not for all-gather, nor on A100.
  NcclSweep ag;
  ag.op = CollOp::AllGather;
  ag.ranks = 8;
  ag.min_bytes = ag.max_bytes = 1LL << 30;
  EXPECT_EQ(predict_nccl_table(h, ag).front().algo, Algorithm::Ring);
}

TEST(NcclModel, ChannelsDropForSmallMessagesLikeNccl) {
  // NCCL (enqueue.cc): channels drop while bytes < channels * threads * per-thread threshold.
  const Cluster c = cluster("h100-1024");  // collective.channels: 8
  CollectiveRequest r;
  r.op = CollOp::AllReduce;
  r.members.resize(16);
  std::iota(r.members.begin(), r.members.end(), 0);
  r.bytes = 20480;  // LL128: 640 threads * 8 B = 5,120 B per channel -> 4 channels
  EXPECT_EQ(nccl_channels(c, r, Algorithm::Ring, Protocol::LL128), 4);
  r.bytes = 4096;  // LL on a 16-rank ring: 512 * 8 * 16 = 65,536 B per channel -> 1
  EXPECT_EQ(nccl_channels(c, r, Algorithm::Ring, Protocol::LL), 1);
  r.bytes = 1 << 20;  // Simple: 512 * 64 = 32 KiB per channel -> all 8
  EXPECT_EQ(nccl_channels(c, r, Algorithm::Ring, Protocol::Simple), 8);
  EXPECT_EQ(nccl_channels(c, r, Algorithm::Nvls, Protocol::Simple), 16);  // NCCL's NVLS channels
  r.channels = 3;  // an explicit request wins
  EXPECT_EQ(nccl_channels(c, r, Algorithm::Ring, Protocol::LL), 3);
}

TEST(NcclModel, TreeBetweenNodesForSmallAllReducesAndLinkBoundsForLargeOnes) {
  // 16 nodes of 8 H100 (the first 128 GPUs of h100-1024): NCCL's tree costs log2(16) = 4 network
  // steps each way where the ring pays 2 * 15 network and 2 * 112 NVLink steps, so small
  // all-reduces take the tree with LL.
  const Cluster c = cluster("h100-1024");
  const NcclRow small = predict(c, 128, 64 << 10, NetworkModel::Analytical);
  EXPECT_EQ(small.algo, Algorithm::Tree);
  EXPECT_EQ(small.protocol, Protocol::LL);
  EXPECT_EQ(predict(c, 128, 64 << 10, NetworkModel::Flow).algo, Algorithm::Tree);
  // Large ones: bounded by the effective links, 8 NICs * 50 GB/s * 0.94 per node and 450 * 0.824 GB/s
  // of NVLink per GPU, and within 20 % of the tighter bound.
  const double bound = std::min(8 * 50 * 0.94, 450 * 20.6 / 25);
  for (NetworkModel m : {NetworkModel::Analytical, NetworkModel::Flow}) {
    const NcclRow large = predict(c, 128, 1LL << 30, m);
    EXPECT_EQ(large.protocol, Protocol::Simple);
    EXPECT_LE(large.busbw_gb_per_s, bound * 1.0001);
    EXPECT_GT(large.busbw_gb_per_s, 0.8 * bound) << to_string(large.algo);
  }
}

TEST(NcclModel, NvlsTreeBetweenTwoNodes) {
  // 2 nodes of 8 H100 (the first 16 GPUs of h100-1024): large all-reduces take NCCL's NVLS tree,
  // NVLS inside each node while each GPU's 1/8 share crosses its own rail, pipelined. Its time is
  // the slower of NVLS (7/8 S over 450 * 0.824 * 0.625 GB/s) and the rail (S/8 each way over
  // 50 * 0.94 GB/s: Simple moves the data alone on the wire) plus 150 + 2 * 1 * 20.9 us.
  const Cluster c = cluster("h100-1024");
  const int64_t s = 1LL << 30;
  const double nvls_ns = 0.875 * s / (450 * 20.6 / 25 * 0.625);
  const double rail_ns = s / 8.0 / (50 * 0.94);
  const double want = 1000 * (150 + 2 * 20.9) + std::max(nvls_ns, rail_ns);
  for (NetworkModel m : {NetworkModel::Analytical, NetworkModel::Flow}) {
    const NcclRow r = predict(c, 16, s, m);
    EXPECT_EQ(r.algo, Algorithm::NvlsTree) << to_string(m);
    EXPECT_NEAR(static_cast<double>(r.time_ns), want, want * 1e-3) << to_string(m);
  }
  // Not across nodes with unequal members, nor for small messages (the tree with LL wins).
  EXPECT_EQ(predict(c, 16, 64 << 10).algo, Algorithm::Tree);
  EXPECT_EQ(predict(c, 12, s).algo == Algorithm::NvlsTree, false);
}

namespace {
CollectiveRequest all_reduce(int ranks, Algorithm a, Protocol p, int64_t bytes) {
  CollectiveRequest r;
  r.op = CollOp::AllReduce;
  r.members.resize(ranks);
  std::iota(r.members.begin(), r.members.end(), 0);
  r.algo = a;
  r.protocol = p;
  r.bytes = bytes;
  return r;
}
double time_ns(const Cluster& c, const CollectiveRequest& r, NetworkModel m) {
  return static_cast<double>(collective_time_ns(c, r, m));
}
}  // namespace

// NCCL's tree latency (tuning.cc): tree baseLat + 2 ((ppn - 1) NVLink tree steps + log2(nodes) NET
// tree steps); LL between nodes is held to NCCL's llMaxBws ceiling (Hopper: 45 GB/s of busbw on 2
// nodes, 35 beyond), as algorithm bandwidth half of it for the tree, busbw / (2 (n-1)/n) for rings.
// At 1 GiB the tree correction is 1.
TEST(NcclModel, TreeLatencyAndTheLlCeilingBetweenNodes) {
  const Cluster c = cluster("h100-1024");
  const int64_t s = 1LL << 30;
  for (NetworkModel m : {NetworkModel::Analytical, NetworkModel::Flow}) {
    // 2 nodes: 6.8 + 2 (7 * 0.6 + 1 * 5.0) us, then S at 45 / 2 GB/s.
    double want = 1000 * (6.8 + 2 * (7 * 0.6 + 5.0)) + s / 22.5;
    EXPECT_NEAR(time_ns(c, all_reduce(16, Algorithm::Tree, Protocol::LL, s), m), want, want * 1e-3);
    // 4 nodes: 2 network steps each way, 35 / 2 GB/s.
    want = 1000 * (6.8 + 2 * (7 * 0.6 + 2 * 5.0)) + s / 17.5;
    EXPECT_NEAR(time_ns(c, all_reduce(32, Algorithm::Tree, Protocol::LL, s), m), want, want * 1e-3);
    // Ring on 2 nodes: 45 * 16 / 30 GB/s; every one of the 28 NVLink steps pays the network
    // overhead 1.5 us (> LL's 0.76), the 2 network steps 2.7 us.
    want = 1000 * (6.6 + 28 * 1.5 + 2 * 2.7) + s / (45.0 * 16 / 30);
    EXPECT_NEAR(time_ns(c, all_reduce(16, Algorithm::Ring, Protocol::LL, s), m), want, want * 1e-3);
  }
}

// NCCL's treeCorrectionFactor: a tree all-reduce of 1 MiB moves its bytes at 1/2 (Simple, 2^14 * 64
// B) of the rate it has at 1 GiB (factor 1 from 2^23 * 64 B); the ring has no such factor.
TEST(NcclModel, TreeCorrectionAtMediumSizes) {
  const Cluster c = cluster("h100-1024");
  for (NetworkModel m : {NetworkModel::Analytical, NetworkModel::Flow}) {
    for (Algorithm a : {Algorithm::Tree, Algorithm::Ring}) {
      const double lat = time_ns(c, all_reduce(32, a, Protocol::Simple, 0), m);
      const double big = time_ns(c, all_reduce(32, a, Protocol::Simple, 1LL << 30), m) - lat;
      const double mid = time_ns(c, all_reduce(32, a, Protocol::Simple, 1LL << 20), m) - lat;
      const double factor = a == Algorithm::Tree ? 0.5 : 1.0;
      EXPECT_NEAR(mid, big / 1024 / factor, big / 1024 * 0.01) << to_string(a);
    }
  }
}

// Between nodes the network carries the protocol's wire format at the NIC's effective rate: one GPU
// on each of 2 nodes, a ring all-reduce moves S each way through one 50 * 0.94 GB/s NIC (Simple), or
// S / (120/128) (LL128) - not at the NVLink-fitted efficiencies.
TEST(NcclModel, NetworkFlowsAtTheWireEfficiency) {
  const Cluster c = cluster("h100-1024");
  CollectiveRequest r = all_reduce(2, Algorithm::Ring, Protocol::Simple, 1LL << 30);
  r.members = {0, 8};
  r.channels = 1;
  for (NetworkModel m : {NetworkModel::Analytical, NetworkModel::Flow}) {
    for (Protocol p : {Protocol::Simple, Protocol::LL128}) {
      r.protocol = p;
      CollectiveRequest r0 = r;
      r0.bytes = 0;
      const double wire = p == Protocol::Simple ? 1.0 : 120.0 / 128.0;
      const double want = static_cast<double>(r.bytes) / (50 * 0.94 * wire);
      EXPECT_NEAR(time_ns(c, r, m) - time_ns(c, r0, m), want, want * 1e-3) << to_string(p);
    }
  }
}

TEST(NcclModel, ClustersWithoutTheSectionKeepTheAlphaBetaModel) {
  Cluster c;
  c.device = *device_preset("H100-SXM");
  c.nodes = 1;
  c.gpus_per_node = 8;
  c.topo.kind = TopologyKind::Crossbar;
  c.topo.nvlink_gb_per_s = 100;
  c.topo.nvlink_latency_ns = 0;
  c.coll.step_latency_ns = 1000;
  build_topology(c);
  EXPECT_FALSE(c.nccl.enabled);
  const NcclRow r = predict(c, 8, 1LL << 30);
  EXPECT_EQ(r.protocol, Protocol::Simple);
  EXPECT_EQ(r.algo, Algorithm::Ring);
  const double want = 14 * 1000 + 1.75 * (1LL << 30) / 100.0;  // links at 100 %
  EXPECT_NEAR(static_cast<double>(r.time_ns), want, want * 1e-3);
}

TEST(NcclModel, SectionErrorsNameTheKey) {
  const std::string base = "device: H100-SXM\ntopology: {kind: crossbar}\n";
  EXPECT_NO_THROW(parse_cluster(base + "nccl: {}\n", "t.yaml"));
  try {
    parse_cluster(base + "nccl:\n  simple: {efficiency: 1.5}\n", "t.yaml");
    FAIL() << "expected InputError";
  } catch (const orrery::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("nccl.simple.efficiency"), std::string::npos) << e.what();
  }
  try {
    parse_cluster(base + "nccl:\n  protocol: LL\n", "t.yaml");
    FAIL() << "expected InputError";
  } catch (const orrery::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("nccl.protocol"), std::string::npos) << e.what();
  }
  const std::pair<const char*, const char*> bad_keys[] = {
      {"nccl:\n  ll_max_busbw_gb_per_s: -1\n", "nccl.ll_max_busbw_gb_per_s"},
      {"nccl:\n  net_overhead_us: -1\n", "nccl.net_overhead_us"},
      {"nccl:\n  ll128: {tree_net_step_latency_us: -2}\n", "nccl.ll128.tree_net_step_latency_us"}};
  for (const auto& [yaml, key] : bad_keys) {
    try {
      parse_cluster(base + yaml, "t.yaml");
      FAIL() << "expected InputError for " << key;
    } catch (const orrery::InputError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  const Cluster h = parse_cluster(base + "nccl: {}\n", "t.yaml");
  EXPECT_TRUE(h.nccl.nvls);                                      // Hopper
  EXPECT_DOUBLE_EQ(h.nccl.ll_max_busbw_2_nodes_gb_per_s, 45.0);  // NCCL llMaxBws Hopper N2
  EXPECT_DOUBLE_EQ(h.nccl.ll_max_busbw_gb_per_s, 35.0);          // and N4
  EXPECT_NEAR(h.nccl.nvlink_efficiency, 20.6 / 25.0, 1e-12);
  const Cluster a = parse_cluster("device: A100\ntopology: {kind: crossbar}\nnccl: {}\n", "t.yaml");
  EXPECT_FALSE(a.nccl.nvls);
  EXPECT_NEAR(a.nccl.nvlink_efficiency, 0.8, 1e-12);
}
