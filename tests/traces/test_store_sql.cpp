// Schema version 2: the per-span SQL table on request (export_sqlite, sql_spans), collectives
// found through the blocks' communicator ranges, and version-1 files refused by name.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <tuple>

#include "orrery/common/error.hpp"
#include "orrery/traces/store.hpp"
#include "test_util.hpp"

namespace orrery::traces {
namespace {

using testing::make_trace;
using testing::same_span;
using testing::TempDir;

// One integer from a SQL query on `path`, opened read-only.
int64_t sql_int(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  int64_t v = -12345;
  if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW) {
    v = sqlite3_column_int64(st, 0);
  } else {
    ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

TEST(StoreSql, ExportAddsTheSpansTableWithEveryAttribute) {
  TempDir dir;
  const Trace t = make_trace(3, 500);  // 3 ranks x 2 streams x 500 spans
  const auto path = dir.path("t.db");
  const auto out = dir.path("sql.db");
  write_trace(t, path);
  export_sqlite(path, out);
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));

  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM spans"), 3000);
  int64_t comm0 = 0, step2 = 0, dur = 0, layer_sum = 0;
  for (const auto& s : t.spans) {
    comm0 += s.comm == 0 ? 1 : 0;
    step2 += s.step == 2 ? 1 : 0;
    dur += s.end_ns - s.start_ns;
    layer_sum += s.layer;
  }
  EXPECT_EQ(comm0, 3 * 250);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM spans WHERE comm=0"), comm0);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM spans WHERE step=2"), step2);
  EXPECT_EQ(sql_int(out, "SELECT SUM(end_ns - start_ns) FROM spans"), dur);
  EXPECT_EQ(sql_int(out, "SELECT SUM(layer) FROM spans"), layer_sum);
  EXPECT_EQ(sql_int(out,
                    "SELECT count(*) FROM spans s JOIN strings n ON n.id = s.name "
                    "WHERE n.text = 'all_reduce'"),
            3 * 500);
  EXPECT_EQ(sql_int(out,
                    "SELECT count(*) FROM sqlite_master WHERE type='index' AND name IN "
                    "('spans_by_comm_seq','spans_by_step','counters_by_rank')"),
            3);
  // Counter samples one row each beside the blocks, for SQL users.
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM counters"), 3 * 20);
  EXPECT_EQ(sql_int(out,
                    "SELECT count(*) FROM counters WHERE rank=2 AND ts_ns=1000+100*19 AND "
                    "value=1024.0*(19+2)+0.25"),
            1);
  EXPECT_EQ(sql_int(out, "SELECT value FROM meta WHERE key='sql_spans'"), 1);
  EXPECT_EQ(sql_int(out, "PRAGMA user_version"), kSchemaVersion);
  // The source has neither.
  EXPECT_EQ(sql_int(path, "SELECT count(*) FROM sqlite_master WHERE name='spans'"), 0);
  EXPECT_EQ(sql_int(path, "SELECT count(*) FROM meta WHERE key='sql_spans'"), 0);

  // The copy is an ordinary trace to the reader, span for span.
  TraceReader r(out);
  EXPECT_TRUE(r.complete());
  const Trace back = r.load_all();
  ASSERT_EQ(back.spans.size(), t.spans.size());
  for (size_t i = 0; i < t.spans.size(); ++i)
    ASSERT_TRUE(same_span(back.spans[i], t.spans[i])) << i;
  EXPECT_EQ(back.strings.all(), t.strings.all());
  EXPECT_EQ(back.counters.size(), t.counters.size());
}

TEST(StoreSql, ExportRefusesItsInputAsOutputAndBadInput) {
  TempDir dir;
  const auto path = dir.path("t.db");
  write_trace(make_trace(1, 10), path);
  EXPECT_THROW(export_sqlite(path, path), InputError);
  EXPECT_THROW(export_sqlite(dir.path("missing.db"), dir.path("o.db")), InputError);
  EXPECT_FALSE(std::filesystem::exists(dir.path("o.db")));
  EXPECT_EQ(TraceReader(path).span_count(), 20);
}

TEST(StoreSql, BlocksCarryTheirCommunicatorRange) {
  TempDir dir;
  const Trace t = make_trace(2, 100);  // comm spans alternate comm 0 / 1 on stream 1
  const auto path = dir.path("t.db");
  write_trace(t, path);
  // Compute-stream blocks have no communicator; comm-stream blocks hold comms 0..1.
  EXPECT_EQ(sql_int(path, "SELECT count(*) FROM blocks WHERE stream=0 AND min_comm IS NULL"),
            sql_int(path, "SELECT count(*) FROM blocks WHERE stream=0"));
  EXPECT_EQ(sql_int(path,
                    "SELECT count(*) FROM blocks WHERE stream=1 AND "
                    "(min_comm<>0 OR max_comm<>1)"),
            0);
  EXPECT_EQ(sql_int(path, "SELECT count(*) FROM blocks WHERE stream=1"), 2);
}

TEST(StoreSql, CollectivesOfSkipsBlocksOutsideTheirRangeExactly) {
  TempDir dir;
  // One stream whose spans use communicators 0 then 2 (never 1; one of its blocks holds both, so
  // its range covers 1), and a stream whose one block mixes 1 and 3: every answer must still be
  // exactly the spans of that communicator.
  Trace t;
  t.meta.world_size = 2;
  const NameId n = t.strings.intern("op");
  for (int32_t comm : {0, 2}) {
    for (int i = 0; i < 1500; ++i) {  // more than one block (1024 spans) per communicator
      Span s{0, 1, SpanKind::Collective, n, comm * 1000000 + i * 10, comm * 1000000 + i * 10 + 5};
      s.comm = comm;
      s.seq = i;
      t.spans.push_back(s);
    }
  }
  for (int i = 0; i < 10; ++i) {
    Span s{1, 1, SpanKind::P2P, n, i * 10, i * 10 + 5};
    s.comm = i % 2 ? 3 : 1;
    s.seq = i / 2;
    s.peer = 0;
    t.spans.push_back(s);
  }
  t.sort_spans();
  const auto path = dir.path("t.db");
  write_trace(t, path);
  TraceReader r(path);
  EXPECT_EQ(r.collectives_of(0).size(), 1500u);
  const auto two = r.collectives_of(2);
  ASSERT_EQ(two.size(), 1500u);
  for (size_t i = 0; i < two.size(); ++i) {
    EXPECT_EQ(two[i].comm, 2);
    EXPECT_EQ(two[i].seq, static_cast<int64_t>(i));
  }
  const auto one = r.collectives_of(1);
  ASSERT_EQ(one.size(), 5u);
  for (const auto& s : one) EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(r.collectives_of(3).size(), 5u);
  EXPECT_TRUE(r.collectives_of(4).empty());
  EXPECT_TRUE(r.collectives_of(-1).empty());
}

TEST(StoreSql, VersionOneFileIsRefusedByName) {
  TempDir dir;
  const auto path = dir.path("v1.db");
  write_trace(make_trace(1, 10), path);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version=1", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  try {
    TraceReader r(path);
    FAIL() << "a version-1 file opened";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ": schema version 1, expected 3 (or 2, without block checksums)");
  }
}

}  // namespace
}  // namespace orrery::traces
