// Importer tests: Kineto (PyTorch profiler Chrome-trace JSON) and Nsight Systems (SQLite export).
// Fixtures (tests/data/import):
//  - kineto_gpu_rank{0,1}.json: HAND-WRITTEN in the format torch.profiler writes on CUDA machines
//    (make_kineto_gpu_fixture.py says what is in them), so every count and time below is known.
//  - torch113_legacy_ddp_cpu_rank{0,1}.json: RECORDED with torch 1.13 (Debian's, built without
//    Kineto, so PyTorch's legacy exporter wrote them: a top-level array, no categories) from a
//    tiny GPT-like model under DDP over gloo on 2 CPU processes (make_kineto_fixture.py).
//  - the nsys files are built here with SQLite in the documented export schema.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/traces/import.hpp"
#include "orrery/traces/kernel_work.hpp"
#include "orrery/traces/store.hpp"
#include "test_util.hpp"

namespace orrery::traces {
namespace {

const std::string kData = ORRERY_IMPORT_DATA;

std::string data(const std::string& name) { return kData + "/" + name; }

std::map<SpanKind, int64_t> kind_counts(const Trace& t, int32_t rank = -1) {
  std::map<SpanKind, int64_t> m;
  for (const auto& s : t.spans) {
    if (rank < 0 || s.rank == rank) m[s.kind] += 1;
  }
  return m;
}

std::vector<const Span*> spans_named(const Trace& t, const std::string& name, int32_t rank) {
  std::vector<const Span*> v;
  for (const auto& s : t.spans) {
    if (s.rank == rank && t.name_of(s) == name) v.push_back(&s);
  }
  return v;
}

// Expects an InputError whose message contains each of `parts`.
template <typename F>
void expect_input_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// ---------------------------------------------------------------------------------------------
// Kineto, hand-written GPU fixture.

TEST(ImportKineto, GpuFixtureCountsPerKind) {
  const Trace t = import_kineto({data("kineto_gpu_rank0.json"), data("kineto_gpu_rank1.json")});
  ASSERT_EQ(t.ranks.size(), 2u);
  EXPECT_EQ(t.meta.source, TraceSource::Import);
  EXPECT_EQ(t.meta.world_size, 2);
  for (int32_t r = 0; r < 2; ++r) {
    auto k = kind_counts(t, r);
    EXPECT_EQ(k[SpanKind::Compute], 2) << r;     // 2 sgemm kernels
    EXPECT_EQ(k[SpanKind::Collective], 2) << r;  // all-reduce, all-gather kernels
    EXPECT_EQ(k[SpanKind::Memcpy], 2) << r;      // memcpy + memset
    EXPECT_EQ(k[SpanKind::Phase], 3) << r;       // 2 steps + "forward"
    // aten::mm x2, cudaLaunchKernel x4, record_param_comms x2, one python_function
    EXPECT_EQ(k[SpanKind::Other], 9) << r;
    EXPECT_EQ(t.ranks[static_cast<size_t>(r)].device, "cuda:0");
  }
  EXPECT_EQ(t.spans.size(), 36u);
  ASSERT_EQ(t.counters.size(), 2u);  // one [memory] sample per rank
  EXPECT_EQ(t.strings.str(t.counters[0].name), "mem.cuda");
  EXPECT_EQ(t.counters[0].value, 1048576.0);

  const ImportSummary s = summarize_import(t, ImportFormat::Kineto, {"a", "b"});
  EXPECT_EQ(s.ranks, 2);
  EXPECT_EQ(s.steps, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(s.collectives, 4);
  EXPECT_EQ(s.communicators, 1);
  EXPECT_EQ(s.skipped_events, 6);  // per rank: the "Trace" span and an ac2g flow start and end
}

TEST(ImportKineto, GpuFixtureStreamsTimesAndSteps) {
  const Trace t = import_kineto({data("kineto_gpu_rank0.json"), data("kineto_gpu_rank1.json")});
  std::map<std::pair<int32_t, int32_t>, std::string> names;
  for (const auto& s : t.streams) names[{s.rank, s.stream}] = s.name;
  // Device streams first, by stream number, then the host thread.
  EXPECT_EQ(names[std::make_pair(0, 0)], "stream 7");
  EXPECT_EQ(names[std::make_pair(0, 1)], "stream 20");
  EXPECT_EQ(names[std::make_pair(0, 2)], "thread 1234 (python)");
  EXPECT_EQ(names[std::make_pair(1, 2)], "thread 1235 (python)");

  // Rebased to the earliest event of both files: rank 0's step 2 at 100 us after the base.
  EXPECT_EQ(t.meta.start_time_unix_ns, 1700000000000000000 + 100'000);
  const auto steps = spans_named(t, "step", 0);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0]->kind, SpanKind::Phase);
  EXPECT_EQ(steps[0]->step, 2);
  EXPECT_EQ(steps[0]->start_ns, 0);
  EXPECT_EQ(steps[0]->end_ns, 1'000'000);
  EXPECT_EQ(steps[1]->step, 3);
  EXPECT_EQ(spans_named(t, "step", 1)[0]->start_ns, 5'000);  // rank 1 is 5 us later

  // The kernel of step 2, and its step from its launch (correlation 1001 at 120 us).
  const auto sgemm = spans_named(t, "ampere_sgemm_128x64_nn", 0);
  ASSERT_EQ(sgemm.size(), 2u);
  EXPECT_EQ(sgemm[0]->start_ns, 30'000);
  EXPECT_EQ(sgemm[0]->end_ns, 430'000);
  EXPECT_EQ(sgemm[0]->step, 2);
  EXPECT_EQ(sgemm[1]->step, 3);
  // 10.0015 us = 10001.5 ns: rounded half away from zero.
  const auto memcpy = spans_named(t, "Memcpy HtoD (Pageable -> Device)", 0);
  ASSERT_EQ(memcpy.size(), 1u);
  EXPECT_EQ(memcpy[0]->start_ns, 440'000);
  EXPECT_EQ(memcpy[0]->duration_ns(), 10'002);
  EXPECT_EQ(memcpy[0]->bytes, 4096);
  // The memset has no launch record: its own start (1700 us) puts it in step 3.
  EXPECT_EQ(spans_named(t, "Memset (Device)", 0)[0]->step, 3);
  // The host op with fractional times: 110.5 us for 20.25 us.
  const auto mm = spans_named(t, "aten::mm", 0);
  EXPECT_EQ(mm[0]->start_ns, 10'500);
  EXPECT_EQ(mm[0]->duration_ns(), 20'250);
  EXPECT_EQ(mm[0]->kind, SpanKind::Other);  // a GPU rank's host work is not compute
}

TEST(ImportKineto, GpuFixtureCollectives) {
  const Trace t = import_kineto({data("kineto_gpu_rank0.json"), data("kineto_gpu_rank1.json")});
  ASSERT_EQ(t.comms.size(), 1u);
  EXPECT_EQ(t.comms[0].name, "default_pg (pg 0)");
  EXPECT_EQ(t.comms[0].ranks, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(t.comms[0].kind, CommKind::World);
  for (int32_t r = 0; r < 2; ++r) {
    std::vector<const Span*> coll;
    for (const auto& s : t.spans) {
      if (s.rank == r && s.kind == SpanKind::Collective) coll.push_back(&s);
    }
    ASSERT_EQ(coll.size(), 2u);
    // The all-reduce kernel has no arguments of its own: they come from the record_param_comms
    // with its External id (1 Mi floats).
    EXPECT_EQ(coll[0]->op, CollOp::AllReduce);
    EXPECT_EQ(coll[0]->bytes, 4 * 1048576);
    EXPECT_EQ(coll[0]->seq, 0);
    EXPECT_EQ(coll[0]->step, 2);
    EXPECT_EQ(coll[0]->comm, 0);
    // The all-gather kernel's own arguments: max(in 1000, out 2000) bf16 elements.
    EXPECT_EQ(coll[1]->op, CollOp::AllGather);
    EXPECT_EQ(coll[1]->bytes, 4000);
    EXPECT_EQ(coll[1]->seq, 1);
    EXPECT_EQ(coll[1]->step, 3);
  }
}

// compute [130, 530) + [1130, 1430) us, communication [230, 430) + [1400, 1600) us per rank: the
// metrics must find overlap 200 + 30 us of 400 us, exposed 170 us.
TEST(ImportKineto, MetricsOfTheGpuFixture) {
  const Trace t = import_kineto({data("kineto_gpu_rank0.json"), data("kineto_gpu_rank1.json")});
  const profiler::Metrics m = profiler::compute_metrics(t);
  ASSERT_EQ(m.ranks.size(), 2u);
  for (const auto& r : m.ranks) {
    EXPECT_EQ(r.total.compute_ns, 700'000) << r.rank;
    EXPECT_EQ(r.total.comm_ns, 400'000) << r.rank;
    EXPECT_EQ(r.total.overlap_ns, 230'000) << r.rank;
    EXPECT_EQ(r.total.exposed_comm_ns, 170'000) << r.rank;
    EXPECT_DOUBLE_EQ(r.total.overlap_pct(), 57.5);
    EXPECT_EQ(r.total.memcpy_ns, 10'002 + 5'000);
  }
  ASSERT_EQ(m.steps.size(), 2u);
  EXPECT_EQ(m.steps[0].step, 2);
  EXPECT_EQ(m.steps[0].duration_ns(), 1'005'000);  // rank 0's start to rank 1's end
}

TEST(ImportKineto, RankComesFromDistributedInfoNotFileOrder) {
  const Trace t = import_kineto({data("kineto_gpu_rank1.json"), data("kineto_gpu_rank0.json")});
  const auto steps1 = spans_named(t, "step", 1);
  ASSERT_EQ(steps1.size(), 2u);
  EXPECT_EQ(steps1[0]->start_ns, 5'000);
  expect_input_error(
      [&] {
        import_kineto({data("kineto_gpu_rank0.json"), data("kineto_gpu_rank0.json")});
      },
      {"kineto_gpu_rank0.json", "rank 0 again"});
}

TEST(ImportKineto, ExactNanosecondsFromDecimalMicroseconds) {
  // A double holds 1700000000123456.789 only to 0.25 us; the importer reads the decimal text.
  const std::string text = R"({"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1700000000123456.789, "dur": 0.0005},
    {"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 1700000000123456.7894, "dur": 1e-3},
    {"ph": "X", "cat": "kernel", "name": "k3", "pid": 0, "tid": 7, "ts": 1700000000123457, "dur": 2.5E+1}]})";
  const Trace t = import_kineto_texts({text}, {"inline.json"});
  EXPECT_EQ(t.meta.start_time_unix_ns, 1700000000123456789);
  const auto k = spans_named(t, "k", 0), k2 = spans_named(t, "k2", 0), k3 = spans_named(t, "k3", 0);
  ASSERT_EQ(k.size(), 1u);
  EXPECT_EQ(k[0]->start_ns, 0);
  EXPECT_EQ(k[0]->end_ns, 1);     // 0.5 ns rounds away from zero
  EXPECT_EQ(k2[0]->start_ns, 0);  // .7894 us = 789.4 ns -> 789
  EXPECT_EQ(k2[0]->duration_ns(), 1);
  EXPECT_EQ(k3[0]->start_ns, 211);
  EXPECT_EQ(k3[0]->duration_ns(), 25'000);
  EXPECT_EQ(t.ranks[0].rank, 0);  // no distributedInfo: the file's position
}

// Kineto before PyTorch 1.13 (e.g. HolisticTraceAnalysis' A100 test traces of 2022): launches
// and kernels carry their correlation id as "External id", and only time links a launch to its
// operator. Thread 100: aten::linear [1000, 2000) encloses aten::t [1010, 1020) and aten::addmm
// [1100, 1900), whose launch at 1200 starts the kernel at 3000; aten::mm [5000, 5500) launches at
// 5100 the kernel at 6000. The launch at 7000 is in no op (no work); on thread 200, aten::mm
// [7900, 8100) launches at 8000 the kernel at 9000, while thread 100's aten::add [7950, 8050) is
// open at the same time on another thread.
TEST(ImportKineto, OlderSchemaLinksLaunchesToTheirOperatorByTime) {
  const std::string text = R"({"traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 100, "ts": 1000, "dur": 1000,
     "args": {"External id": 5, "Input Dims": [[64, 128], [32, 128], [32]], "Input type": ["float", "float", "float"]}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::t", "pid": 1, "tid": 100, "ts": 1010, "dur": 10,
     "args": {"External id": 6, "Input Dims": [[32, 128]], "Input type": ["float"]}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 100, "ts": 1100, "dur": 800,
     "args": {"External id": 7, "Input Dims": [[32], [64, 128], [128, 32], [], []], "Input type": ["float", "float", "float", "Scalar", "Scalar"]}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 100, "ts": 1200, "dur": 5,
     "args": {"External id": 900, "correlation": 900}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 100, "ts": 5000, "dur": 500,
     "args": {"External id": 8, "Input Dims": [[16, 256], [256, 8]], "Input type": ["float", "float"]}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 100, "ts": 5100, "dur": 5,
     "args": {"External id": 901, "correlation": 901}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 100, "ts": 7000, "dur": 5,
     "args": {"External id": 902, "correlation": 902}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 100, "ts": 7950, "dur": 100,
     "args": {"External id": 9, "Input Dims": [[4], [4], []], "Input type": ["float", "float", "Scalar"]}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 200, "ts": 7900, "dur": 200,
     "args": {"External id": 10, "Input Dims": [[8, 8], [8, 4]], "Input type": ["float", "float"]}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 200, "ts": 8000, "dur": 5,
     "args": {"External id": 903, "correlation": 903}},
    {"ph": "X", "cat": "kernel", "name": "gemm_a", "pid": 0, "tid": 7, "ts": 3000, "dur": 1000,
     "args": {"External id": 900, "correlation": 900, "device": 0, "stream": 7}},
    {"ph": "X", "cat": "kernel", "name": "gemm_b", "pid": 0, "tid": 7, "ts": 6000, "dur": 500,
     "args": {"External id": 901, "correlation": 901, "device": 0, "stream": 7}},
    {"ph": "X", "cat": "kernel", "name": "orphan", "pid": 0, "tid": 7, "ts": 7100, "dur": 100,
     "args": {"External id": 902, "correlation": 902, "device": 0, "stream": 7}},
    {"ph": "X", "cat": "kernel", "name": "gemm_c", "pid": 0, "tid": 7, "ts": 9000, "dur": 100,
     "args": {"External id": 903, "correlation": 903, "device": 0, "stream": 7}}]})";
  const Trace t = import_kineto_texts({text}, {"old_schema.json"});
  const auto rows = read_kernel_work(t);
  ASSERT_EQ(rows.size(), 3u);
  std::map<std::string, double> flops;
  for (const auto& k : rows) {
    EXPECT_EQ(k.work.cls, "gemm");
    flops[k.op] += k.work.flops;
  }
  EXPECT_DOUBLE_EQ(flops["aten::addmm"], 2.0 * 64 * 32 * 128);
  EXPECT_DOUBLE_EQ(flops["aten::mm"], 2.0 * 16 * 8 * 256 + 2.0 * 8 * 4 * 8);
  EXPECT_DOUBLE_EQ(spans_named(t, "gemm_a", 0).front()->flops, 2.0 * 64 * 32 * 128);
  EXPECT_DOUBLE_EQ(spans_named(t, "gemm_b", 0).front()->flops, 2.0 * 16 * 8 * 256);
  EXPECT_DOUBLE_EQ(spans_named(t, "gemm_c", 0).front()->flops, 2.0 * 8 * 4 * 8);
  EXPECT_DOUBLE_EQ(spans_named(t, "orphan", 0).front()->flops, 0);
}

TEST(ImportKineto, CpuOnlyRankLeavesAreComputeAndRecordParamCommsIsCollective) {
  // A CPU-only rank: aten::linear [0, 100) encloses aten::addmm [10, 90) which encloses
  // aten::copy_ [20, 30); a sibling aten::relu [100, 120); record_param_comms [120, 150).
  const std::string text = R"({"distributedInfo": {"rank": 1, "world_size": 4}, "traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1, "ts": 0, "dur": 200},
    {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
    {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 10, "dur": 80},
    {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": 1, "tid": 1, "ts": 20, "dur": 10},
    {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": 100, "dur": 20},
    {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 120, "dur": 30,
     "args": {"Collective name": "send", "In msg nelems": 10, "Out msg nelems": 0, "dtype": "Double",
              "Process Group Name": "3", "Group size": 2, "Process Group Ranks": "[1, 3]"}}]})";
  const Trace t = import_kineto_texts({text}, {"cpu.json"});
  EXPECT_EQ(t.meta.world_size, 4);
  ASSERT_EQ(t.ranks.size(), 1u);
  EXPECT_EQ(t.ranks[0].rank, 1);
  EXPECT_EQ(t.ranks[0].device, "cpu");
  std::map<std::string, SpanKind> kinds;
  for (const auto& s : t.spans) kinds[t.name_of(s)] = s.kind;
  EXPECT_EQ(kinds["aten::linear"], SpanKind::Other);
  EXPECT_EQ(kinds["aten::addmm"], SpanKind::Other);
  EXPECT_EQ(kinds["aten::copy_"], SpanKind::Compute);
  EXPECT_EQ(kinds["aten::relu"], SpanKind::Compute);
  EXPECT_EQ(kinds["record_param_comms"], SpanKind::P2P);
  const auto p2p = spans_named(t, "record_param_comms", 1);
  EXPECT_EQ(p2p[0]->op, CollOp::Send);
  EXPECT_EQ(p2p[0]->bytes, 80);
  EXPECT_EQ(p2p[0]->step, 7);
  ASSERT_EQ(t.comms.size(), 1u);
  EXPECT_EQ(t.comms[0].ranks, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(t.comms[0].kind, CommKind::Other);
  const profiler::Metrics m = profiler::compute_metrics(t);
  EXPECT_EQ(m.ranks[0].total.compute_ns, 30'000);  // copy_ 10 us + relu 20 us
  EXPECT_EQ(m.ranks[0].total.comm_ns, 30'000);
}

TEST(ImportKineto, RecordedLegacyCpuDdpTrace) {
  const Trace t = import_kineto(
      {data("torch113_legacy_ddp_cpu_rank0.json"), data("torch113_legacy_ddp_cpu_rank1.json")});
  ASSERT_EQ(t.ranks.size(), 2u);
  const ImportSummary s = summarize_import(t, ImportFormat::Kineto, {});
  EXPECT_EQ(s.steps, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(s.spans, 1249 + 1250);  // every event of the files is a span
  EXPECT_EQ(s.skipped_events, 0);
  // gloo's own ops (on gloo's threads) are the collectives: 2 broadcasts and 3 all-reduces each.
  for (int32_t r = 0; r < 2; ++r) {
    std::map<CollOp, int> ops;
    for (const auto& sp : t.spans) {
      if (sp.rank == r && sp.kind == SpanKind::Collective) ops[sp.op] += 1;
    }
    EXPECT_EQ(ops[CollOp::Broadcast], 2);
    EXPECT_EQ(ops[CollOp::AllReduce], 3);
    EXPECT_EQ(ops.size(), 2u);
    EXPECT_EQ(spans_named(t, "step", r).size(), 3u);
  }
  EXPECT_EQ(t.streams.size(), 6u);  // threads 1, 2, 3 per rank
  // Leaves never nest: on each stream, no Compute span lies inside another.
  for (size_t i = 1; i < t.spans.size(); ++i) {
    const Span& a = t.spans[i - 1];
    const Span& b = t.spans[i];
    if (a.rank == b.rank && a.stream == b.stream && a.kind == SpanKind::Compute &&
        b.kind == SpanKind::Compute && a.duration_ns() > 0 && b.duration_ns() > 0) {
      EXPECT_LE(a.end_ns, b.start_ns) << t.name_of(a) << " / " << t.name_of(b);
    }
  }
  const profiler::Metrics m = profiler::compute_metrics(t);
  for (const auto& r : m.ranks) {
    EXPECT_GT(r.total.compute_ns, 0);
    EXPECT_GT(r.total.comm_ns, 0);
  }
}

TEST(ImportKineto, MalformedInputsAreInputErrorsNamingTheFile) {
  testing::TempDir dir;
  const auto p = dir.path("bad.json");
  write_file(p, "{\"traceEvents\": [");
  expect_input_error([&] { import_kineto({p}); }, {"bad.json", "not valid JSON"});
  write_file(p, "");
  expect_input_error([&] { import_kineto({p}); }, {"bad.json", "not valid JSON"});
  write_file(p, "{\"events\": []}");
  expect_input_error([&] { import_kineto({p}); }, {"bad.json", "traceEvents"});
  write_file(p, "{\"traceEvents\": {}}");
  expect_input_error([&] { import_kineto({p}); }, {"bad.json", "not an array"});
  write_file(p, "42");
  expect_input_error([&] { import_kineto({p}); }, {"bad.json", "traceEvents"});
  write_file(
      p, R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 1}]})");
  expect_input_error([&] { import_kineto({p}); }, {"bad.json", "traceEvents[0]", "\"ts\""});
  write_file(p, R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1}]})");
  expect_input_error([&] { import_kineto({p}); }, {"bad.json", "\"dur\""});
  write_file(
      p, R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1e300, "dur": 1}]})");
  expect_input_error([&] { import_kineto({p}); }, {"bad.json", "\"ts\""});
  write_file(p, R"({"distributedInfo": {"rank": "first"}, "traceEvents": []})");
  expect_input_error([&] { import_kineto({p}); }, {"bad.json", "distributedInfo.rank"});
  expect_input_error([&] { import_kineto({dir.path("missing.json")}); },
                     {"missing.json", "cannot open"});
}

TEST(ImportKineto, OddButValidJsonDoesNotCrash) {
  // Deep nesting, events of every type, wrong types where nothing is required.
  std::string deep = "{\"traceEvents\": [";
  for (int i = 0; i < 100000; ++i) deep += "[";
  for (int i = 0; i < 100000; ++i) deep += "]";
  deep +=
      ", 1, \"x\", null, {\"ph\": 3}, {\"ph\": \"X\", \"cat\": 7}, {\"ph\": \"i\", \"name\": "
      "\"[memory]\", \"ts\": 1}]}";
  const Trace t = import_kineto_texts({deep}, {"deep.json"});
  EXPECT_TRUE(t.spans.empty());
  EXPECT_EQ(t.ranks.size(), 1u);
}

// ---------------------------------------------------------------------------------------------
// Nsight Systems: files in the documented export schema, built here.

class NsysFile {
 public:
  explicit NsysFile(const std::string& path) : path_(path) {
    std::filesystem::remove(path);
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) throw std::runtime_error("open");
    exec("PRAGMA journal_mode=MEMORY; PRAGMA synchronous=OFF");  // test files: no fsync
  }
  ~NsysFile() { sqlite3_close(db_); }
  void exec(const std::string& sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      const std::string msg = err ? err : "?";
      sqlite3_free(err);
      throw std::runtime_error(msg + " in " + sql);
    }
  }

 private:
  std::string path_;
  sqlite3* db_ = nullptr;
};

constexpr int64_t kHw = int64_t{1} << 56;  // the hardware-id bits above the pid in global ids
int64_t gpid(int64_t pid) { return kHw | (pid << 24); }
int64_t gtid(int64_t pid, int64_t tid) { return gpid(pid) | tid; }

constexpr const char* kNsysSchema = R"sql(
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
CREATE TABLE TARGET_INFO_GPU (id INTEGER NOT NULL, name TEXT, busLocation TEXT);
CREATE TABLE ThreadNames (nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
  shortName INTEGER NOT NULL, mangledName INTEGER, gridX INTEGER, gridY INTEGER, gridZ INTEGER,
  blockX INTEGER, blockY INTEGER, blockZ INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL,
  srcKind INTEGER, dstKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
  eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,
  returnValue INTEGER NOT NULL, callchainId INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
  rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
  endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER,
  doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, floatValue REAL, jsonTextId INTEGER,
  jsonText TEXT);
)sql";

// Two processes: pid 7000 on device 0 (rank 0) and pid 5000 on device 1 (rank 1).
// pid 7000: stream 7 sgemm [1000, 5000) and elementwise [5000, 6000) launched in step 0,
//   sgemm [11000, 14000) launched at 10500 (step 1); stream 13 NCCL all-reduce [4000, 8000);
//   a memcpy HtoD [500, 900) of 4096 B; NVTX "step 0" [0, 10000), "step 1" [10000, 20000) and
//   "forward" [100, 3000) (by textId); a mark and a domain creation (not ranges).
// pid 5000: sgemm [1000, 5000) on stream 7, NCCL all-reduce [4500, 8000) on stream 13.
// `extra_sql` runs last, with @A standing for pid 7000's thread's globalTid.
void make_nsys(const std::string& path, bool with_session_start = true,
               std::string extra_sql = "") {
  NsysFile f(path);
  f.exec(kNsysSchema);
  f.exec(R"(INSERT INTO StringIds VALUES (1, 'sgemm_kernel'),
    (2, 'ncclDevKernel_AllReduce_Sum_f32_RING_LL'), (3, 'elementwise_kernel'), (4, 'forward'),
    (5, 'cudaLaunchKernel_v7000'), (6, 'python3'), (7, 'void sgemm_kernel<float>(float*)'),
    (8, 'ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm *, unsigned long, ncclWork *)'),
    (9, 'void elementwise_kernel<128>()'))");
  if (with_session_start) {
    f.exec("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000, '', '')");
  }
  f.exec(
      "INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H100', '0000:01:00.0'), (1, 'NVIDIA H100', "
      "'0000:02:00.0')");
  const auto a = std::to_string(gpid(7000)), b = std::to_string(gpid(5000));
  const auto at = std::to_string(gtid(7000, 7001)), bt = std::to_string(gtid(5000, 5001));
  f.exec("INSERT INTO ThreadNames VALUES (6, 0, " + at + ")");
  f.exec(
      "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, "
      "correlationId, globalPid, demangledName, shortName) VALUES "
      "(1000, 5000, 0, 1, 7, 1, " +
      a + ", 7, 1), (5000, 6000, 0, 1, 7, 2, " + a +
      ", 9, 3), "
      "(11000, 14000, 0, 1, 7, 4, " +
      a + ", 7, 1), (4000, 8000, 0, 1, 13, 3, " + a +
      ", 8, 2), "
      "(1000, 5000, 1, 1, 7, 1, " +
      b + ", 7, 1), (4500, 8000, 1, 1, 13, 2, " + b + ", 8, 2)");
  f.exec(
      "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, streamId, "
      "correlationId, globalPid, bytes, copyKind) VALUES (500, 900, 0, 1, 7, 9, " +
      a + ", 4096, 1)");
  f.exec(
      "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, "
      "nameId, returnValue) VALUES (800, 810, 0, " +
      at + ", 1, 5, 0), (850, 860, 0, " + at + ", 2, 5, 0), (900, 910, 0, " + at +
      ", 3, 5, 0), (10500, 10510, 0, " + at +
      ", 4, 5, 0), "
      "(800, 810, 0, " +
      bt + ", 1, 5, 0), (900, 910, 0, " + bt + ", 2, 5, 0)");
  f.exec(
      "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId) VALUES "
      "(0, 10000, 59, 'step 0', " +
      at + ", NULL), (10000, 20000, 59, 'step 1', " + at +
      ", NULL), "
      "(100, 3000, 59, NULL, " +
      at + ", 4), (50, NULL, 34, 'a mark', " + at +
      ", NULL), "
      "(0, NULL, 75, 'NCCL', " +
      at + ", NULL)");
  for (size_t p = extra_sql.find("@A"); p != std::string::npos; p = extra_sql.find("@A"))
    extra_sql.replace(p, 2, at);
  if (!extra_sql.empty()) f.exec(extra_sql);
}

TEST(ImportNsys, CountsRanksStreamsAndSteps) {
  testing::TempDir dir;
  const auto path = dir.path("job.sqlite");
  make_nsys(path);
  const Trace t = import_nsys({path});
  ASSERT_EQ(t.ranks.size(), 2u);
  EXPECT_EQ(t.ranks[0].device, "cuda:0");  // pid 7000: the lower device is rank 0
  EXPECT_EQ(t.ranks[1].device, "cuda:1");
  auto k0 = kind_counts(t, 0), k1 = kind_counts(t, 1);
  EXPECT_EQ(k0[SpanKind::Compute], 3);
  EXPECT_EQ(k0[SpanKind::Collective], 1);
  EXPECT_EQ(k0[SpanKind::Memcpy], 1);
  EXPECT_EQ(k0[SpanKind::Phase], 3);
  EXPECT_EQ(k1[SpanKind::Compute], 1);
  EXPECT_EQ(k1[SpanKind::Collective], 1);
  EXPECT_EQ(k1[SpanKind::Phase], 0);
  EXPECT_EQ(t.spans.size(), 10u);

  std::map<std::pair<int32_t, int32_t>, std::string> names;
  for (const auto& s : t.streams) names[{s.rank, s.stream}] = s.name;
  EXPECT_EQ(names[std::make_pair(0, 0)], "stream 7");
  EXPECT_EQ(names[std::make_pair(0, 1)], "stream 13");
  EXPECT_EQ(names[std::make_pair(0, 2)], "python3");  // ThreadNames
  EXPECT_EQ(names.size(), 5u);

  // Rebased to the earliest event (the first NVTX step at 0), Unix time from the session start.
  EXPECT_EQ(t.meta.start_time_unix_ns, 1700000000000000000);
  const auto steps = spans_named(t, "step", 0);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0]->step, 0);
  EXPECT_EQ(steps[1]->step, 1);
  EXPECT_EQ(steps[1]->start_ns, 10000);
  EXPECT_EQ(spans_named(t, "forward", 0).size(), 1u);
  const auto sgemm = spans_named(t, "sgemm_kernel", 0);
  ASSERT_EQ(sgemm.size(), 2u);
  EXPECT_EQ(sgemm[0]->step, 0);
  EXPECT_EQ(sgemm[1]->step, 1);  // runs at 11000, launched at 10500
  const auto copy = spans_named(t, "Memcpy HtoD", 0);
  ASSERT_EQ(copy.size(), 1u);
  EXPECT_EQ(copy[0]->bytes, 4096);
  EXPECT_EQ(copy[0]->start_ns, 500);

  const auto coll = spans_named(t, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1);
  ASSERT_EQ(coll.size(), 1u);
  EXPECT_EQ(coll[0]->op, CollOp::AllReduce);
  EXPECT_EQ(coll[0]->seq, 0);
  ASSERT_EQ(t.comms.size(), 1u);
  EXPECT_EQ(t.comms[0].name, "world");
  EXPECT_EQ(t.comms[0].ranks, (std::vector<int32_t>{0, 1}));

  const ImportSummary s = summarize_import(t, ImportFormat::Nsys, {path});
  EXPECT_EQ(s.steps, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(s.collectives, 2);
}

// PyTorch's NVTX ranges with shapes (emit_nvtx(record_shapes=True)): pid 7000's launches at 800
// (the sgemm) and 850 (the elementwise kernel) are inside "aten::mm ... sizes = [[64, 128],
// [128, 32]]" [700, 950), itself inside an aten::linear range: the innermost range is the op, its
// two kernels share its work. The launch at 900 (an NCCL kernel) is no compute; the one at 10500 is
// inside an aten::add range, a memory-bound op, which NVTX (no dtypes) does not attribute.
TEST(ImportNsys, KernelWorkFromNvtxShapes) {
  testing::TempDir dir;
  const auto path = dir.path("shapes.sqlite");
  make_nsys(path, true,
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES "
            "(600, 1000, 59, 'aten::linear, seq = 2, op_id = 8, sizes = [[4, 16, 128], [32, 128], "
            "[32]]', @A), (700, 950, 59, 'aten::mm, seq = 3, op_id = 9, sizes = [[64, 128], [128, "
            "32]], input_op_ids = [(8, 0)]', @A), (10400, 10600, 59, 'aten::add, seq = 4, sizes = "
            "[[64, 32], [64, 32], []]', @A)");
  const Trace t = import_nsys({path});
  const auto rows = read_kernel_work(t);
  ASSERT_EQ(rows.size(), 2u);
  const double flops = 2.0 * 64 * 32 * 128;
  for (const auto& k : rows) {
    EXPECT_EQ(k.rank, 0);
    EXPECT_EQ(k.op, "aten::mm");
    EXPECT_EQ(k.work.cls, "gemm");
    EXPECT_DOUBLE_EQ(k.work.flops, flops);
  }
  EXPECT_EQ(rows[0].group, rows[1].group);
  EXPECT_EQ(recorded_gpu_names(t).front(), "NVIDIA H100");  // TARGET_INFO_GPU
  const auto sgemm = spans_named(t, "sgemm_kernel", 0);
  ASSERT_EQ(sgemm.size(), 2u);
  EXPECT_DOUBLE_EQ(sgemm[0]->flops, flops / 2);  // launched at 800
  EXPECT_DOUBLE_EQ(sgemm[1]->flops, 0);          // launched at 10500, inside aten::add
  EXPECT_DOUBLE_EQ(spans_named(t, "elementwise_kernel", 0).front()->flops, flops / 2);
  // The parser: name and dims; a range without sizes is no op.
  const auto mm = parse_nvtx_op("aten::bmm, seq = 1, sizes = [[2, 3, 4], [2, 4, 5]]");
  ASSERT_TRUE(mm);
  EXPECT_EQ(mm->first, "aten::bmm");
  ASSERT_EQ(mm->second.size(), 2u);
  EXPECT_EQ(mm->second[1].dims, (std::vector<int64_t>{2, 4, 5}));
  EXPECT_FALSE(parse_nvtx_op("forward"));
  EXPECT_FALSE(parse_nvtx_op("aten::mm, seq = 1, sizes = [[1, x]]"));
}

// A device name that is not UTF-8 (a fuzz finding: the JSON of the trace's extra metadata threw
// out of the importer and ended the process) is imported with each bad byte replaced by U+FFFD;
// an operator name of the kernel work rows likewise.
TEST(ImportNsys, NamesThatAreNotUtf8AreReplacedNotFatal) {
  testing::TempDir dir;
  const auto path = dir.path("bytes.sqlite");
  make_nsys(path, true);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "UPDATE TARGET_INFO_GPU SET name = CAST(X'4E5649444941FE' AS TEXT)",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  const Trace t = import_nsys({path});
  EXPECT_NO_THROW((void)nlohmann::json::parse(t.meta.extra_json));
  ASSERT_FALSE(recorded_gpu_names(t).empty());
  EXPECT_EQ(recorded_gpu_names(t).front(), "NVIDIA\xEF\xBF\xBD");
  // An operator name (from NVTX ranges) the same way into the kernel work rows.
  Trace w;
  KernelWork k;
  k.op = "aten::\xFFmm";
  k.work.cls = "gemm";
  write_kernel_work(w, {k});
  const auto rows = read_kernel_work(w);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].op, "aten::\xEF\xBF\xBDmm");
}

// Rank 0: compute [1000, 6000) + [11000, 14000) = 8000 ns, communication [4000, 8000) = 4000 ns,
// overlap [4000, 6000) = 2000 ns (50 %).
TEST(ImportNsys, MetricsOfTheImport) {
  testing::TempDir dir;
  const auto path = dir.path("job.sqlite");
  make_nsys(path);
  const profiler::Metrics m = profiler::compute_metrics(import_nsys({path}));
  ASSERT_EQ(m.ranks.size(), 2u);
  EXPECT_EQ(m.ranks[0].total.compute_ns, 8000);
  EXPECT_EQ(m.ranks[0].total.comm_ns, 4000);
  EXPECT_EQ(m.ranks[0].total.overlap_ns, 2000);
  EXPECT_DOUBLE_EQ(m.ranks[0].total.overlap_pct(), 50.0);
  EXPECT_EQ(m.ranks[1].total.overlap_ns, 500);  // [4500, 5000)
}

TEST(ImportNsys, SeveralFilesAreSeveralRanks) {
  testing::TempDir dir;
  make_nsys(dir.path("a.sqlite"));
  make_nsys(dir.path("b.sqlite"));
  const Trace t = import_nsys({dir.path("a.sqlite"), dir.path("b.sqlite")});
  EXPECT_EQ(t.ranks.size(), 4u);
  EXPECT_EQ(t.meta.world_size, 4);
  EXPECT_EQ(t.spans.size(), 20u);
  EXPECT_EQ(t.comms[0].ranks.size(), 4u);
}

TEST(ImportNsys, OptionalTablesMayBeMissing) {
  testing::TempDir dir;
  const auto path = dir.path("min.sqlite");
  {
    NsysFile f(path);
    f.exec("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)");
    f.exec(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, "
        "streamId INTEGER, globalPid INTEGER, demangledName INTEGER)");
    f.exec("INSERT INTO StringIds VALUES (1, 'k')");
    f.exec("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (10, 20, 0, 7, " +
           std::to_string(gpid(1)) + ", 1), (30, 25, 0, 7, " + std::to_string(gpid(1)) +
           ", 1)");  // the second ends early
  }
  const Trace t = import_nsys({path});
  ASSERT_EQ(t.spans.size(), 1u);
  EXPECT_EQ(t.name_of(t.spans[0]), "k");
  EXPECT_EQ(t.spans[0].start_ns, 0);
  EXPECT_EQ(t.meta.start_time_unix_ns, 0);  // no session start time
  EXPECT_EQ(summarize_import(t, ImportFormat::Nsys, {}).skipped_events, 1);
}

TEST(ImportNsys, MalformedInputsNameTheFileAndTheTable) {
  testing::TempDir dir;
  const auto path = dir.path("bad.sqlite");
  {
    NsysFile f(path);
    f.exec("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)");
  }
  expect_input_error([&] { import_nsys({path}); }, {"bad.sqlite", "CUPTI_ACTIVITY_KIND_KERNEL"});
  {
    NsysFile f(path);
    f.exec("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)");
    f.exec(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, "
        "streamId INTEGER, globalPid INTEGER)");
  }
  expect_input_error([&] { import_nsys({path}); },
                     {"bad.sqlite", "CUPTI_ACTIVITY_KIND_KERNEL", "shortName or demangledName"});
  {
    NsysFile f(path);
    f.exec(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, streamId INTEGER, "
        "globalPid INTEGER, shortName INTEGER)");
  }
  expect_input_error([&] { import_nsys({path}); }, {"bad.sqlite", "no column deviceId"});
  write_file(path, "not a database at all, just text that is long enough");
  expect_input_error([&] { import_nsys({path}); }, {"bad.sqlite", "not an SQLite file"});
  expect_input_error([&] { import_nsys({dir.path("none.sqlite")}); },
                     {"none.sqlite", "cannot open"});
}

// ---------------------------------------------------------------------------------------------
// Writing: import_to_file and the command.

TEST(ImportToFile, WritesACompleteTraceAndNothingOnError) {
  testing::TempDir dir;
  const auto out = dir.path("out.db");
  const ImportSummary s = import_to_file(
      ImportFormat::Kineto, {data("kineto_gpu_rank0.json"), data("kineto_gpu_rank1.json")}, out);
  EXPECT_EQ(s.spans, 36);
  TraceReader r(out);
  EXPECT_TRUE(r.complete());
  EXPECT_EQ(r.meta().source, TraceSource::Import);
  EXPECT_EQ(r.span_count(), 36);
  const auto agg = r.step_aggregates();
  EXPECT_EQ(agg.size(), 4u);  // 2 ranks x steps 2, 3
  const Trace back = r.load_all();
  EXPECT_EQ(back.comms.size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));

  const auto bad = dir.path("bad.json");
  write_file(bad, "[");
  const auto out2 = dir.path("out2.db");
  EXPECT_THROW(import_to_file(ImportFormat::Kineto, {bad}, out2), InputError);
  EXPECT_FALSE(std::filesystem::exists(out2));
  EXPECT_FALSE(std::filesystem::exists(out2 + ".partial"));
  EXPECT_THROW(import_format_from_string("perfetto"), InputError);
}

#ifdef ORRERY_BIN
struct CliResult {
  int rc = -1;
  std::string out;
};

CliResult run_orrery(const std::string& args) {
  CliResult r;
  FILE* p = popen((std::string(ORRERY_BIN) + " " + args + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(ImportCli, KinetoJsonSummary) {
  testing::TempDir dir;
  const auto out = dir.path("t.db");
  const CliResult r = run_orrery("import kineto " + data("kineto_gpu_rank0.json") + " " +
                                 data("kineto_gpu_rank1.json") + " --out " + out + " --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ranks"], 2);
  EXPECT_EQ(j["spans"], 36);
  EXPECT_EQ(j["spans_by_kind"]["compute"], 4);
  EXPECT_EQ(j["spans_by_kind"]["collective"], 4);
  EXPECT_EQ(j["steps"], nlohmann::json::array({2, 3}));
  const CliResult text =
      run_orrery("import kineto " + data("kineto_gpu_rank0.json") + " --out " + out);
  EXPECT_EQ(text.rc, 0) << text.out;
  EXPECT_NE(text.out.find("steps: 2 (2..3)"), std::string::npos) << text.out;
}

TEST(ImportCli, MalformedInputExitsTwoNamingTheFile) {
  testing::TempDir dir;
  const auto bad = dir.path("broken.json");
  write_file(bad, "{\"traceEvents\": 5}");
  const CliResult r = run_orrery("import kineto " + bad + " --out " + dir.path("t.db"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("broken.json"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir.path("t.db")));
  const CliResult n = run_orrery("import nsys " + bad + " --out " + dir.path("t.db"));
  EXPECT_EQ(n.rc, 2) << n.out;
  EXPECT_NE(n.out.find("not an SQLite file"), std::string::npos) << n.out;
  const CliResult f = run_orrery("import chrome " + bad + " --out " + dir.path("t.db"));
  EXPECT_EQ(f.rc, 2) << f.out;
}
#endif

}  // namespace
}  // namespace orrery::traces
