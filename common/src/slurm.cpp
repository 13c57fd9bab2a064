// Slurm's environment: the job, its allocation, and the launch mistakes said before MPI starts.
#include "orrery/common/slurm.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "orrery/common/error.hpp"

namespace orrery {
namespace {

std::string env_text(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// A whole number >= 0 from the environment; `fallback` when unset or not a number.
int env_count(const char* name, int fallback) {
  const std::string v = env_text(name);
  if (v.empty()) return fallback;
  size_t used = 0;
  try {
    const int n = std::stoi(v, &used);
    return used == v.size() && n >= 0 ? n : fallback;
  } catch (const std::exception&) {
    return fallback;
  }
}

}  // namespace

int slurm_cpus_total(const std::string& spec) {
  const auto bad = [&spec](const std::string& why) {
    return InputError("SLURM_JOB_CPUS_PER_NODE '" + spec + "': " + why +
                      " (expected a list like 4(x2),2)");
  };
  if (spec.empty()) throw bad("empty");
  long total = 0;
  size_t i = 0;
  while (i < spec.size()) {
    size_t j = i;
    while (j < spec.size() && std::isdigit(static_cast<unsigned char>(spec[j]))) ++j;
    if (j == i) throw bad("a count expected at character " + std::to_string(i + 1));
    const long cpus = std::stol(spec.substr(i, j - i));
    long times = 1;
    if (j < spec.size() && spec[j] == '(') {
      if (spec.compare(j, 2, "(x") != 0)
        throw bad("'(x' expected at character " + std::to_string(j + 1));
      size_t k = j + 2, m = k;
      while (m < spec.size() && std::isdigit(static_cast<unsigned char>(spec[m]))) ++m;
      if (m == k || m >= spec.size() || spec[m] != ')')
        throw bad("a repeat count and ')' expected at character " + std::to_string(k + 1));
      times = std::stol(spec.substr(k, m - k));
      j = m + 1;
    }
    total += cpus * times;
    if (total > 1'000'000'000) throw bad("too many CPUs");
    if (j < spec.size()) {
      if (spec[j] != ',') throw bad("',' expected at character " + std::to_string(j + 1));
      ++j;
      if (j == spec.size()) throw bad("nothing after the last ','");
    }
    i = j;
  }
  return static_cast<int>(total);
}

std::optional<SlurmJob> slurm_job() {
  SlurmJob j;
  j.job_id = env_text("SLURM_JOB_ID");
  if (j.job_id.empty()) j.job_id = env_text("SLURM_JOBID");
  if (j.job_id.empty()) return std::nullopt;
  j.step_id = env_text("SLURM_STEP_ID");
  j.nodelist = env_text("SLURM_JOB_NODELIST");
  if (j.nodelist.empty()) j.nodelist = env_text("SLURM_NODELIST");
  j.partition = env_text("SLURM_JOB_PARTITION");
  j.cluster = env_text("SLURM_CLUSTER_NAME");
  j.nodes = env_count("SLURM_JOB_NUM_NODES", env_count("SLURM_NNODES", 0));
  j.tasks = env_count("SLURM_NTASKS", env_count("SLURM_NPROCS", 0));
  const std::string cpus = env_text("SLURM_JOB_CPUS_PER_NODE");
  if (!cpus.empty()) {
    try {
      j.cpus = slurm_cpus_total(cpus);
    } catch (const InputError&) {
      j.cpus = 0;  // unknown: the allocation check then relies on the task count alone
    }
  }
  j.cpus_per_task = std::max(1, env_count("SLURM_CPUS_PER_TASK", 1));
  j.local_rank = env_count("SLURM_LOCALID", -1);
  return j;
}

int slurm_allocation_slots(const SlurmJob& job) {
  if (job.tasks > 0) return job.tasks;
  return job.cpus / std::max(1, job.cpus_per_task);
}

std::string slurm_text(const SlurmJob& j) {
  std::string s = "Slurm job " + j.job_id;
  if (!j.step_id.empty()) s += " step " + j.step_id;
  s += ":";
  if (j.tasks > 0) s += " " + std::to_string(j.tasks) + (j.tasks == 1 ? " task" : " tasks");
  if (j.nodes > 0)
    s += std::string(j.tasks > 0 ? " on " : " ") + std::to_string(j.nodes) +
         (j.nodes == 1 ? " node" : " nodes");
  if (!j.nodelist.empty()) s += " (" + j.nodelist + ")";
  if (!j.partition.empty()) s += ", partition " + j.partition;
  if (!j.cluster.empty()) s += ", cluster " + j.cluster;
  return s;
}

std::string slurm_json(const SlurmJob& j) {
  const nlohmann::json o = {
      {"job_id", j.job_id},       {"step_id", j.step_id}, {"nodelist", j.nodelist},
      {"partition", j.partition}, {"cluster", j.cluster}, {"nodes", j.nodes},
      {"tasks", j.tasks},         {"cpus", j.cpus},       {"cpus_per_task", j.cpus_per_task}};
  return o.dump();
}

std::string srun_without_pmi_problem() {
  if (env_text("SLURM_STEP_ID").empty()) return "";
  if (env_count("SLURM_NTASKS", 1) <= 1) return "";
  for (const char* pmi : {"PMIX_RANK", "PMI_RANK", "PMI_FD", "OMPI_COMM_WORLD_SIZE"}) {
    if (std::getenv(pmi)) return "";
  }
  const auto job = slurm_job();
  return "started by srun (" + (job ? slurm_text(*job) : std::string("a Slurm step")) +
         ") without a PMI plugin, so MPI cannot join its " + env_text("SLURM_NTASKS") +
         " tasks into one world: run srun --mpi=pmix (Open MPI's; `srun --mpi=list` shows the "
         "plugins of this cluster), or set MpiDefault=pmix in slurm.conf";
}

std::string slurm_allocation_problem(int nproc) {
  const auto job = slurm_job();
  if (!job || !job->step_id.empty()) return "";
  const int slots = slurm_allocation_slots(*job);
  if (slots <= 0 || nproc <= slots) return "";
  return "the Slurm allocation is smaller than the layout: it holds " + std::to_string(slots) +
         (slots == 1 ? " rank" : " ranks") +
         (job->tasks > 0 ? std::string(" (SLURM_NTASKS; ")
                         : " (SLURM_JOB_CPUS_PER_NODE / SLURM_CPUS_PER_TASK; ") +
         slurm_text(*job) + "), the layout needs " + std::to_string(nproc) +
         ": ask for --ntasks=" + std::to_string(nproc) +
         " (sbatch/salloc), or set a smaller parallel.dp";
}

}  // namespace orrery
