// Runs under Slurm: the job a process belongs to, read from Slurm's environment (SLURM_JOB_ID,
// SLURM_STEP_ID, ...), the ranks its allocation offers, and the launch mistakes that would
// otherwise end in MPI's own abort (srun without a PMI plugin, an allocation smaller than the
// layout). Shared by the runtime (its launch checks, the run metadata) and `orrery report`. Ranks
// under srun come from PMIx through Open MPI (srun --mpi=pmix); SLURM_PROCID and
// SLURM_LOCALID give the rank and the local rank where MPI's variables are absent (comm.hpp).
#pragma once

#include <optional>
#include <string>

namespace orrery {

struct SlurmJob {
  std::string job_id;     // SLURM_JOB_ID
  std::string step_id;    // SLURM_STEP_ID; "" in a batch script or an salloc shell (no step)
  std::string nodelist;   // SLURM_JOB_NODELIST, as Slurm writes it ("node[01-04]")
  std::string partition;  // SLURM_JOB_PARTITION
  std::string cluster;    // SLURM_CLUSTER_NAME
  int nodes = 0;          // SLURM_JOB_NUM_NODES
  int tasks = 0;          // SLURM_NTASKS (0: not set, e.g. sbatch --nodes without --ntasks)
  int cpus = 0;           // SLURM_JOB_CPUS_PER_NODE summed over the nodes
  int cpus_per_task = 1;  // SLURM_CPUS_PER_TASK
  int local_rank = -1;    // SLURM_LOCALID (-1: not set)
};

// The Slurm job of this process; nullopt outside Slurm (no SLURM_JOB_ID).
std::optional<SlurmJob> slurm_job();

// SLURM_JOB_CPUS_PER_NODE's form, "4(x2),2" (two nodes of 4, one of 2), summed: 10. InputError
// naming the text when it is not of that form.
int slurm_cpus_total(const std::string& spec);

// The ranks the allocation can hold: its tasks when SLURM_NTASKS is set, else its CPUs divided by
// the CPUs per task; 0 when neither is known.
int slurm_allocation_slots(const SlurmJob& job);

// "Slurm job 12 step 0: 4 tasks on 1 node (vm), partition local, cluster orrery-local".
std::string slurm_text(const SlurmJob& job);
// {"job_id": "12", "step_id": "0", "nodelist": "vm", ...}, the keys named as the fields.
std::string slurm_json(const SlurmJob& job);

// Why MPI cannot form the world of a Slurm step started by srun without a PMI plugin (srun's
// default --mpi=none on most clusters): "" when this is no such step. Open MPI would abort in
// MPI_Init with a page about building Slurm's PMI support.
std::string srun_without_pmi_problem();

// Why a job that needs `nproc` ranks cannot start them in this Slurm allocation (a batch script
// or an salloc shell): "" when it can, or outside Slurm, or inside a job step.
std::string slurm_allocation_problem(int nproc);

}  // namespace orrery
