// Issue 9: readers open traces read-only, read the trace of a run still in progress without
// blocking or breaking its writer, leave the file as it was, work without write permission, and
// merged traces keep every rank's flight_records (and rank_status) rows.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/traces/store.hpp"
#include "test_util.hpp"

namespace orrery::traces {
namespace {

namespace fs = std::filesystem;
using testing::make_trace;
using testing::same_span;
using testing::TempDir;

void write_strings(TraceWriter& w, const Trace& t) {
  for (const auto& s : t.strings.all()) w.intern(s);
}

TEST(StoreLive, ReaderKeptOpenSeesEachFlushedBatchAndTheWriterCloses) {
  TempDir dir;
  const auto path = dir.path("live.db");
  const Trace t = make_trace(1, 400);  // 800 spans, in (rank, stream, start) order
  TraceWriter w(path, 100);
  w.set_meta(t.meta);
  write_strings(w, t);
  for (size_t i = 0; i < 250; ++i) w.add_span(t.spans[i]);  // two full batches flushed, 50 held

  TraceReader r(path);  // opened mid-run, kept open through the rest
  EXPECT_FALSE(r.complete());
  EXPECT_EQ(r.meta().scenario_name, "test");
  EXPECT_EQ(r.span_count(), 200);
  {
    const Trace part = r.load_all();
    ASSERT_EQ(part.spans.size(), 200u);
    for (size_t i = 0; i < 200; ++i) ASSERT_TRUE(same_span(part.spans[i], t.spans[i])) << i;
  }
  for (size_t i = 250; i < 520; ++i) w.add_span(t.spans[i]);  // flushed at 300, 400, 500
  EXPECT_EQ(r.span_count(), 500);
  EXPECT_EQ(r.spans_in_window(0, 0, INT64_MIN, INT64_MAX).size(), 400u);
  EXPECT_EQ(r.spans_in_window(0, 1, INT64_MIN, INT64_MAX).size(), 100u);
  w.flush();
  EXPECT_EQ(r.span_count(), 520);
  for (size_t i = 520; i < t.spans.size(); ++i) w.add_span(t.spans[i]);
  // The writer closes while the reader still holds the file.
  EXPECT_NO_THROW(w.close());
  EXPECT_TRUE(r.complete());
  const Trace all = r.load_all();
  ASSERT_EQ(all.spans.size(), t.spans.size());
  for (size_t i = 0; i < t.spans.size(); ++i) ASSERT_TRUE(same_span(all.spans[i], t.spans[i])) << i;
  EXPECT_EQ(r.collectives_of(0).size(), 200u);
  EXPECT_EQ(r.collectives_of(1).size(), 200u);
}

TEST(StoreLive, ConcurrentReaderNeverBlocksTheWriterAndSeesWholeBatches) {
  TempDir dir;
  const auto path = dir.path("live.db");
  const Trace t = make_trace(2, 1500);  // 6000 spans
  constexpr size_t kBatch = 250;
  TraceWriter w(path, kBatch);
  w.set_meta(t.meta);
  write_strings(w, t);
  w.flush();  // the file has its strings and metadata before the reader starts

  std::atomic<bool> done{false}, failed{false};
  std::atomic<int> reads{0};
  std::vector<std::string> problems;
  std::thread reader([&] {
    try {
      TraceReader r(path);
      int64_t last = 0;
      while (!done.load()) {
        const int64_t n = r.span_count();
        const auto loaded = static_cast<int64_t>(r.load_all(2).spans.size());
        if (n % static_cast<int64_t>(kBatch) != 0) problems.push_back("partial batch " + std::to_string(n));
        if (n < last || loaded < n) problems.push_back("went back: " + std::to_string(n));
        last = n;
        reads.fetch_add(1);
      }
    } catch (const std::exception& e) {
      problems.push_back(e.what());
      failed = true;
    }
  });
  // The writer goes on regardless of the reader; each batch is visible once flushed.
  for (size_t i = 0; i < t.spans.size(); ++i) {
    ASSERT_NO_THROW(w.add_span(t.spans[i]));
    if (i % 500 == 0) std::this_thread::yield();
  }
  while (reads.load() < 3 && !failed.load()) std::this_thread::yield();
  done = true;
  reader.join();
  EXPECT_TRUE(problems.empty()) << problems.front();
  EXPECT_NO_THROW(w.close());
  TraceReader r(path);
  EXPECT_TRUE(r.complete());
  EXPECT_EQ(r.span_count(), 6000);
}

// The bytes of every file in `dir`, by name.
std::vector<std::pair<std::string, std::string>> snapshot_dir(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream f(e.path(), std::ios::binary);
    out.emplace_back(e.path().filename().string(),
                     std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(StoreLive, ReadingAClosedTraceChangesNothing) {
  TempDir dir;
  const auto path = dir.path("t.db");
  write_trace(make_trace(2, 300), path);
  const auto before = snapshot_dir(fs::path(path).parent_path().string());
  ASSERT_EQ(before.size(), 1u);  // one self-contained file
  {
    TraceReader r(path);
    EXPECT_EQ(r.load_all().spans.size(), 1200u);
    EXPECT_EQ(r.spans_in_window(1, 1, INT64_MIN, INT64_MAX).size(), 300u);
    EXPECT_EQ(r.collectives_of(0).size(), 300u);
    EXPECT_EQ(r.step_aggregates().size(), 2u * 6u);
  }
  EXPECT_EQ(snapshot_dir(fs::path(path).parent_path().string()), before);
}

// Runs `fn` in a child process without write permission on anything here: as root (which
// ignores file modes) the child first becomes nobody. Returns the child's exit status, or -1 when
// the privileges cannot be dropped.
template <class Fn>
int run_unprivileged(Fn fn) {
  const pid_t pid = fork();
  if (pid < 0) return -2;
  if (pid == 0) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(100);
    int code = 3;
    try {
      code = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      code = 4;
    }
    _exit(code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status)) return -3;
  return WEXITSTATUS(status) == 100 ? -1 : WEXITSTATUS(status);
}

// Makes `dir` and every file in it read-only (files 0444, directory 0555).
void make_read_only(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) fs::permissions(e.path(), fs::perms(0444));
  fs::permissions(dir, fs::perms(0555));
}

void make_writable(const std::string& dir) { fs::permissions(dir, fs::perms(0755)); }

// Runs `fn` unprivileged with `dir` read-only; expects it to return 0 (skips where privileges
// cannot be dropped).
template <class Fn>
void expect_reads_read_only(const std::string& dir, Fn fn) {
  make_read_only(dir);
  const int rc = run_unprivileged(fn);
  make_writable(dir);
  if (rc == -1) GTEST_SKIP() << "cannot drop root privileges here to test file permissions";
  EXPECT_EQ(rc, 0);
}

TEST(StoreLive, ReadsWithoutWritePermission) {
  TempDir dir;
  const auto sub = dir.path("ro");
  fs::create_directories(sub);
  const auto path = sub + "/t.db";
  write_trace(make_trace(2, 300), path);
  expect_reads_read_only(sub, [&] {
    TraceReader r(path);
    if (!r.complete()) return 1;
    if (r.load_all().spans.size() != 1200u) return 2;
    if (r.collectives_of(0).size() != 300u) return 5;
    return 0;
  });
  EXPECT_FALSE(fs::exists(path + "-wal"));
  EXPECT_FALSE(fs::exists(path + "-shm"));
}

TEST(StoreLive, ReadsAnUnclosedTraceWithoutWritePermission) {
  TempDir dir;
  const auto sub = dir.path("ro");
  fs::create_directories(sub);
  const auto path = sub + "/died.db";
  const Trace t = make_trace(2, 1000);
  // A writer that flushed 2500 spans and died: its file is in WAL mode, with -wal and -shm.
  ASSERT_TRUE(testing::write_then_die(path, t, 2500, 0));
  ASSERT_TRUE(fs::exists(path + "-wal"));
  expect_reads_read_only(sub, [&] {
    TraceReader r(path);
    if (r.complete()) return 1;
    if (r.span_count() != 2500) return 2;
    if (r.load_all().spans.size() != 2500u) return 5;
    return 0;
  });
}

TEST(StoreLive, ReadsATraceClosedUnderAReaderWithoutWritePermission) {
  TempDir dir;
  const auto sub = dir.path("ro");
  fs::create_directories(sub);
  const auto path = sub + "/t.db";
  const Trace t = make_trace(1, 300);
  {
    // close() cannot leave WAL mode while a reader holds the file: the file stays a WAL database.
    TraceWriter w(path, 100);
    write_strings(w, t);
    w.add_spans(t.spans);
    w.flush();
    TraceReader r(path);
    EXPECT_EQ(r.span_count(), 600);
    w.close();
    EXPECT_TRUE(r.complete());
  }
  expect_reads_read_only(sub, [&] {
    TraceReader r(path);
    if (!r.complete()) return 1;
    if (r.load_all().spans.size() != 600u) return 2;
    return 0;
  });
}

// The profiler's per-rank tables, as profiler/src/capture/flight_recorder.cpp creates them.
void add_flight_tables(const std::string& path, int32_t rank, int records) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  std::string sql =
      "CREATE TABLE flight_records (rank INTEGER, comm INTEGER, seq INTEGER, op INTEGER, bytes "
      "INTEGER, dtype INTEGER, peer INTEGER, step INTEGER, state INTEGER, scheduled_ns INTEGER, "
      "started_ns INTEGER, completed_ns INTEGER);"
      "CREATE TABLE rank_status (rank INTEGER PRIMARY KEY, state INTEGER, step INTEGER, detail "
      "TEXT);";
  for (int i = 0; i < records; ++i) {
    sql += "INSERT INTO flight_records VALUES(" + std::to_string(rank) + ",0," + std::to_string(i) +
           ",1,4096,0,-1,0,2,10,20,30);";
  }
  sql += "INSERT INTO rank_status VALUES(" + std::to_string(rank) + ",1,3,'done');";
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_close(db);
}

int64_t count_rows(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_stmt* st = nullptr;
  int64_t n = -1;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
    n = sqlite3_column_int64(st, 0);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return n;
}

TEST(StoreLive, MergeCopiesEveryRanksFlightRecords) {
  TempDir dir;
  const Trace full = make_trace(3, 50);
  std::vector<std::string> inputs;
  const int records[] = {5, 3, 0};  // rank 2 has the tables but no records
  for (int r = 0; r < 3; ++r) {
    Trace part = full;
    part.spans.erase(std::remove_if(part.spans.begin(), part.spans.end(),
                                    [&](const Span& s) { return s.rank != r; }),
                     part.spans.end());
    inputs.push_back(dir.path("t.rank" + std::to_string(r) + ".db"));
    write_trace(part, inputs.back());
    add_flight_tables(inputs.back(), r, records[r]);
  }
  const auto out = dir.path("t.db");
  merge_traces(inputs, out);
  EXPECT_EQ(count_rows(out, "SELECT count(*) FROM flight_records"), 8);
  EXPECT_EQ(count_rows(out, "SELECT count(*) FROM flight_records WHERE rank=0"), 5);
  EXPECT_EQ(count_rows(out, "SELECT count(*) FROM flight_records WHERE rank=1"), 3);
  EXPECT_EQ(count_rows(out, "SELECT SUM(seq) FROM flight_records"), (0 + 1 + 2 + 3 + 4) + (0 + 1 + 2));
  EXPECT_EQ(count_rows(out, "SELECT SUM(completed_ns) FROM flight_records"), 8 * 30);
  EXPECT_EQ(count_rows(out, "SELECT count(*) FROM rank_status"), 3);
  EXPECT_EQ(count_rows(out, "SELECT SUM(step) FROM rank_status"), 9);
  // The merged file is still an ordinary trace.
  TraceReader r(out);
  EXPECT_TRUE(r.complete());
  EXPECT_EQ(r.span_count(), static_cast<int64_t>(full.spans.size()));
  // The inputs were only read.
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(count_rows(inputs[rank], "SELECT count(*) FROM flight_records"), records[rank]);
  }
}

TEST(StoreLive, MergeWithoutFlightRecordsAddsNoTable) {
  TempDir dir;
  const auto a = dir.path("a.db");
  const auto b = dir.path("b.db");
  write_trace(make_trace(1, 20), a);
  write_trace(make_trace(1, 20, 2), b);
  const auto out = dir.path("m.db");
  merge_traces({a, b}, out);
  EXPECT_EQ(count_rows(out, "SELECT count(*) FROM sqlite_master WHERE name='flight_records'"), 0);
  EXPECT_EQ(TraceReader(out).span_count(), 80);
}

TEST(StoreLive, MergeWithMismatchedSideTableIsAnInputError) {
  TempDir dir;
  const auto a = dir.path("a.db");
  const auto b = dir.path("b.db");
  write_trace(make_trace(1, 20), a);
  write_trace(make_trace(1, 20, 2), b);
  add_flight_tables(a, 0, 2);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(b.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE flight_records(rank INTEGER); INSERT INTO flight_records VALUES(1)",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  const auto out = dir.path("m.db");
  try {
    merge_traces({a, b}, out);
    FAIL() << "merged";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(b), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".partial"));
}

}  // namespace
}  // namespace orrery::traces
