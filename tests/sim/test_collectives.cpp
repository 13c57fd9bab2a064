// Collective algorithms against their alpha-beta closed forms (shared/reference/facts.md), in both
// network models, on contention-free crossbars, rings and fat-trees; contention; busbw; determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "orrery/common/error.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/collectives.hpp"
#include "orrery/sim/nccl_table.hpp"
#include "orrery/sim/network.hpp"

using namespace orrery::sim;
using orrery::traces::CollOp;

namespace {

constexpr double kB = 100.0;        // GB/s == bytes/ns per direction
constexpr int64_t kLinkLat = 700;   // ns per link
constexpr int64_t kStepLat = 2000;  // ns per algorithm step
constexpr int64_t kS = 1LL << 30;

Cluster crossbar(int n, int channels = 0) {
  Cluster c;
  c.name = "xbar";
  c.device = *device_preset("H100-SXM");
  c.nodes = 1;
  c.gpus_per_node = n;
  c.topo.kind = TopologyKind::Crossbar;
  c.topo.nvlink_gb_per_s = kB;
  c.topo.nvlink_latency_ns = kLinkLat;
  c.coll.step_latency_ns = kStepLat;
  c.coll.channels = channels;
  build_topology(c);
  return c;
}

CollectiveRequest request(CollOp op, int n, Algorithm a, int64_t bytes = kS) {
  CollectiveRequest r;
  r.op = op;
  r.members.resize(n);
  std::iota(r.members.begin(), r.members.end(), 0);
  r.algo = a;
  r.bytes = bytes;
  return r;
}

void expect_close(double got, double want) {
  EXPECT_NEAR(got, want, want * 1e-3) << "got " << got << " want " << want;
}

// Both models must agree with the closed form on a contention-free network.
void check(const Cluster& c, const CollectiveRequest& r, double want_ns) {
  SCOPED_TRACE(std::string(orrery::traces::to_string(r.op)) + " " + std::string(to_string(r.algo)) +
               " n=" + std::to_string(r.members.size()));
  expect_close(static_cast<double>(collective_time_ns(c, r, NetworkModel::Analytical)), want_ns);
  expect_close(static_cast<double>(collective_time_ns(c, r, NetworkModel::Flow)), want_ns);
}

const double kAlphaXbar = 2 * kLinkLat + kStepLat;  // GPU -> switch -> GPU, plus the step overhead

}  // namespace

TEST(Collectives, RingAllReduceClosedForm) {
  for (int n : {2, 3, 8, 16}) {
    for (int ch : {1, 4}) {
      const Cluster c = crossbar(n, ch);
      const double S = kS;
      check(c, request(CollOp::AllReduce, n, Algorithm::Ring),
            2.0 * (n - 1) * kAlphaXbar + 2.0 * (n - 1) / n * S / kB);
    }
  }
}

TEST(Collectives, RingReduceScatterAllGatherClosedForm) {
  for (int n : {4, 8}) {
    const Cluster c = crossbar(n);
    for (CollOp op : {CollOp::ReduceScatter, CollOp::AllGather}) {
      check(c, request(op, n, Algorithm::Ring), (n - 1) * kAlphaXbar + (n - 1.0) / n * kS / kB);
    }
  }
}

TEST(Collectives, HalvingDoublingClosedForm) {
  for (int n : {2, 8, 16}) {
    const Cluster c = crossbar(n);
    const double lg = std::log2(n);
    check(c, request(CollOp::AllReduce, n, Algorithm::HalvingDoubling),
          2 * lg * kAlphaXbar + 2.0 * (n - 1) / n * kS / kB);
    check(c, request(CollOp::ReduceScatter, n, Algorithm::HalvingDoubling),
          lg * kAlphaXbar + (n - 1.0) / n * kS / kB);
    check(c, request(CollOp::AllGather, n, Algorithm::HalvingDoubling),
          lg * kAlphaXbar + (n - 1.0) / n * kS / kB);
  }
  EXPECT_THROW(
      plan_collective(crossbar(6), request(CollOp::AllReduce, 6, Algorithm::HalvingDoubling)),
      orrery::InputError);
}

TEST(Collectives, DoubleBinaryTreeClosedForm) {
  // Pipelined: every rank is interior in at most one tree, so its busiest link carries its parent,
  // two children and its leaf-tree parent: 4 flows of S/2 = 2S; depth log2(n) up and down.
  for (int n : {8, 16, 32}) {
    const Cluster c = crossbar(n);
    check(c, request(CollOp::AllReduce, n, Algorithm::Tree),
          2 * std::log2(n) * kAlphaXbar + 2.0 * kS / kB);
  }
}

TEST(Collectives, DirectAllToAllClosedForm) {
  for (int n : {4, 8}) {
    const Cluster c = crossbar(n);
    check(c, request(CollOp::AllToAll, n, Algorithm::Direct), kAlphaXbar + (n - 1.0) / n * kS / kB);
  }
}

TEST(Collectives, BroadcastAndSendRecvClosedForm) {
  const int n = 8;
  const Cluster c = crossbar(n);
  // Pipelined chain: (n-1) latency steps, the data once over each link.
  check(c, request(CollOp::Broadcast, n, Algorithm::Ring), (n - 1) * kAlphaXbar + 1.0 * kS / kB);
  check(c, request(CollOp::Reduce, n, Algorithm::Ring), (n - 1) * kAlphaXbar + 1.0 * kS / kB);
  // Pipelined binary tree: interior nodes send to two children.
  check(c, request(CollOp::Broadcast, n, Algorithm::Tree), 3 * kAlphaXbar + 2.0 * kS / kB);
  CollectiveRequest p = request(CollOp::Send, 2, Algorithm::Auto);
  p.members = {3, 5};
  check(c, p, kAlphaXbar + 1.0 * kS / kB);
}

TEST(Collectives, RingOnAPhysicalRing) {
  // A ring all-reduce laid on a ring topology uses each link in one direction only: contention free.
  Cluster c;
  c.name = "ring";
  c.device = *device_preset("A100-SXM-80GB");
  c.nodes = 8;
  c.gpus_per_node = 1;
  c.topo.kind = TopologyKind::Ring;
  c.topo.link_gb_per_s = 25;
  c.topo.link_latency_ns = 1500;
  c.coll.step_latency_ns = 500;
  build_topology(c);
  const int n = 8;
  check(c, request(CollOp::AllReduce, n, Algorithm::Ring),
        2.0 * (n - 1) * 2000 + 2.0 * (n - 1) / n * kS / 25);
}

TEST(Collectives, HierarchicalClosedFormOnDgxNodes) {
  // 4 DGX-style nodes of 8 GPUs, rail-optimized: intra-node reduce-scatter and all-gather over
  // NVLink (ring of 8), inter-node ring all-reduce of S/8 per rail over the NICs.
  Cluster c;
  c.name = "dgx4";
  c.device = *device_preset("H100-SXM");
  c.nodes = 4;
  c.gpus_per_node = 8;
  c.topo.kind = TopologyKind::FatTree;
  c.topo.nvlink_gb_per_s = 400;
  c.topo.nvlink_latency_ns = 300;
  c.topo.nic_gb_per_s = 50;
  c.topo.nic_latency_ns = 900;
  c.topo.switch_latency_ns = 400;
  c.coll.step_latency_ns = 1000;
  build_topology(c);
  const double g = 8, m = 4, S = kS;
  const double a_intra = 2 * 300 + 1000;
  const double a_inter = 2 * 900 + 1000;  // GPU -> NIC -> leaf -> NIC -> GPU, same rail, same leaf
  const double want = 2 * ((g - 1) * a_intra + (g - 1) / g * S / 400) + 2 * (m - 1) * a_inter +
                      2 * (m - 1) / m * (S / g) / 50;
  check(c, request(CollOp::AllReduce, 32, Algorithm::Hierarchical), want);
}

TEST(Collectives, RingAcrossDgxNodesIsBoundByTheNics) {
  // 8 channels: channel c crosses nodes on rail c; each NIC carries one channel, each GPU's NVLink
  // carries all 8 (450 GB/s > 8 x 50), so the NICs bound it: busbw = 8 x 50 GB/s per GPU.
  Cluster c;
  c.name = "dgx2";
  c.device = *device_preset("H100-SXM");
  c.nodes = 2;
  c.gpus_per_node = 8;
  c.topo.kind = TopologyKind::FatTree;
  c.topo.nvlink_gb_per_s = 450;
  c.topo.nvlink_latency_ns = 0;
  c.topo.nic_gb_per_s = 50;
  c.topo.nic_latency_ns = 0;
  c.topo.switch_latency_ns = 0;
  build_topology(c);
  const int n = 16;
  const double want = 2.0 * (n - 1) / n * kS / (8 * 50);
  check(c, request(CollOp::AllReduce, n, Algorithm::Ring), want);
}

TEST(FlowModel, TwoFlowsOnOneLinkGetHalfTheBandwidthEach) {
  const Cluster c = crossbar(4);
  Engine e;
  auto net = make_network(NetworkModel::Flow, c, e);
  TimeNs t1 = -1, t2 = -1;
  CollectiveRequest a = request(CollOp::Send, 2, Algorithm::Auto);
  a.members = {0, 1};
  CollectiveRequest b = a;
  b.members = {0, 2};  // shares GPU 0's uplink with a
  net->start(a, [&] { t1 = e.now(); });
  net->start(b, [&] { t2 = e.now(); });
  e.run();
  expect_close(static_cast<double>(t1), kAlphaXbar + kS / (kB / 2));
  EXPECT_EQ(t1, t2);
  // The analytical model ignores contention between requests.
  Engine e2;
  auto an = make_network(NetworkModel::Analytical, c, e2);
  TimeNs u = -1;
  an->start(a, [] {});
  an->start(b, [&] { u = e2.now(); });
  e2.run();
  expect_close(static_cast<double>(u), kAlphaXbar + kS / kB);
}

TEST(FlowModel, AFlowSpeedsUpWhenItsCompetitorEnds) {
  // Two flows share GPU 0's uplink; the first carries half as much. It ends at 2*(S/2)/B; the second
  // then has the link alone: total S/2 at B/2 + S/2 at B = 1.5 S / B.
  const Cluster c = crossbar(3);
  Engine e;
  auto net = make_network(NetworkModel::Flow, c, e);
  CollectiveRequest a = request(CollOp::Send, 2, Algorithm::Auto, kS / 2);
  a.members = {0, 1};
  CollectiveRequest b = request(CollOp::Send, 2, Algorithm::Auto, kS);
  b.members = {0, 2};
  TimeNs ta = 0, tb = 0;
  net->start(a, [&] { ta = e.now(); });
  net->start(b, [&] { tb = e.now(); });
  e.run();
  expect_close(static_cast<double>(ta), kAlphaXbar + 1.0 * kS / kB);
  expect_close(static_cast<double>(tb), kAlphaXbar + 1.5 * kS / kB);
}

TEST(FlowModel, ConcurrentCollectivesAreDeterministic) {
  Cluster c;
  c.name = "ft";
  c.device = *device_preset("H100-SXM");
  c.nodes = 16;
  c.gpus_per_node = 8;
  c.topo.kind = TopologyKind::FatTree;
  c.topo.radix = 16;  // small switches: several leaves and spines, ECMP collisions
  c.topo.oversubscription = 3;
  c.topo.rail_optimized = false;
  build_topology(c);
  auto run = [&] {
    Engine e;
    auto net = make_network(NetworkModel::Flow, c, e);
    std::vector<TimeNs> done;
    for (int k = 0; k < 4; ++k) {
      CollectiveRequest r;
      r.op = k % 2 ? CollOp::AllToAll : CollOp::AllReduce;
      for (int g = k; g < c.num_gpus(); g += 4) r.members.push_back(g);
      r.bytes = (k + 1) * (1 << 24);
      e.schedule_at(k * 1000, [&, r] { net->start(r, [&] { done.push_back(e.now()); }); });
    }
    e.run();
    return done;
  };
  const auto a = run();
  const auto b = run();
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a, b);
}

// The default flow model re-rates only the flows a change reaches through saturated links; the
// reference re-rates whole connected components. On concurrent collectives and transfers that
// contend on an oversubscribed fat-tree both give the same completion times, to the nanosecond,
// while the default re-rates fewer flows.
TEST(FlowModel, SaturatedSubproblemMatchesWholeComponents) {
  Cluster c;
  c.name = "ft";
  c.device = *device_preset("H100-SXM");
  c.nodes = 16;
  c.gpus_per_node = 8;
  c.topo.kind = TopologyKind::FatTree;
  c.topo.radix = 16;
  c.topo.oversubscription = 3;
  c.topo.rail_optimized = false;
  build_topology(c);
  auto run = [&](bool whole, NetworkStats& stats) {
    Engine e;
    auto net = make_network(NetworkModel::Flow, c, e, whole);
    std::vector<TimeNs> done(40, -1);
    for (int k = 0; k < 40; ++k) {
      CollectiveRequest r;
      if (k % 5 == 0) {
        r.op = CollOp::AllReduce;
        for (int g = k % 8; g < c.num_gpus(); g += 8) r.members.push_back(g);
      } else {
        r.op = CollOp::Send;
        r.members = {(k * 37) % c.num_gpus(), (k * 53 + 11) % c.num_gpus()};
        if (r.members[0] == r.members[1]) r.members[1] = (r.members[1] + 9) % c.num_gpus();
      }
      r.bytes = int64_t(1 + k % 7) << 22;
      e.schedule_at(k * 20'000, [&, r, k] { net->start(r, [&, k] { done[k] = e.now(); }); });
    }
    e.run();
    stats = net->stats();
    return done;
  };
  NetworkStats fast, ref;
  const auto a = run(false, fast);
  const auto b = run(true, ref);
  for (TimeNs t : a) EXPECT_GT(t, 0);
  EXPECT_EQ(a, b);
  EXPECT_LT(fast.solved_flows, ref.solved_flows);
}

// A phase that starts alone on idle links takes the rates of its template's first solve: the
// second of two identical all-reduces, one after the other, solves nothing and takes as long.
TEST(FlowModel, IdlePhasesReuseTheirSolve) {
  const Cluster c = crossbar(8);
  Engine e;
  auto net = make_network(NetworkModel::Flow, c, e);
  const CollectiveRequest r = request(CollOp::AllReduce, 8, Algorithm::Ring, kS);
  TimeNs first = -1, second = -1;
  net->start(r, [&] {
    first = e.now();
    net->start(r, [&] { second = e.now(); });
  });
  e.run();
  EXPECT_EQ(net->stats().solves, 1u);
  EXPECT_EQ(net->stats().cached_solves, 1u);
  EXPECT_EQ(second - first, first);
}

TEST(NcclTable, BusBandwidthFollowsTheNcclTestsFactors) {
  // With no latency, a ring's busbw equals the link bandwidth for all-reduce, all-gather and
  // reduce-scatter (that is what the nccl-tests factors are for).
  Cluster c = crossbar(8);
  c.topo.nvlink_latency_ns = 0;
  c.coll.step_latency_ns = 0;
  build_topology(c);
  for (CollOp op :
       {CollOp::AllReduce, CollOp::AllGather, CollOp::ReduceScatter, CollOp::AllToAll}) {
    NcclSweep s;
    s.op = op;
    s.ranks = 8;
    s.min_bytes = 1 << 20;
    s.max_bytes = 1 << 26;
    s.factor = 4;
    s.model = NetworkModel::Flow;
    const auto rows = predict_nccl_table(c, s);
    ASSERT_EQ(rows.size(), 4u);
    for (const auto& r : rows) {
      EXPECT_NEAR(r.algbw_gb_per_s, r.bytes / static_cast<double>(r.time_ns), 1e-12);
      EXPECT_NEAR(r.busbw_gb_per_s, r.algbw_gb_per_s * orrery::traces::busbw_factor(op, 8), 1e-9);
      EXPECT_NEAR(r.busbw_gb_per_s, kB, kB * 1e-3) << orrery::traces::to_string(op);
    }
  }
}

TEST(NcclTable, SizesStepByTheFactorAndRoundToElements) {
  const Cluster c = crossbar(8);
  NcclSweep s;
  s.op = CollOp::AllGather;
  s.ranks = 8;
  s.min_bytes = 8;
  s.max_bytes = 1 << 10;
  s.factor = 2;
  const auto rows = predict_nccl_table(c, s);
  ASSERT_EQ(rows.size(), 8u);   // 8, 16, ..., 1024
  EXPECT_EQ(rows[0].bytes, 0);  // 8 B cannot hold one float per rank
  EXPECT_EQ(rows[2].bytes, 32);
  EXPECT_EQ(rows[2].count, 8);
  EXPECT_EQ(rows.back().bytes, 1024);
}

TEST(Collectives, AutoPicksRingOnOneNodeAndTreeForSmallMultiNodeMessages) {
  const Cluster x = crossbar(8);
  EXPECT_EQ(choose_algorithm(x, request(CollOp::AllReduce, 8, Algorithm::Auto)), Algorithm::Ring);
  EXPECT_EQ(choose_algorithm(x, request(CollOp::AllToAll, 8, Algorithm::Auto)), Algorithm::Direct);
  Cluster c;
  c.device = *device_preset("H100-SXM");
  c.nodes = 32;
  c.gpus_per_node = 8;
  c.topo.kind = TopologyKind::FatTree;
  c.coll.step_latency_ns = 2000;
  build_topology(c);
  // 256 ranks: a ring pays 510 latency steps, a tree about 2*log2(256).
  EXPECT_EQ(choose_algorithm(c, request(CollOp::AllReduce, 256, Algorithm::Auto, 1 << 16)),
            Algorithm::Tree);
  // Large: whichever is cheaper (here the multi-node tree has the ring's bandwidth and less latency).
  for (int64_t bytes : {1LL << 26, 1LL << 32}) {
    CollectiveRequest r = request(CollOp::AllReduce, 256, Algorithm::Auto, bytes);
    const Algorithm a = choose_algorithm(c, r);
    r.algo = Algorithm::Ring;
    const int64_t ring = collective_time_ns(c, r, NetworkModel::Analytical);
    r.algo = Algorithm::Tree;
    const int64_t tree = collective_time_ns(c, r, NetworkModel::Analytical);
    EXPECT_EQ(a, tree < ring ? Algorithm::Tree : Algorithm::Ring);
  }
}

TEST(Collectives, BadRequests) {
  const Cluster c = crossbar(4);
  CollectiveRequest r = request(CollOp::AllReduce, 4, Algorithm::Ring);
  r.members = {0, 9};
  EXPECT_THROW(plan_collective(c, r), orrery::InputError);
  r.members = {1, 1};
  EXPECT_THROW(plan_collective(c, r), orrery::InputError);
  r = request(CollOp::AllToAll, 4, Algorithm::Ring);
  EXPECT_THROW(plan_collective(c, r), orrery::InputError);
}

TEST(Collectives, RingLatencyIsTheSumOfItsEdgeLatencies) {
  // A pipelined ring pays each edge's latency, not the slowest edge's on every step: 2 nodes of 8,
  // per channel 14 NVLink edges and 2 PXN edges between the nodes.
  Cluster c;
  c.name = "dgx2";
  c.device = *device_preset("H100-SXM");
  c.nodes = 2;
  c.gpus_per_node = 8;
  c.topo.kind = TopologyKind::FatTree;
  c.topo.nvlink_gb_per_s = 450;
  c.topo.nvlink_latency_ns = 200;
  c.topo.nic_gb_per_s = 50;
  c.topo.nic_latency_ns = 1500;
  c.coll.step_latency_ns = 1000;
  build_topology(c);
  const int n = 16;
  const double a_intra = 2 * 200 + 1000;
  const double a_inter = 200 + 2 * 1500 + 1000;  // GPU -> NVSwitch -> NIC -> leaf -> NIC -> GPU
  const double mean = (14 * a_intra + 2 * a_inter) / 16;
  check(c, request(CollOp::AllReduce, n, Algorithm::Ring),
        2.0 * (n - 1) * mean + 2.0 * (n - 1) / n * kS / (8 * 50));
}

TEST(Collectives, MultiNodeTreeUsesEveryNicLikeARing) {
  // NCCL's tree across 4 DGX nodes, 8 channels: each channel's head GPU (its own NIC) is interior in
  // at most one inter-node tree, so its NIC carries 4 flows of S/(2C): 2S/(C * B_nic); the node
  // chains over NVLink (450 GB/s) are faster. Latency: 2 * (tree depth 2 + chain 7) steps.
  Cluster c;
  c.name = "dgx4";
  c.device = *device_preset("H100-SXM");
  c.nodes = 4;
  c.gpus_per_node = 8;
  c.topo.kind = TopologyKind::FatTree;
  c.topo.nvlink_gb_per_s = 450;
  c.topo.nvlink_latency_ns = 0;
  c.topo.nic_gb_per_s = 50;
  c.topo.nic_latency_ns = 0;
  c.topo.switch_latency_ns = 0;
  c.coll.step_latency_ns = 1000;
  build_topology(c);
  check(c, request(CollOp::AllReduce, 32, Algorithm::Tree),
        2 * (2 + 7) * 1000.0 + 2.0 * kS / (8 * 50));
}

TEST(FlowModel, ReSolvesOnlyTheFlowsThatShareLinks) {
  const Cluster c = crossbar(4);
  auto send = [](int a, int b, int64_t bytes) {
    CollectiveRequest r = request(CollOp::Send, 2, Algorithm::Auto, bytes);
    r.members = {a, b};
    return r;
  };
  {
    // Disjoint links: each start re-rates one flow; the ends re-rate nobody.
    Engine e;
    auto net = make_network(NetworkModel::Flow, c, e);
    net->start(send(0, 1, kS), [] {});
    net->start(send(2, 3, kS / 2), [] {});
    e.run();
    EXPECT_EQ(net->stats().solves, 2u);
    EXPECT_EQ(net->stats().solved_flows, 2u);
  }
  {
    // Shared uplink: the second start re-rates both, the first end re-rates the survivor.
    Engine e;
    auto net = make_network(NetworkModel::Flow, c, e);
    net->start(send(0, 1, kS / 2), [] {});
    net->start(send(0, 2, kS), [] {});
    e.run();
    EXPECT_EQ(net->stats().solves, 3u);
    EXPECT_EQ(net->stats().solved_flows, 1u + 2u + 1u);
  }
}
