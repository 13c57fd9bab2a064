// Single-process parts of the distributed runtime: the mpirun command line, PATH lookup, rank
// coordinates from the placement, what the trainer refuses, the one-rank communicator, and DDP's
// buckets and a one-rank DDP step (no communication: gradients untouched).
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/ddp.hpp"
#include "orrery/runtime/launch.hpp"
#include "orrery/runtime/trainer.hpp"

namespace orrery::runtime {
namespace {

TEST(Launch, MpirunCommandLine) {
  MpirunOptions o;
  o.nproc = 4;
  o.oversubscribe = true;
  o.allow_run_as_root = true;
  const auto cmd = mpirun_command("/usr/bin/mpirun", o, {"/bin/orrery", "run", "s.yaml"});
  EXPECT_EQ(cmd, (std::vector<std::string>{"/usr/bin/mpirun", "-n", "4", "--oversubscribe",
                                           "--allow-run-as-root", "--bind-to", "none",
                                           "/bin/orrery", "run", "s.yaml"}));
  o.oversubscribe = o.allow_run_as_root = false;
  EXPECT_EQ(mpirun_command("mpirun", o, {"a"}).size(), 6u);
  EXPECT_TRUE(mpirun_options_for(100000).oversubscribe);
}

TEST(Launch, FindExecutableAndPaths) {
  EXPECT_EQ(find_executable("sh").empty(), false);
  EXPECT_EQ(find_executable("orrery-surely-not-a-program"), "");
  EXPECT_EQ(find_executable("/bin/sh"), "/bin/sh");
  EXPECT_EQ(rank_trace_path("out/x.db", 3), "out/x.db.rank3.db");
  const std::string d = default_trace_path("gpt-tiny");
  EXPECT_EQ(d.rfind("out/gpt-tiny-", 0), 0u) << d;
  EXPECT_EQ(d.substr(d.size() - 3), ".db");
  EXPECT_FALSE(self_executable().empty());
  EXPECT_EQ(run_and_wait({"sh", "-c", "exit 3"}), 3);
  EXPECT_EQ(run_and_wait({"sh", "-c", "kill -TERM $$"}), 128 + 15);
}

TEST(Launch, LauncherEnvironment) {
  if (started_by_launcher()) GTEST_SKIP() << "running under a launcher";
  EXPECT_EQ(launcher_world_size(), 1);
  EXPECT_EQ(launcher_world_rank(), 0);
  ::setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
  ::setenv("OMPI_COMM_WORLD_RANK", "4", 1);
  EXPECT_TRUE(started_by_launcher());
  EXPECT_EQ(launcher_world_size(), 6);
  EXPECT_EQ(launcher_world_rank(), 4);
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  EXPECT_FALSE(started_by_launcher());
}

TEST(Layout, PlacementFastestFirst) {
  Scenario s;
  s.parallel.dp = 2;
  s.parallel.tp = 2;
  s.parallel.pp = 3;
  s.parallel.placement = "tp,dp,pp";
  // rank = tp + 2 * (dp + 2 * pp)
  const Layout l = Layout::of(s, 1 + 2 * (1 + 2 * 2));
  EXPECT_EQ(l.tp_rank, 1);
  EXPECT_EQ(l.dp_rank, 1);
  EXPECT_EQ(l.pp_rank, 2);
  s.parallel.placement = "dp,tp,pp";
  const Layout m = Layout::of(s, 1);
  EXPECT_EQ(m.dp_rank, 1);
  EXPECT_EQ(m.tp_rank, 0);
  s.parallel.placement = "dp,dp,pp";
  EXPECT_THROW(Layout::of(s, 0), InputError);
}

TEST(Trainer, RefusesWhatIsNotImplementedYet) {
  Scenario s;
  s.parallel.tp = 3;  // 4 heads do not split over 3 ranks
  EXPECT_THROW(check_supported(s), InputError);
  s.parallel.tp = 1;
  s.parallel.pp = 3;  // 4 layers do not split into 3 stages
  EXPECT_THROW(check_supported(s), InputError);
  s.parallel.pp = 8;  // more stages than layers
  EXPECT_THROW(check_supported(s), InputError);
  s.parallel.pp = 1;
  s.parallel.zero = 1;  // ZeRO without data parallelism
  EXPECT_THROW(check_supported(s), InputError);
  s.parallel.zero = 0;
  s.parallel.pp = 2;
  s.parallel.schedule = "interleaved";  // not implemented in the runtime
  EXPECT_THROW(check_supported(s), InputError);
  s.parallel.schedule = "1f1b";
  EXPECT_NO_THROW(check_supported(s));
  s.parallel.pp = 1;
  s.runtime.device = "cuda";
  EXPECT_THROW(check_supported(s), InputError);
  s.runtime.device = "cpu";
  EXPECT_NO_THROW(check_supported(s));
  // A world of the wrong size.
  s.parallel.dp = 2;
  s.training.global_batch = 16;
  auto local = make_local_communicator();
  EXPECT_THROW(Trainer(s, *local, nullptr), InputError);
}

TEST(LocalComm, OneRankCollectivesAreIdentities) {
  auto c = make_local_communicator();
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->rank(), 0);
  std::vector<float> a{1, 2, 3}, b(3);
  c->all_reduce(a.data(), 3, DType::F32, ReduceOp::Avg).wait();
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  c->all_gather(a.data(), b.data(), 3, DType::F32).wait();
  EXPECT_EQ(b, a);
  c->send(a.data(), 3, DType::F32, 0).wait();
  std::vector<float> r(3);
  c->recv(r.data(), 3, DType::F32, 0).wait();
  EXPECT_EQ(r, a);
  EXPECT_THROW(c->recv(r.data(), 3, DType::F32, 0), InternalError);
  auto sub = c->split(0, 0, traces::CommKind::DP, "dp");
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->info().kind, traces::CommKind::DP);
}

TEST(Ddp, OneRankStepLeavesGradientsAlone) {
  Scenario s;
  s.model.layers = 2;
  s.model.d_model = 16;
  s.model.heads = 2;
  s.model.vocab = 32;
  s.model.seq = 8;
  Gpt m = gpt_create(gpt_config(s.model), GptShard{}, 1);
  for (size_t i = 0; i < m.grads.size(); ++i) m.grads[i] = static_cast<float>(i % 7);
  auto c = make_local_communicator();
  DataParallel ddp(m, *c, DdpOptions{0.001, true});
  EXPECT_GT(ddp.buckets().size(), 2u);
  ddp.begin_backward(true, 0, 0);
  for (int seg = s.model.layers; seg >= kEmbedSegment; --seg) ddp.on_grads_ready(seg);
  ddp.finish_backward();
  for (size_t i = 0; i < m.grads.size(); ++i) ASSERT_EQ(m.grads[i], static_cast<float>(i % 7));
  EXPECT_THROW(make_ddp_buckets(m, 0.0), InputError);
}

}  // namespace
}  // namespace orrery::runtime
