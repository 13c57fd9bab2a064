// orrery commbench's pieces that need no MPI: option checks (each refusal and its message), the
// sizes and default groups, the trace's scenario and marker, and the table computed from a
// hand-built trace with known times (medians of min(end) - max(start), send_recv messages,
// warm-up and incomplete collectives left out). The sweep itself runs under MPI in
// tests/runtime/mpi/commbench_checks.sh.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"
#include "orrery/runtime/commbench.hpp"

namespace orrery::runtime {
namespace {

using traces::CollOp;
using traces::SpanKind;

template <typename F>
std::string input_error_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

TEST(CommBench, OpNames) {
  for (BenchOp op : {BenchOp::AllReduce, BenchOp::ReduceScatter, BenchOp::AllGather,
                     BenchOp::Broadcast, BenchOp::SendRecv}) {
    EXPECT_EQ(bench_op_from_string(to_string(op)), op);
    EXPECT_EQ(bench_span_name(op), "bench." + std::string(to_string(op)));
  }
  EXPECT_EQ(bench_op_from_string("AllReduce"), BenchOp::AllReduce);
  EXPECT_EQ(bench_op_from_string("send-recv"), BenchOp::SendRecv);
  EXPECT_EQ(bench_op_from_string("sendrecv"), BenchOp::SendRecv);
  EXPECT_FALSE(bench_op_from_string("all_to_all"));
  EXPECT_FALSE(bench_op_from_string(""));
}

TEST(CommBench, SizesAndDefaultGroups) {
  CommBenchOptions o;
  o.min_bytes = 4096;
  o.max_bytes = 65536;
  EXPECT_EQ(bench_sizes(o), (std::vector<int64_t>{4096, 8192, 16384, 32768, 65536}));
  o.max_bytes = 100000;  // not a power of two: stops at the last doubling below it
  EXPECT_EQ(bench_sizes(o).back(), 65536);
  EXPECT_EQ(bench_sizes(CommBenchOptions{}).size(), 13u);  // 4K..16M
  EXPECT_EQ(default_bench_groups(8), (std::vector<int>{2, 4, 8}));
  EXPECT_EQ(default_bench_groups(4), (std::vector<int>{2, 4}));
  EXPECT_EQ(default_bench_groups(2), (std::vector<int>{2}));
  EXPECT_EQ(default_bench_groups(6), (std::vector<int>{2, 6}));
  EXPECT_EQ(default_bench_groups(3), (std::vector<int>{3}));
  EXPECT_EQ(checked_bench_options({}, 4).groups, (std::vector<int>{2, 4}));
  CommBenchOptions o2;
  o2.ops = {BenchOp::SendRecv, BenchOp::AllReduce, BenchOp::Broadcast};
  EXPECT_EQ(checked_bench_options(o2, 4).ops,  // send_recv last
            (std::vector<BenchOp>{BenchOp::AllReduce, BenchOp::Broadcast, BenchOp::SendRecv}));
}

TEST(CommBench, RefusedOptionsNameTheOption) {
  auto with = [](auto change) {
    CommBenchOptions o;
    change(o);
    return o;
  };
  EXPECT_NE(input_error_of([&] {
              checked_bench_options({}, 1);
            }).find("--nproc 1: commbench needs at least 2 ranks"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] {
              checked_bench_options(with([](auto& o) { o.groups = {3}; }), 4);
            }).find("--groups: group size 3 does not divide the 4 ranks"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] {
              checked_bench_options(with([](auto& o) { o.groups = {2, 8}; }), 4);
            }).find("--groups: group size 8 exceeds the 4 ranks"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] {
              checked_bench_options(with([](auto& o) { o.groups = {1}; }), 4);
            }).find("group size 1 is below 2"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] {
              checked_bench_options(with([](auto& o) { o.groups = {2, 2}; }), 4);
            }).find("group size 2 given twice"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] {
              checked_bench_options(with([](auto& o) { o.min_bytes = 65536, o.max_bytes = 4096; }),
                                    2);
            }).find("--min-bytes 65536 is larger than --max-bytes 4096"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] {
              checked_bench_options(with([](auto& o) { o.min_bytes = 4098; }), 2);
            }).find("not a multiple of 4"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] {
              checked_bench_options(with([](auto& o) { o.min_bytes = 16; }), 8);
            }).find("at least 4 x the largest group (32 bytes"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] {
              checked_bench_options(with([](auto& o) { o.max_bytes = kBenchMaxBytes * 2; }), 2);
            }).find("at most 1G"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] {
              checked_bench_options(with([](auto& o) { o.iters = 0; }), 2);
            }).find("--iters 0"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] {
              checked_bench_options(with([](auto& o) { o.warmup = -1; }), 2);
            }).find("--warmup -1"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] {
              checked_bench_options(with([](auto& o) { o.ops.clear(); }), 2);
            }).find("--ops"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] {
              checked_bench_options(with([](auto& o) {
                                      o.ops = {BenchOp::Broadcast, BenchOp::Broadcast};
                                    }),
                                    2);
            }).find("broadcast given twice"),
            std::string::npos);
}

TEST(CommBench, TraceScenarioParsesAndMarkerSaysCommbench) {
  CommBenchOptions o = checked_bench_options({}, 8);
  const Scenario s = commbench_scenario(8, o);
  const Scenario back = parse_scenario(s.text, "commbench scenario");
  EXPECT_EQ(back.name, "commbench");
  EXPECT_EQ(back.world_size(), 8);
  EXPECT_EQ(back.runtime.threads, 1);
  EXPECT_EQ(back.training.steps, o.iters);
  EXPECT_EQ(s.text.rfind("# orrery commbench", 0), 0u);

  const auto j = nlohmann::json::parse(commbench_extra_json(8, o));
  EXPECT_EQ(j["kind"], "commbench");
  EXPECT_EQ(j["commbench"]["warmup_name"], "bench.warmup");
  EXPECT_EQ(j["commbench"]["warmup_step"], -1);
  EXPECT_EQ(j["commbench"]["groups"], nlohmann::json({2, 4, 8}));
  EXPECT_EQ(j["commbench"]["sizes"].size(), 13u);
  traces::Trace t;
  t.meta.extra_json = j.dump();
  EXPECT_TRUE(is_commbench_trace(t));
  t.meta.extra_json = "{\"threads\": 1}";
  EXPECT_FALSE(is_commbench_trace(t));
  t.meta.extra_json = "not json";
  EXPECT_FALSE(is_commbench_trace(t));
}

// A trace built by hand: a group of ranks {0, 1} (comm 5) and a lone-member comm of 2 ranks (6).
struct Builder {
  traces::Trace t;
  Builder() {
    t.comms.push_back({5, traces::CommKind::TP, "bench.g2[0-1]", {0, 1}});
    t.comms.push_back({6, traces::CommKind::TP, "bench.g2[2-3]", {2, 3}});
  }
  void add(int rank, const std::string& name, CollOp op, int comm, int64_t seq, int step,
           int64_t bytes, int64_t start, int64_t end, int peer = -1) {
    traces::Span s;
    s.rank = rank;
    s.stream = 1;
    s.kind = (op == CollOp::Send || op == CollOp::Recv) ? SpanKind::P2P : SpanKind::Collective;
    s.name = t.strings.intern(name);
    s.op = op;
    s.comm = comm;
    s.seq = seq;
    s.step = step;
    s.bytes = bytes;
    s.start_ns = start;
    s.end_ns = end;
    s.peer = peer;
    t.spans.push_back(s);
  }
};

TEST(CommBench, TableFromKnownSpans) {
  Builder b;
  // Warm-up (left out): a huge time that would move every median.
  b.add(0, "bench.warmup", CollOp::AllReduce, 5, 0, -1, 4096, 0, 1000000);
  b.add(1, "bench.warmup", CollOp::AllReduce, 5, 0, -1, 4096, 0, 1000000);
  // Two timed all-reduces: 300 - 150 = 150 and 1100 - 1000 = 100 -> median 125.
  b.add(0, "bench.all_reduce", CollOp::AllReduce, 5, 1, 0, 4096, 100, 300);
  b.add(1, "bench.all_reduce", CollOp::AllReduce, 5, 1, 0, 4096, 150, 320);
  b.add(0, "bench.all_reduce", CollOp::AllReduce, 5, 2, 1, 4096, 1000, 1100);
  b.add(1, "bench.all_reduce", CollOp::AllReduce, 5, 2, 1, 4096, 990, 1200);
  // An incomplete collective (one member of comm 6): no instance, its span still counted.
  b.add(2, "bench.all_reduce", CollOp::AllReduce, 6, 0, 0, 4096, 0, 5);
  // A broadcast whose root was done before the other arrived: skipped.
  b.add(0, "bench.broadcast", CollOp::Broadcast, 5, 3, 0, 8192, 0, 10, 0);
  b.add(1, "bench.broadcast", CollOp::Broadcast, 5, 3, 0, 8192, 20, 30, 0);
  // send_recv, one exchange: 0->1 received at 45, started max(0, 12) = 12 -> 33;
  // 1->0 received at 60, started max(10, 5) = 10 -> 50; median 41.5.
  b.add(0, "bench.send_recv", CollOp::Send, 5, 4, 0, 4096, 0, 50, 1);
  b.add(0, "bench.send_recv", CollOp::Recv, 5, 5, 0, 4096, 5, 60, 1);
  b.add(1, "bench.send_recv", CollOp::Send, 5, 4, 0, 4096, 10, 40, 0);
  b.add(1, "bench.send_recv", CollOp::Recv, 5, 5, 0, 4096, 12, 45, 0);
  // Not a bench span: ignored.
  b.add(0, "grad.bucket", CollOp::AllReduce, 5, 9, 0, 4096, 0, 7);

  const auto rows = commbench_table(b.t);
  ASSERT_EQ(rows.size(), 3u);
  const CommBenchRow& ar = rows[0];
  EXPECT_EQ(ar.op, BenchOp::AllReduce);
  EXPECT_EQ(ar.group_size, 2);
  EXPECT_EQ(ar.groups, 2);  // comms 5 and 6 have spans
  EXPECT_EQ(ar.bytes, 4096);
  EXPECT_EQ(ar.count, 1024);
  EXPECT_EQ(ar.instances, 2);
  EXPECT_EQ(ar.skipped, 0);
  EXPECT_EQ(ar.spans, 5);
  EXPECT_DOUBLE_EQ(ar.time_ns, 125.0);
  EXPECT_DOUBLE_EQ(ar.span_median_ns, 170.0);  // durations 200, 170, 100, 210, 5
  EXPECT_DOUBLE_EQ(ar.algbw_gb_per_s, 4096.0 / 125.0);
  EXPECT_DOUBLE_EQ(ar.busbw_gb_per_s, 4096.0 / 125.0 * 2.0 * (2 - 1) / 2);

  const CommBenchRow& bc = rows[1];
  EXPECT_EQ(bc.op, BenchOp::Broadcast);
  EXPECT_EQ(bc.bytes, 8192);
  EXPECT_EQ(bc.instances, 0);
  EXPECT_EQ(bc.skipped, 1);
  EXPECT_DOUBLE_EQ(bc.time_ns, 0.0);
  EXPECT_DOUBLE_EQ(bc.algbw_gb_per_s, 0.0);

  const CommBenchRow& sr = rows[2];
  EXPECT_EQ(sr.op, BenchOp::SendRecv);
  EXPECT_EQ(sr.instances, 2);
  EXPECT_EQ(sr.spans, 4);
  EXPECT_DOUBLE_EQ(sr.time_ns, 41.5);
  EXPECT_DOUBLE_EQ(sr.busbw_gb_per_s, 4096.0 / 41.5);  // factor 1
}

}  // namespace
}  // namespace orrery::runtime
