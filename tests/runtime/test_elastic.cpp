// Single-process parts of elastic restarts (runtime/elastic.hpp): the attempts' JSON both ways,
// faults on later attempts, hostfile slots, the checkpoint a restart takes (not an earlier job's),
// the time lost, and the mpirun options a restart passes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <utime.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/runtime/elastic.hpp"
#include "orrery/runtime/launch.hpp"

namespace orrery::runtime {
namespace {
namespace fs = std::filesystem;

TEST(Elastic, AttemptsJsonRoundTrip) {
  Attempt a;
  a.attempt = 1;
  a.nproc = 4;
  a.dp = 4;
  a.start_unix_ns = 1'000;
  a.failed = true;
  a.end_unix_ns = 5'000;
  a.exit_status = 137;
  a.lost_ranks = {3};
  a.failed_step = 3;
  a.failure = "rank 3 was lost";
  a.trace = "x.attempt1.db";
  a.lost_ns = 4'000;
  Attempt b;
  b.attempt = 2;
  b.nproc = 2;
  b.dp = 2;
  b.resumed_from_step = 2;
  b.resumed_from = "ckpt/step-2";
  b.start_unix_ns = 6'000;
  const auto back = attempts_from_json(attempts_to_json({a, b}), "test");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].lost_ranks, std::vector<int>{3});
  EXPECT_EQ(back[0].failed_step, 3);
  EXPECT_EQ(back[0].lost_ns, 4'000);
  EXPECT_EQ(back[0].trace, "x.attempt1.db");
  EXPECT_EQ(back[0].exit_status, 137);
  EXPECT_FALSE(back[1].failed);
  EXPECT_EQ(back[1].resumed_from, "ckpt/step-2");
  EXPECT_EQ(back[1].resumed_from_step, 2);
  EXPECT_EQ(back[1].nproc, 2);
  EXPECT_THROW(attempts_from_json("{}", "test"), InputError);
  EXPECT_THROW(attempts_from_json("[{\"attempt\": 1}]", "test"), InputError);
  EXPECT_THROW(attempts_from_json("not json", "test"), InputError);
}

TEST(Elastic, FaultsFireOnTheFirstAttemptUnlessEveryAttempt) {
  Scenario s;
  s.faults.kill_rank = 1;
  s.faults.step = 3;
  s.faults.kill_after_step = 2;
  faults_for_attempt(s, 1);
  EXPECT_EQ(s.faults.kill_rank, 1);
  Scenario every = s;
  every.faults.every_attempt = true;
  faults_for_attempt(every, 2);
  EXPECT_EQ(every.faults.kill_rank, 1);
  EXPECT_EQ(every.faults.kill_after_step, 2);
  faults_for_attempt(s, 2);
  EXPECT_EQ(s.faults.kill_rank, -1);
  EXPECT_EQ(s.faults.kill_after_step, -1);
}

TEST(Elastic, HostfileSlots) {
  const fs::path dir = fs::temp_directory_path() / "orrery-elastic-hostfile";
  fs::create_directories(dir);
  const std::string p = (dir / "hosts").string();
  std::ofstream(p) << "# a comment\nnode1 slots=4\nnode2 slots=2 max_slots=8  # two\nnode3\n\n";
  EXPECT_EQ(hostfile_slots(p), 7);
  std::ofstream(p) << "node1 slots=x\n";
  try {
    hostfile_slots(p);
    FAIL() << "slots=x accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(p + ":1: 'slots=x'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(hostfile_slots((dir / "missing").string()), InputError);
  fs::remove_all(dir);
}

void write_checkpoint_manifest(const fs::path& step_dir, int64_t mtime_s) {
  fs::create_directories(step_dir);
  const fs::path m = step_dir / "manifest.json";
  std::ofstream(m) << "{}";
  struct utimbuf t {};
  t.actime = t.modtime = static_cast<time_t>(mtime_s);
  ASSERT_EQ(::utime(m.c_str(), &t), 0);
}

TEST(Elastic, NewestCheckpointIsThisJobs) {
  const fs::path dir = fs::temp_directory_path() / "orrery-elastic-ckpt";
  fs::remove_all(dir);
  EXPECT_FALSE(newest_checkpoint_since(dir.string(), 0).has_value());  // no directory
  const int64_t job_start_s = 2'000'000'000;
  // An earlier job's step-6, this job's step-2 (its manifest does not verify: it is skipped with the
  // reason) and a partial step-4.
  write_checkpoint_manifest(dir / "step-6", job_start_s - 100);
  write_checkpoint_manifest(dir / "step-2", job_start_s + 5);
  fs::create_directories(dir / "step-4");
  EXPECT_EQ(checkpoint_time_unix_ns((dir / "step-2").string()), (job_start_s + 5) * 1'000'000'000);
  EXPECT_EQ(checkpoint_time_unix_ns((dir / "step-4").string()), 0);
  EXPECT_FALSE(newest_checkpoint_since(dir.string(), job_start_s * 1'000'000'000).has_value());
  // With the earlier job's counted (a job started before it), step-6 is the newest: it does not
  // verify either, so none is taken.
  EXPECT_FALSE(newest_checkpoint_since(dir.string(), 0).has_value());
  fs::remove_all(dir);
}

TEST(Elastic, TimeLost) {
  Attempt a;
  a.start_unix_ns = 100;
  a.end_unix_ns = 1'000;
  // A checkpoint written during the attempt: the work since it, and the gap to the restart.
  EXPECT_EQ(time_lost_ns(a, 600, 1'100), 500);
  // From scratch, or a checkpoint older than the attempt: all of it.
  EXPECT_EQ(time_lost_ns(a, 0, 1'100), 1'000);
  EXPECT_EQ(time_lost_ns(a, 50, 1'100), 1'000);
}

TEST(Elastic, MpirunPassesHostfileAndEnvironment) {
  MpirunOptions o;
  o.nproc = 2;
  o.hostfile = "hosts";
  o.export_env = {"ORRERY_ATTEMPTS"};
  EXPECT_EQ(mpirun_command("mpirun", o, {"a"}),
            (std::vector<std::string>{"mpirun", "-n", "2", "--hostfile", "hosts", "-x",
                                      "ORRERY_ATTEMPTS", "--bind-to", "none", "a"}));
}

}  // namespace
}  // namespace orrery::runtime
