// The core-sharing weights of the calibrated simulator (hardware.hpp's CoreSharing):
//   comm_thread_weight v: each collective member in flight on a node counts as v busy threads in the
//     processor-sharing compute rate (busy_slowdown; the executor re-rates the node's computing ranks
//     when a collective starts and ends; calibrate fits v from compute spans with collectives in
//     flight against the same ops without);
//   comm_compute_weight w: a collective launched while k of its own members compute takes
//     (1 + w k / cores) x its time, at any crowding, k read after the launch instant (calibrate fits
//     w from overlapped training collectives against the commbench table of the same (op, n, R)).
// Every expected number is a closed form worked out in the comments.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "calibration_fixtures.hpp"
#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"
#include "orrery/sim/calibrate.hpp"
#include "orrery/sim/core_sharing.hpp"
#include "orrery/sim/executor.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/sim/workload.hpp"

namespace orrery::sim {
namespace {

using testing_fixtures::add_step_phases;
using testing_fixtures::parse_error;
using testing_fixtures::plain_cluster;
using testing_fixtures::real_run;
using testing_fixtures::tiny;
using traces::CollOp;

// ---- 1. busy_slowdown: the law for a (fractional) busy-thread count

TEST(BusySlowdown, EqualsComputeSlowdownAtWholeRanksTimesThreads) {
  CoreSharing s;
  s.cores = 4;
  s.contention_at_full = 1.3;
  s.oversubscription_exponent = 1.5;
  for (int threads : {1, 2, 3}) {
    s.threads_per_rank = threads;
    for (int n = 1; n <= 10; ++n)
      EXPECT_DOUBLE_EQ(busy_slowdown(s, double(n) * threads), compute_slowdown(s, n))
          << threads << " " << n;
  }
}

TEST(BusySlowdown, FractionalCountsBelowAndBeyondTheCores) {
  CoreSharing s;
  s.cores = 4;
  s.contention_at_full = 1.3;
  s.oversubscription_exponent = 2.0;
  // u <= 1: 1 + (c - 1)(busy - 1)/(cores - 1).
  EXPECT_DOUBLE_EQ(busy_slowdown(s, 1.0), 1.0);
  EXPECT_NEAR(busy_slowdown(s, 2.5), 1.0 + 0.3 * 1.5 / 3.0, 1e-12);    // 1.15
  EXPECT_NEAR(busy_slowdown(s, 3.25), 1.0 + 0.3 * 2.25 / 3.0, 1e-12);  // 1.225
  EXPECT_DOUBLE_EQ(busy_slowdown(s, 4.0), 1.3);                        // u = 1: c
  // u > 1: c · u^e.
  EXPECT_NEAR(busy_slowdown(s, 4.4), 1.3 * 1.1 * 1.1, 1e-12);   // u = 1.1: 1.573
  EXPECT_NEAR(busy_slowdown(s, 6.0), 1.3 * 1.5 * 1.5, 1e-12);   // u = 1.5: 2.925
  EXPECT_NEAR(busy_slowdown(s, 10.0), 1.3 * 2.5 * 2.5, 1e-12);  // u = 2.5: 8.125
  // Continuous at the cores: just beyond is c · (1 + ε)².
  EXPECT_NEAR(busy_slowdown(s, 4.0 + 4e-9), 1.3, 1e-8);
  s.oversubscription_exponent = 0.5;
  EXPECT_NEAR(busy_slowdown(s, 16.0), 1.3 * 2.0, 1e-12);  // u = 4: 1.3 · 4^0.5
  EXPECT_NEAR(busy_slowdown(s, 9.0), 1.3 * 1.5, 1e-12);   // u = 2.25: 1.3 · 1.5
  // Non-decreasing in the busy count for c >= 1 (calibrate bisects on it).
  s.oversubscription_exponent = 1.0;
  double prev = 0;
  for (double b = 1.0; b <= 20.0; b += 0.125) {
    const double f = busy_slowdown(s, b);
    EXPECT_GE(f, prev) << b;
    prev = f;
  }
  // One core: 1 up to one busy thread, then u = busy.
  CoreSharing one;
  one.cores = 1;
  EXPECT_DOUBLE_EQ(busy_slowdown(one, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(busy_slowdown(one, 2.5), 2.5);
}

TEST(BusySlowdown, NoCoresOrNoBusyThreadsIsOne) {
  CoreSharing none;  // cores = 0: no sharing model
  none.contention_at_full = 2.0;
  for (double b : {0.0, 0.5, 1.0, 3.5, 64.0, 1000.0})
    EXPECT_DOUBLE_EQ(busy_slowdown(none, b), 1.0) << b;
  CoreSharing s;
  s.cores = 2;
  s.contention_at_full = 1.5;
  EXPECT_DOUBLE_EQ(busy_slowdown(s, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(busy_slowdown(s, -1.0), 1.0);
}

// ---- 2. the profile's YAML keys

TEST(SharingWeightsYaml, RoundTripAndDefaults) {
  HardwareProfile p = default_hardware_profile("cpu", false);
  p.name = "weights";
  p.sharing.cores = 2;
  p.sharing.threads_per_rank = 1;
  p.sharing.contention_at_full = 1.25;
  p.sharing.comm_compute_weight = 0.375;
  p.sharing.comm_thread_weight = 1.25;
  const HardwareProfile q = parse_hardware_profile(to_yaml(p), "weights.yaml");
  EXPECT_EQ(q.sharing.cores, 2);
  EXPECT_DOUBLE_EQ(q.sharing.contention_at_full, 1.25);
  EXPECT_DOUBLE_EQ(q.sharing.comm_compute_weight, 0.375);
  EXPECT_DOUBLE_EQ(q.sharing.comm_thread_weight, 1.25);
  // And once more through the written form.
  const HardwareProfile r = parse_hardware_profile(to_yaml(q), "weights2.yaml");
  EXPECT_DOUBLE_EQ(r.sharing.comm_compute_weight, 0.375);
  EXPECT_DOUBLE_EQ(r.sharing.comm_thread_weight, 1.25);
  // Absent keys: 0 (no stretch, no progress threads); zero is allowed.
  const HardwareProfile d = parse_hardware_profile("sharing: {cores: 2}\n", "d.yaml");
  EXPECT_EQ(d.sharing.comm_compute_weight, 0.0);
  EXPECT_EQ(d.sharing.comm_thread_weight, 0.0);
  const HardwareProfile z = parse_hardware_profile(
      "sharing: {cores: 2, comm_compute_weight: 0, comm_thread_weight: 0.5}\n", "z.yaml");
  EXPECT_EQ(z.sharing.comm_compute_weight, 0.0);
  EXPECT_DOUBLE_EQ(z.sharing.comm_thread_weight, 0.5);
}

TEST(SharingWeightsYaml, NegativeOrNonNumericWeightIsAnInputErrorNamingTheKey) {
  for (const char* key : {"comm_compute_weight", "comm_thread_weight"}) {
    const std::string k = key;
    const std::string neg = parse_error("sharing: {cores: 2, " + k + ": -0.5}\n");
    EXPECT_NE(neg.find("sharing." + k), std::string::npos) << neg;
    EXPECT_NE(neg.find("bad.yaml"), std::string::npos) << neg;
    const std::string word = parse_error("sharing: {cores: 2, " + k + ": lots}\n");
    EXPECT_NE(word.find("sharing." + k), std::string::npos) << word;
    EXPECT_THROW(parse_hardware_profile("sharing: {cores: 2, " + k + ": -1e-9}\n", "bad.yaml"),
                 InputError);
  }
}

// ---- 3./4. the executor

// A hand-built workload: every rank of stage s runs progs[s]. Ops: compute (duration), or a collective
// (all-reduce on `group`); deps within the rank.
struct OpSpec {
  bool collective = false;
  int64_t duration_ns = 0;
  GroupRole group = GroupRole::DP;
  std::vector<uint32_t> deps;
};

Workload hand_workload(int dp, int pp, const std::vector<std::vector<OpSpec>>& progs) {
  Workload w;
  w.layout.dp = dp;
  w.layout.tp = 1;
  w.layout.pp = pp;
  w.names = {"compute", "all_reduce"};
  w.steps = 1;
  w.micro_batches = 1;
  for (int s = 0; s < pp; ++s) {
    StageProgram p;
    p.stage = s;
    int32_t seq = 0;
    for (const auto& spec : progs[s]) {
      Op op;
      op.step = 0;
      op.micro_batch = 0;
      if (spec.collective) {
        op.name = 1;
        op.kind = traces::SpanKind::Collective;
        op.stream = kStreamDp;
        op.group = spec.group;
        op.coll = CollOp::AllReduce;
        op.bytes = 1 << 20;
        op.seq = seq++;
      } else {
        op.name = 0;
        op.kind = traces::SpanKind::Compute;
        op.stream = kStreamCompute;
        op.duration_ns = spec.duration_ns;
      }
      op.dep_begin = static_cast<uint32_t>(p.deps.size());
      op.dep_count = static_cast<uint32_t>(spec.deps.size());
      for (uint32_t d : spec.deps) p.deps.push_back(d);
      p.stream_ops[op.stream].push_back(static_cast<uint32_t>(p.ops.size()));
      p.ops.push_back(op);
    }
    w.stages.push_back(std::move(p));
  }
  return w;
}

// plain_cluster(gpus, per_node) (calibration_fixtures.hpp): the executor only needs the rank-to-node
// map, comm_time replaces the network.

constexpr int64_t kMs = 1'000'000;

// dp 2: both ranks compute `compute_ns` and, at the same instant, all-reduce (taking comm_ns).
struct Timeline {
  int64_t compute_end[2];
  int64_t comm_end[2];
  size_t ranks;
};

Timeline run_dp2(const CoreSharing& s, int64_t compute_ns, int64_t comm_ns, const Cluster& c,
                 bool comm_after_compute = false) {
  OpSpec comp{false, compute_ns, GroupRole::None, {}};
  OpSpec coll{true, 0, GroupRole::DP, {}};
  if (comm_after_compute) coll.deps = {0};
  const Workload w = hand_workload(2, 1, {{comp, coll}});
  ExecutorOptions o;
  o.comm_time = [comm_ns](const CollectiveRequest&) { return comm_ns; };
  o.core_sharing = &s;
  const ExecResult r = execute(w, c, o);
  Timeline t{};
  t.ranks = r.ranks.size();
  for (size_t i = 0; i < r.ranks.size() && i < 2; ++i) {
    t.compute_end[i] = r.ranks[i].ops[0].end_ns;
    t.comm_end[i] = r.ranks[i].ops[1].end_ns;
  }
  return t;
}

TEST(ExecutorCommThreads, CollectiveInFlightReRatesTheComputingRanks) {
  // 2 cores, contention 1, exponent 1. Both ranks compute 10 ms; a 2-member all-reduce is in flight
  // for the first 4 ms. With v = 1: busy = 2 + 1 · 2 = 4 on 2 cores -> slowdown 2, rate 1/2 for 4 ms
  // (2 ms of work), then busy 2 -> rate 1 for the remaining 8 ms: ends at 4 + 8 = 12 ms.
  const Cluster c = plain_cluster(2, 2);
  CoreSharing s;
  s.cores = 2;
  s.comm_thread_weight = 1.0;
  const Timeline t = run_dp2(s, 10 * kMs, 4 * kMs, c);
  EXPECT_EQ(t.ranks, 2u);  // core sharing simulates every rank (not the dp = 0 representative)
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(t.compute_end[r], 12 * kMs) << r;
    EXPECT_EQ(t.comm_end[r], 4 * kMs) << r;  // v does not stretch the collective itself
  }
  // v = 0: busy 2 on 2 cores throughout, slowdown c = 1: 10 ms.
  s.comm_thread_weight = 0.0;
  const Timeline t0 = run_dp2(s, 10 * kMs, 4 * kMs, c);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(t0.compute_end[r], 10 * kMs) << r;
  // v = 0.5, a 3 ms all-reduce: busy 3 -> slowdown 1.5, 3 ms at 2/3 = 2 ms of work, then 8 ms: 11 ms.
  s.comm_thread_weight = 0.5;
  const Timeline th = run_dp2(s, 10 * kMs, 3 * kMs, c);
  for (int r = 0; r < 2; ++r) EXPECT_NEAR(double(th.compute_end[r]), double(11 * kMs), 1.0) << r;
  // A collective outlasting the compute (v = 1, 30 ms): rate 1/2 throughout, 10 ms of work in 20 ms.
  s.comm_thread_weight = 1.0;
  const Timeline tl = run_dp2(s, 10 * kMs, 30 * kMs, c);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(tl.compute_end[r], 20 * kMs) << r;
    EXPECT_EQ(tl.comm_end[r], 30 * kMs) << r;
  }
  // The collective after the compute (dep): nothing computes while it is in flight: 10 ms, then 4.
  const Timeline ta = run_dp2(s, 10 * kMs, 4 * kMs, c, true);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ta.compute_end[r], 10 * kMs) << r;
    EXPECT_EQ(ta.comm_end[r], 14 * kMs) << r;
  }
}

TEST(ExecutorCommThreads, ContentionAndExponentEnterTheLaw) {
  // c = 1.2, e = 2, 2 cores, v = 1. While the all-reduce (4 ms) is in flight busy = 4, u = 2:
  // slowdown 1.2 · 2² = 4.8 -> 4 / 4.8 ms of work; then busy 2, u = 1: 1.2 -> the rest,
  // (10 - 4/4.8) · 1.2 = 12 - 1 = 11 ms: ends at 4 + 11 = 15 ms.
  CoreSharing s;
  s.cores = 2;
  s.contention_at_full = 1.2;
  s.oversubscription_exponent = 2.0;
  s.comm_thread_weight = 1.0;
  const Timeline t = run_dp2(s, 10 * kMs, 4 * kMs, plain_cluster(2, 2));
  for (int r = 0; r < 2; ++r) EXPECT_NEAR(double(t.compute_end[r]), double(15 * kMs), 1.0) << r;
}

TEST(ExecutorCommThreads, CountsTheMembersOnEachNode) {
  // The two ranks on two nodes (one GPU each): each node has 1 computing rank and 1 member of the
  // all-reduce. v = 1: busy 1 + 1 = 2 per node.
  CoreSharing s;
  s.comm_thread_weight = 1.0;
  // 2 cores per node: u = 1, slowdown c = 1: the compute is not slowed, 10 ms.
  s.cores = 2;
  const Timeline t2 = run_dp2(s, 10 * kMs, 4 * kMs, plain_cluster(2, 1));
  for (int r = 0; r < 2; ++r) EXPECT_EQ(t2.compute_end[r], 10 * kMs) << r;
  // 1 core per node: u = 2, slowdown 2 for 4 ms (2 ms of work), then 8 ms alone: 12 ms.
  s.cores = 1;
  const Timeline t1 = run_dp2(s, 10 * kMs, 4 * kMs, plain_cluster(2, 1));
  for (int r = 0; r < 2; ++r) EXPECT_EQ(t1.compute_end[r], 12 * kMs) << r;
}

TEST(ExecutorCommComputeWeight, CollectiveStretchedByTheComputingRanksAtItsStart) {
  // 4 cores, contention 1 (2 computing ranks are not slowed), w = 0.5, comm_time 4 ms.
  const Cluster c = plain_cluster(2, 2);
  CoreSharing s;
  s.cores = 4;
  s.comm_compute_weight = 0.5;
  // k = 2 computing at the launch: (1 + 0.5 · 2 / 4) · 4 ms = 5 ms; the compute keeps its 10 ms.
  const Timeline t = run_dp2(s, 10 * kMs, 4 * kMs, c);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(t.comm_end[r], 5 * kMs) << r;
    EXPECT_EQ(t.compute_end[r], 10 * kMs) << r;
  }
  // k = 0 (launched after the compute): unstretched, 10 + 4 ms.
  const Timeline a = run_dp2(s, 10 * kMs, 4 * kMs, c, true);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(a.comm_end[r], 14 * kMs) << r;
  // w = 0: 4 ms.
  s.comm_compute_weight = 0.0;
  const Timeline z = run_dp2(s, 10 * kMs, 4 * kMs, c);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(z.comm_end[r], 4 * kMs) << r;
  // Not a core-sharing run (cores = 0): w is not applied.
  CoreSharing off;
  off.comm_compute_weight = 0.5;
  const Timeline n = run_dp2(off, 10 * kMs, 4 * kMs, c);
  EXPECT_EQ(n.comm_end[0], 4 * kMs);
}

TEST(ExecutorCommComputeWeight, OneComputingRankOfTwo) {
  // pp 2: ranks 0 and 1 share the embedding all-reduce; only stage 0 computes (10 ms) when it
  // starts. 4 cores, w = 0.5: (1 + 0.5 · 1 / 4) · 4 ms = 4.5 ms.
  OpSpec comp{false, 10 * kMs, GroupRole::None, {}};
  OpSpec emb{true, 0, GroupRole::Embedding, {}};
  const Workload w = hand_workload(1, 2, {{comp, emb}, {emb}});
  CoreSharing s;
  s.cores = 4;
  s.comm_compute_weight = 0.5;
  ExecutorOptions o;
  o.comm_time = [](const CollectiveRequest&) { return int64_t(4 * kMs); };
  o.core_sharing = &s;
  const ExecResult r = execute(w, plain_cluster(2, 2), o);
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_EQ(r.ranks[0].ops[1].end_ns, 4 * kMs + kMs / 2);
  EXPECT_EQ(r.ranks[1].ops[0].end_ns, 4 * kMs + kMs / 2);
  EXPECT_EQ(r.ranks[0].ops[0].end_ns, 10 * kMs);
}

TEST(ExecutorCommComputeWeight, StretchedAtAnyCrowding) {
  // k counts at any crowding (commit 70c0e3f: no ranks x threads <= cores condition any more).
  const Cluster c = plain_cluster(2, 2);
  CoreSharing s;
  s.comm_compute_weight = 0.5;
  // 2 ranks x 1 thread on 1 core, k = 2: (1 + 0.5 · 2 / 1) · 4 ms = 8 ms.
  s.cores = 1;
  EXPECT_EQ(run_dp2(s, 10 * kMs, 4 * kMs, c).comm_end[0], 8 * kMs);
  // 2 ranks x 3 threads on 4 cores: (1 + 0.5 · 2 / 4) · 4 ms = 5 ms.
  s.cores = 4;
  s.threads_per_rank = 3;
  EXPECT_EQ(run_dp2(s, 10 * kMs, 4 * kMs, c).comm_end[0], 5 * kMs);
  // 2 ranks x 2 threads on 4 cores: 5 ms as well (k counts ranks, not threads).
  s.threads_per_rank = 2;
  EXPECT_EQ(run_dp2(s, 10 * kMs, 4 * kMs, c).comm_end[0], 5 * kMs);
}

TEST(ExecutorCommComputeWeight, OnlyItsOwnMembersCount) {
  // pp 3 on one node: the embedding all-reduce joins stages 0 and 2, which do not compute; stage 1
  // computes 10 ms meanwhile but is no member: k = 0, the all-reduce keeps its 4 ms.
  OpSpec comp{false, 10 * kMs, GroupRole::None, {}};
  OpSpec emb{true, 0, GroupRole::Embedding, {}};
  const Workload w = hand_workload(1, 3, {{emb}, {comp}, {emb}});
  CoreSharing s;
  s.cores = 4;
  s.comm_compute_weight = 0.5;
  ExecutorOptions o;
  o.comm_time = [](const CollectiveRequest&) { return int64_t(4 * kMs); };
  o.core_sharing = &s;
  const ExecResult r = execute(w, plain_cluster(3, 3), o);
  ASSERT_EQ(r.ranks.size(), 3u);
  EXPECT_EQ(r.ranks[0].ops[0].end_ns, 4 * kMs);
  EXPECT_EQ(r.ranks[2].ops[0].end_ns, 4 * kMs);
  EXPECT_EQ(r.ranks[1].ops[0].end_ns, 10 * kMs);
}

TEST(ExecutorCommComputeWeight, ComputeStartedAtTheSameInstantCounts) {
  // Each rank: op0 computes 2 ms; then both the all-reduce (op1) and a 10 ms compute (op2) depend on
  // op0 (a bucket issued together with the next backward op). At 2 ms rank 0's op0 completes first
  // (its all-reduce waits for rank 1, its op2 starts), then rank 1's: the all-reduce launches before
  // rank 1's op2 starts in event order, but k is read after the instant: k = 2. 4 cores, w = 0.5:
  // (1 + 0.5 · 2 / 4) · 4 ms = 5 ms: it ends at 7 ms (k = 1 would give 6.5 ms).
  OpSpec first{false, 2 * kMs, GroupRole::None, {}};
  OpSpec coll{true, 0, GroupRole::DP, {0}};
  OpSpec next{false, 10 * kMs, GroupRole::None, {0}};
  const Workload w = hand_workload(2, 1, {{first, coll, next}});
  CoreSharing s;
  s.cores = 4;
  s.comm_compute_weight = 0.5;
  ExecutorOptions o;
  o.comm_time = [](const CollectiveRequest&) { return int64_t(4 * kMs); };
  o.core_sharing = &s;
  const ExecResult r = execute(w, plain_cluster(2, 2), o);
  ASSERT_EQ(r.ranks.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(r.ranks[k].ops[1].active_ns, 2 * kMs) << k;
    EXPECT_EQ(r.ranks[k].ops[1].end_ns, 7 * kMs) << k;
    EXPECT_EQ(r.ranks[k].ops[2].end_ns, 12 * kMs) << k;  // 2 computing on 4 cores: not slowed
  }
}

TEST(ExecutorSharingWeights, BothWeightsTogether) {
  // 2 cores, c = 1, w = 1, v = 1: the all-reduce launched with k = 2 computing takes
  // (1 + 1 · 2 / 2) · 4 ms = 8 ms; meanwhile busy = 2 + 2 = 4, rate 1/2: 4 ms of work, then the
  // remaining 6 ms at rate 1: the compute ends at 14 ms.
  CoreSharing s;
  s.cores = 2;
  s.comm_compute_weight = 1.0;
  s.comm_thread_weight = 1.0;
  const Timeline t = run_dp2(s, 10 * kMs, 4 * kMs, plain_cluster(2, 2));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(t.comm_end[r], 8 * kMs) << r;
    EXPECT_EQ(t.compute_end[r], 14 * kMs) << r;
  }
}

// ---- 5. calibrate

// tiny(dp) (calibration_fixtures.hpp): the 2-layer model, micro-batch 4, seq 64, on dp ranks.

// Lone-rank op times (ns; multiples of 10, so 1.2x, 1.5x and 1.8x stay whole).
struct OpTime {
  const char* name;
  int layer;
  int64_t ns;
  bool backward;
  traces::SpanKind kind = traces::SpanKind::Compute;
};
const std::vector<OpTime> kOps{{"fwd.embed", -1, 20'000, false},
                               {"fwd.block", 0, 100'000, false},
                               {"fwd.block", 1, 100'000, false},
                               {"fwd.head", 2, 60'000, false},
                               {"bwd.head", 2, 120'000, true},
                               {"bwd.block", 1, 200'000, true},
                               {"bwd.block", 0, 200'000, true},
                               {"bwd.embed", -1, 40'000, true},
                               {"adamw", -1, 80'000, false, traces::SpanKind::Optimizer}};
constexpr int64_t kBackwardNs = 120'000 + 2 * 200'000 + 40'000;  // 560 us alone
constexpr int64_t kArBytes = 1 << 20;

// A training run on dp ranks of one host, 4 steps, every rank in lockstep: the forward ops and adamw
// at `plain` x the lone time; with dp > 1 a DP all-reduce of kArBytes on each rank spans exactly the
// backward ops, which run at `overlapped` x (with dp = 1 the backward runs at `plain`).
// `stagger` (dp 2): rank 1 instead runs its backward at `plain` right after its forward, with no
// collective in flight, and then waits in the all-reduce; rank 0 idles that long first, then runs its
// backward inside the all-reduce as above. Both all-reduce spans coincide, and at their midpoint only
// rank 0 computes (k = 1 member).
traces::Trace make_run(int dp, double plain, double overlapped, bool stagger = false) {
  traces::Trace t = real_run(tiny(dp), "run-dp" + std::to_string(dp) + ".db");
  const auto step_name = t.strings.intern("step");
  const auto ar_name = t.strings.intern("ddp.all_reduce");
  const double bwd_factor = dp > 1 ? overlapped : plain;
  int64_t now = 0;
  for (int step = 0; step < 4; ++step) {
    const int64_t step_start = now;
    int64_t end = now;
    for (int r = 0; r < dp; ++r) {
      int64_t tt = step_start;
      bool ar_open = false;
      const bool rank1_early = stagger && r == 1;
      int64_t bwd = 0;  // the all-reduce: the backward ops at bwd_factor
      for (const auto& b : kOps)
        if (b.backward) bwd += std::llround(double(b.ns) * bwd_factor);
      auto all_reduce = [&](int64_t from) {
        traces::Span sp;
        sp.rank = r, sp.stream = 1, sp.kind = traces::SpanKind::Collective, sp.name = ar_name;
        sp.start_ns = from, sp.end_ns = from + bwd, sp.step = step, sp.bytes = kArBytes,
        sp.comm = 0;
        sp.seq = step, sp.op = CollOp::AllReduce;
        t.spans.push_back(sp);
        ar_open = true;
      };
      for (const auto& o : kOps) {
        if (o.backward && !ar_open && dp > 1 && !rank1_early) {
          if (stagger)
            tt += std::llround(double(kBackwardNs) * plain);  // rank 0 waits for rank 1's backward
          all_reduce(tt);  // the all-reduce covers the backward ops exactly
        }
        if (!o.backward && o.kind == traces::SpanKind::Optimizer && rank1_early) {
          all_reduce(tt);  // rank 1 waits in it, idle
          tt += bwd;
        }
        const int64_t dur =
            std::llround(double(o.ns) * (o.backward && !rank1_early ? bwd_factor : plain));
        traces::Span sp;
        sp.rank = r, sp.stream = 0, sp.kind = o.kind, sp.name = t.strings.intern(o.name);
        sp.start_ns = tt, sp.end_ns = tt + dur, sp.step = step, sp.micro_batch = 0,
        sp.layer = o.layer;
        t.spans.push_back(sp);
        tt += dur;
      }
      end = std::max(end, tt);
    }
    add_step_phases(t, dp, step_name, step, step_start, end);
    now = end + 1000;
  }
  t.sort_spans();
  return t;
}

TEST(CalibrateSharingWeights, ThreadWeightFromOverlappedComputeAndSharingFromTheRest) {
  // Serial run at 1x; dp2 run whose forward ops and adamw (no collective in flight) take 1x and whose
  // backward ops (2 all-reduce spans, one per rank, in flight at their midpoints: m = 2) take 1.5x.
  // Sharing: only the non-overlapped spans count, f(2) = 1 -> contention_at_full = 1 (2 ranks on 2
  // cores). Thread weight: law(2 + 2v) = 1.5 · law(2) with law(b) = b / 2 beyond the 2 cores:
  // (2 + 2v) / 2 = 1.5 -> v = 0.5.
  const std::vector<traces::Trace> runs{make_run(1, 1.0, 1.0), make_run(2, 1.0, 1.5)};
  CalibrationOptions opt;
  opt.cores = 2;
  const CalibrationResult r = calibrate(runs, opt);
  EXPECT_EQ(r.profile.sharing.cores, 2);
  EXPECT_EQ(r.profile.sharing.threads_per_rank, 1);
  EXPECT_DOUBLE_EQ(r.profile.sharing.contention_at_full, 1.0);
  EXPECT_NEAR(r.profile.sharing.comm_thread_weight, 0.5, 1e-9);
  ASSERT_EQ(r.sharing.size(), 2u);
  EXPECT_DOUBLE_EQ(r.sharing[1].factor, 1.0);  // the overlapped backward is not in the slowdown
  // No commbench table: no comm_compute_weight.
  EXPECT_EQ(r.profile.sharing.comm_compute_weight, 0.0);
  // The lone-rank times of the backward ops come out as the serial ones (1.5x divided by the law's
  // law(2 + 2 · 0.5) / law(2) = 1.5): the measured ops are the truth.
  int matched = 0;
  for (const auto& m : r.profile.ops)
    for (const auto& o : kOps) {
      if (m.name != o.name) continue;
      EXPECT_NEAR(double(m.time_ns), double(o.ns), 2.0) << m.name;
      ++matched;
    }
  EXPECT_GE(matched, 7);
  // The weights survive the calibrated YAML.
  const HardwareProfile back = parse_hardware_profile(calibrated_yaml(r), "calibrated.yaml");
  EXPECT_NEAR(back.sharing.comm_thread_weight, 0.5, 1e-9);

  // Crowded at 1.2x without communication and 1.8x with: c = 1.2 from the 1.2x spans; the overlapped
  // ratio against (serial x 1.2) is 1.5 again: 1.2 · (2 + 2v) / 2 = 1.5 · 1.2 -> v = 0.5.
  const CalibrationResult r2 = calibrate({make_run(1, 1.0, 1.0), make_run(2, 1.2, 1.8)}, opt);
  EXPECT_NEAR(r2.profile.sharing.contention_at_full, 1.2, 1e-12);
  EXPECT_NEAR(r2.profile.sharing.comm_thread_weight, 0.5, 1e-9);

  // No slowdown with collectives in flight: v = 0.
  const CalibrationResult r0 = calibrate({make_run(1, 1.0, 1.0), make_run(2, 1.0, 1.0)}, opt);
  EXPECT_NEAR(r0.profile.sharing.comm_thread_weight, 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(r0.profile.sharing.contention_at_full, 1.0);

  // 4 cores: law(2) = 1 (c = 1 below the cores), and law(b) = b / 4 beyond them:
  // (2 + 2v) / 4 = 1.5 -> v = 2.
  opt.cores = 4;
  const CalibrationResult r4 = calibrate(runs, opt);
  EXPECT_DOUBLE_EQ(r4.profile.sharing.contention_at_full, 1.0);
  EXPECT_NEAR(r4.profile.sharing.comm_thread_weight, 2.0, 1e-9);
}

// A commbench trace (runtime/commbench.hpp) of 2 ranks on the host, one group {0, 1}: 3 timed
// all-reduces per size, both members starting and ending together, taking table[size].
const std::vector<std::pair<int64_t, int64_t>> kBenchTable{
    {kArBytes / 2, 300'000}, {kArBytes, 560'000}, {kArBytes * 2, 1'000'000}};

traces::Trace make_bench() {
  traces::Trace t;
  t.meta.source = traces::TraceSource::Real;
  Scenario s = tiny(2);
  s.name = "commbench";
  t.meta.scenario_name = "commbench";
  t.meta.scenario_text = "# commbench: a collective sweep, not a training run\n" + to_yaml(s);
  t.meta.world_size = 2;
  t.meta.dp = 2;
  t.meta.extra_json =
      R"({"kind": "commbench", "commbench": {"groups": [2], "iters": 3, "warmup": 0}})";
  t.path = "commbench-2.db";
  for (int r = 0; r < 2; ++r) t.ranks.push_back({r, "host", "cpu", r, 0, 0});
  traces::CommunicatorInfo c;
  c.id = 1;
  c.kind = traces::CommKind::TP;
  c.name = "bench.g2[0-1]";
  c.ranks = {0, 1};
  t.comms.push_back(c);
  const auto name = t.strings.intern("bench.all_reduce");
  int64_t now = 1'000'000, seq = 0;
  for (const auto& [bytes, ns] : kBenchTable) {
    for (int it = 0; it < 3; ++it) {
      for (int r = 0; r < 2; ++r) {
        traces::Span sp;
        sp.rank = r, sp.stream = 1, sp.kind = traces::SpanKind::Collective, sp.name = name;
        sp.op = CollOp::AllReduce, sp.step = it, sp.bytes = bytes, sp.comm = 1, sp.seq = seq;
        sp.start_ns = now, sp.end_ns = now + ns;
        t.spans.push_back(sp);
      }
      ++seq;
      now += 2'000'000;
    }
  }
  t.sort_spans();
  return t;
}

TEST(CalibrateSharingWeights, ComputeWeightFromOverlappedCollectivesAgainstTheBenchTable) {
  // The dp2 run's all-reduces (1 MiB) span its backward ops: 1.5 x 560 us = 840 us, with both ranks
  // computing at their midpoints (k = 2). The bench table at 1 MiB, 2 ranks on the node: 560 us.
  // (1 + w · 2 / cores) = 840 / 560 = 1.5: on 2 cores w = 0.5, on 4 cores w = 1.
  const std::vector<traces::Trace> runs{make_run(1, 1.0, 1.0), make_run(2, 1.0, 1.5), make_bench()};
  CalibrationOptions opt;
  opt.cores = 2;
  const CalibrationResult r = calibrate(runs, opt);
  const CollectiveOverride* table = nullptr;
  for (const auto& o : r.profile.collectives)
    if (!o.table.empty()) table = &o;
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->ranks_on_node, 2);
  EXPECT_EQ(table->table, kBenchTable);
  EXPECT_EQ(table->time_ns(kArBytes, 2), 560'000);
  EXPECT_NEAR(r.profile.sharing.comm_compute_weight, 0.5, 1e-12);
  // The bench does not move the other fits.
  EXPECT_DOUBLE_EQ(r.profile.sharing.contention_at_full, 1.0);
  EXPECT_NEAR(r.profile.sharing.comm_thread_weight, 0.5, 1e-9);
  const HardwareProfile back = parse_hardware_profile(calibrated_yaml(r), "calibrated.yaml");
  EXPECT_NEAR(back.sharing.comm_compute_weight, 0.5, 1e-9);

  opt.cores = 4;
  const CalibrationResult r4 = calibrate(runs, opt);
  EXPECT_NEAR(r4.profile.sharing.comm_compute_weight, 1.0, 1e-12);

  // Only one member computing at the all-reduces' midpoints (rank 1 ran its backward before, at 1x,
  // and waits): 1 + w · 1 / cores = 1.5 -> w = 1 on 2 cores (2 on 4). The thread weight is unchanged:
  // rank 0's backward still has both ranks' all-reduce spans in flight (m = 2) at 1.5x, rank 1's none.
  const std::vector<traces::Trace> staggered{make_run(1, 1.0, 1.0), make_run(2, 1.0, 1.5, true),
                                             make_bench()};
  opt.cores = 2;
  const CalibrationResult rs = calibrate(staggered, opt);
  EXPECT_NEAR(rs.profile.sharing.comm_compute_weight, 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(rs.profile.sharing.contention_at_full, 1.0);
  EXPECT_NEAR(rs.profile.sharing.comm_thread_weight, 0.5, 1e-9);
  opt.cores = 4;
  EXPECT_NEAR(calibrate(staggered, opt).profile.sharing.comm_compute_weight, 2.0, 1e-12);

  // Collectives that took the bench's time: w = 0. (All-reduces of 560 us: backward at 1x.)
  const CalibrationResult r1 =
      calibrate({make_run(1, 1.0, 1.0), make_run(2, 1.0, 1.0), make_bench()}, opt);
  EXPECT_NEAR(r1.profile.sharing.comm_compute_weight, 0.0, 1e-12);
}

}  // namespace
}  // namespace orrery::sim
