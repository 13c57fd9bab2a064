// Slurm's environment as runtime/slurm.hpp reads it: the CPU list's form, the job, the slots of an
// allocation, and the two launch mistakes said before MPI starts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/common/slurm.hpp"

namespace orrery {
namespace {

// Sets the given variables (and unsets every other variable a test here reads) for one test; puts
// them back as they were after it.
class Env {
 public:
  explicit Env(const std::map<std::string, std::string>& set) {
    for (const char* n : kNames) {
      const char* v = std::getenv(n);
      saved_[n] = v ? std::optional<std::string>(v) : std::nullopt;
      ::unsetenv(n);
    }
    for (const auto& [k, v] : set) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~Env() {
    for (const auto& [k, v] : saved_) {
      if (v)
        ::setenv(k.c_str(), v->c_str(), 1);
      else
        ::unsetenv(k.c_str());
    }
  }

 private:
  static constexpr const char* kNames[] = {"SLURM_JOB_ID",
                                           "SLURM_JOBID",
                                           "SLURM_STEP_ID",
                                           "SLURM_JOB_NODELIST",
                                           "SLURM_NODELIST",
                                           "SLURM_JOB_PARTITION",
                                           "SLURM_CLUSTER_NAME",
                                           "SLURM_JOB_NUM_NODES",
                                           "SLURM_NNODES",
                                           "SLURM_NTASKS",
                                           "SLURM_NPROCS",
                                           "SLURM_JOB_CPUS_PER_NODE",
                                           "SLURM_CPUS_PER_TASK",
                                           "SLURM_LOCALID",
                                           "PMIX_RANK",
                                           "PMI_RANK",
                                           "PMI_FD",
                                           "OMPI_COMM_WORLD_SIZE"};
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST(Slurm, CpusPerNodeList) {
  EXPECT_EQ(slurm_cpus_total("4"), 4);
  EXPECT_EQ(slurm_cpus_total("4(x2),2"), 10);
  EXPECT_EQ(slurm_cpus_total("72(x16)"), 1152);
  EXPECT_EQ(slurm_cpus_total("2,3,5"), 10);
  for (const char* bad : {"", "x", "4(x", "4(2)", "4(x2", "4,", ",4", "4;2", "4(x)"}) {
    EXPECT_THROW(slurm_cpus_total(bad), InputError) << bad;
  }
  try {
    slurm_cpus_total("4(2)");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_JOB_CPUS_PER_NODE '4(2)'"), std::string::npos);
  }
}

TEST(Slurm, NoJobOutsideSlurm) {
  Env env({});
  EXPECT_FALSE(slurm_job().has_value());
  EXPECT_EQ(srun_without_pmi_problem(), "");
  EXPECT_EQ(slurm_allocation_problem(1024), "");
}

TEST(Slurm, BatchScriptJob) {
  Env env({{"SLURM_JOB_ID", "12"},
           {"SLURM_JOB_NODELIST", "node[01-02]"},
           {"SLURM_JOB_PARTITION", "gpu"},
           {"SLURM_CLUSTER_NAME", "c1"},
           {"SLURM_JOB_NUM_NODES", "2"},
           {"SLURM_JOB_CPUS_PER_NODE", "8(x2)"},
           {"SLURM_CPUS_PER_TASK", "2"}});
  const auto j = slurm_job();
  ASSERT_TRUE(j.has_value());
  EXPECT_EQ(j->job_id, "12");
  EXPECT_EQ(j->step_id, "");
  EXPECT_EQ(j->nodes, 2);
  EXPECT_EQ(j->tasks, 0);
  EXPECT_EQ(j->cpus, 16);
  EXPECT_EQ(slurm_allocation_slots(*j), 8);  // no SLURM_NTASKS: 16 CPUs / 2 per task
  EXPECT_EQ(slurm_text(*j), "Slurm job 12: 2 nodes (node[01-02]), partition gpu, cluster c1");
  EXPECT_EQ(slurm_allocation_problem(8), "");
  const std::string p = slurm_allocation_problem(16);
  EXPECT_NE(p.find("smaller than the layout"), std::string::npos) << p;
  EXPECT_NE(p.find("holds 8 ranks"), std::string::npos) << p;
  EXPECT_NE(p.find("needs 16"), std::string::npos) << p;
  EXPECT_NE(p.find("--ntasks=16"), std::string::npos) << p;
}

TEST(Slurm, TasksCountBeforeCpus) {
  Env env({{"SLURM_JOB_ID", "5"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_CPUS_PER_NODE", "64"}});
  const auto j = slurm_job();
  ASSERT_TRUE(j.has_value());
  EXPECT_EQ(slurm_allocation_slots(*j), 4);
  EXPECT_EQ(slurm_allocation_problem(4), "");
  EXPECT_NE(slurm_allocation_problem(5).find("holds 4 ranks (SLURM_NTASKS; Slurm job 5: 4 tasks)"),
            std::string::npos);
}

TEST(Slurm, InsideAStepTheAllocationIsNotChecked) {
  // Under srun the step's tasks are the ranks; the world-size check names them instead.
  Env env(
      {{"SLURM_JOB_ID", "5"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "2"}, {"PMIX_RANK", "0"}});
  EXPECT_EQ(slurm_allocation_problem(4), "");
  EXPECT_EQ(srun_without_pmi_problem(), "");
}

TEST(Slurm, SrunWithoutPmi) {
  Env env({{"SLURM_JOB_ID", "7"},
           {"SLURM_STEP_ID", "1"},
           {"SLURM_NTASKS", "4"},
           {"SLURM_JOB_NUM_NODES", "1"}});
  const std::string p = srun_without_pmi_problem();
  EXPECT_NE(p.find("srun --mpi=pmix"), std::string::npos) << p;
  EXPECT_NE(p.find("Slurm job 7 step 1: 4 tasks on 1 node"), std::string::npos) << p;
  EXPECT_NE(p.find("its 4 tasks"), std::string::npos) << p;
}

TEST(Slurm, OneTaskStepNeedsNoPmi) {
  Env env({{"SLURM_JOB_ID", "7"}, {"SLURM_STEP_ID", "1"}, {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(srun_without_pmi_problem(), "");
}

TEST(Slurm, JsonNamesTheFields) {
  Env env({{"SLURM_JOB_ID", "9"},
           {"SLURM_STEP_ID", "0"},
           {"SLURM_NTASKS", "4"},
           {"SLURM_JOB_NODELIST", "vm"},
           {"SLURM_LOCALID", "3"}});
  const auto j = slurm_job();
  ASSERT_TRUE(j.has_value());
  EXPECT_EQ(j->local_rank, 3);
  const std::string s = slurm_json(*j);
  EXPECT_NE(s.find("\"job_id\":\"9\""), std::string::npos) << s;
  EXPECT_NE(s.find("\"step_id\":\"0\""), std::string::npos) << s;
  EXPECT_NE(s.find("\"tasks\":4"), std::string::npos) << s;
  EXPECT_NE(s.find("\"nodelist\":\"vm\""), std::string::npos) << s;
}

}  // namespace
}  // namespace orrery
