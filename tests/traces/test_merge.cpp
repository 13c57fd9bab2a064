// merge_traces on the per-rank files of one run (every rank interning the same names in the same
// order, so the span blocks, counter blocks, step rows and zoom chunks are copied as stored): the
// merged file holds the blocks of its inputs byte for byte, in input order, and the same spans,
// counters, steps, ranks, streams, communicators and metadata as the whole trace written in one
// go; a flipped bit in an input's block is an InputError naming the file and the block, and leaves
// no output (an older file of that name stays as it was).
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/synth.hpp"
#include "orrery/traces/zoom.hpp"
#include "test_util.hpp"

namespace orrery::traces {
namespace {

using testing::same_span;
using testing::TempDir;

// Every row of `sql` on the file at `path`, each row's columns as text (blobs in hex), '|'-joined.
std::vector<std::string> rows(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sql;
  std::vector<std::string> out;
  while (st && sqlite3_step(st) == SQLITE_ROW) {
    std::string row;
    for (int c = 0; c < sqlite3_column_count(st); ++c) {
      const auto* text = sqlite3_column_text(st, c);
      row += (c ? "|" : "") + std::string(text ? reinterpret_cast<const char*>(text) : "NULL");
    }
    out.push_back(std::move(row));
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

// Flips one bit of the packed bytes of row `id` of `table` (blocks or counter_blocks) in place.
void flip_bit(const std::string& path, const std::string& table, int64_t id, size_t byte, int bit) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  const std::string select = "SELECT packed FROM " + table + " WHERE id = ?1";
  ASSERT_EQ(sqlite3_prepare_v2(db, select.c_str(), -1, &st, nullptr), SQLITE_OK);
  sqlite3_bind_int64(st, 1, id);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  const auto* p = static_cast<const unsigned char*>(sqlite3_column_blob(st, 0));
  std::vector<unsigned char> bytes(p, p + sqlite3_column_bytes(st, 0));
  sqlite3_finalize(st);
  ASSERT_LT(byte, bytes.size());
  bytes[byte] ^= static_cast<unsigned char>(1u << bit);
  const std::string update = "UPDATE " + table + " SET packed = ?1 WHERE id = ?2";
  ASSERT_EQ(sqlite3_prepare_v2(db, update.c_str(), -1, &st, nullptr), SQLITE_OK);
  sqlite3_bind_blob(st, 1, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 2, id);
  EXPECT_EQ(sqlite3_step(st), SQLITE_DONE);
  sqlite3_finalize(st);
  sqlite3_close(db);
}

// A synthetic DDP run of `ranks` ranks written whole to <dir>/whole.db and as per-rank files, each
// with the run's string table (as every rank of a run interns the same names in the same order).
struct RunFiles {
  Trace full;
  std::string whole;
  std::vector<std::string> per_rank;
};

RunFiles write_run(const TempDir& dir, int ranks, int steps) {
  SynthOptions o;
  o.ranks = ranks;
  o.steps = steps;
  RunFiles run;
  run.full = synthesize(o);
  run.whole = dir.path("whole.db");
  write_trace(run.full, run.whole);
  for (int r = 0; r < ranks; ++r) {
    Trace part;
    part.meta = run.full.meta;
    part.ranks.push_back(run.full.ranks[static_cast<size_t>(r)]);
    for (const auto& s : run.full.streams)
      if (s.rank == r) part.streams.push_back(s);
    part.comms = run.full.comms;
    part.strings = run.full.strings;
    for (const auto& s : run.full.spans)
      if (s.rank == r) part.spans.push_back(s);
    for (const auto& c : run.full.counters)
      if (c.rank == r) part.counters.push_back(c);
    run.per_rank.push_back(dir.path("rank" + std::to_string(r) + ".db"));
    write_trace(part, run.per_rank.back());
  }
  return run;
}

constexpr const char* kBlockRows =
    "SELECT rank, stream, chunk, count, min_start_ns, max_end_ns, max_dur_ns, min_comm, max_comm, "
    "crc32c, hex(packed) FROM blocks ORDER BY id";
constexpr const char* kCounterBlockRows =
    "SELECT rank, name, count, min_ts_ns, max_ts_ns, crc32c, hex(packed) FROM counter_blocks "
    "ORDER BY id";
constexpr const char* kZoomChunkRows =
    "SELECT rank, stream, row, level, chunk, buckets, crc32c, hex(packed) FROM zoom_chunks "
    "ORDER BY rank, stream, row, level, chunk";

// The rows of `sql` of every input, in input order (sorted when `sort`).
std::vector<std::string> rows_of_all(const std::vector<std::string>& inputs, const char* sql,
                                     bool sort) {
  std::vector<std::string> out;
  for (const auto& in : inputs) {
    const auto r = rows(in, sql);
    out.insert(out.end(), r.begin(), r.end());
  }
  if (sort) std::sort(out.begin(), out.end());
  return out;
}

TEST(MergeRun, PerRankFilesMergeToTheBlocksOfTheInputsAndTheSpansOfTheWholeRun) {
  TempDir dir;
  const RunFiles run = write_run(dir, 6, 60);
  const auto out = dir.path("merged.db");
  merge_traces(run.per_rank, out);

  // The blocks, counter blocks and zoom chunks are the inputs', byte for byte (blocks in input
  // order: the merged ids follow the inputs).
  EXPECT_EQ(rows(out, kBlockRows), rows_of_all(run.per_rank, kBlockRows, false));
  EXPECT_EQ(rows(out, kCounterBlockRows), rows_of_all(run.per_rank, kCounterBlockRows, false));
  const auto chunks = rows(out, kZoomChunkRows);
  EXPECT_EQ(chunks, rows_of_all(run.per_rank, kZoomChunkRows, true));
  // The zoom levels and steps are those of the whole run written in one go.
  EXPECT_EQ(chunks, rows(run.whole, kZoomChunkRows));
  EXPECT_EQ(rows(out, "SELECT * FROM zoom_levels"), rows(run.whole, "SELECT * FROM zoom_levels"));
  const char* kLanes = "SELECT * FROM zoom_lanes ORDER BY rank, stream";
  EXPECT_EQ(rows(out, kLanes), rows(run.whole, kLanes));
  const char* kSteps = "SELECT * FROM steps ORDER BY rank, step";
  EXPECT_EQ(rows(out, kSteps), rows(run.whole, kSteps));

  // The same spans, counters, ranks, streams, communicators and names as the whole run.
  TraceReader r(out);
  EXPECT_TRUE(r.complete());
  const Trace m = r.load_all();
  const Trace w = load_trace(run.whole);
  ASSERT_EQ(m.spans.size(), run.full.spans.size());
  ASSERT_EQ(m.spans.size(), w.spans.size());
  for (size_t i = 0; i < m.spans.size(); ++i) {
    ASSERT_TRUE(same_span(m.spans[i], w.spans[i])) << i;
    ASSERT_EQ(m.strings.str(m.spans[i].name), w.strings.str(w.spans[i].name)) << i;
  }
  ASSERT_EQ(m.counters.size(), w.counters.size());
  for (size_t i = 0; i < m.counters.size(); ++i) {
    EXPECT_EQ(m.counters[i].rank, w.counters[i].rank);
    EXPECT_EQ(m.counters[i].ts_ns, w.counters[i].ts_ns);
    EXPECT_EQ(m.counters[i].value, w.counters[i].value);
    EXPECT_EQ(m.strings.str(m.counters[i].name), w.strings.str(w.counters[i].name));
  }
  EXPECT_EQ(rows(out, "SELECT * FROM ranks ORDER BY rank"),
            rows(run.whole, "SELECT * FROM ranks ORDER BY rank"));
  EXPECT_EQ(rows(out, "SELECT * FROM streams ORDER BY rank, stream"),
            rows(run.whole, "SELECT * FROM streams ORDER BY rank, stream"));
  EXPECT_EQ(rows(out, "SELECT * FROM communicators ORDER BY id"),
            rows(run.whole, "SELECT * FROM communicators ORDER BY id"));
  EXPECT_EQ(rows(out, "SELECT * FROM strings ORDER BY id"),
            rows(run.whole, "SELECT * FROM strings ORDER BY id"));
  // The metadata too, but for the merge's note of its inputs.
  const auto no_extra = "SELECT key, value FROM meta WHERE key <> 'extra_json' ORDER BY key";
  EXPECT_EQ(rows(out, no_extra), rows(run.whole, no_extra));
  const auto extra = nlohmann::json::parse(m.meta.extra_json);
  EXPECT_EQ(extra["merged_from"], 6);
  // Several blocks per stream (the copy keeps their order), several counter blocks per rank.
  const auto lanes = rows(out, "SELECT DISTINCT rank, stream FROM blocks");
  EXPECT_GT(rows(out, kBlockRows).size(), lanes.size());
  EXPECT_GT(rows(out, kCounterBlockRows).size(), run.full.ranks.size());

  // Closed forms: every rank's steps count its spans, and the file checks clean.
  int64_t counted = 0;
  for (const auto& s : r.step_aggregates()) counted += s.span_count;
  EXPECT_EQ(counted, static_cast<int64_t>(run.full.spans.size()));
  const auto v = r.verify();
  EXPECT_TRUE(v.damaged.empty());
  EXPECT_EQ(v.spans, static_cast<int64_t>(run.full.spans.size()));
  EXPECT_EQ(v.counter_samples, static_cast<int64_t>(run.full.counters.size()));
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
}

// The InputError message of merge_traces(inputs, out), or "(no InputError)".
std::string merge_error(const std::vector<std::string>& inputs, const std::string& out) {
  try {
    merge_traces(inputs, out);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

// The bytes of the file at `path`.
std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A damaged zoom chunk in the third rank's file: the merge writes the lanes of ranks 0 and 1 from
// their files' levels before it meets it; that transaction rolls back and the levels come from the
// merged spans instead (what an input's damaged levels get), the same levels as the merge of the
// undamaged files.
TEST(MergeRun, DamagedZoomChunkOfAnInputRollsBackToTheLevelsOfTheMergedSpans) {
  TempDir dir;
  const RunFiles run = write_run(dir, 4, 5);
  const auto good = dir.path("good.db");
  merge_traces(run.per_rank, good);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(run.per_rank[2].c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "UPDATE zoom_chunks SET crc32c = crc32c + 1 WHERE rowid = (SELECT "
                           "max(rowid) FROM zoom_chunks)",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    EXPECT_EQ(sqlite3_changes(db), 1);
    sqlite3_close(db);
  }
  ASSERT_FALSE(verify_zoom_levels(run.per_rank[2]).damaged.empty());
  const auto out = dir.path("merged.db");
  merge_traces(run.per_rank, out);
  for (const char* q :
       {"SELECT * FROM zoom_levels", "SELECT * FROM zoom_lanes ORDER BY rank, stream",
        "SELECT rank, stream, row, level, chunk, buckets, crc32c, hex(packed) FROM zoom_chunks "
        "ORDER BY rank, stream, row, level, chunk"})
    EXPECT_EQ(rows(out, q), rows(good, q)) << q;
  EXPECT_GT(rows(out, "SELECT DISTINCT rank FROM zoom_chunks").size(), 2u);
  const ZoomVerification v = verify_zoom_levels(out);
  EXPECT_EQ(v.unused, "");
  EXPECT_TRUE(v.damaged.empty());
  EXPECT_GT(v.chunks, 0);
}

TEST(MergeRun, FlippedBitInAnInputBlockNamesFileAndBlockAndLeavesNoOutput) {
  TempDir dir;
  const RunFiles run = write_run(dir, 4, 5);
  const auto out = dir.path("merged.db");
  merge_traces(run.per_rank, out);  // an older merge under the output's name
  const std::string before = file_bytes(out);
  ASSERT_FALSE(before.empty());

  // One bit of the third rank's second span block, then of its first counter block.
  const std::string& damaged = run.per_rank[2];
  flip_bit(damaged, "blocks", 2, 9, 2);
  const auto stream = rows(damaged, "SELECT stream FROM blocks WHERE id = 2").at(0);
  EXPECT_EQ(merge_error(run.per_rank, out), damaged +
                                                ": corrupt trace (span block 2 (rank 2, stream " +
                                                stream + "): checksum mismatch)");
  EXPECT_EQ(file_bytes(out), before);
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
  const auto fresh = dir.path("fresh.db");
  EXPECT_NE(merge_error(run.per_rank, fresh), "(no InputError)");
  EXPECT_FALSE(std::filesystem::exists(fresh));
  EXPECT_FALSE(std::filesystem::exists(fresh + ".partial"));

  // Repaired, the span blocks pass; a flipped bit of a counter block is named the same way.
  flip_bit(damaged, "blocks", 2, 9, 2);
  flip_bit(damaged, "counter_blocks", 1, 0, 0);
  const auto name = rows(damaged, "SELECT name FROM counter_blocks WHERE id = 1").at(0);
  EXPECT_EQ(merge_error(run.per_rank, fresh),
            damaged + ": corrupt trace (counter block 1 (rank 2, counter " + name +
                "): checksum mismatch)");
  EXPECT_FALSE(std::filesystem::exists(fresh));
  EXPECT_FALSE(std::filesystem::exists(fresh + ".partial"));
}

}  // namespace
}  // namespace orrery::traces
