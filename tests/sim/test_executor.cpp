// Executor: the pipeline bubble on equal-cost stages equals (p-1)/(m+p-1) of the step (closed form)
// for GPipe and 1F1B, 1F1B start times follow the textbook, collectives take the network model's
// isolated time, all-ranks equals representatives on a symmetric layout, runs are bit-identical,
// and GPT-3 175B on 1,024 GPUs runs.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <tuple>

#include "orrery/common/error.hpp"
#include "orrery/sim/executor.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim {
namespace {

using testing::h100_cluster;
using testing::h100_cost;
using testing::rail_fat_tree;
using testing::small_scenario;

// Sets every compute op of a pure pipeline workload (tp = dp = 1) to equal stage costs: the forward
// of a micro-batch on a stage takes tf, its backward tb, everything else zero.
void equalize(Workload& w, int64_t tf, int64_t tb) {
  for (auto& p : w.stages) {
    const int per_stage = w.scenario.model.layers / w.scenario.parallel.pp;
    for (auto& op : p.ops) {
      const std::string& n = w.names[op.name];
      if (n == names::kBlockForward)
        op.duration_ns = tf / per_stage;
      else if (n == names::kBlockBackward)
        op.duration_ns = tb / per_stage;
      else
        op.duration_ns = 0;
    }
  }
}

ExecutorOptions zero_cost_network() {
  ExecutorOptions o;
  o.comm_time = [](const CollectiveRequest&) { return int64_t(0); };
  return o;
}

int64_t busy_compute_ns(const RankRun& r) {
  int64_t busy = 0;
  for (size_t i = 0; i < r.ops.size(); ++i)
    if (r.program->ops[i].stream == kStreamCompute) busy += r.ops[i].end_ns - r.ops[i].start_ns;
  return busy;
}

TEST(Executor, BubbleClosedFormGPipeAnd1F1B) {
  const Cluster c = h100_cluster(8);
  for (const char* sched : {"gpipe", "1f1b"}) {
    for (auto [p, m] : {std::pair{4, 8}, std::pair{4, 4}, std::pair{2, 6}, std::pair{8, 16}}) {
      const int64_t tf = 1000, tb = 2000;
      Workload w = build_workload(small_scenario(p * 2, 1, 1, p, m, sched), h100_cost());
      equalize(w, tf, tb);
      const auto opt = zero_cost_network();
      const ExecResult r = execute(w, c, opt);
      ASSERT_EQ(r.ranks.size(), size_t(p));
      // Step = (m + p - 1)(tf + tb); each stage busy m(tf + tb): bubble (p-1)/(m+p-1) of the step.
      EXPECT_EQ(r.makespan_ns, (m + p - 1) * (tf + tb)) << sched << " p=" << p << " m=" << m;
      for (const auto& rank : r.ranks) {
        EXPECT_EQ(busy_compute_ns(rank), m * (tf + tb));
        const double bubble = 1.0 - double(busy_compute_ns(rank)) / double(r.makespan_ns);
        EXPECT_DOUBLE_EQ(bubble, double(p - 1) / double(m + p - 1));
      }
    }
  }
}

TEST(Executor, OneFOneBTextbookStartTimes) {
  // p = 4, m = 8, tf = 1, tb = 2 (units of 1 us): warm-up forward i of stage s starts at (s + i)·tf;
  // the last stage alternates F_i at i·(tf+tb) + 3·tf, B_i right after it.
  const int p = 4, m = 8;
  const int64_t tf = 1000, tb = 2000;
  Workload w = build_workload(small_scenario(p, 1, 1, p, m, "1f1b"), h100_cost());
  equalize(w, tf, tb);
  const auto opt = zero_cost_network();
  const ExecResult r = execute(w, h100_cluster(8), opt);
  std::map<std::tuple<int, int, bool>, int64_t> start;  // (stage, mb, backward) -> start
  for (const auto& rank : r.ranks)
    for (size_t i = 0; i < rank.ops.size(); ++i) {
      const Op& op = rank.program->ops[i];
      const std::string& n = w.names[op.name];
      if (n == names::kBlockForward)
        start[{rank.coord.pp, op.micro_batch, false}] = rank.ops[i].start_ns;
      if (n == names::kBlockBackward)
        start[{rank.coord.pp, op.micro_batch, true}] = rank.ops[i].start_ns;
    }
  for (int s = 0; s < p; ++s)
    for (int i = 0; i < p - s; ++i)
      EXPECT_EQ((start[{s, i, false}]), (s + i) * tf) << s << " " << i;
  for (int i = 0; i < m; ++i) {
    EXPECT_EQ((start[{p - 1, i, false}]), (p - 1) * tf + i * (tf + tb)) << i;
    EXPECT_EQ((start[{p - 1, i, true}]), p * tf + i * (tf + tb)) << i;
  }
  // Stage 0's last backward ends the step.
  EXPECT_EQ(r.makespan_ns, (m + p - 1) * (tf + tb));
}

TEST(Executor, TensorParallelAllReducesTakeTheNetworkTime) {
  const Cluster c = h100_cluster(8);
  const Workload w =
      build_workload(small_scenario(2, 1, 8, 1, 2), h100_cost(), {1, precision_config("mixed")});
  ExecutorOptions opt;
  opt.network = NetworkModel::Analytical;
  const ExecResult r = execute(w, c, opt);
  ASSERT_EQ(r.ranks.size(), 1u);
  CollectiveRequest req;
  req.op = traces::CollOp::AllReduce;
  req.members = {0, 1, 2, 3, 4, 5, 6, 7};
  req.bytes = 2 * 128 * 256 * 2;  // B·T·C·2 (mixed precision)
  const int64_t expected = collective_time_ns(c, req, NetworkModel::Analytical);
  ASSERT_GT(expected, 0);
  int n = 0;
  const auto& rank = r.ranks[0];
  for (size_t i = 0; i < rank.ops.size(); ++i) {
    const Op& op = rank.program->ops[i];
    if (w.names[op.name] != names::kTpAllReduce) continue;
    EXPECT_EQ(op.bytes, req.bytes);
    EXPECT_EQ(rank.ops[i].end_ns - rank.ops[i].active_ns, expected);
    ++n;
  }
  EXPECT_EQ(n, 2 * 2 * 4);
}

TEST(Executor, ProfileCollectiveOverride) {
  const Cluster c = h100_cluster(8);
  const Workload w =
      build_workload(small_scenario(2, 1, 8, 1, 2), h100_cost(), {1, precision_config("mixed")});
  HardwareProfile hw = default_hardware_profile("H100-SXM", true);
  CollectiveOverride o;
  o.op = traces::CollOp::AllReduce;
  o.scope = CollectiveScope::IntraNode;
  o.latency_ns = 10'000;
  o.bus_bandwidth_bytes_per_s = 100e9;
  hw.collectives.push_back(o);
  ExecutorOptions opt;
  opt.profile = &hw;
  const ExecResult r = execute(w, c, opt);
  const auto& rank = r.ranks[0];
  const int64_t bytes = 2 * 128 * 256 * 2;
  for (size_t i = 0; i < rank.ops.size(); ++i) {
    if (w.names[rank.program->ops[i].name] != names::kTpAllReduce) continue;
    // latency + S · 2(n-1)/n / busbw
    EXPECT_EQ(rank.ops[i].end_ns - rank.ops[i].active_ns,
              10'000 + int64_t(std::ceil(bytes * 1.75 / 100e9 * 1e9)));
  }
}

TEST(Executor, AllRanksEqualsRepresentativesOnASymmetricLayout) {
  // dp 2 × tp 2 × pp 2 inside one node, analytical network (no contention): every rank of a stage
  // has exactly its representative's timeline.
  const Cluster c = h100_cluster(8);
  const Workload w = build_workload(small_scenario(4, 2, 2, 2, 4), h100_cost());
  ExecutorOptions rep, all;
  rep.network = all.network = NetworkModel::Analytical;
  all.all_ranks = true;
  const ExecResult a = execute(w, c, rep), b = execute(w, c, all);
  ASSERT_EQ(a.ranks.size(), 2u);
  ASSERT_EQ(b.ranks.size(), 8u);
  EXPECT_EQ(a.makespan_ns, b.makespan_ns);
  for (const auto& full : b.ranks) {
    const RankRun& r = a.ranks[full.coord.pp];
    ASSERT_EQ(r.coord.pp, full.coord.pp);
    for (size_t i = 0; i < r.ops.size(); ++i) {
      EXPECT_EQ(r.ops[i].start_ns, full.ops[i].start_ns);
      EXPECT_EQ(r.ops[i].end_ns, full.ops[i].end_ns);
    }
  }
}

// Every rank of dp 2 x tp 2 x pp 4 on 8 nodes of 2 GPUs on a rail-optimized 3-tier fat-tree of
// radix-4 switches (a rail spans four leaves in two pods; the replicas' pp transfers meet on
// aggregation and core links): the flow model's default re-rating (the flows reached through
// saturated links) gives every op the times of the reference (whole connected components).
TEST(Executor, FlowSubproblemsMatchWholeComponents) {
  Cluster c;
  c.name = "rail-radix4";
  c.device = *device_preset("H100-SXM");
  c.nodes = 8;
  c.gpus_per_node = 2;
  c.topo.kind = TopologyKind::FatTree;
  c.topo.radix = 4;
  c.topo.tiers = 3;
  build_topology(c);
  Scenario s = small_scenario(8, 2, 2, 4, 6);
  const Workload w = build_workload(s, h100_cost());
  ExecutorOptions fast, ref;
  fast.all_ranks = ref.all_ranks = true;
  fast.rail_symmetry = ref.rail_symmetry = false;  // every rank's flows (RailSymmetry... below)
  ref.flow_whole_components = true;
  const ExecResult a = execute(w, c, fast), b = execute(w, c, ref);
  ASSERT_EQ(a.ranks.size(), 16u);
  EXPECT_EQ(a.makespan_ns, b.makespan_ns);
  for (size_t k = 0; k < a.ranks.size(); ++k)
    for (size_t i = 0; i < a.ranks[k].ops.size(); ++i) {
      ASSERT_EQ(a.ranks[k].ops[i].active_ns, b.ranks[k].ops[i].active_ns);
      ASSERT_EQ(a.ranks[k].ops[i].end_ns, b.ranks[k].ops[i].end_ns);
    }
  EXPECT_GT(b.network.solves, 0u);  // the flows did contend
}

// The rail symmetry (executor.hpp): every rank simulated through tp rank 0 of each group gives
// every op of every rank, copies included, the times of the literal simulation of every rank, to
// the nanosecond, on fabrics where the replicas' traffic contends on the spines: dp 4 x tp 2 x pp 2
// on 8 nodes of 2 GPUs, a rail spanning 4 leaves (radix 4: two pods of a 3-tier fabric; radix 8:
// one spine tier), across schedules, ZeRO 1 with overlapped buckets, sequence parallelism, MoE
// all-to-alls and NCCL's share of the GPU; and the simulated trace is span for span the same.
TEST(Executor, RailSymmetryMatchesEveryRankLiterally) {
  struct Case {
    const char* what;
    int radix, tiers;
    Scenario s;
    double comm_share = 0;
  };
  std::vector<Case> cases;
  cases.push_back({"1f1b, 3 tiers", 4, 3, small_scenario(8, 4, 2, 2, 6)});
  cases.push_back({"1f1b, 2 tiers, nccl share", 8, 2, small_scenario(8, 4, 2, 2, 6), 0.074});
  cases.push_back({"interleaved", 4, 3, small_scenario(8, 4, 2, 2, 4, "interleaved")});
  cases.back().s.parallel.virtual_stages = 2;
  cases.push_back({"zero 1, overlapped buckets", 4, 3, small_scenario(8, 4, 2, 2, 4)});
  cases.back().s.parallel.zero = 1;
  cases.back().s.zero.overlap_grad_reduce = true;
  cases.back().s.parallel.bucket_mb = 0.25;
  cases.push_back({"sequence parallel, gpipe", 4, 3, small_scenario(8, 4, 2, 2, 4, "gpipe")});
  cases.back().s.parallel.sequence_parallel = true;
  cases.push_back({"moe, ep 2", 4, 3, small_scenario(8, 4, 2, 2, 4)});
  cases.back().s.model.moe.experts = 4;
  cases.back().s.model.moe.every = 2;
  cases.back().s.parallel.ep = 2;
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    const Cluster c = rail_fat_tree(8, 2, k.radix, k.tiers);
    ASSERT_TRUE(c.topology->rails_are_copies());
    const Workload w = build_workload(k.s, h100_cost(), {2, precision_config("mixed")});
    ASSERT_TRUE(rail_symmetry_applies(w.layout, c));
    ExecutorOptions sym, lit, rep;
    sym.all_ranks = lit.all_ranks = true;
    lit.rail_symmetry = false;
    sym.comm_compute_share = lit.comm_compute_share = rep.comm_compute_share = k.comm_share;
    const ExecResult a = execute(w, c, sym), b = execute(w, c, lit), r = execute(w, c, rep);
    ASSERT_EQ(a.ranks.size(), 8u);
    ASSERT_EQ(a.copies.size(), 8u);
    ASSERT_EQ(b.ranks.size(), 16u);
    EXPECT_TRUE(b.copies.empty());
    EXPECT_EQ(a.makespan_ns, b.makespan_ns);
    EXPECT_LT(a.events, b.events);
    // The replicas do contend: one representative per stage misses time every rank spends.
    EXPECT_NE(r.makespan_ns, b.makespan_ns);
    std::vector<const RankRun*> by_rank(16, nullptr);
    for (const auto& run : a.ranks) by_rank[size_t(run.rank)] = &run;
    for (const auto& [rank, i] : a.copies) {
      ASSERT_EQ(w.layout.coord(rank).tp, 1);
      by_rank[size_t(rank)] = &a.ranks[size_t(i)];
    }
    for (const auto& full : b.ranks) {
      const RankRun* mine = by_rank[size_t(full.rank)];
      ASSERT_NE(mine, nullptr);
      ASSERT_EQ(mine->program, full.program);
      for (size_t i = 0; i < full.ops.size(); ++i) {
        ASSERT_EQ(mine->ops[i].start_ns, full.ops[i].start_ns)
            << "rank " << full.rank << " op " << i;
        ASSERT_EQ(mine->ops[i].active_ns, full.ops[i].active_ns)
            << "rank " << full.rank << " op " << i;
        ASSERT_EQ(mine->ops[i].end_ns, full.ops[i].end_ns) << "rank " << full.rank << " op " << i;
      }
    }
    const traces::Trace ta = make_trace(w, a, c, 989e12), tb = make_trace(w, b, c, 989e12);
    ASSERT_EQ(ta.spans.size(), tb.spans.size());
    ASSERT_EQ(ta.ranks.size(), 16u);
    ASSERT_EQ(ta.comms.size(), tb.comms.size());
    for (size_t i = 0; i < ta.spans.size(); ++i) {
      const traces::Span &x = ta.spans[i], &y = tb.spans[i];
      ASSERT_EQ(std::tie(x.rank, x.stream, x.name, x.start_ns, x.end_ns, x.comm, x.peer, x.seq),
                std::tie(y.rank, y.stream, y.name, y.start_ns, y.end_ns, y.comm, y.peer, y.seq));
    }
  }
}

// Where the symmetry is not exact, every rank is simulated literally: a 3-tier fabric whose pods
// hold two rails' leaves, one rail spanning two pods (6 nodes, radix 4: rail 0 on leaves 0-2, rail
// 1 on 3-5, pod 1 holds leaves 2 and 3); a fat-tree that is not rail-optimized; tp smaller than the
// node; the ranks' spread.
TEST(Executor, RailSymmetryOnlyWhereExact) {
  EXPECT_FALSE(rail_fat_tree(6, 2, 4, 3).topology->rails_are_copies());
  EXPECT_FALSE(rail_fat_tree(8, 2, 4, 3, false).topology->rails_are_copies());
  EXPECT_TRUE(rail_fat_tree(8, 4, 8, 2).topology->rails_are_copies());
  const Cluster shared = rail_fat_tree(6, 2, 4, 3);
  const Workload w6 = build_workload(small_scenario(8, 3, 2, 2, 3), h100_cost());
  EXPECT_FALSE(rail_symmetry_applies(w6.layout, shared));
  ExecutorOptions all;
  all.all_ranks = true;
  EXPECT_EQ(execute(w6, shared, all).ranks.size(), 12u);
  const Cluster c4 = rail_fat_tree(8, 4, 8, 2);
  const Workload tp2 = build_workload(small_scenario(8, 8, 2, 2, 2), h100_cost());
  EXPECT_FALSE(rail_symmetry_applies(tp2.layout, c4));
  const Workload tp4 = build_workload(small_scenario(8, 4, 4, 2, 2), h100_cost());
  EXPECT_TRUE(rail_symmetry_applies(tp4.layout, c4));
  ExecutorOptions jitter = all;
  jitter.rank_jitter = 0.02;
  EXPECT_EQ(execute(tp4, c4, jitter).ranks.size(), 32u);
  EXPECT_EQ(execute(tp4, c4, all).ranks.size(), 8u);
  Scenario dp_first = small_scenario(8, 4, 4, 2, 2);
  dp_first.parallel.placement = "dp,tp,pp";
  EXPECT_FALSE(rail_symmetry_applies(build_workload(dp_first, h100_cost()).layout, c4));
}

TEST(Executor, DeterministicBitIdentical) {
  const Cluster c = h100_cluster(64);
  Scenario s = small_scenario(8, 4, 4, 4, 8);
  s.parallel.zero = 1;
  const Workload w = build_workload(s, h100_cost(), {2, precision_config("mixed")});
  ExecutorOptions opt;
  opt.network = NetworkModel::Flow;
  const ExecResult a = execute(w, c, opt), b = execute(w, c, opt);
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  EXPECT_EQ(a.makespan_ns, b.makespan_ns);
  EXPECT_EQ(a.events, b.events);
  for (size_t k = 0; k < a.ranks.size(); ++k)
    for (size_t i = 0; i < a.ranks[k].ops.size(); ++i) {
      ASSERT_EQ(a.ranks[k].ops[i].start_ns, b.ranks[k].ops[i].start_ns);
      ASSERT_EQ(a.ranks[k].ops[i].active_ns, b.ranks[k].ops[i].active_ns);
      ASSERT_EQ(a.ranks[k].ops[i].end_ns, b.ranks[k].ops[i].end_ns);
    }
}

TEST(Executor, TraceHasEverySpanAndCommunicator) {
  const Cluster c = h100_cluster(8);
  const Workload w = build_workload(small_scenario(4, 2, 2, 2, 4), h100_cost());
  const ExecResult r = execute(w, c, {});
  const traces::Trace t = make_trace(w, r, c, 989e12);
  EXPECT_EQ(t.meta.source, traces::TraceSource::Sim);
  EXPECT_EQ(t.ranks.size(), 2u);
  size_t ops = 0, phases = 0;
  for (const auto& sp : t.spans) (sp.kind == traces::SpanKind::Phase ? phases : ops)++;
  EXPECT_EQ(ops, w.op_count());
  // Per rank: 1 step + 4 forward + 4 backward + 1 optimizer phase spans.
  EXPECT_EQ(phases, 2u * (1 + 4 + 4 + 1));
  // Communicators: for each simulated rank its tp, dp and pp group; the stage 0/1 pair shares pp
  // and embedding groups.
  std::map<traces::CommKind, int> kinds;
  for (const auto& cm : t.comms) ++kinds[cm.kind];
  EXPECT_EQ(kinds[traces::CommKind::TP], 2);
  EXPECT_EQ(kinds[traces::CommKind::DP], 2);
  EXPECT_EQ(kinds[traces::CommKind::PP], 1);
  EXPECT_EQ(kinds[traces::CommKind::Other], 1);
  for (const auto& sp : t.spans) {
    EXPECT_LE(sp.start_ns, sp.end_ns);
    if (sp.kind == traces::SpanKind::Collective || sp.kind == traces::SpanKind::P2P) {
      EXPECT_GE(sp.comm, 0);
    }
  }
}

TEST(Executor, ClusterTooSmallIsAnInputError) {
  const Workload w = build_workload(small_scenario(4, 2, 2, 2, 4), h100_cost());
  EXPECT_THROW(execute(w, h100_cluster(4), {}), InputError);
}

TEST(Executor, Gpt3On1024GpusRuns) {
  const Workload w =
      build_workload(testing::gpt3_175b(8), h100_cost(), {1, precision_config("mixed")});
  const Cluster c = h100_cluster(1024);
  ExecutorOptions opt;
  opt.network = NetworkModel::Analytical;
  const ExecResult r = execute(w, c, opt);
  ASSERT_EQ(r.ranks.size(), 16u);
  // At least the compute of 192 micro-batches on one stage, and a bubble on top.
  int64_t busy = 0;
  for (const auto& rk : r.ranks) busy = std::max(busy, busy_compute_ns(rk));
  EXPECT_GT(r.makespan_ns, busy);
}

// comm_compute_share s: a compute op of t ns that runs while c ns of its rank's communication are
// on the network takes t + s·c (the overlapped part at 1 - s, the rest at the full rate); the
// communication is not slowed; compute after it runs at the full rate; s = 0 changes nothing.
TEST(Executor, CommComputeShareClosedForm) {
  Workload w = build_workload(small_scenario(2, 2, 1, 1, 2), h100_cost());
  StageProgram p;
  p.stage = 0;
  p.layers = w.stages[0].layers;
  const auto name = [&](const std::string& n) {
    w.names.push_back(n);
    return uint32_t(w.names.size() - 1);
  };
  const uint32_t a = name("test.a"), b = name("test.b"), ar = name("test.allreduce");
  auto compute = [&](uint32_t n, int64_t ns) {
    Op op;
    op.name = n;
    op.duration_ns = ns;
    op.step = 0;
    return op;
  };
  auto collective = [&](int seq) {
    Op op;
    op.name = ar;
    op.kind = traces::SpanKind::Collective;
    op.stream = kStreamDp;
    op.group = GroupRole::DP;
    op.coll = traces::CollOp::AllReduce;
    op.seq = seq;
    op.bytes = 1024;
    op.step = 0;
    return op;
  };
  const int64_t ta = 100000, tb = 50000, tc = 40000;
  p.ops = {compute(a, ta), collective(0), collective(1), compute(b, tb)};
  p.deps = {0};  // b after a (same stream anyway)
  p.ops[3].dep_begin = 0, p.ops[3].dep_count = 1;
  p.stream_ops[kStreamCompute] = {0, 3};
  p.stream_ops[kStreamDp] = {1, 2};
  w.stages = {p};
  ExecutorOptions o;
  o.comm_time = [tc](const CollectiveRequest&) { return tc; };
  for (double share : {0.0, 0.25, 0.5}) {
    o.comm_compute_share = share;
    const ExecResult r = execute(w, h100_cluster(2), o);
    ASSERT_EQ(r.ranks.size(), 1u);
    const auto& t = r.ranks[0].ops;
    // Two all-reduces back to back: 2·tc on the network while a computes.
    EXPECT_EQ(t[1].end_ns, tc) << share;
    EXPECT_EQ(t[2].end_ns, 2 * tc) << share;
    const int64_t a_end = ta + std::llround(share * 2 * tc);
    EXPECT_EQ(t[0].end_ns, a_end) << share;
    EXPECT_EQ(t[3].start_ns, a_end) << share;
    EXPECT_EQ(t[3].end_ns, a_end + tb) << share;
    EXPECT_EQ(r.makespan_ns, a_end + tb) << share;
  }
}

}  // namespace
}  // namespace orrery::sim

namespace orrery::sim {
namespace {

// Core sharing: ranks of a node computing at once share its cores (processor sharing).
TEST(Executor, CoreSharingSymmetricRanksSlowDownByTheLaw) {
  // dp = 4 on one node, free network: the four ranks are always busy together, so every compute op
  // runs at 1 / compute_slowdown(4): with 2 cores, contention 1 and exponent 1, exactly half speed.
  const Cluster c = testing::h100_cluster(4);
  Workload w = build_workload(testing::small_scenario(4, 4, 1, 1, 2), testing::h100_cost());
  for (auto& p : w.stages)
    for (auto& op : p.ops) op.duration_ns = op.stream == kStreamCompute ? 1000 : 0;
  ExecutorOptions alone = zero_cost_network();
  const int64_t t1 = execute(w, c, alone).makespan_ns;
  for (auto [cores, factor] : {std::pair{4, 1}, std::pair{2, 2}, std::pair{1, 4}}) {
    CoreSharing s;
    s.cores = cores;
    ExecutorOptions o = zero_cost_network();
    o.core_sharing = &s;
    const ExecResult r = execute(w, c, o);
    EXPECT_EQ(r.ranks.size(), 4u);  // every rank simulated
    EXPECT_EQ(r.makespan_ns, factor * t1) << cores;
  }
}

TEST(Executor, CoreSharingPipelineIsWorkConserving) {
  // A 2-stage pipeline on ONE core: whenever a stage waits for its neighbour the other has the core
  // to itself, so the step takes exactly the two stages' work, p · m · (tf + tb), instead of the
  // dedicated-core (m + p − 1)(tf + tb).
  const int p = 2, m = 4;
  const int64_t tf = 1000, tb = 2000;
  for (const char* sched : {"gpipe", "1f1b"}) {
    Workload w =
        build_workload(testing::small_scenario(p * 2, 1, 1, p, m, sched), testing::h100_cost());
    equalize(w, tf, tb);
    CoreSharing s;
    s.cores = 1;
    ExecutorOptions o = zero_cost_network();
    o.core_sharing = &s;
    const ExecResult r = execute(w, testing::h100_cluster(8), o);
    EXPECT_NEAR(double(r.makespan_ns), double(p * m * (tf + tb)), 8.0) << sched;
  }
}

}  // namespace
}  // namespace orrery::sim
