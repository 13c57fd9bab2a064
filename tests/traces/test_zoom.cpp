// Zoom levels (traces/zoom.hpp): counts, busy times and extents against the closed form on a
// hand-built trace at every level, from the file and computed in memory; files without them,
// stale or of another version (computed on open, and said why); a damaged chunk is an error
// naming the chunk, a damaged header (grid, rows) is not used; merge combines the inputs' levels.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>

#include "orrery/common/error.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/zoom.hpp"
#include "test_util.hpp"

namespace orrery::traces {
namespace {

using testing::TempDir;

Span span(int32_t rank, int32_t stream, int64_t start, int64_t end, SpanKind kind, NameId name) {
  Span s;
  s.rank = rank;
  s.stream = stream;
  s.start_ns = start;
  s.end_ns = end;
  s.kind = kind;
  s.name = name;
  return s;
}

// Rank 0, stream 0: a phase "step" over [0, 65536) (row 0) and 1022 ops "op" [64 i, 64 i + 16)
// (row 1); stream 1: one collective [1000, 1100). The busiest lane has 1023 spans: 4^3 level-0
// buckets of 1024 ns (a power of 4), 16 op periods each.
constexpr int64_t kOps = 1022, kBase = 1024, kPeriod = 64, kDur = 16;
Trace hand_built() {
  Trace t;
  t.meta.source = TraceSource::Synth;
  t.ranks.push_back(RankInfo{0, "h", "cpu", 0, 0, 0});
  t.streams.push_back(StreamInfo{0, 0, "compute"});
  t.streams.push_back(StreamInfo{0, 1, "comm"});
  const NameId step = t.strings.intern("step"), op = t.strings.intern("op");
  const NameId ar = t.strings.intern("all_reduce");
  t.spans.push_back(span(0, 0, 0, 64 * kBase, SpanKind::Phase, step));
  for (int64_t i = 0; i < kOps; ++i)
    t.spans.push_back(span(0, 0, kPeriod * i, kPeriod * i + kDur, SpanKind::Compute, op));
  t.spans.push_back(span(0, 1, 1000, 1100, SpanKind::Collective, ar));
  t.sort_spans();
  return t;
}

// Checks every level of `z` against the closed form.
void expect_closed_form(const ZoomIndex& z) {
  const NameId op_name = hand_built().strings.intern("op");
  const ZoomGrid& g = z.grid();
  ASSERT_EQ(g.levels, 3);
  ASSERT_EQ(g.base_ns, kBase);
  ASSERT_EQ(g.origin_ns, 0);
  ASSERT_EQ(z.span_count(), 1024);
  ASSERT_EQ(z.lanes().size(), 2u);
  EXPECT_EQ(z.lanes()[0].rows, 2);
  EXPECT_EQ(z.lanes()[0].spans, 1023);
  EXPECT_EQ(z.lanes()[1].rows, 1);
  for (int k = 0; k <= g.levels; ++k) {
    const int64_t n = g.buckets(k), w = g.bucket_ns(k), per = 16LL << (2 * k);  // ops per bucket
    ASSERT_EQ(n * w, 64 * kBase);
    // Row 0: the phase covers every bucket whole; it starts in bucket 0.
    const auto phase = z.buckets(0, 0, 0, k, 0, n);
    ASSERT_EQ(static_cast<int64_t>(phase.size()), n) << "level " << k;
    for (int64_t i = 0; i < n; ++i) {
      const auto& b = phase[static_cast<size_t>(i)];
      EXPECT_EQ(b.index, i);
      EXPECT_EQ(b.count, i == 0 ? 1 : 0);
      EXPECT_EQ(b.busy_ns(), w);
      EXPECT_EQ(b.kind_ns[static_cast<int>(SpanKind::Phase)], w);
      EXPECT_EQ(b.lo_ns, i * w);
      EXPECT_EQ(b.hi_ns, (i + 1) * w);
      EXPECT_EQ(b.dominant(), SpanKind::Phase);
    }
    // Row 1: ops [per i, min(per (i + 1), kOps)); busy kDur each; extent from the first op's
    // start to the last op's end.
    const auto ops = z.buckets(0, 0, 1, k, 0, n);
    ASSERT_EQ(static_cast<int64_t>(ops.size()), n);
    for (int64_t i = 0; i < n; ++i) {
      const auto& b = ops[static_cast<size_t>(i)];
      const int64_t first = per * i, last = std::min(per * (i + 1), kOps) - 1;
      EXPECT_EQ(b.count, last - first + 1) << "level " << k << " bucket " << i;
      EXPECT_EQ(b.busy_ns(), kDur * (last - first + 1));
      EXPECT_EQ(b.kind_ns[static_cast<int>(SpanKind::Compute)], b.busy_ns());
      EXPECT_EQ(b.lo_ns, kPeriod * first);
      EXPECT_EQ(b.hi_ns, kPeriod * last + kDur);
      EXPECT_EQ(b.name, op_name);
    }
    // Stream 1: [1000, 1100) crosses the first boundary of level 0 only.
    const auto coll = z.buckets(0, 1, 0, k, 0, n);
    if (k == 0) {
      ASSERT_EQ(coll.size(), 2u);
      EXPECT_EQ(coll[0].count, 1);
      EXPECT_EQ(coll[0].busy_ns(), 24);
      EXPECT_EQ(coll[0].lo_ns, 1000);
      EXPECT_EQ(coll[0].hi_ns, 1024);
      EXPECT_EQ(coll[1].index, 1);
      EXPECT_EQ(coll[1].count, 0);
      EXPECT_EQ(coll[1].busy_ns(), 76);
      EXPECT_EQ(coll[1].lo_ns, 1024);
      EXPECT_EQ(coll[1].hi_ns, 1100);
    } else {
      ASSERT_EQ(coll.size(), 1u);
      EXPECT_EQ(coll[0].count, 1);
      EXPECT_EQ(coll[0].busy_ns(), 100);
      EXPECT_EQ(coll[0].kind_ns[static_cast<int>(SpanKind::Collective)], 100);
    }
  }
  // Spans starting in a range, from the levels: exact over whole buckets (the first quarter: the
  // phase, 16 x 16 ops, the collective), spread evenly inside one (half of level 0's bucket 1).
  EXPECT_EQ(z.spans_between(0, 64 * kBase), 1024);
  EXPECT_EQ(z.spans_between(0, 16 * kBase), 1 + 16 * 16 + 1);
  EXPECT_EQ(z.spans_between(kBase, kBase + kBase / 2), 8);
  // A sub-range reads only its buckets.
  const auto part = z.buckets(0, 0, 1, 0, 10, 13);
  ASSERT_EQ(part.size(), 3u);
  EXPECT_EQ(part.front().index, 10);
  EXPECT_EQ(part.back().index, 12);
}

void exec(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_close(db);
}

// Flips bit 0 of byte `at` of the packed bytes of the chunk selected by `where`.
void flip_bit(const std::string& path, const std::string& where, int at) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  const std::string sel = "SELECT rowid, packed FROM zoom_chunks WHERE " + where;
  ASSERT_EQ(sqlite3_prepare_v2(db, sel.c_str(), -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  const int64_t rowid = sqlite3_column_int64(st, 0);
  std::string bytes(static_cast<const char*>(sqlite3_column_blob(st, 1)),
                    static_cast<size_t>(sqlite3_column_bytes(st, 1)));
  sqlite3_finalize(st);
  ASSERT_GT(bytes.size(), static_cast<size_t>(at));
  bytes[static_cast<size_t>(at)] ^= 1;
  ASSERT_EQ(sqlite3_prepare_v2(db, "UPDATE zoom_chunks SET packed = ?1 WHERE rowid = ?2", -1, &st,
                               nullptr),
            SQLITE_OK);
  sqlite3_bind_blob(st, 1, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 2, rowid);
  ASSERT_EQ(sqlite3_step(st), SQLITE_DONE);
  sqlite3_finalize(st);
  sqlite3_close(db);
}

size_t z_chunks(const std::string& path) {
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "SELECT count(*) FROM zoom_chunks", -1, &st, nullptr);
  sqlite3_step(st);
  const auto n = static_cast<size_t>(sqlite3_column_int64(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(db);
  return n;
}

TEST(Zoom, LevelsWrittenWithTheTraceEqualTheClosedForm) {
  TempDir dir;
  const auto path = dir.path("z.db");
  write_trace(hand_built(), path);
  ZoomIndex z(path);
  EXPECT_TRUE(z.from_file()) << z.note();
  expect_closed_form(z);
  EXPECT_NE(zoom_summary(path).find("version 1, 4 levels, finest bucket 1024 ns, 2 lanes"),
            std::string::npos)
      << zoom_summary(path);
}

TEST(Zoom, InMemoryEqualsFile) {
  const auto a = compute_zoom_levels(hand_built());
  TempDir dir;
  const auto path = dir.path("z.db");
  write_trace(hand_built(), path);
  const auto b = compute_zoom_levels(TraceReader(path));
  ASSERT_EQ(a.chunks.size(), b.chunks.size());
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    EXPECT_EQ(a.chunks[i].packed, b.chunks[i].packed);
    EXPECT_EQ(a.chunks[i].crc32c, b.chunks[i].crc32c);
  }
  // What the writer stored, a lane at a time as it computed them (write_zoom_levels from the
  // reader), is the same chunks, lanes and grid.
  ZoomIndex stored(path);
  ASSERT_TRUE(stored.from_file()) << stored.note();
  EXPECT_EQ(stored.grid().base_ns, a.grid.base_ns);
  EXPECT_EQ(stored.grid().levels, a.grid.levels);
  ASSERT_EQ(stored.lanes().size(), a.lanes.size());
  std::vector<ZoomChunk> chunks;
  for (const auto& l : stored.lanes()) stored.stored_chunks(l.rank, l.stream, chunks);
  ASSERT_EQ(chunks.size(), a.chunks.size());
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].packed, a.chunks[i].packed) << i;
    EXPECT_EQ(chunks[i].level, a.chunks[i].level) << i;
    EXPECT_EQ(chunks[i].row, a.chunks[i].row) << i;
  }
}

TEST(Zoom, FileWithoutLevelsComputesThemOnOpenAndIndexWritesThem) {
  TempDir dir;
  const auto path = dir.path("old.db");
  write_trace(hand_built(), path);
  exec(path, "DROP TABLE zoom_levels; DROP TABLE zoom_lanes; DROP TABLE zoom_chunks;");
  {
    ZoomIndex z(path);
    EXPECT_FALSE(z.from_file());
    EXPECT_NE(z.note().find("the file has no zoom levels"), std::string::npos) << z.note();
    expect_closed_form(z);
  }
  EXPECT_NE(zoom_summary(path).find("not used: the file has no zoom levels"), std::string::npos);
  build_zoom_levels(path);
  ZoomIndex z(path);
  EXPECT_TRUE(z.from_file()) << z.note();
  expect_closed_form(z);
}

TEST(Zoom, StaleOrOtherVersionIsNotUsed) {
  TempDir dir;
  const auto path = dir.path("z.db");
  write_trace(hand_built(), path);
  exec(path, "UPDATE zoom_levels SET span_count = 1000");
  {
    ZoomIndex z(path);
    EXPECT_FALSE(z.from_file());
    EXPECT_NE(z.note().find("stale (they cover 1000 spans, the trace has 1024)"), std::string::npos)
        << z.note();
    expect_closed_form(z);
  }
  exec(path, "UPDATE zoom_levels SET span_count = 1024, version = 7");
  ZoomIndex z(path);
  EXPECT_FALSE(z.from_file());
  EXPECT_NE(z.note().find("version 7, expected 1"), std::string::npos) << z.note();
  expect_closed_form(z);
}

TEST(Zoom, DamagedHeaderIsNotUsed) {
  TempDir dir;
  const auto path = dir.path("z.db");
  write_trace(hand_built(), path);
  exec(path, "UPDATE zoom_lanes SET rows = 1 WHERE stream = 0");  // would hide the ops row
  ZoomIndex z(path);
  EXPECT_FALSE(z.from_file());
  EXPECT_NE(z.note().find("zoom header (grid and lanes) is damaged: checksum mismatch"),
            std::string::npos)
      << z.note();
  expect_closed_form(z);  // computed on open
}

TEST(Zoom, CorruptChunkIsAnErrorNamingIt) {
  TempDir dir;
  const auto path = dir.path("z.db");
  write_trace(hand_built(), path);
  flip_bit(path, "rank = 0 AND stream = 0 AND row = 1 AND level = 2", 3);
  ZoomIndex z(path);
  ASSERT_TRUE(z.from_file());
  EXPECT_NO_THROW(z.buckets(0, 0, 1, 1, 0, 16));  // other chunks still read
  try {
    z.buckets(0, 0, 1, 2, 0, 4);
    FAIL() << "a damaged chunk was decoded";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("corrupt zoom levels (chunk 0 of rank 0, stream 0, row 1, level 2): checksum "
                     "mismatch"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("orrery info --index"), std::string::npos) << m;
  }
  // Rebuilding repairs it.
  build_zoom_levels(path);
  expect_closed_form(ZoomIndex(path));
}

TEST(Zoom, MergeRebuildsTheLevelsOfTheMergedSpans) {
  TempDir dir;
  Trace a = hand_built();
  Trace b = hand_built();
  for (auto& s : b.spans) s.rank = 1;
  b.ranks[0].rank = 1;
  for (auto& s : b.streams) s.rank = 1;
  write_trace(a, dir.path("a.db"));
  write_trace(b, dir.path("b.db"));
  merge_traces({dir.path("a.db"), dir.path("b.db")}, dir.path("m.db"));
  ZoomIndex z(dir.path("m.db"));
  EXPECT_TRUE(z.from_file()) << z.note();
  EXPECT_EQ(z.span_count(), 2048);
  ASSERT_EQ(z.lanes().size(), 4u);
  EXPECT_EQ(z.lanes()[2].rank, 1);
  // The busiest lane has as many spans as each input's: the same grid.
  EXPECT_EQ(z.grid().levels, 3);
  EXPECT_EQ(z.grid().base_ns, kBase);
  int64_t count = 0, busy = 0;
  for (const auto& bk : z.buckets(1, 0, 1, z.grid().levels, 0, 1)) {
    count += bk.count;
    busy += bk.busy_ns();
  }
  EXPECT_EQ(count, kOps);
  EXPECT_EQ(busy, kDur * kOps);
}

// Per-rank files whose ranges differ: the merged file's levels, combined from the inputs' levels,
// equal the levels computed from the merged spans on the same grid, bucket for bucket; with an
// input without levels they are computed from the spans, and equal those too.
TEST(Zoom, MergedLevelsFromTheInputsEqualThoseOfTheMergedSpans) {
  TempDir dir;
  std::vector<std::string> inputs;
  Trace all;
  for (int r = 0; r < 3; ++r) {
    Trace t = testing::make_trace(1, 700 + 300 * r, 11 + r);
    for (auto& s : t.spans) {
      s.rank = r;
      s.start_ns += 12345 * r;
      s.end_ns += 12345 * r;
    }
    for (auto& s : t.streams) s.rank = r;
    for (auto& c : t.counters) c.rank = r;
    t.ranks[0].rank = r;
    inputs.push_back(dir.path("r" + std::to_string(r) + ".db"));
    write_trace(t, inputs.back());
    for (const auto& s : t.spans) all.spans.push_back(s);
  }
  auto same = [&](const std::string& merged) {
    ZoomIndex z(merged);
    ASSERT_TRUE(z.from_file()) << z.note();
    const auto expect = compute_zoom_levels(TraceReader(merged).load_all(), z.grid());
    ASSERT_EQ(expect.lanes.size(), z.lanes().size());
    for (size_t l = 0; l < expect.lanes.size(); ++l) {
      EXPECT_EQ(expect.lanes[l].rows, z.lanes()[l].rows);
      EXPECT_EQ(expect.lanes[l].spans, z.lanes()[l].spans);
    }
    ASSERT_EQ(expect.chunks.size(), z_chunks(merged));
    for (const auto& c : expect.chunks) {
      const auto want = decode_zoom_chunk(c, z.grid(), merged);
      const auto got = z.buckets(c.rank, c.stream, c.row, c.level, c.chunk * kZoomChunkBuckets,
                                 (c.chunk + 1) * kZoomChunkBuckets);
      ASSERT_EQ(want.size(), got.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(want[i].index, got[i].index);
        EXPECT_EQ(want[i].count, got[i].count);
        EXPECT_EQ(want[i].kind_ns, got[i].kind_ns);
        EXPECT_EQ(want[i].lo_ns, got[i].lo_ns);
        EXPECT_EQ(want[i].hi_ns, got[i].hi_ns);
      }
    }
  };
  const auto m1 = dir.path("m1.db");
  merge_traces(inputs, m1);
  ASSERT_TRUE(merge_zoom_levels(inputs, m1).has_value());
  same(m1);
  exec(inputs[1], "DROP TABLE zoom_chunks");
  EXPECT_FALSE(merge_zoom_levels(inputs, m1).has_value());
  const auto m2 = dir.path("m2.db");
  merge_traces(inputs, m2);
  same(m2);
}

// Per-rank files on one grid (the usual case: the ranks of one run): the merge copies each lane's
// stored chunks instead of decoding and re-deriving them, and the chunks are the same as the
// re-derived ones, byte for byte; a damaged chunk of an input is still an error naming it.
TEST(Zoom, MergedLevelsCopiedFromInputsOnTheSameGridEqualTheDerivedOnes) {
  TempDir dir;
  std::vector<std::string> inputs;
  for (int r = 0; r < 3; ++r) {
    Trace t = testing::make_trace(1, 900, 21);  // the same time range: one grid
    for (auto& s : t.spans) s.rank = r;
    for (auto& s : t.streams) s.rank = r;
    for (auto& c : t.counters) c.rank = r;
    t.ranks[0].rank = r;
    inputs.push_back(dir.path("r" + std::to_string(r) + ".db"));
    write_trace(t, inputs.back());
  }
  const auto m = dir.path("m.db");
  merge_traces(inputs, m);
  const ZoomGrid g = ZoomIndex(m).grid();
  for (const auto& in : inputs) {
    const ZoomGrid gi = ZoomIndex(in).grid();
    ASSERT_EQ(gi.origin_ns, g.origin_ns);
    ASSERT_EQ(gi.base_ns, g.base_ns);
    ASSERT_EQ(gi.levels, g.levels);
  }
  const auto copied = merge_zoom_levels(inputs, m, true);
  const auto derived = merge_zoom_levels(inputs, m, false);
  ASSERT_TRUE(copied && derived);
  ASSERT_GT(copied->chunks.size(), 3u);
  ASSERT_EQ(copied->chunks.size(), derived->chunks.size());
  for (size_t i = 0; i < copied->chunks.size(); ++i) {
    const ZoomChunk &a = copied->chunks[i], &b = derived->chunks[i];
    EXPECT_EQ(std::tie(a.rank, a.stream, a.row, a.level, a.chunk, a.buckets, a.crc32c),
              std::tie(b.rank, b.stream, b.row, b.level, b.chunk, b.buckets, b.crc32c));
    EXPECT_EQ(a.packed, b.packed);
  }
  exec(inputs[2], "UPDATE zoom_chunks SET packed = zeroblob(length(packed)) WHERE rowid = 1");
  try {
    merge_zoom_levels(inputs, m, true);
    FAIL() << "a damaged chunk was copied";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(inputs[2]), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace orrery::traces
