// The commbench calibration path: measured collective tables (CollectiveOverride::time_ns's
// interpolation, their YAML keys), profile_for_ranks choosing the entries of the run's crowding,
// and calibrate turning a commbench trace (runtime/commbench.hpp) into per-(op, group size, ranks
// on the node) tables of median transfer times. Every expected number is worked out in the
// comments.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "calibration_fixtures.hpp"
#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"
#include "orrery/sim/calibrate.hpp"
#include "orrery/sim/core_sharing.hpp"
#include "orrery/sim/cost_model.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/sim/workload.hpp"

namespace orrery::sim {
namespace {

using testing_fixtures::make_run;
using testing_fixtures::parse_error;
using testing_fixtures::tiny;
using testing_fixtures::Truth;
using traces::CollOp;
using Table = std::vector<std::pair<int64_t, int64_t>>;

CollectiveOverride make_override(CollOp op, int ranks, int ranks_on_node, int64_t latency_ns,
                                 double busbw, Table table = {}) {
  CollectiveOverride o;
  o.op = op;
  o.ranks = ranks;
  o.ranks_on_node = ranks_on_node;
  o.latency_ns = latency_ns;
  o.bus_bandwidth_bytes_per_s = busbw;
  o.table = std::move(table);
  return o;
}

// ---- CollectiveOverride::time_ns

TEST(CollectiveTable, AlphaBetaWithoutATable) {
  // all_reduce over 4 ranks: busbw factor 2(4-1)/4 = 1.5; 10 us + ceil(bytes · 1.5 / 3 GB/s).
  const CollectiveOverride o = make_override(CollOp::AllReduce, 4, 0, 10'000, 3e9);
  EXPECT_DOUBLE_EQ(traces::busbw_factor(CollOp::AllReduce, 4), 1.5);
  EXPECT_EQ(o.time_ns(1001, 4), 10'000 + 501);             // 1001 · 1.5 / 3 = 500.5 ns -> 501
  EXPECT_EQ(o.time_ns(4'000'001, 4), 10'000 + 2'000'001);  // 6'000'001.5 / 3 = 2'000'000.5 ns
  EXPECT_EQ(o.time_ns(0, 4), 10'000);
  // Over 2 ranks the factor is 1: 1001 / 3 = 333.67 ns -> 334.
  EXPECT_EQ(o.time_ns(1001, 2), 10'000 + 334);
}

TEST(CollectiveTable, InterpolatesAndExtrapolatesTheMeasuredPoints) {
  // The latency and bandwidth (and the group size) are not used once there is a table.
  const CollectiveOverride o = make_override(CollOp::AllReduce, 2, 4, 999'999, 1.0,
                                             {{4096, 10'000}, {8192, 14'000}, {16384, 30'000}});
  // Exact at the points.
  EXPECT_EQ(o.time_ns(4096, 2), 10'000);
  EXPECT_EQ(o.time_ns(8192, 2), 14'000);
  EXPECT_EQ(o.time_ns(16384, 2), 30'000);
  EXPECT_EQ(o.time_ns(8192, 8), 14'000);
  // Linear in between: t = y0 + (y1 - y0)(b - x0)/(x1 - x0).
  EXPECT_EQ(o.time_ns(6144, 2), 12'000);   // midpoint of the first segment
  EXPECT_EQ(o.time_ns(5000, 2), 10'883);   // 10000 + 4000 · 904 / 4096 = 10882.8125
  EXPECT_EQ(o.time_ns(12288, 2), 22'000);  // midpoint of the second
  EXPECT_EQ(o.time_ns(10000, 2), 17'531);  // 14000 + 16000 · 1808 / 8192 = 17531.25
  EXPECT_EQ(o.time_ns(8193, 2), 14'002);   // 14000 + 16000 / 8192 = 14001.95
  // Below the first size: the first time.
  EXPECT_EQ(o.time_ns(4095, 2), 10'000);
  EXPECT_EQ(o.time_ns(100, 2), 10'000);
  EXPECT_EQ(o.time_ns(0, 2), 10'000);
  // Beyond the last: along the last segment (slope 16000 / 8192 ns per byte).
  EXPECT_EQ(o.time_ns(32768, 2), 62'000);  // 30000 + 16000 · 16384 / 8192
  EXPECT_EQ(o.time_ns(20480, 2), 38'000);  // 30000 + 16000 · 4096 / 8192
  // One point: its time everywhere.
  const CollectiveOverride one = make_override(CollOp::Send, 2, 0, 0, 1e9, {{4096, 7'000}});
  EXPECT_EQ(one.time_ns(1, 2), 7'000);
  EXPECT_EQ(one.time_ns(1 << 20, 2), 7'000);
  // A falling last segment extrapolates down to 0, never below: 5000 - 4 · (4000 - 2000) < 0.
  const CollectiveOverride down =
      make_override(CollOp::Send, 2, 0, 0, 1e9, {{1000, 5'000}, {2000, 1'000}});
  EXPECT_EQ(down.time_ns(2500, 2), 0);  // 1000 - 4 · 500 = -1000 -> 0
  EXPECT_EQ(down.time_ns(2200, 2), 200);
}

// ---- YAML

TEST(CollectiveTable, RanksOnNodeAndTableRoundTripThroughYaml) {
  HardwareProfile p = default_hardware_profile("cpu", false);
  p.name = "tables";
  p.collectives.push_back(make_override(CollOp::AllReduce, 2, 8, 50'000, 0.3e9,
                                        {{4096, 51'700}, {65536, 60'125}, {1048576, 1'041'600}}));
  p.collectives.push_back(
      make_override(CollOp::Send, 2, 4, 3'000, 2e9, {{4096, 3'275}, {8192, 5'550}}));
  p.collectives.push_back(make_override(CollOp::AllReduce, 2, 0, 10'000, 2e9));
  const std::string y = to_yaml(p);
  const HardwareProfile q = parse_hardware_profile(y, "tables.yaml");
  ASSERT_EQ(q.collectives.size(), 3u) << y;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(q.collectives[i].op, p.collectives[i].op) << i;
    EXPECT_EQ(q.collectives[i].ranks, p.collectives[i].ranks) << i;
    EXPECT_EQ(q.collectives[i].ranks_on_node, p.collectives[i].ranks_on_node) << i;
    EXPECT_EQ(q.collectives[i].latency_ns, p.collectives[i].latency_ns) << i;
    EXPECT_DOUBLE_EQ(q.collectives[i].bus_bandwidth_bytes_per_s,
                     p.collectives[i].bus_bandwidth_bytes_per_s)
        << i;
    EXPECT_EQ(q.collectives[i].table, p.collectives[i].table) << i;
  }
  // The keys as documented: [bytes, microseconds] pairs, ranks_on_node only when set. (Doubles are
  // written with 17 significant digits, 51.7 as 51.700000000000003, so the text is not compared.)
  EXPECT_NE(y.find("ranks_on_node: 8"), std::string::npos) << y;
  EXPECT_NE(y.find("table: [[4096, 51.7"), std::string::npos) << y;
  EXPECT_NE(y.find("[65536, 60.125]"), std::string::npos) << y;
  EXPECT_EQ(y.find("ranks_on_node: 0"), std::string::npos) << y;
  // A hand-written entry as in hardware.hpp's example.
  const HardwareProfile h = parse_hardware_profile(
      "collectives:\n"
      "  - {op: all_reduce, ranks: 2, ranks_on_node: 8, latency_us: 50, bus_bandwidth_gbps: 0.3,\n"
      "     table: [[4096, 51.7], [1048576, 1041.6]]}\n",
      "hand.yaml");
  ASSERT_EQ(h.collectives.size(), 1u);
  EXPECT_EQ(h.collectives[0].ranks_on_node, 8);
  EXPECT_EQ(h.collectives[0].table, (Table{{4096, 51'700}, {1048576, 1'041'600}}));
  // The time halfway along in bytes: 51.7 + (1041.6 - 51.7) · 0.5 us.
  EXPECT_EQ(h.collectives[0].time_ns(4096 + (1048576 - 4096) / 2, 2), 546'650);
}

TEST(CollectiveTable, BadTablesAndCrowdingsAreNamed) {
  const std::string head = "collectives:\n  - {op: all_reduce, ranks: 2, bus_bandwidth_gbps: 1, ";
  auto has = [](const std::string& msg, const std::string& what) {
    return msg.find(what) != std::string::npos;
  };
  // Sizes not ascending (falling, and repeated).
  std::string e = parse_error(head + "table: [[8192, 2], [4096, 1]]}\n");
  EXPECT_TRUE(has(e, "bad.yaml:2")) << e;
  EXPECT_TRUE(has(e, "collectives[].table")) << e;
  EXPECT_TRUE(has(e, "sizes must ascend")) << e;
  e = parse_error(head + "table: [[4096, 1], [4096, 2]]}\n");
  EXPECT_TRUE(has(e, "sizes must ascend")) << e;
  // A point that is not a [bytes, us] pair.
  e = parse_error(head + "table: [[4096, 1, 2]]}\n");
  EXPECT_TRUE(has(e, "collectives[].table")) << e;
  EXPECT_TRUE(has(e, "expected a pair")) << e;
  e = parse_error(head + "table: [4096, 1]}\n");
  EXPECT_TRUE(has(e, "expected a pair")) << e;
  e = parse_error(head + "table: {4096: 1}}\n");
  EXPECT_TRUE(has(e, "collectives[].table")) << e;
  // Negative bytes, negative time.
  e = parse_error(head + "table: [[-1, 2]]}\n");
  EXPECT_TRUE(has(e, "collectives[].table")) << e;
  EXPECT_TRUE(has(e, "bytes >= 0")) << e;
  // A fraction of a byte (was read as 4096, silently).
  e = parse_error(head + "table: [[4096.5, 2]]}\n");
  EXPECT_TRUE(has(e, "collectives[].table")) << e;
  EXPECT_TRUE(has(e, "bytes >= 0")) << e;
  e = parse_error(head + "table: [[4096, -2]]}\n");
  EXPECT_TRUE(has(e, "expected a time >= 0")) << e;
  // ranks_on_node must be a whole number >= 0.
  e = parse_error(head + "ranks_on_node: 1.5}\n");
  EXPECT_TRUE(has(e, "collectives[].ranks_on_node")) << e;
  EXPECT_TRUE(has(e, "whole number")) << e;
  e = parse_error(head + "ranks_on_node: -2}\n");
  EXPECT_TRUE(has(e, "collectives[].ranks_on_node")) << e;
}

// ---- profile_for_ranks: the entries of the run's crowding

const CollectiveOverride* find_entry(const HardwareProfile& p, CollOp op, int ranks) {
  const CollectiveOverride* found = nullptr;
  int count = 0;
  for (const auto& o : p.collectives)
    if (o.op == op && o.ranks == ranks) found = &o, ++count;
  return count == 1 ? found : nullptr;  // exactly one entry per (op, n) survives
}

TEST(CollectiveTable, ProfileForRanksKeepsTheRunsCrowding) {
  HardwareProfile p = default_hardware_profile("cpu", false);
  p.sharing.cores = 2;
  p.sharing.threads_per_rank = 1;
  p.sharing.comm_exponent = 1.0;
  // comm_slowdown: u = R / 2 cores, u^1 beyond the cores: R=2 -> 1, 4 -> 2, 6 -> 3, 8 -> 4.
  ASSERT_DOUBLE_EQ(comm_slowdown(p.sharing, 2), 1.0);
  ASSERT_DOUBLE_EQ(comm_slowdown(p.sharing, 4), 2.0);
  ASSERT_DOUBLE_EQ(comm_slowdown(p.sharing, 6), 3.0);
  ASSERT_DOUBLE_EQ(comm_slowdown(p.sharing, 8), 4.0);
  const Table ar2{{4096, 20'000}, {8192, 24'000}};
  const Table ar8{{4096, 80'000}, {8192, 96'000}};
  const Table ag2{{4096, 30'000}, {8192, 40'000}};
  const Table ag8{{4096, 120'000}, {8192, 160'004}};
  p.collectives.push_back(make_override(CollOp::AllReduce, 2, 2, 20'000, 1e9, ar2));
  p.collectives.push_back(make_override(CollOp::AllReduce, 2, 8, 80'000, 0.25e9, ar8));
  p.collectives.push_back(make_override(CollOp::AllReduce, 2, 0, 10'000, 2e9));  // any crowding
  p.collectives.push_back(make_override(CollOp::AllGather, 4, 2, 30'000, 1e9, ag2));
  p.collectives.push_back(make_override(CollOp::AllGather, 4, 8, 120'000, 0.25e9, ag8));

  // R = 8: the R=8 entries as measured, the others dropped.
  {
    const HardwareProfile q = profile_for_ranks(p, 8, false);
    ASSERT_EQ(q.collectives.size(), 2u);
    const auto* ar = find_entry(q, CollOp::AllReduce, 2);
    ASSERT_NE(ar, nullptr);
    EXPECT_EQ(ar->table, ar8);
    EXPECT_EQ(ar->latency_ns, 80'000);
    EXPECT_DOUBLE_EQ(ar->bus_bandwidth_bytes_per_s, 0.25e9);
    EXPECT_EQ(ar->ranks_on_node, 0);  // now the run's own entry: it applies at any crowding
    const auto* ag = find_entry(q, CollOp::AllGather, 4);
    ASSERT_NE(ag, nullptr);
    EXPECT_EQ(ag->table, ag8);
    EXPECT_EQ(ag->latency_ns, 120'000);
    // The simulator's lookup then finds the measured table: halfway in the first segment.
    const auto* o = q.find_override(CollOp::AllReduce, true, 2);
    ASSERT_NE(o, nullptr);
    EXPECT_EQ(o->time_ns(6144, 2), 88'000);
  }
  // R = 2: likewise the R=2 entries.
  {
    const HardwareProfile q = profile_for_ranks(p, 2, false);
    ASSERT_EQ(q.collectives.size(), 2u);
    ASSERT_NE(find_entry(q, CollOp::AllReduce, 2), nullptr);
    EXPECT_EQ(find_entry(q, CollOp::AllReduce, 2)->table, ar2);
    ASSERT_NE(find_entry(q, CollOp::AllGather, 4), nullptr);
    EXPECT_EQ(find_entry(q, CollOp::AllGather, 4)->table, ag2);
  }
  // R = 4, no R=4 all_reduce entry: the generic one, scaled by comm_slowdown(4) = 2.
  {
    const HardwareProfile q = profile_for_ranks(p, 4, false);
    ASSERT_EQ(q.collectives.size(), 2u);
    const auto* ar = find_entry(q, CollOp::AllReduce, 2);
    ASSERT_NE(ar, nullptr);
    EXPECT_TRUE(ar->table.empty());
    EXPECT_EQ(ar->latency_ns, 20'000);
    EXPECT_DOUBLE_EQ(ar->bus_bandwidth_bytes_per_s, 1e9);
    EXPECT_EQ(ar->ranks_on_node, 0);
    // 20 us + 1 MB / 1 GB/s.
    EXPECT_EQ(ar->time_ns(1'000'000, 2), 20'000 + 1'000'000);
  }
  // R = 6: all_reduce again the generic one, x3; all_gather has only R=2 and R=8 entries: the
  // nearer crowding (|ln 8/6| < |ln 2/6|) scaled by comm_slowdown(6) / comm_slowdown(8) = 3/4.
  {
    const HardwareProfile q = profile_for_ranks(p, 6, false);
    ASSERT_EQ(q.collectives.size(), 2u);
    const auto* ar = find_entry(q, CollOp::AllReduce, 2);
    ASSERT_NE(ar, nullptr);
    EXPECT_TRUE(ar->table.empty());
    EXPECT_EQ(ar->latency_ns, 30'000);
    EXPECT_NEAR(ar->bus_bandwidth_bytes_per_s, 2e9 / 3, 1e-3);
    const auto* ag = find_entry(q, CollOp::AllGather, 4);
    ASSERT_NE(ag, nullptr);
    EXPECT_EQ(ag->table, (Table{{4096, 90'000}, {8192, 120'003}}));  // 120000 · 3/4, 160004 · 3/4
    EXPECT_EQ(ag->latency_ns, 90'000);
    EXPECT_NEAR(ag->bus_bandwidth_bytes_per_s, 0.25e9 / 0.75, 1e-3);
    EXPECT_EQ(ag->ranks_on_node, 0);
  }
  // Without a sharing model the profile is returned as it is (every entry, crowdings included).
  HardwareProfile none = p;
  none.sharing.cores = 0;
  EXPECT_EQ(profile_for_ranks(none, 8, false).collectives.size(), 5u);
}

// ---- calibrate with a commbench trace (the training runs: calibration_fixtures.hpp's make_run, 25 us
// + bytes / 3 GB/s all-reduces)

// The bench's transfer times (ns), per size: instance i of a size is timed iteration i / 2 of group
// i % 2 (groups {0,1} and {2,3}). Medians over the 6 instances (the mean of the 3rd and 4th):
//   4 KiB: 10000 10200 10400 10600 10800 | 500000 (an outlier)  -> (10400 + 10600) / 2 = 10500
//   8 KiB:  9000  9100  9300  9500  9600   9800                 -> (9300 + 9500) / 2  =  9400  (<
//   10500)
//  16 KiB: 20000 20100 20300 20500 20600  20900                 -> (20300 + 20500) / 2 = 20400
// Made non-decreasing in size (a smaller message never costs more than a larger one): 4 KiB ->
// 9400.
const std::vector<int64_t> kSizes{4096, 8192, 16384};
const std::vector<std::vector<int64_t>> kArTimes{{10'400, 500'000, 10'000, 10'800, 10'600, 10'200},
                                                 {9'500, 9'000, 9'800, 9'300, 9'100, 9'600},
                                                 {20'900, 20'300, 20'000, 20'600, 20'100, 20'500}};
const Table kArTable{{4096, 9'400}, {8192, 9'400}, {16384, 20'400}};
// Point-to-point: per size 12 messages (2 pairs x 2 directions x 3 iterations), message i is
// iteration i / 4, pair (i / 2) % 2, direction i % 2. Medians (mean of the 6th and 7th):
//   4 KiB: 3000 ... 3500 in steps of 50, and 90000 (outlier) -> (3250 + 3300) / 2 = 3275
//   8 KiB: 5000 ... 6100 in steps of 100                     -> (5500 + 5600) / 2 = 5550
const std::vector<std::vector<int64_t>> kP2pTimes{
    {3'300, 3'000, 90'000, 3'450, 3'100, 3'250, 3'500, 3'050, 3'400, 3'200, 3'150, 3'350},
    {6'100, 5'000, 5'500, 5'900, 5'100, 6'000, 5'300, 5'700, 5'200, 5'800, 5'400, 5'600}};
const Table kSendTable{{4096, 3'275}, {8192, 5'550}};

// A commbench trace of 4 ranks with group size 2 (runtime/commbench.hpp): communicators
// bench.g2[0-1] and bench.g2[2-3] (kind TP), a warm-up (step -1, far slower: it must not count) and
// 3 timed iterations of all_reduce at 4, 8 and 16 KiB, then send_recv at 4 and 8 KiB.
traces::Trace make_bench() {
  traces::Trace t;
  t.meta.source = traces::TraceSource::Real;
  t.meta.scenario_name = "commbench";
  Scenario s = tiny(4, 1, 64);
  s.name = "commbench";
  t.meta.scenario_text = "# commbench: a collective sweep, not a training run\n" + to_yaml(s);
  t.meta.world_size = 4;
  t.meta.dp = 4;
  t.meta.extra_json =
      R"({"kind": "commbench", "commbench": {"groups": [2], "iters": 3, "warmup": 1}})";
  t.path = "commbench-4.db";
  for (int r = 0; r < 4; ++r) t.ranks.push_back({r, "host", "cpu", r, 0, 0});
  for (int g = 0; g < 2; ++g) {
    traces::CommunicatorInfo c;
    c.id = 1 + g;
    c.kind = traces::CommKind::TP;
    c.name = "bench.g2[" + std::to_string(2 * g) + "-" + std::to_string(2 * g + 1) + "]";
    c.ranks = {2 * g, 2 * g + 1};
    t.comms.push_back(c);
  }
  const auto ar_name = t.strings.intern("bench.all_reduce");
  const auto sr_name = t.strings.intern("bench.send_recv");
  const auto warm_name = t.strings.intern("bench.warmup");
  int64_t seq[2] = {0, 0};
  int64_t now = 1'000'000;
  auto span = [&](int rank, traces::SpanKind kind, traces::NameId name, CollOp op, int step,
                  int64_t bytes, int comm, int64_t start, int64_t end) {
    traces::Span sp;
    sp.rank = rank, sp.stream = 1, sp.kind = kind, sp.name = name, sp.op = op, sp.step = step,
    sp.bytes = bytes;
    sp.comm = comm, sp.start_ns = start, sp.end_ns = end;
    return sp;
  };
  // One all-reduce instance of group g: the second member arrives 300 ns after the first and both
  // finish together, so the transfer time (from the last arrival) is `time`: the first member's
  // span is 300 ns longer. (The members end together so that min(end) and max(end) agree.)
  auto all_reduce = [&](int g, int step, traces::NameId name, int64_t bytes, int64_t time,
                        int64_t t0) {
    auto a = span(2 * g, traces::SpanKind::Collective, name, CollOp::AllReduce, step, bytes, 1 + g,
                  t0, t0 + 300 + time);
    auto b = span(2 * g + 1, traces::SpanKind::Collective, name, CollOp::AllReduce, step, bytes,
                  1 + g, t0 + 300, t0 + 300 + time);
    a.seq = b.seq = seq[g]++;
    t.spans.push_back(a);
    t.spans.push_back(b);
  };
  for (size_t si = 0; si < kSizes.size(); ++si) {
    for (int g = 0; g < 2; ++g) all_reduce(g, -1, warm_name, kSizes[si], 7'000'000, now);
    now += 10'000'000;
    for (int it = 0; it < 3; ++it) {
      for (int g = 0; g < 2; ++g)
        all_reduce(g, it, ar_name, kSizes[si], kArTimes[si][2 * it + g], now);
      now += 1'000'000;
    }
  }
  // send_recv: pair (a, b) = (2p, 2p+1); a posts its send at t0 and its receive at t0 + 10, b its
  // send at t0 + 500 and its receive at t0 + 510. Message a->b: b's recv.end - max(t0, t0 + 510);
  // b->a: a's recv.end - max(t0 + 500, t0 + 10).
  auto send_recv = [&](int pair, int step, traces::NameId name, int64_t bytes, int64_t t_ab,
                       int64_t t_ba, int64_t t0) {
    const int a = 2 * pair, b = 2 * pair + 1, comm = 1 + pair;
    auto sa = span(a, traces::SpanKind::P2P, name, CollOp::Send, step, bytes, comm, t0, t0 + 20);
    auto ra = span(a, traces::SpanKind::P2P, name, CollOp::Recv, step, bytes, comm, t0 + 10,
                   t0 + 500 + t_ba);
    auto sb =
        span(b, traces::SpanKind::P2P, name, CollOp::Send, step, bytes, comm, t0 + 500, t0 + 520);
    auto rb = span(b, traces::SpanKind::P2P, name, CollOp::Recv, step, bytes, comm, t0 + 510,
                   t0 + 510 + t_ab);
    sa.peer = ra.peer = b;
    sb.peer = rb.peer = a;
    sa.seq = sb.seq = seq[pair]++;
    ra.seq = rb.seq = seq[pair]++;
    for (const auto& sp : {sa, ra, sb, rb}) t.spans.push_back(sp);
  };
  for (size_t si = 0; si < 2; ++si) {
    for (int p = 0; p < 2; ++p) send_recv(p, -1, warm_name, kSizes[si], 8'000'000, 8'000'000, now);
    now += 20'000'000;
    for (int it = 0; it < 3; ++it) {
      for (int p = 0; p < 2; ++p)
        send_recv(p, it, sr_name, kSizes[si], kP2pTimes[si][4 * it + 2 * p],
                  kP2pTimes[si][4 * it + 2 * p + 1], now);
      now += 1'000'000;
    }
  }
  t.sort_spans();
  return t;
}

// The (op, n = 2, ranks_on_node R) table entry of a profile, or null.
const CollectiveOverride* bench_entry(const HardwareProfile& p, CollOp op, int r) {
  const CollectiveOverride* found = nullptr;
  for (const auto& o : p.collectives)
    if (o.op == op && o.ranks == 2 && o.ranks_on_node == r) {
      if (found) return nullptr;  // more than one
      found = &o;
    }
  return found;
}

TEST(CalibrateBench, TablesOfMedianTransferTimesPerCrowding) {
  const Truth truth;
  std::vector<traces::Trace> training;
  // A serial run and a dp2 run at 1.2x: on 4 cores, contention_at_full = 1 + 0.2 / ((2-1)/(4-1))
  // = 1.6.
  training.push_back(make_run(tiny(1, 4, 64), truth, 1.0));
  training.push_back(make_run(tiny(2, 4, 64), truth, 1.2));
  std::vector<traces::Trace> with_bench = training;
  with_bench.push_back(make_bench());
  CalibrationOptions opt;
  opt.cores = 4;
  opt.name = "bench";
  const CalibrationResult base = calibrate(training, opt);
  const CalibrationResult r = calibrate(with_bench, opt);

  // all_reduce over 2 ranks with 4 on the node: the medians, made non-decreasing.
  const auto* ar = bench_entry(r.profile, CollOp::AllReduce, 4);
  ASSERT_NE(ar, nullptr);
  EXPECT_EQ(ar->table, kArTable);
  EXPECT_EQ(ar->scope, CollectiveScope::Any);
  for (size_t i = 1; i < ar->table.size(); ++i)
    EXPECT_LE(ar->table[i - 1].second, ar->table[i].second);
  EXPECT_GE(ar->latency_ns, 0);
  EXPECT_GT(ar->bus_bandwidth_bytes_per_s, 0);
  // send over 2 ranks (the matched send/recv pairs).
  const auto* snd = bench_entry(r.profile, CollOp::Send, 4);
  ASSERT_NE(snd, nullptr);
  EXPECT_EQ(snd->table, kSendTable);
  // No other measured table: the training runs give alpha-beta entries (ranks_on_node 0) only.
  int tables = 0;
  for (const auto& o : r.profile.collectives) tables += o.table.empty() ? 0 : 1;
  EXPECT_EQ(tables, 2);
  for (const auto& o : base.profile.collectives) EXPECT_TRUE(o.table.empty());

  // The bench is no compute run: not among the sharing rows, and the sharing law is the training
  // runs' alone (4 ranks on 4 cores would otherwise pull contention_at_full towards 1).
  ASSERT_EQ(r.sharing.size(), 2u);
  for (const auto& row : r.sharing) EXPECT_NE(row.trace, "commbench-4.db");
  EXPECT_EQ(r.sharing[0].ranks, 1);
  EXPECT_EQ(r.sharing[1].ranks, 2);
  EXPECT_NEAR(base.profile.sharing.contention_at_full, 1.6, 1e-5);
  EXPECT_DOUBLE_EQ(r.profile.sharing.contention_at_full, base.profile.sharing.contention_at_full);
  EXPECT_DOUBLE_EQ(r.profile.sharing.oversubscription_exponent,
                   base.profile.sharing.oversubscription_exponent);
  // Nor does it change the compute fit.
  ASSERT_EQ(r.ops.size(), base.ops.size());
  for (size_t i = 0; i < r.ops.size(); ++i)
    EXPECT_DOUBLE_EQ(r.ops[i].measured_ns, base.ops[i].measured_ns) << i;

  // A 4-rank run gets the measured tables; a 2-rank one the generic alpha-beta entries.
  const HardwareProfile at4 = profile_for_ranks(r.profile, 4, false);
  const auto* o4 = at4.find_override(CollOp::AllReduce, true, 2);
  ASSERT_NE(o4, nullptr);
  EXPECT_EQ(o4->table, kArTable);
  EXPECT_EQ(o4->time_ns(6144, 2), 9'400);
  EXPECT_EQ(o4->time_ns(12288, 2), 14'900);  // (9400 + 20400) / 2
  const HardwareProfile at2 = profile_for_ranks(r.profile, 2, false);
  const auto* o2 = at2.find_override(CollOp::AllReduce, true, 2);
  ASSERT_NE(o2, nullptr);
  EXPECT_TRUE(o2->table.empty());

  // The tables survive the calibrated YAML.
  const HardwareProfile back = parse_hardware_profile(calibrated_yaml(r), "calibrated.yaml");
  ASSERT_NE(bench_entry(back, CollOp::AllReduce, 4), nullptr);
  EXPECT_EQ(bench_entry(back, CollOp::AllReduce, 4)->table, kArTable);
  ASSERT_NE(bench_entry(back, CollOp::Send, 4), nullptr);
  EXPECT_EQ(bench_entry(back, CollOp::Send, 4)->table, kSendTable);
}

TEST(CalibrateBench, OnlyACommbenchTraceIsAnError) {
  try {
    calibrate({make_bench()});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("commbench"), std::string::npos) << e.what();
  }
  // Two bench traces alone too.
  EXPECT_THROW(calibrate({make_bench(), make_bench()}), InputError);
}

}  // namespace
}  // namespace orrery::sim
