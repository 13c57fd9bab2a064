// `orrery info`, `orrery info --verify` and `orrery export` run as a user runs them: on a trace
// written here, on one with a flipped bit, on a schema-2 file, on bad files and with a bad
// --format. Exit codes: 0 ok, 2 bad input.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../test_util.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::traces {
namespace {

struct Result {
  int rc = -1;
  std::string out;  // stdout and stderr together
};

Result run(const std::string& args) {
  const std::string cmd = std::string(ORRERY_BIN) + " " + args + " 2>&1";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(CliInfo, JsonDescribesTheTrace) {
  testing::TempDir dir;
  const Trace t = testing::make_trace(3, 100);
  const auto path = dir.path("t.db");
  write_trace(t, path);
  const Result r = run("info " + path + " --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["schema_version"], kSchemaVersion);
  EXPECT_EQ(j["block_checksums"], true);
  EXPECT_EQ(j["complete"], true);
  EXPECT_EQ(j["source"], "synth");
  EXPECT_EQ(j["scenario_name"], "test");
  EXPECT_EQ(j["world_size"], 3);
  EXPECT_EQ(j["layout"]["dp"], 3);
  EXPECT_EQ(j["span_count"], 600);
  EXPECT_EQ(j["counter_count"], 60);
  EXPECT_EQ(j["ranks"].size(), 3u);
  EXPECT_EQ(j["streams"].size(), 6u);
  EXPECT_EQ(j["streams"][1]["name"], "comm");
  EXPECT_EQ(j["streams"][1]["spans"], 100);
  EXPECT_EQ(j["communicators"].size(), 2u);
  EXPECT_EQ(j["extra"]["note"], "unit test");
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const auto& s : t.spans) lo = std::min(lo, s.start_ns), hi = std::max(hi, s.end_ns);
  EXPECT_EQ(j["time_range"]["start_ns"], lo);
  EXPECT_EQ(j["time_range"]["end_ns"], hi);

  const Result text = run("info " + path);
  ASSERT_EQ(text.rc, 0) << text.out;
  EXPECT_NE(text.out.find("spans            600"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("dp=3 tp=1 pp=1"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("checksums        CRC32C on every span and counter block"),
            std::string::npos)
      << text.out;
}

// Flips bit 2 of byte 9 of the packed bytes of the span block of (rank 1, stream 1), as a bad disk
// sector or a bad copy would; returns the block's id.
int64_t flip_one_bit(const std::string& path) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, "SELECT id, packed FROM blocks WHERE rank=1 AND stream=1", -1,
                               &st, nullptr),
            SQLITE_OK);
  EXPECT_EQ(sqlite3_step(st), SQLITE_ROW);
  const int64_t id = sqlite3_column_int64(st, 0);
  const auto* p = static_cast<const unsigned char*>(sqlite3_column_blob(st, 1));
  std::string bytes(reinterpret_cast<const char*>(p),
                    static_cast<size_t>(sqlite3_column_bytes(st, 1)));
  sqlite3_finalize(st);
  bytes.at(9) = static_cast<char>(bytes.at(9) ^ 0x04);
  EXPECT_EQ(sqlite3_prepare_v2(db, "UPDATE blocks SET packed=?1 WHERE id=?2", -1, &st, nullptr),
            SQLITE_OK);
  sqlite3_bind_blob(st, 1, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 2, id);
  EXPECT_EQ(sqlite3_step(st), SQLITE_DONE);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return id;
}

TEST(CliInfo, VerifyExitCodes) {
  testing::TempDir dir;
  const auto path = dir.path("t.db");
  write_trace(testing::make_trace(2, 12), path);
  Result r = run("info --verify " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(
      r.out.find(path + ": checked 4 span blocks (48 spans) and 2 counter blocks (40 samples)"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("ok: every block matches its CRC32C and decodes"), std::string::npos)
      << r.out;

  const int64_t id = flip_one_bit(path);
  const std::string block = "span block " + std::to_string(id) + " (rank 1, stream 1)";
  r = run("info --verify " + path);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find(path + ": 1 of 6 blocks damaged:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  " + block + ": checksum mismatch: CRC32C 0x"), std::string::npos)
      << r.out;
  r = run("info --verify --json " + path);
  EXPECT_EQ(r.rc, 2) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["span_blocks"], 4);
  EXPECT_EQ(j["spans"], 36);  // the spans of the 3 whole blocks
  ASSERT_EQ(j["damaged"].size(), 1u);
  EXPECT_EQ(j["damaged"][0].get<std::string>().rfind(block + ": checksum mismatch", 0), 0u);

  // Every command that reads the spans stops with the same one-line error, exit 2.
  for (const std::string& cmd :
       {std::string("report "), "export --format chrome --out " + dir.path("x.json") + " "}) {
    r = run(cmd + path);
    EXPECT_EQ(r.rc, 2) << cmd << r.out;
    EXPECT_NE(r.out.find(path + ": corrupt trace (" + block + ": checksum mismatch"),
              std::string::npos)
        << cmd << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << cmd << r.out;
  }
  // `orrery info` alone does not read the blocks.
  EXPECT_EQ(run("info " + path).rc, 0);
}

// Zoom levels: `info` describes them, `info --verify` checks every chunk (a damaged one exits 2
// naming it), `info --index` rewrites them (and makes a file without them whole again).
TEST(CliInfo, ZoomLevelsVerifiedAndRebuilt) {
  testing::TempDir dir;
  const auto path = dir.path("t.db");
  write_trace(testing::make_trace(2, 12), path);
  Result r = run("info " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("zoom levels      version 1, "), std::string::npos) << r.out;
  r = run("info --verify " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("  zoom levels: "), std::string::npos) << r.out;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "UPDATE zoom_chunks SET crc32c = (crc32c + 1) % 4294967296 WHERE rowid "
                         "= (SELECT min(rowid) FROM zoom_chunks)",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  r = run("info --verify " + path);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("corrupt zoom levels (chunk 0 of rank 0, stream 0, row 0, level 0): "
                       "checksum mismatch"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("1 of "), std::string::npos) << r.out;
  r = run("info --index " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find(path + ": zoom levels written (version 1, "), std::string::npos) << r.out;
  EXPECT_EQ(run("info --verify " + path).rc, 0);
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "DROP TABLE zoom_chunks", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  r = run("info " + path);
  EXPECT_NE(r.out.find("not used: the file has no zoom levels"), std::string::npos) << r.out;
  EXPECT_EQ(run("info --index " + path).rc, 0);
  EXPECT_EQ(run("info --verify " + path).rc, 0);
}

TEST(CliInfo, SchemaTwoFileSaysItHasNoChecksums) {
  const std::string path = std::string(ORRERY_TRACE_DATA) + "/schema2-ddp2.db";
  Result r = run("info " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("checksums        none (schema version 2, written before block checksums"),
            std::string::npos)
      << r.out;
  r = run("info --verify " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("checked 6 span blocks (44 spans) and 0 counter blocks (28 samples)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("ok: every block decodes"), std::string::npos) << r.out;
  EXPECT_EQ(run("report " + path).rc, 0);
}

TEST(CliInfo, BadFilesExitTwoWithOneLine) {
  testing::TempDir dir;
  const auto garbage = dir.path("garbage.db");
  std::ofstream(garbage) << std::string(5000, 'x');
  for (const auto& path : {garbage, dir.path("missing.db")}) {
    const Result r = run("info " + path);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(path), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
}

TEST(CliExport, ChromeJsonHasEveryEvent) {
  testing::TempDir dir;
  const Trace t = testing::make_trace(2, 50);
  const auto path = dir.path("t.db");
  write_trace(t, path);
  const auto out = dir.path("t.json");
  const Result r = run("export " + path + " --format chrome --out " + out + " --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["spans"], 200);
  std::ifstream f(out);
  const auto doc = nlohmann::json::parse(f);
  size_t x = 0, c = 0;
  for (const auto& e : doc["traceEvents"]) {
    x += e["ph"] == "X" ? 1 : 0;
    c += e["ph"] == "C" ? 1 : 0;
  }
  EXPECT_EQ(x, 200u);
  EXPECT_EQ(c, 40u);
}

TEST(CliExport, SqliteCopyHasTheSpansTable) {
  testing::TempDir dir;
  const auto path = dir.path("t.db");
  write_trace(testing::make_trace(2, 50), path);
  const auto out = dir.path("sql.db");
  const Result r = run("export " + path + " --format sqlite --out " + out + " --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["spans"], 200);
  EXPECT_EQ(j["counters"], 40);
  // The copy reads as the same trace (its SQL table is checked in test_store_sql.cpp).
  EXPECT_EQ(TraceReader(out).span_count(), 200);
  EXPECT_EQ(load_trace(out).spans.size(), 200u);
}

TEST(CliExport, UnknownFormatIsAnInputError) {
  testing::TempDir dir;
  const auto path = dir.path("t.db");
  write_trace(testing::make_trace(1, 5), path);
  const Result r = run("export " + path + " --format perfetto --out " + dir.path("x.json"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("perfetto"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir.path("x.json")));
}

}  // namespace
}  // namespace orrery::traces
