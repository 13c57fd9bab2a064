// Pipeline layouts with dp > 1 that used to deadlock in the executor (tp1 pp4 dp2 ZeRO 2, tied
// embeddings, 4 micro-batches): the last stage blocks in the tied-embedding all-reduce until the
// first stage's backward, which needs the gradient a middle stage sends after an activation send
// still waiting for the last stage. The runtime posts sends (MPI_Isend) without waiting for the
// earlier ones, so the simulator must too. Every op of the family around it runs, the counts of
// its collectives are the runtime's, and a true cycle is an InternalError naming ranks and ops.
#include <gtest/gtest.h>

#include <string>

#include "orrery/common/error.hpp"
#include "orrery/sim/executor.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim {
namespace {

using testing::h100_cluster;
using testing::h100_cost;
using testing::small_scenario;

Scenario dense(int pp, int zero, int m, bool tied) {
  Scenario s = small_scenario(pp * 2, 2, 1, pp, m);
  s.parallel.zero = zero;
  s.model.tied_embeddings = tied;
  return s;
}

// Ops named `name` in a stage's program.
int count_ops(const Workload& w, int stage, const std::string& name) {
  int n = 0;
  for (const auto& op : w.stages[stage].ops) n += w.names[op.name] == name;
  return n;
}

// Every op of every simulated rank ran to its end.
void expect_all_ran(const ExecResult& r, const std::string& what) {
  for (const auto& run : r.ranks) {
    int left = 0;
    for (const auto& t : run.ops) left += t.end_ns < 0;
    EXPECT_EQ(left, 0) << what << " rank " << run.rank;
  }
}

TEST(PipelineDeadlock, Pp4Dp2Zero2TiedFourMicroBatches) {
  const Workload w = build_workload(dense(4, 2, 4, true), h100_cost());
  // ZeRO 2: the tied wte's sum and the reduce-scatter after every backward of the end stages.
  EXPECT_EQ(count_ops(w, 0, std::string(names::kEmbedAllReduce)), 4);
  EXPECT_EQ(count_ops(w, 3, std::string(names::kEmbedAllReduce)), 4);
  EXPECT_EQ(count_ops(w, 1, std::string(names::kEmbedAllReduce)), 0);
  EXPECT_EQ(count_ops(w, 1, std::string(names::kDpReduceScatter)), 4);
  for (bool all : {false, true}) {
    ExecutorOptions o;
    o.all_ranks = all;
    const ExecResult r = execute(w, h100_cluster(8), o);
    EXPECT_EQ(r.ranks.size(), all ? 8u : 4u);
    expect_all_ran(r, all ? "all ranks" : "representatives");
    EXPECT_GT(r.makespan_ns, 0);
  }
}

TEST(PipelineDeadlock, FamilyAroundTheDenseLayoutSimulates) {
  const Cluster c = h100_cluster(8);
  for (int pp : {2, 4})
    for (int zero = 0; zero <= 3; ++zero)
      for (int m = 1; m <= 8; ++m)
        for (bool tied : {true, false}) {
          const std::string what = "pp" + std::to_string(pp) + " zero" + std::to_string(zero) +
                                   " m" + std::to_string(m) + (tied ? " tied" : " untied");
          const Workload w = build_workload(dense(pp, zero, m, tied), h100_cost());
          // The tied sum: once a step without ZeRO or with ZeRO 1, per micro-batch with ZeRO 2/3.
          const int sums = !tied ? 0 : (zero >= 2 ? m : 1);
          EXPECT_EQ(count_ops(w, 0, std::string(names::kEmbedAllReduce)), sums) << what;
          EXPECT_EQ(count_ops(w, pp - 1, std::string(names::kEmbedAllReduce)), sums) << what;
          for (bool all : {false, true}) {
            ExecutorOptions o;
            o.all_ranks = all;
            ExecResult r;
            ASSERT_NO_THROW(r = execute(w, c, o)) << what;
            expect_all_ran(r, what);
          }
        }
}

// A cycle (the first stage's first op waiting for its own last op) is reported, not a hang.
TEST(PipelineDeadlock, CycleIsAnErrorNamingRanksAndOps) {
  Workload w = build_workload(dense(2, 2, 2, true), h100_cost());
  StageProgram& p = w.stages[0];
  uint32_t first = 0;
  while (p.ops[first].dep_count == 0) ++first;
  p.deps[p.ops[first].dep_begin] = static_cast<uint32_t>(p.ops.size() - 1);
  ExecutorOptions o;
  o.all_ranks = true;
  try {
    execute(w, h100_cluster(4), o);
    FAIL() << "no deadlock reported";
  } catch (const InternalError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("simulation deadlock"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0 stream " + std::string(stream_name(p.ops[first].stream)) +
                       " stuck at op '" + w.names[p.ops[first].name] + "'"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("rank 1 "), std::string::npos) << msg;  // its dp peer, stuck likewise
    EXPECT_NE(msg.find("waiting for op '" + w.names[p.ops.back().name] + "'"), std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace orrery::sim
