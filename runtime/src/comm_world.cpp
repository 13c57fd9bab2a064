// Choosing the world communicator: launcher detection from the environment, and MPI when this
// library was built with it.
//
// Whether MPI is in the build is known from the include path: the runtime's CMakeLists compiles
// runtime/src/mpi/*.cpp and adds MPI's include directory (MPI::MPI_C) exactly when MPI was found,
// and Debian's mpi.h lives outside the default include path.
#include <cstdlib>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/common/slurm.hpp"
#include "orrery/runtime/comm.hpp"

#if defined(ORRERY_HAVE_MPI) || __has_include(<mpi.h>)
#define ORRERY_RUNTIME_MPI 1
#else
#define ORRERY_RUNTIME_MPI 0
#endif

namespace orrery::runtime {

#if ORRERY_RUNTIME_MPI
// Defined in mpi/mpi_comm.cpp.
std::unique_ptr<Communicator> make_mpi_world_communicator(const WorldOptions& opt);
#endif

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  try {
    return std::stoi(v);
  } catch (...) {
    return fallback;
  }
}

}  // namespace

bool started_by_launcher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
         std::getenv("PMIX_RANK") || (std::getenv("SLURM_STEP_ID") && std::getenv("SLURM_NTASKS"));
}

int launcher_world_size() {
  if (!started_by_launcher()) return 1;
  int n = env_int("OMPI_COMM_WORLD_SIZE", -1);
  if (n < 0) n = env_int("PMI_SIZE", -1);
  if (n < 0 && std::getenv("SLURM_STEP_ID")) n = env_int("SLURM_NTASKS", -1);
  return n < 0 ? 1 : n;
}

int launcher_world_rank() {
  if (!started_by_launcher()) return 0;
  int r = env_int("OMPI_COMM_WORLD_RANK", -1);
  if (r < 0) r = env_int("PMI_RANK", -1);
  if (r < 0) r = env_int("PMIX_RANK", -1);
  if (r < 0 && std::getenv("SLURM_STEP_ID")) r = env_int("SLURM_PROCID", -1);
  return r < 0 ? 0 : r;
}

bool mpi_available() { return ORRERY_RUNTIME_MPI != 0; }

std::unique_ptr<Communicator> make_world_communicator(const WorldOptions& opt) {
  if (!started_by_launcher()) return make_local_communicator();
  // srun without a PMI plugin: MPI_Init would abort with Open MPI's page about rebuilding Slurm.
  if (const std::string why = orrery::srun_without_pmi_problem(); !why.empty())
    throw InputError(why);
#if ORRERY_RUNTIME_MPI
  return make_mpi_world_communicator(opt);
#else
  if (launcher_world_size() > 1) {
    throw InputError("started by a launcher with " + std::to_string(launcher_world_size()) +
                     " ranks, but this orrery was built without MPI (install libopenmpi-dev and "
                     "rebuild)");
  }
  return make_local_communicator();
#endif
}

}  // namespace orrery::runtime
