// Losing no spans when a run fails, without MPI: the failure paths' flush of every live recorder,
// the periodic flush, the ranks' status rows, and salvage_failed_run() merging the per-rank files
// of a failed run and naming the rank that was lost.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "orrery/profiler/flight_recorder.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/launch.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime {
namespace {
namespace fs = std::filesystem;

std::string temp_path(const char* tag) {
  return ::testing::TempDir() + "orrery_failure_" + tag + "_" + std::to_string(::getpid()) + ".db";
}

traces::Span span_at(int32_t step, int64_t t, traces::NameId name) {
  traces::Span s;
  s.kind = traces::SpanKind::Compute;
  s.name = name;
  s.step = step;
  s.start_ns = t;
  s.end_ns = t + 10;
  return s;
}

TEST(RankFailure, FlushLiveWritesBufferedSpans) {
  const std::string path = temp_path("live");
  traces::TraceWriter writer(path);
  profiler::Recorder rec(&writer, 0);  // buffers 4096 spans per thread: none reach the writer
  const traces::NameId name = rec.intern("work");
  for (int i = 0; i < 100; ++i) rec.record(span_at(0, i * 100, name));
  EXPECT_EQ(traces::TraceReader(path).span_count(), 0);
  profiler::Recorder::flush_live();
  // Readable while the writer is still open (WAL), as the files of a killed rank are.
  EXPECT_EQ(traces::TraceReader(path).span_count(), 100);
  writer.close();
  fs::remove(path);
}

TEST(RankFailure, PeriodicFlushWritesWithoutBeingAsked) {
  const std::string path = temp_path("periodic");
  traces::TraceWriter writer(path);
  profiler::Recorder rec(&writer, 0);
  const traces::NameId name = rec.intern("work");
  for (int i = 0; i < 50; ++i) rec.record(span_at(1, i * 100, name));
  rec.start_periodic_flush(std::chrono::milliseconds(10));
  int64_t seen = 0;
  for (int tries = 0; tries < 500 && seen < 50; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    seen = traces::TraceReader(path).span_count();
  }
  EXPECT_EQ(seen, 50);
  rec.start_periodic_flush(std::chrono::milliseconds(0));  // stops it
  writer.close();
  fs::remove(path);
}

TEST(RankFailure, StatusRoundTripAndFinalStates) {
  const std::string path = temp_path("status");
  { traces::TraceWriter writer(path); }
  profiler::FlightRecorder fr;
  fr.set_rank(3);
  fr.set_status(profiler::RankState::Running, 4);
  fr.set_status(profiler::RankState::Failed, 4, "exit 1");
  fr.set_status(profiler::RankState::Stopped, 4, "SIGTERM");  // ignored: failed is final
  profiler::write_rank_status(path, fr.status());
  const auto rows = profiler::read_rank_status(path);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].rank, 3);
  EXPECT_EQ(rows[0].state, profiler::RankState::Failed);
  EXPECT_EQ(rows[0].step, 4);
  EXPECT_EQ(rows[0].detail, "exit 1");
  fs::remove(path);
}

// Per-rank files as a 4-rank run leaves them when rank `lost` dies in step 2: every rank has
// spans of steps 0 and 1, the survivors also of step 2 and a "stopped" status.
void write_rank_files(const std::string& out, int lost, bool lost_has_file) {
  for (int r = 0; r < 4; ++r) {
    if (r == lost && !lost_has_file) continue;
    const std::string file = rank_trace_path(out, r);
    traces::TraceWriter writer(file);
    traces::RunMeta meta;
    meta.source = traces::TraceSource::Real;
    meta.world_size = 4;
    meta.extra_json = "{\"threads\": 1}";
    writer.set_meta(meta);
    traces::RankInfo ri;
    ri.rank = r;
    writer.add_rank(ri);
    profiler::Recorder rec(&writer, r);
    const traces::NameId name = rec.intern("step");
    for (int step = 0; step < (r == lost ? 2 : 3); ++step) {
      for (int i = 0; i < 5; ++i) rec.record(span_at(step, step * 1000 + i * 100, name));
    }
    rec.flush();
    profiler::RankStatus st;
    st.rank = r;
    st.step = 2;
    st.state = r == lost ? profiler::RankState::Running : profiler::RankState::Stopped;
    st.detail = r == lost ? "" : "SIGTERM";
    profiler::write_rank_status(file, st);
  }
}

TEST(RankFailure, SalvageNamesTheLostRankAndMergesTheRest) {
  const std::string out = temp_path("salvage");
  write_rank_files(out, 2, true);
  const FailedRun f = salvage_failed_run(out, 4, 128 + 9);
  EXPECT_EQ(f.message, "rank 2 was lost (killed by signal 9) during step 2; ranks 0,1,3 stopped");
  EXPECT_EQ(f.lost_ranks, std::vector<int>{2});
  ASSERT_EQ(f.trace, out) << f.merge_error;
  for (int r = 0; r < 4; ++r) EXPECT_FALSE(fs::exists(rank_trace_path(out, r)));
  const traces::Trace t = traces::load_trace(out);
  EXPECT_EQ(t.spans.size(), 3u * 15 + 10);  // three survivors x 3 steps, the lost rank x 2
  const auto statuses = profiler::read_rank_status(out);
  ASSERT_EQ(statuses.size(), 4u);
  EXPECT_EQ(statuses[2].state, profiler::RankState::Running);
  // The failure's account in the typed meta (traces::RunFailure), the run's own keys kept.
  EXPECT_TRUE(t.meta.failure.failed);
  EXPECT_EQ(t.meta.failure.lost_ranks, std::vector<int32_t>{2});
  EXPECT_EQ(t.meta.failure.message, f.message);
  EXPECT_EQ(t.meta.failure.step, 2);
  EXPECT_EQ(nlohmann::json::parse(t.meta.extra_json).at("threads"), 1);
  EXPECT_FALSE(nlohmann::json::parse(t.meta.extra_json).contains("failed"));
  fs::remove(out);
}

TEST(RankFailure, SalvageCountsARankWithoutAFileAsLost) {
  const std::string out = temp_path("nofile");
  write_rank_files(out, 1, false);
  const FailedRun f = salvage_failed_run(out, 4, 1);
  EXPECT_EQ(f.message,
            "rank 1 was lost (ended without saying why) during step 2; ranks 0,2,3 stopped");
  EXPECT_EQ(f.trace, out);
  fs::remove(out);
}

TEST(RankFailure, SalvageWithoutFilesDoesNothing) {
  const std::string out = temp_path("none");
  const FailedRun f = salvage_failed_run(out, 2, 2);
  EXPECT_TRUE(f.message.empty());
  EXPECT_TRUE(f.trace.empty());
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace orrery::runtime
