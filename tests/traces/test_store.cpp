// Trace store: exact round trips, window/collective/step queries against brute force, files still
// being written or never closed, several writer threads, merge, and every kind of bad file.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "orrery/common/error.hpp"
#include "orrery/traces/store.hpp"
#include "test_util.hpp"

namespace orrery::traces {
namespace {

using testing::make_trace;
using testing::same_span;
using testing::TempDir;

void expect_same_trace(const Trace& a, const Trace& b) {
  EXPECT_EQ(a.meta.source, b.meta.source);
  EXPECT_EQ(a.meta.scenario_text, b.meta.scenario_text);
  EXPECT_EQ(a.meta.scenario_name, b.meta.scenario_name);
  EXPECT_EQ(a.meta.host, b.meta.host);
  EXPECT_EQ(a.meta.start_time_unix_ns, b.meta.start_time_unix_ns);
  EXPECT_EQ(a.meta.world_size, b.meta.world_size);
  EXPECT_EQ(a.meta.dp, b.meta.dp);
  EXPECT_EQ(a.meta.tp, b.meta.tp);
  EXPECT_EQ(a.meta.pp, b.meta.pp);
  EXPECT_EQ(a.meta.tokens_per_step, b.meta.tokens_per_step);
  EXPECT_EQ(a.meta.model_flops_per_step, b.meta.model_flops_per_step);
  EXPECT_EQ(a.meta.peak_flops_per_rank, b.meta.peak_flops_per_rank);
  EXPECT_EQ(a.meta.origin, b.meta.origin);
  EXPECT_EQ(a.meta.layout, b.meta.layout);
  EXPECT_EQ(a.meta.failure, b.meta.failure);
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (size_t i = 0; i < a.ranks.size(); ++i) {
    EXPECT_EQ(a.ranks[i].rank, b.ranks[i].rank);
    EXPECT_EQ(a.ranks[i].host, b.ranks[i].host);
    EXPECT_EQ(a.ranks[i].device, b.ranks[i].device);
    EXPECT_EQ(a.ranks[i].dp, b.ranks[i].dp);
  }
  ASSERT_EQ(a.streams.size(), b.streams.size());
  for (size_t i = 0; i < a.streams.size(); ++i) EXPECT_EQ(a.streams[i].name, b.streams[i].name);
  ASSERT_EQ(a.comms.size(), b.comms.size());
  for (size_t i = 0; i < a.comms.size(); ++i) {
    EXPECT_EQ(a.comms[i].id, b.comms[i].id);
    EXPECT_EQ(a.comms[i].kind, b.comms[i].kind);
    EXPECT_EQ(a.comms[i].name, b.comms[i].name);
    EXPECT_EQ(a.comms[i].ranks, b.comms[i].ranks);
  }
  EXPECT_EQ(a.strings.all(), b.strings.all());
  ASSERT_EQ(a.spans.size(), b.spans.size());
  for (size_t i = 0; i < a.spans.size(); ++i) {
    ASSERT_TRUE(same_span(a.spans[i], b.spans[i])) << "span " << i;
  }
  ASSERT_EQ(a.counters.size(), b.counters.size());
  for (size_t i = 0; i < a.counters.size(); ++i) {
    EXPECT_EQ(a.counters[i].rank, b.counters[i].rank);
    EXPECT_EQ(a.counters[i].name, b.counters[i].name);
    EXPECT_EQ(a.counters[i].ts_ns, b.counters[i].ts_ns);
    EXPECT_EQ(a.counters[i].value, b.counters[i].value);
  }
}

// Brute-force window: the reader's documented overlap rule.
std::vector<Span> brute_window(const Trace& t, int32_t rank, int32_t stream, int64_t t0,
                               int64_t t1) {
  std::vector<Span> out;
  for (const auto& s : t.spans) {
    if (s.rank == rank && s.stream == stream && s.start_ns < t1 &&
        (s.end_ns > t0 || s.start_ns >= t0)) {
      out.push_back(s);
    }
  }
  return out;
}

int sqlite_exec(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  sqlite3_close(db);
  return rc;
}

// Expects an InputError whose message names the file and contains `needle` (or `alt`).
void expect_input_error(const std::string& path, const std::string& needle,
                        const std::string& alt = "") {
  try {
    TraceReader r(path);
    (void)r.load_all();
    FAIL() << "no error for " << path;
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_TRUE(msg.find(needle) != std::string::npos ||
                (!alt.empty() && msg.find(alt) != std::string::npos))
        << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
}

TEST(Store, RoundTripIsExact) {
  TempDir dir;
  const Trace t = make_trace(3, 500);
  const auto path = dir.path("t.db");
  write_trace(t, path);
  TraceReader r(path);
  EXPECT_EQ(r.schema_version(), kSchemaVersion);
  EXPECT_TRUE(r.complete());
  EXPECT_EQ(r.span_count(), 3 * 2 * 500);
  const Trace back = r.load_all();
  EXPECT_EQ(back.path, path);
  expect_same_trace(t, back);
  EXPECT_EQ(back.meta.extra_json, t.meta.extra_json);
  // A closed file is one self-contained file: no WAL left beside it.
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
}

// Traces written before the typed keys kept the failure, micro-batches and the commbench kind in
// extra_json: the reader takes them from there when the keys are missing.
TEST(Store, OlderTracesGiveTheirTypedMetaFromExtraJson) {
  TempDir dir;
  Trace t = make_trace(2, 5);
  t.meta.source = TraceSource::Real;
  t.meta.origin = TraceOrigin::Unknown;
  t.meta.layout = {};
  t.meta.failure = {};
  t.meta.extra_json =
      R"({"threads":1,"micro_batches":4,"failed":true,"lost_ranks":[1],"failure":"rank 1 was lost"})";
  const std::string path = dir.path("old.db");
  write_trace(t, path);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "DELETE FROM meta WHERE key IN ('origin', 'zero', 'micro_batches', "
                           "'schedule', 'placement', 'recompute', 'device', 'precision', "
                           "'failed', 'lost_ranks', 'failed_step', 'failure')",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  const RunMeta m = TraceReader(path).meta();
  EXPECT_EQ(m.origin, TraceOrigin::Run);
  EXPECT_EQ(m.layout.micro_batches, 4);
  EXPECT_EQ(m.failure, (RunFailure{true, {1}, -1, "rank 1 was lost"}));
  EXPECT_FALSE(is_commbench(m));

  // A commbench trace of then; and the typed keys win over extra_json where both exist.
  t.meta.extra_json = R"({"kind":"commbench","failed":true})";
  t.meta.failure = {};
  write_trace(t, path);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "DELETE FROM meta WHERE key = 'origin'", nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  const RunMeta b = TraceReader(path).meta();
  EXPECT_EQ(b.origin, TraceOrigin::Commbench);
  EXPECT_TRUE(is_commbench(b));
  EXPECT_FALSE(b.failure.failed);  // the written 'failed' key (0) is the answer
}

TEST(Store, CorruptLostRanksIsAnInputErrorNamingTheFile) {
  TempDir dir;
  const std::string path = dir.path("bad.db");
  write_trace(make_trace(1, 2), path);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE meta SET value = '[1,' WHERE key = 'lost_ranks'", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  try {
    (void)TraceReader(path).meta();
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lost_ranks"), std::string::npos) << e.what();
  }
}

TEST(Store, SchemaVersionIsInUserVersionAndMeta) {
  TempDir dir;
  const auto path = dir.path("t.db");
  write_trace(make_trace(1, 10), path);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, nullptr);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), kSchemaVersion);
  sqlite3_finalize(st);
  sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key='schema_version'", -1, &st, nullptr);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), kSchemaVersion);
  sqlite3_finalize(st);
  // The per-span and per-sample SQL tables and their indexes are not written unless asked for
  // (schema version 2 for spans, 3 for counters, which are packed in blocks).
  sqlite3_prepare_v2(db,
                     "SELECT count(*) FROM sqlite_master WHERE name IN "
                     "('spans_by_comm_seq','spans_by_step','counters_by_rank','counters')",
                     -1, &st, nullptr);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), 0);
  sqlite3_finalize(st);
  sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_master WHERE name='spans'", -1, &st, nullptr);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
}

TEST(Store, EmptyTraceRoundTrips) {
  TempDir dir;
  const auto path = dir.path("empty.db");
  Trace t;
  write_trace(t, path);
  TraceReader r(path);
  EXPECT_EQ(r.span_count(), 0);
  EXPECT_FALSE(r.time_range().has_value());
  EXPECT_TRUE(r.spans_in_window(0, 0, 0, 100).empty());
  EXPECT_TRUE(r.load_all().spans.empty());
}

TEST(Store, TimeRangeAndStreamBounds) {
  TempDir dir;
  const Trace t = make_trace(2, 300);
  const auto path = dir.path("t.db");
  write_trace(t, path);
  TraceReader r(path);
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  std::map<std::pair<int, int>, int64_t> count, max_dur;
  for (const auto& s : t.spans) {
    lo = std::min(lo, s.start_ns);
    hi = std::max(hi, s.end_ns);
    count[{s.rank, s.stream}] += 1;
    max_dur[{s.rank, s.stream}] = std::max(max_dur[{s.rank, s.stream}], s.duration_ns());
  }
  ASSERT_TRUE(r.time_range().has_value());
  EXPECT_EQ(r.time_range()->start_ns, lo);
  EXPECT_EQ(r.time_range()->end_ns, hi);
  const auto bounds = r.stream_bounds();
  ASSERT_EQ(bounds.size(), count.size());
  for (const auto& b : bounds) {
    EXPECT_EQ(b.count, (count[{b.rank, b.stream}]));
    EXPECT_EQ(b.max_dur_ns, (max_dur[{b.rank, b.stream}]));
  }
}

TEST(Store, WindowQueryMatchesBruteForce) {
  TempDir dir;
  Trace t = make_trace(2, 2000, 7);
  // Edge cases: a zero-length span and a span ending exactly at a window start.
  const NameId mark = t.strings.intern("marker");
  t.spans.push_back({1, 0, SpanKind::Phase, mark, 50000, 50000});
  t.spans.push_back({1, 0, SpanKind::Phase, mark, 49000, 60000});
  t.sort_spans();
  const auto path = dir.path("t.db");
  write_trace(t, path);
  TraceReader r(path);
  std::mt19937_64 rng(3);
  int nonempty = 0;
  for (int q = 0; q < 200; ++q) {
    const int32_t rank = static_cast<int32_t>(rng() % 2);
    const int32_t stream = static_cast<int32_t>(rng() % 2);
    const int64_t t0 = static_cast<int64_t>(rng() % 1200000);
    const int64_t t1 = t0 + 1 + static_cast<int64_t>(rng() % 50000);
    const auto got = r.spans_in_window(rank, stream, t0, t1);
    const auto want = brute_window(t, rank, stream, t0, t1);
    ASSERT_EQ(got.size(), want.size()) << "window " << t0 << ".." << t1;
    for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(same_span(got[i], want[i]));
    nonempty += got.empty() ? 0 : 1;
  }
  EXPECT_GT(nonempty, 100);
  // The zero-length marker counts when it starts inside the window, not when it ends at t0.
  EXPECT_EQ(r.spans_in_window(1, 0, 50000, 50001).size(),
            brute_window(t, 1, 0, 50000, 50001).size());
  const auto at = r.spans_in_window(1, 0, 60000, 60001);
  for (const auto& s : at) EXPECT_NE(s.end_ns, 60000);
  EXPECT_TRUE(r.spans_in_window(0, 0, 10, 10).empty());
  EXPECT_TRUE(r.spans_in_window(5, 0, 0, INT64_MAX).empty());
  EXPECT_EQ(r.spans_in_window(0, 1, INT64_MIN, INT64_MAX).size(), 2000u);
}

TEST(Store, CollectivesInSequenceOrder) {
  TempDir dir;
  const Trace t = make_trace(3, 100);
  const auto path = dir.path("t.db");
  write_trace(t, path);
  TraceReader r(path);
  for (int32_t comm : {0, 1}) {
    const auto got = r.collectives_of(comm);
    size_t want = 0;
    for (const auto& s : t.spans) want += s.comm == comm ? 1 : 0;
    ASSERT_EQ(got.size(), want);
    EXPECT_EQ(want, 3u * 50u);
    for (size_t i = 1; i < got.size(); ++i) {
      EXPECT_LE(got[i - 1].seq, got[i].seq);
      if (got[i - 1].seq == got[i].seq) {
        EXPECT_LT(got[i - 1].rank, got[i].rank);
      }
    }
    for (const auto& s : got) EXPECT_EQ(s.comm, comm);
  }
  EXPECT_TRUE(r.collectives_of(9).empty());
}

TEST(Store, StepAggregatesMatchBruteForce) {
  TempDir dir;
  const Trace t = make_trace(2, 400);
  const auto path = dir.path("t.db");
  write_trace(t, path);
  TraceReader r(path);
  std::map<std::pair<int, int>, TraceReader::StepAggregate> want;
  for (const auto& s : t.spans) {
    if (s.step < 0) continue;
    auto [it, fresh] =
        want.try_emplace({s.rank, s.step},
                         TraceReader::StepAggregate{s.rank, s.step, s.start_ns, s.end_ns, 0, 0, 0});
    auto& a = it->second;
    a.start_ns = std::min(a.start_ns, s.start_ns);
    a.end_ns = std::max(a.end_ns, s.end_ns);
    if (s.kind == SpanKind::Compute || s.kind == SpanKind::Optimizer)
      a.compute_ns += s.duration_ns();
    if (s.kind == SpanKind::Collective || s.kind == SpanKind::P2P)
      a.collective_ns += s.duration_ns();
    a.span_count += 1;
  }
  const auto got = r.step_aggregates();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got.size(), 2u * 8u);
  for (const auto& g : got) {
    const auto& w = want.at({g.rank, g.step});
    EXPECT_EQ(g.start_ns, w.start_ns);
    EXPECT_EQ(g.end_ns, w.end_ns);
    EXPECT_EQ(g.compute_ns, w.compute_ns);
    EXPECT_EQ(g.collective_ns, w.collective_ns);
    EXPECT_EQ(g.span_count, w.span_count);
  }
}

TEST(Store, CountersRoundTrip) {
  TempDir dir;
  const Trace t = make_trace(2, 10);
  const auto path = dir.path("t.db");
  write_trace(t, path);
  const auto c = TraceReader(path).counters();
  ASSERT_EQ(c.size(), 40u);
  EXPECT_EQ(c[0].rank, 0);
  EXPECT_EQ(c[0].ts_ns, 1000);
  EXPECT_EQ(c[0].value, 0.25);
  EXPECT_EQ(c[39].rank, 1);
  EXPECT_EQ(c[39].value, 1024.0 * 20 + 0.25);
}

TEST(Store, ReaderSeesFileWhileItIsWritten) {
  TempDir dir;
  const auto path = dir.path("live.db");
  const Trace t = make_trace(1, 1000);
  TraceWriter w(path, 256);
  for (const auto& s : t.strings.all()) w.intern(s);
  for (size_t i = 0; i < 600; ++i) w.add_span(t.spans[i]);
  w.flush();
  {
    TraceReader r(path);
    EXPECT_FALSE(r.complete());
    EXPECT_EQ(r.span_count(), 600);
    EXPECT_EQ(r.load_all().spans.size(), 600u);
  }
  for (size_t i = 600; i < t.spans.size(); ++i) w.add_span(t.spans[i]);
  w.flush();
  {
    TraceReader r(path);
    EXPECT_EQ(r.span_count(), 2000);
    const Trace back = r.load_all();
    ASSERT_EQ(back.spans.size(), t.spans.size());
    for (size_t i = 0; i < t.spans.size(); ++i) ASSERT_TRUE(same_span(back.spans[i], t.spans[i]));
  }
  w.close();
  w.close();  // idempotent
  EXPECT_TRUE(TraceReader(path).complete());
  EXPECT_THROW(w.add_span(t.spans[0]), InternalError);
}

TEST(Store, FileOfAWriterThatDiedStillOpens) {
  TempDir dir;
  const auto path = dir.path("died.db");
  const Trace t = make_trace(2, 1000);
  // The child writes, flushes part of the trace and dies without close(): as a crashed run would.
  ASSERT_TRUE(testing::write_then_die(path, t, 2500, 50));
  TraceReader r(path);
  EXPECT_FALSE(r.complete());
  EXPECT_EQ(r.meta().scenario_name, "test");
  EXPECT_EQ(r.span_count(), 2500);
  const Trace back = r.load_all();
  ASSERT_EQ(back.spans.size(), 2500u);
  for (size_t i = 0; i < 2500; ++i) ASSERT_TRUE(same_span(back.spans[i], t.spans[i])) << i;
  // Queries work without the spans rows and indexes close() would have built.
  EXPECT_EQ(r.spans_in_window(0, 0, INT64_MIN, INT64_MAX).size(), 1000u);
  std::vector<Span> want;
  for (size_t i = 0; i < 2500; ++i) {
    if (t.spans[i].comm == 0) want.push_back(t.spans[i]);
  }
  std::stable_sort(want.begin(), want.end(), [](const Span& a, const Span& b) {
    return std::tie(a.seq, a.rank, a.start_ns) < std::tie(b.seq, b.rank, b.start_ns);
  });
  const auto coll = r.collectives_of(0);
  ASSERT_EQ(coll.size(), want.size());
  ASSERT_FALSE(coll.empty());
  for (size_t i = 0; i < coll.size(); ++i) ASSERT_TRUE(same_span(coll[i], want[i])) << i;
  int64_t step_spans = 0;
  for (const auto& a : r.step_aggregates()) step_spans += a.span_count;
  EXPECT_EQ(step_spans, 2500);
}

// Each flush adds its batch's part of a (rank, step) to the step row (nothing per step is held
// between flushes): spans of two ranks' steps over three streams, added stream by stream as the
// export streams them and in batches of 5, so every step is split over several flushes; the rows
// equal a fold over all spans, and each stream's spans come back in start order.
TEST(Store, StepRowsAddUpOverFlushes) {
  TempDir dir;
  const auto path = dir.path("steps.db");
  std::vector<Span> spans;
  for (int32_t rank = 0; rank < 2; ++rank)
    for (int32_t stream = 0; stream < 3; ++stream)
      for (int32_t i = 0; i < 12; ++i) {
        Span s;
        s.rank = rank, s.stream = stream, s.step = i % 4;
        s.kind = stream == 0 ? SpanKind::Compute
                             : (stream == 1 ? SpanKind::Collective : SpanKind::Memcpy);
        // Starts out of order inside a batch (odd i before even i of a pair).
        s.start_ns = 1000 * (i ^ 1) + 37 * stream + 5 * rank;
        s.end_ns = s.start_ns + 100 + 7 * i + stream;
        spans.push_back(s);
      }
  {
    TraceWriter w(path, 5);
    w.intern("x");
    for (const auto& s : spans) w.add_span(s);
    w.close();
  }
  std::map<std::pair<int32_t, int32_t>, TraceReader::StepAggregate> want;
  for (const auto& s : spans) {
    auto [it, fresh] =
        want.try_emplace({s.rank, s.step},
                         TraceReader::StepAggregate{s.rank, s.step, s.start_ns, s.end_ns, 0, 0, 0});
    auto& a = it->second;
    a.start_ns = std::min(a.start_ns, s.start_ns), a.end_ns = std::max(a.end_ns, s.end_ns);
    (s.kind == SpanKind::Compute ? a.compute_ns : a.collective_ns) +=
        s.kind == SpanKind::Memcpy ? 0 : s.end_ns - s.start_ns;
    a.span_count += 1;
  }
  TraceReader r(path);
  const auto got = r.step_aggregates();
  ASSERT_EQ(got.size(), want.size());
  for (const auto& g : got) {
    const auto& w = want.at({g.rank, g.step});
    EXPECT_EQ(g.start_ns, w.start_ns) << g.rank << "/" << g.step;
    EXPECT_EQ(g.end_ns, w.end_ns);
    EXPECT_EQ(g.compute_ns, w.compute_ns);
    EXPECT_EQ(g.collective_ns, w.collective_ns);
    EXPECT_EQ(g.span_count, 9);  // 3 per stream
  }
  for (int32_t rank = 0; rank < 2; ++rank)
    for (int32_t stream = 0; stream < 3; ++stream) {
      const auto back = r.spans_in_window(rank, stream, INT64_MIN, INT64_MAX);
      ASSERT_EQ(back.size(), 12u);
      for (size_t i = 1; i < back.size(); ++i) EXPECT_LT(back[i - 1].start_ns, back[i].start_ns);
    }
}

TEST(Store, SeveralWriterThreads) {
  TempDir dir;
  const auto path = dir.path("mt.db");
  constexpr int kThreads = 4, kPerThread = 20000;
  {
    TraceWriter w(path, 1000);
    std::vector<std::thread> threads;
    for (int th = 0; th < kThreads; ++th) {
      threads.emplace_back([&w, th] {
        const NameId name = w.intern("op" + std::to_string(th % 2));
        for (int i = 0; i < kPerThread; ++i) {
          Span s;
          s.rank = th;
          s.stream = i % 3;
          s.name = name;
          s.start_ns = i * 10;
          s.end_ns = i * 10 + 5;
          s.seq = i;
          w.add_span(s);
          if (i % 1000 == 0) w.add_counter({th, name, i, static_cast<double>(i)});
        }
      });
    }
    for (auto& t : threads) t.join();
    w.close();
  }
  TraceReader r(path);
  EXPECT_EQ(r.span_count(), kThreads * kPerThread);
  const Trace t = r.load_all();
  EXPECT_EQ(t.strings.size(), 2u);
  EXPECT_EQ(t.counters.size(), static_cast<size_t>(kThreads * kPerThread / 1000));
  std::vector<int64_t> seq_sum(kThreads, 0);
  for (const auto& s : t.spans) seq_sum[s.rank] += s.seq;
  for (int th = 0; th < kThreads; ++th) {
    EXPECT_EQ(seq_sum[th], int64_t{kPerThread} * (kPerThread - 1) / 2);
  }
  EXPECT_TRUE(std::is_sorted(t.spans.begin(), t.spans.end(), [](const Span& a, const Span& b) {
    return std::tie(a.rank, a.stream, a.start_ns) < std::tie(b.rank, b.stream, b.start_ns);
  }));
}

TEST(Store, WriterRefusesUncreatablePath) {
  EXPECT_THROW(TraceWriter("/nonexistent-dir/x/t.db"), InputError);
}

TEST(StoreBadFiles, MissingFile) {
  TempDir dir;
  expect_input_error(dir.path("nope.db"), "no such trace file");
}

TEST(StoreBadFiles, EmptyFile) {
  TempDir dir;
  const auto path = dir.path("empty.db");
  std::ofstream(path).close();
  expect_input_error(path, "empty file");
}

TEST(StoreBadFiles, Garbage) {
  TempDir dir;
  const auto path = dir.path("garbage.db");
  std::ofstream f(path, std::ios::binary);
  for (int i = 0; i < 10000; ++i) f << "this is not a database ";
  f.close();
  expect_input_error(path, "file is not a database");
}

TEST(StoreBadFiles, SqliteWithoutOrreryTables) {
  TempDir dir;
  const auto path = dir.path("other.db");
  ASSERT_EQ(sqlite_exec(path, "CREATE TABLE t(x); INSERT INTO t VALUES(1);"), SQLITE_OK);
  expect_input_error(path, "no Orrery tables");
}

TEST(StoreBadFiles, OtherSchemaVersion) {
  TempDir dir;
  const auto path = dir.path("v7.db");
  write_trace(make_trace(1, 10), path);
  ASSERT_EQ(sqlite_exec(path, "PRAGMA user_version=7"), SQLITE_OK);
  expect_input_error(path, "schema version 7, expected " + std::to_string(kSchemaVersion) +
                               " (or 2, without block checksums)");
}

TEST(StoreBadFiles, Truncated) {
  TempDir dir;
  const auto path = dir.path("cut.db");
  write_trace(make_trace(2, 5000), path);
  const auto size = std::filesystem::file_size(path);
  ASSERT_GT(size, 100000u);
  std::filesystem::resize_file(path, size / 2);
  expect_input_error(path, "truncated");
}

TEST(StoreBadFiles, CorruptPagesInTheMiddle) {
  TempDir dir;
  const auto path = dir.path("corrupt.db");
  write_trace(make_trace(2, 5000), path);
  const auto size = std::filesystem::file_size(path);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    // Overwrite everything after the first pages (schema) with a pattern: span pages are broken.
    f.seekp(static_cast<std::streamoff>(size / 4));
    const std::string junk(size / 2, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  // SQLite notices broken B-tree pages; broken packed span bytes are caught by their decoder.
  expect_input_error(path, "cannot read trace", "corrupt trace");
}

TEST(StoreBadFiles, DamagedBlockIndex) {
  TempDir dir;
  const auto off_by_one = dir.path("off_by_one.db");
  write_trace(make_trace(2, 3000), off_by_one);
  ASSERT_EQ(sqlite_exec(off_by_one, "UPDATE blocks SET count=count+1 WHERE id=2"), SQLITE_OK);
  // The count is covered by the block's checksum; with the checksum made to match, the decoder
  // still refuses the block.
  expect_input_error(off_by_one, "span block 2 (rank 0, stream 0): checksum mismatch");
  reseal_block_checksums(off_by_one);
  expect_input_error(off_by_one, "span block 2 (rank 0, stream 0): its bytes do not decode");
  const auto huge = dir.path("huge.db");
  write_trace(make_trace(1, 10), huge);
  ASSERT_EQ(sqlite_exec(huge, "UPDATE blocks SET count=1000000000000"), SQLITE_OK);
  expect_input_error(huge, "more than the file can hold");
}

// Found by fuzz/fuzz_trace (fuzz/README.md): a damaged schema failed the reader's first prepare
// with SQLITE_ERROR, which was an InternalError (exit 1) instead of the user's bad file.
TEST(StoreBadFiles, DamagedSchemaIsAnInputError) {
  TempDir dir;
  const auto format = dir.path("format.db");
  write_trace(make_trace(1, 10), format);
  {
    std::fstream f(format, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(44);  // the header's schema format number: 1..4 are valid
    f.write("\0\0\0\x09", 4);
  }
  expect_input_error(format, "unsupported file format");
  const auto schema = dir.path("schema.db");
  write_trace(make_trace(1, 10), schema);
  ASSERT_EQ(sqlite_exec(schema,
                        "PRAGMA writable_schema=ON; "
                        "UPDATE sqlite_master SET sql='CREATE TABLE blocks(' WHERE name='blocks'"),
            SQLITE_OK);
  expect_input_error(schema, "malformed database schema");
}

TEST(Merge, PerRankFilesBecomeOne) {
  TempDir dir;
  const Trace full = make_trace(3, 200);
  std::vector<std::string> inputs;
  for (int r = 0; r < 3; ++r) {
    // Each rank's file has its own string table, in a different order, with a rank-only name.
    Trace part;
    part.meta = full.meta;
    part.ranks.push_back(full.ranks[r]);
    for (const auto& s : full.streams)
      if (s.rank == r) part.streams.push_back(s);
    part.comms = full.comms;
    part.strings.intern("only on rank " + std::to_string(r));
    for (size_t i = full.strings.size(); i-- > 0;)
      part.strings.intern(full.strings.str(static_cast<NameId>(i)));
    for (auto s : full.spans) {
      if (s.rank != r) continue;
      s.name = part.strings.find(full.strings.str(s.name));
      part.spans.push_back(s);
    }
    for (auto c : full.counters) {
      if (c.rank != r) continue;
      c.name = part.strings.find(full.strings.str(c.name));
      part.counters.push_back(c);
    }
    inputs.push_back(dir.path("rank" + std::to_string(r) + ".db"));
    write_trace(part, inputs.back());
  }
  const auto out = dir.path("merged.db");
  merge_traces(inputs, out);
  TraceReader r(out);
  EXPECT_TRUE(r.complete());
  const Trace m = r.load_all();
  EXPECT_EQ(m.ranks.size(), 3u);
  EXPECT_EQ(m.streams.size(), 6u);
  EXPECT_EQ(m.comms.size(), 2u);
  EXPECT_EQ(m.strings.size(), full.strings.size() + 3);
  EXPECT_EQ(m.meta.world_size, 3);
  ASSERT_EQ(m.spans.size(), full.spans.size());
  for (size_t i = 0; i < m.spans.size(); ++i) {
    Span a = m.spans[i];
    const Span& b = full.spans[i];
    ASSERT_EQ(m.strings.str(a.name), full.strings.str(b.name));
    a.name = b.name;
    ASSERT_TRUE(same_span(a, b)) << i;
  }
  ASSERT_EQ(m.counters.size(), full.counters.size());
  const auto extra = nlohmann::json::parse(m.meta.extra_json);
  EXPECT_EQ(extra["merged_from"], 3);
  EXPECT_EQ(extra["note"], "unit test");
  EXPECT_FALSE(extra.contains("incomplete_inputs"));
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
}

TEST(Merge, IncompleteInputIsMergedAndNoted) {
  TempDir dir;
  const Trace t = make_trace(1, 100);
  const auto a = dir.path("a.db");
  const auto b = dir.path("b.db");
  write_trace(t, a);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto* w = new TraceWriter(b, 10);
    w->set_meta(t.meta);
    w->intern("late");
    Span s;
    s.rank = 1;
    s.start_ns = 5;
    s.end_ns = 9;
    w->add_span(s);
    w->flush();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  const auto out = dir.path("m.db");
  merge_traces({a, b}, out);
  const Trace m = load_trace(out);
  EXPECT_EQ(m.spans.size(), t.spans.size() + 1);
  const auto extra = nlohmann::json::parse(m.meta.extra_json);
  ASSERT_TRUE(extra.contains("incomplete_inputs"));
  EXPECT_EQ(extra["incomplete_inputs"], nlohmann::json::array({b}));
  EXPECT_EQ(m.spans.back().rank, 1);
  EXPECT_EQ(m.strings.str(m.spans.back().name), "late");
}

// merge_traces streams each input stream by stream in windows of start time: a stream of many
// windows' worth of spans, with zero-length spans, ties in start and spans far longer than a
// window, comes out span for span as it went in.
TEST(Merge, StreamsLargeStreamsInWindowsExactly) {
  TempDir dir;
  Trace t;
  t.meta.world_size = 1;
  t.ranks.push_back({0, "h", "cpu", 0, 0, 0});
  t.streams.push_back({0, 1, "compute"});
  t.streams.push_back({0, 2, "comm"});
  const NameId a = t.strings.intern("a"), b = t.strings.intern("b");
  int64_t seq = 0;
  for (int64_t i = 0; i < 300'000; ++i) {
    Span sp;
    sp.rank = 0;
    sp.stream = 1;
    sp.name = i % 2 ? a : b;
    sp.start_ns = 10 * i;
    sp.end_ns = sp.start_ns + (i % 7 == 0 ? 0 : 15);         // zero-length ones, and overlaps
    if (i % 1000 == 0) sp.end_ns = sp.start_ns + 5'000'000;  // far longer than a window
    sp.seq = seq++;
    t.spans.push_back(sp);
    if (i % 13 == 0) {  // a tie in start, added after
      sp.seq = seq++;
      sp.end_ns = sp.start_ns + 3;
      t.spans.push_back(sp);
    }
  }
  for (int64_t i = 0; i < 3; ++i) {
    Span sp;
    sp.rank = 0;
    sp.stream = 2;
    sp.name = a;
    sp.start_ns = 1'000'000 * i;
    sp.end_ns = sp.start_ns + 7;
    sp.seq = seq++;
    t.spans.push_back(sp);
  }
  const auto in = dir.path("in.db");
  write_trace(t, in);
  const Trace want = load_trace(in);
  const auto out = dir.path("out.db");
  merge_traces({in}, out);
  const Trace got = load_trace(out);
  ASSERT_EQ(got.spans.size(), want.spans.size());
  ASSERT_EQ(got.spans.size(), 300'000u + 300'000u / 13 + 1 + 3);
  for (size_t i = 0; i < got.spans.size(); ++i) {
    ASSERT_EQ(got.strings.str(got.spans[i].name), want.strings.str(want.spans[i].name)) << i;
    Span g = got.spans[i];
    g.name = want.spans[i].name;
    ASSERT_TRUE(same_span(g, want.spans[i])) << i;
  }
}

TEST(Merge, BadInputIsAnInputError) {
  TempDir dir;
  const auto a = dir.path("a.db");
  write_trace(make_trace(1, 5), a);
  EXPECT_THROW(merge_traces({a, dir.path("missing.db")}, dir.path("m.db")), InputError);
  EXPECT_FALSE(std::filesystem::exists(dir.path("m.db")));
  EXPECT_THROW(merge_traces({}, dir.path("m.db")), InputError);
}

}  // namespace
}  // namespace orrery::traces
