// `orrery info` and `orrery export` run as a user runs them: on a trace written here, on bad
// files and with a bad --format. Exit codes: 0 ok, 2 bad input.
#include <gtest/gtest.h>
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
