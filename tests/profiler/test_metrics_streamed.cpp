// compute_metrics_streamed (the streaming `orrery report`) against compute_metrics on the loaded
// trace: every field of Metrics equal, on synthetic DDP and pipeline traces, with windows and
// warm-up steps, on hand-made traces (tag steps, communicator-less collectives, ranks without
// spans), and on a file whose streams arrive out of start order across blocks. The streaming
// reader's span runs are load_all()'s spans in load_all()'s order, and a damaged block is still an
// error naming the file and the block.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "builder.hpp"
#include "orrery/common/error.hpp"
#include "orrery/profiler/compression_metrics.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/synth.hpp"

namespace orrery::profiler {
namespace {

namespace fs = std::filesystem;
using traces::CollOp;
using traces::Span;
using traces::SpanKind;

std::string temp_trace(const std::string& name) {
  return (fs::temp_directory_path() /
          ("orrery_streamed_" + std::to_string(::getpid()) + "_" + name + ".db"))
      .string();
}

void remove_trace(const std::string& path) {
  fs::remove(path);
  fs::remove(path + "-wal");
  fs::remove(path + "-shm");
}

void expect_breakdown_eq(const TimeBreakdown& a, const TimeBreakdown& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.window_ns, b.window_ns);
  EXPECT_EQ(a.compute_ns, b.compute_ns);
  EXPECT_EQ(a.comm_ns, b.comm_ns);
  EXPECT_EQ(a.memcpy_ns, b.memcpy_ns);
  EXPECT_EQ(a.overlap_ns, b.overlap_ns);
  EXPECT_EQ(a.exposed_comm_ns, b.exposed_comm_ns);
  EXPECT_EQ(a.idle_ns, b.idle_ns);
}

void expect_rank_eq(const RankMetrics& a, const RankMetrics& b) {
  SCOPED_TRACE("rank " + std::to_string(a.rank));
  EXPECT_EQ(a.rank, b.rank);
  expect_breakdown_eq(a.total, b.total, "total");
  ASSERT_EQ(a.by_step.size(), b.by_step.size());
  for (const auto& [step, tb] : a.by_step) {
    ASSERT_TRUE(b.by_step.count(step)) << "step " << step;
    expect_breakdown_eq(tb, b.by_step.at(step), "step " + std::to_string(step));
  }
  EXPECT_EQ(a.bubble_ns, b.bubble_ns);
  EXPECT_EQ(a.late_ns_mean, b.late_ns_mean);
  EXPECT_EQ(a.peak_memory_bytes, b.peak_memory_bytes);
  EXPECT_EQ(a.peak_memory_total_bytes, b.peak_memory_total_bytes);
  EXPECT_EQ(a.collectives_checked, b.collectives_checked);
  EXPECT_EQ(a.collectives_late, b.collectives_late);
  EXPECT_EQ(a.counted_step_ns, b.counted_step_ns);
  EXPECT_EQ(a.counted.window_ns, b.counted.window_ns);
  EXPECT_EQ(a.counted.compute_ns, b.counted.compute_ns);
  EXPECT_EQ(a.counted.exposed_tp_ns, b.counted.exposed_tp_ns);
  EXPECT_EQ(a.counted.exposed_dp_ns, b.counted.exposed_dp_ns);
  EXPECT_EQ(a.counted.p2p_ns, b.counted.p2p_ns);
  EXPECT_EQ(a.counted.rest_ns, b.counted.rest_ns);
}

// Every field, exactly (doubles with ==: the same sums in the same order).
void expect_metrics_eq(const Metrics& a, const Metrics& b) {
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (size_t i = 0; i < a.ranks.size(); ++i) expect_rank_eq(a.ranks[i], b.ranks[i]);
  expect_breakdown_eq(a.total, b.total, "total");
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].step, b.steps[i].step);
    EXPECT_EQ(a.steps[i].start_ns, b.steps[i].start_ns);
    EXPECT_EQ(a.steps[i].end_ns, b.steps[i].end_ns);
    EXPECT_EQ(a.steps[i].warmup, b.steps[i].warmup);
  }
  EXPECT_EQ(a.step_mean_ns, b.step_mean_ns);
  EXPECT_EQ(a.step_p50_ns, b.step_p50_ns);
  EXPECT_EQ(a.step_p90_ns, b.step_p90_ns);
  EXPECT_EQ(a.tokens_per_s, b.tokens_per_s);
  EXPECT_EQ(a.achieved_flops, b.achieved_flops);
  EXPECT_EQ(a.mfu, b.mfu);
  EXPECT_EQ(a.bubble_pct, b.bubble_pct);
  ASSERT_EQ(a.collectives.size(), b.collectives.size());
  for (size_t i = 0; i < a.collectives.size(); ++i) {
    const CollectiveStats &x = a.collectives[i], &y = b.collectives[i];
    SCOPED_TRACE("collective " + x.op + " on comm " + std::to_string(x.comm));
    EXPECT_EQ(x.op, y.op);
    EXPECT_EQ(x.comm, y.comm);
    EXPECT_EQ(x.comm_name, y.comm_name);
    EXPECT_EQ(x.comm_size, y.comm_size);
    EXPECT_EQ(x.count, y.count);
    EXPECT_EQ(x.bytes, y.bytes);
    EXPECT_EQ(x.time_ns, y.time_ns);
    EXPECT_EQ(x.algbw_gbps, y.algbw_gbps);
    EXPECT_EQ(x.busbw_gbps, y.busbw_gbps);
    EXPECT_EQ(x.ops, y.ops);
  }
  EXPECT_EQ(a.stragglers, b.stragglers);
  EXPECT_EQ(a.span_count, b.span_count);
  EXPECT_EQ(a.counted_steps, b.counted_steps);
  EXPECT_EQ(a.model_flops_per_s, b.model_flops_per_s);
  EXPECT_EQ(a.peak_flops_per_rank, b.peak_flops_per_rank);
  EXPECT_EQ(a.pipeline, b.pipeline);
  EXPECT_EQ(a.start_ns, b.start_ns);
  EXPECT_EQ(a.end_ns, b.end_ns);
}

Metrics streamed(const std::string& path, const MetricsOptions& opt) {
  traces::TraceReader reader(path);
  const traces::Trace header = reader.load_header();
  EXPECT_TRUE(header.spans.empty());
  return compute_metrics_streamed(reader, header, opt);
}

// The in-memory figures of the loaded file against the streamed ones, whole and in a window,
// with and without warm-up steps; returns the whole-trace metrics.
Metrics expect_same_metrics(const std::string& path) {
  const traces::Trace t = traces::load_trace(path);
  const Metrics whole = compute_metrics(t);
  {
    SCOPED_TRACE("whole trace");
    expect_metrics_eq(whole, streamed(path, {}));
  }
  MetricsOptions opt;
  opt.skip_steps = 1;
  opt.straggler_threshold_ns = 50'000;
  if (whole.end_ns > whole.start_ns) {
    opt.window_start_ns = whole.start_ns + (whole.end_ns - whole.start_ns) / 5;
    opt.window_end_ns = whole.start_ns + (whole.end_ns - whole.start_ns) * 4 / 5;
  }
  SCOPED_TRACE("window and warm-up");
  const Metrics in_memory = compute_metrics(t, opt);
  EXPECT_GT(in_memory.span_count, 0);
  expect_metrics_eq(in_memory, streamed(path, opt));
  return whole;
}

struct SynthCase {
  const char* name;
  traces::SynthOptions o;
};

std::vector<SynthCase> synth_cases() {
  std::vector<SynthCase> out;
  traces::SynthOptions o;
  out.push_back({"ddp", o});
  o.ranks = 6;
  o.steps = 7;
  o.jitter_ns = 300'000;
  o.straggler_rank = 4;
  o.straggler_delay_ns = 900'000;
  o.peak_flops_per_rank = 1e14;
  out.push_back({"jitter_straggler", o});
  traces::SynthOptions p;  // a real-run-like pipeline: 2 pipelines of 4 stages, 8 micro-batches
  p.ranks = 8;
  p.pp = 4;
  p.layers = 16;
  p.micro_batches = 8;
  p.steps = 5;
  out.push_back({"pipeline", p});
  p.ranks = 2;
  p.pp = 2;
  p.layers = 4;
  p.micro_batches = 3;
  out.push_back({"pipeline_no_dp", p});
  return out;
}

TEST(MetricsStreamed, SyntheticTracesGiveIdenticalMetrics) {
  for (const SynthCase& c : synth_cases()) {
    SCOPED_TRACE(c.name);
    const std::string path = temp_trace(c.name);
    traces::write_trace(traces::synthesize(c.o), path);
    const Metrics m = expect_same_metrics(path);
    EXPECT_FALSE(m.collectives.empty());
    EXPECT_EQ(m.pipeline, c.o.pp > 1);
    if (c.o.straggler_rank >= 0) {
      EXPECT_EQ(m.stragglers, std::vector<int32_t>{c.o.straggler_rank});
    }
    remove_trace(path);
  }
}

// Step tags without "step" phases, a communicator-less collective numbered by seq, a P2P pair, a
// memcpy, a zero-length span and a declared rank without spans.
TEST(MetricsStreamed, HandMadeTraceGivesIdenticalMetrics) {
  testing::Builder b(3);
  b.t.ranks.push_back({3, "host", "cpu", 3, 0, 0});
  for (int r = 0; r < 3; ++r) {
    for (int step = 0; step < 3; ++step) {
      const int64_t t0 = step * 10'000 + r * 300;
      b.add(r, 0, SpanKind::Compute, "fwd", t0, t0 + 4'000, step).flops = 1e6 * (r + 1);
      Span& ar = b.add(r, 1, SpanKind::Collective, "all_reduce", t0 + 3'000, t0 + 6'000, step);
      ar.op = CollOp::AllReduce;
      ar.comm = 0;
      ar.seq = step;
      ar.bytes = 1 << 20;
      Span& bare = b.add(r, 1, SpanKind::Collective, "bare", t0 + 6'500, t0 + 7'000, step);
      bare.op = CollOp::Broadcast;
      bare.seq = step;
      bare.bytes = 4096;
      b.add(r, 2, SpanKind::Memcpy, "h2d", t0 + 7'000, t0 + 7'500, step);
      b.add(r, 2, SpanKind::Data, "marker", t0 + 7'600, t0 + 7'600, step);
    }
  }
  Span& send = b.add(0, 1, SpanKind::P2P, "send", 31'000, 32'000);
  send.op = CollOp::Send;
  send.peer = 1;
  send.comm = 0;
  send.bytes = 100;
  const std::string path = temp_trace("hand");
  traces::write_trace(b.t, path);
  const Metrics m = expect_same_metrics(path);
  EXPECT_EQ(m.ranks.size(), 4u);
  EXPECT_EQ(m.steps.size(), 3u);
  remove_trace(path);
}

// A window holding none of an undeclared rank's spans: the rank is left out on both paths.
TEST(MetricsStreamed, WindowWithoutARankLeavesItOutOnBothPaths) {
  testing::Builder b(2);
  b.t.ranks.pop_back();  // rank 1 is not declared
  for (int step = 0; step < 4; ++step) {
    const int64_t t0 = step * 10'000;
    b.add(0, 0, SpanKind::Compute, "fwd", t0, t0 + 5'000, step).flops = 1e6;
    Span& ar = b.add(0, 1, SpanKind::Collective, "ar", t0 + 5'000, t0 + 6'000, step);
    ar.op = CollOp::AllReduce;
    ar.comm = 0;
    ar.seq = step;
  }
  b.add(1, 0, SpanKind::Compute, "late", 50'000, 55'000, 5);
  const std::string path = temp_trace("window_rank");
  traces::write_trace(b.t, path);
  const traces::Trace t = traces::load_trace(path);
  MetricsOptions opt;
  opt.window_start_ns = 0;
  opt.window_end_ns = 40'000;
  const Metrics in_memory = compute_metrics(t, opt);
  ASSERT_EQ(in_memory.ranks.size(), 1u);
  expect_metrics_eq(in_memory, streamed(path, opt));
  expect_same_metrics(path);
  remove_trace(path);
}

// A writer flushing small batches, with long spans recorded when they end (so a stream's spans
// arrive out of start order across blocks): the runs are load_all()'s spans in its order.
TEST(MetricsStreamed, OutOfOrderStreamsAreVisitedInLoadOrder) {
  const std::string path = temp_trace("out_of_order");
  {
    traces::TraceWriter w(path, 64);
    traces::RunMeta meta;
    meta.world_size = 2;
    w.set_meta(meta);
    w.add_rank({0, "host", "cpu", 0, 0, 0});
    w.add_rank({1, "host", "cpu", 1, 0, 0});
    w.add_communicator({0, traces::CommKind::World, "world", {0, 1}});
    const traces::NameId step = w.intern("step"), op = w.intern("op"), ar = w.intern("ar");
    for (int s = 0; s < 6; ++s) {
      for (int r = 0; r < 2; ++r) {
        for (int i = 0; i < 150; ++i) {
          Span sp;
          sp.rank = r;
          sp.stream = i % 2;
          sp.kind = i % 2 ? SpanKind::Collective : SpanKind::Compute;
          sp.name = i % 2 ? ar : op;
          sp.start_ns = s * 100'000 + i * 500 + r * 7 + (i % 5 == 0 ? 0 : 3);
          sp.end_ns = sp.start_ns + 400 + (i % 3) * 200;
          sp.step = s;
          if (i % 2) {
            sp.op = CollOp::AllReduce;
            sp.comm = 0;
            sp.seq = s * 1000 + i;
            sp.bytes = 1000;
          }
          w.add_span(sp);
        }
        Span ph;  // the step's phase, recorded when the step ends: after its spans
        ph.rank = r;
        ph.stream = 0;
        ph.kind = SpanKind::Phase;
        ph.name = step;
        ph.start_ns = s * 100'000;
        ph.end_ns = s * 100'000 + 80'000;
        ph.step = s;
        w.add_span(ph);
      }
    }
    w.close();
  }
  traces::TraceReader reader(path);
  std::vector<Span> visited;
  size_t runs = 0;
  reader.for_each_span_run([&](std::span<const Span> run) {
    ++runs;
    for (size_t i = 1; i < run.size(); ++i) {
      ASSERT_EQ(run[i].rank, run[0].rank);
      ASSERT_EQ(run[i].stream, run[0].stream);
    }
    visited.insert(visited.end(), run.begin(), run.end());
  });
  const traces::Trace t = reader.load_all();
  ASSERT_EQ(visited.size(), t.spans.size());
  EXPECT_GT(runs, 4u);
  for (size_t i = 0; i < visited.size(); ++i) {
    SCOPED_TRACE("span " + std::to_string(i));
    ASSERT_EQ(visited[i].rank, t.spans[i].rank);
    ASSERT_EQ(visited[i].stream, t.spans[i].stream);
    ASSERT_EQ(visited[i].start_ns, t.spans[i].start_ns);
    ASSERT_EQ(visited[i].end_ns, t.spans[i].end_ns);
    ASSERT_EQ(visited[i].kind, t.spans[i].kind);
    ASSERT_EQ(visited[i].seq, t.spans[i].seq);
  }
  expect_same_metrics(path);
  remove_trace(path);
}

// Many collective instances on a declared world, a declared pair and an undeclared communicator,
// with tied starts, a straggler and a rank that stops recording two thirds through (its instances
// are then settled when its last block has been read), and memory counters over several flushes
// with equal times across names: the streamed figures equal the loaded ones, and the lateness and
// memory peaks have their closed forms.
TEST(MetricsStreamed, ManyCollectivesAndCountersGiveIdenticalMetrics) {
  const std::string path = temp_trace("many");
  constexpr int kRanks = 5, kIters = 1200, kDeadAfter = 800;
  constexpr int64_t kDelay = 500'000, kPeriod = 1'000'000;
  {
    traces::TraceWriter w(path, 256);  // many flushes: a series spans many blocks
    traces::RunMeta meta;
    meta.world_size = kRanks;
    w.set_meta(meta);
    std::vector<int32_t> world;
    for (int r = 0; r < kRanks; ++r) {
      w.add_rank({r, "host", "cpu", r, 0, 0});
      world.push_back(r);
    }
    w.add_communicator({0, traces::CommKind::World, "world", world});
    w.add_communicator({1, traces::CommKind::TP, "pair", {0, 1}});
    const traces::NameId fwd = w.intern("fwd"), ar = w.intern("ar"), ag = w.intern("ag");
    const traces::NameId mem_a = w.intern("mem.a"), mem_b = w.intern("mem.b");
    const int64_t offset[kRanks] = {0, 0, 10, kDelay, 20};  // rank 3 straggles
    for (int i = 0; i < kIters; ++i) {
      const int64_t t = i * kPeriod;
      for (int r = 0; r < kRanks; ++r) {
        if (r == 4 && i >= kDeadAfter) continue;
        Span c;
        c.rank = r;
        c.kind = SpanKind::Compute;
        c.name = fwd;
        c.start_ns = t;
        c.end_ns = t + 300'000;
        c.flops = 1e9 / 3;
        w.add_span(c);
        Span a = c;
        a.stream = 1;
        a.kind = SpanKind::Collective;
        a.name = ar;
        a.op = CollOp::AllReduce;
        a.comm = 0;
        a.seq = i;
        a.bytes = 1 << 20;
        a.start_ns = t + 300'000 + offset[r];
        a.end_ns = t + 900'000;
        w.add_span(a);
        if (r < 2 || (r == 2 && i % 3 == 0)) {  // the pair's, and an undeclared group's
          Span g = a;
          g.stream = 2;
          g.name = ag;
          g.op = CollOp::AllGather;
          g.comm = r < 2 ? 1 : 2;
          g.start_ns = t + 100'000 + r;
          g.end_ns = t + 200'000;
          w.add_span(g);
        }
        if (i < 300) {  // a rises as b falls: their sum stays 300 at the end of every instant
          w.add_counter({r, mem_a, t, double(i)});
          w.add_counter({r, mem_b, t, double(300 - i)});
        }
      }
    }
    w.close();
  }
  const Metrics m = expect_same_metrics(path);
  ASSERT_EQ(m.ranks.size(), size_t(kRanks));
  const RankMetrics& late = m.ranks[3];
  // Against the median of 5 starts (t, t, t+10, t+20, t+D): D - 10; of 4 (t, t, t+10, t+D): D - 5.
  EXPECT_EQ(late.collectives_checked, kIters);
  EXPECT_EQ(late.late_ns_mean,
            double(kDeadAfter * (kDelay - 10) + (kIters - kDeadAfter) * (kDelay - 5)) / kIters);
  EXPECT_EQ(m.stragglers, std::vector<int32_t>{3});
  EXPECT_EQ(m.ranks[4].collectives_checked, kDeadAfter);
  for (const RankMetrics& r : m.ranks) {
    EXPECT_EQ(r.peak_memory_total_bytes, 300.0) << "rank " << r.rank;
    EXPECT_EQ(r.peak_memory_bytes.at("mem.a"), 299.0);
    EXPECT_EQ(r.peak_memory_bytes.at("mem.b"), 300.0);
  }
  // The header without the memory counters gives the same figures (they are read from the file).
  traces::TraceReader reader(path);
  const traces::Trace header =
      reader.load_header([](std::string_view n) { return n.rfind("mem.", 0) != 0; });
  EXPECT_TRUE(header.counters.empty());
  expect_metrics_eq(m, compute_metrics_streamed(reader, header, {}));
  remove_trace(path);
}

// A (comm, seq) that repeats after its instance was complete (a second attempt numbering its
// collectives from 0 again): grouped as the loaded trace groups it, all four members at once.
TEST(MetricsStreamed, RepeatedInstancesGiveIdenticalMetrics) {
  testing::Builder b(2);
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (int i = 0; i < 20; ++i) {
      const int64_t t = attempt * 200'000 + i * 10'000;
      for (int r = 0; r < 2; ++r)
        b.coll(r, t + r * (attempt + 1) * 700, t + 5'000, CollOp::AllReduce, 0, i, 64);
    }
  }
  const std::string path = temp_trace("repeated");
  traces::write_trace(b.t, path);
  const Metrics m = expect_same_metrics(path);
  ASSERT_EQ(m.ranks.size(), 2u);
  EXPECT_EQ(m.ranks[1].collectives_checked, 40);
  // Starts t, t + 700 (first attempt) and T, T + 1400: the median lies between the attempts.
  EXPECT_GT(m.ranks[1].late_ns_mean, 0);
  remove_trace(path);
}

TEST(MetricsStreamed, CompressionAccumulatorMatchesTheWholeTracePass) {
  testing::Builder b(2);
  for (int r = 0; r < 2; ++r) {
    for (int step = 0; step < 2; ++step) {
      const int64_t t0 = step * 10'000;
      b.add(r, 0, SpanKind::Compute, "ddp.compress", t0, t0 + 100, step).bytes = 4000;
      Span& g = b.add(r, 1, SpanKind::Collective, "ddp.int8_all_gather", t0 + 200, t0 + 900, step);
      g.op = CollOp::AllGather;
      g.comm = 0;
      g.bytes = 2000;
      b.add(r, 0, SpanKind::Compute, "ddp.decompress", t0 + 1000, t0 + 1100, step);
    }
  }
  const CompressionMetrics whole = compression_metrics(b.t);
  CompressionAccumulator acc(b.t);
  for (auto it = b.t.spans.rbegin(); it != b.t.spans.rend(); ++it) acc.add(*it);
  const CompressionMetrics part = acc.result();
  EXPECT_EQ(part.buckets, whole.buckets);
  EXPECT_EQ(part.raw_bytes, whole.raw_bytes);
  EXPECT_EQ(part.wire_bytes, whole.wire_bytes);
  EXPECT_EQ(part.compress_ns, whole.compress_ns);
  EXPECT_EQ(part.decompress_ns, whole.decompress_ns);
  EXPECT_EQ(part.ranks, whole.ranks);
  EXPECT_EQ(part.steps, whole.steps);
  ASSERT_EQ(part.collectives.size(), 1u);
  EXPECT_EQ(part.collectives[0].raw_bytes, whole.collectives[0].raw_bytes);
  EXPECT_EQ(part.collectives[0].wire_bytes, 4000);  // 4 calls of 2000 bytes / group of 2
}

TEST(MetricsStreamed, DamagedBlockNamesTheFileAndTheBlock) {
  const std::string path = temp_trace("damaged");
  traces::write_trace(traces::synthesize({}), path);
  int64_t id = 0;
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT max(id) FROM blocks", -1, &st, nullptr), SQLITE_OK);
    ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
    id = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    const std::string sql =
        "UPDATE blocks SET crc32c = (crc32c | 1) - (crc32c & 1) WHERE id = " + std::to_string(id);
    ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  try {
    streamed(path, {});
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path + ": corrupt trace (span block " + std::to_string(id) + " (rank "),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("checksum mismatch"), std::string::npos) << what;
  }
  remove_trace(path);
}

}  // namespace
}  // namespace orrery::profiler
