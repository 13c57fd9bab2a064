// Under mpirun with 2 ranks and no GPU: make_nccl_communicator must fail on every rank, at once,
// with a message naming every rank's cause (the ranks exchange their status over the MPI bootstrap
// before NCCL starts, so none waits for another). Exit 0 when it does; 77 (skipped) with a GPU.
#include <cstdio>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/cuda/device.hpp"
#include "orrery/runtime/cuda/nccl_comm.hpp"

int main() {
  using namespace orrery::runtime;
  auto world = make_world_communicator();
  if (cuda::device_count() > 0) {
    std::printf("rank %d: a CUDA device is present; this checks the no-device path\n", world->rank());
    return 77;
  }
  try {
    cuda::make_nccl_communicator(*world, nullptr);
  } catch (const orrery::InternalError& e) {
    const std::string msg = e.what();
    std::printf("rank %d: %s\n", world->rank(), msg.c_str());
    bool all = msg.rfind("NCCL cannot start: ", 0) == 0;
    for (int r = 0; r < world->size(); ++r) all = all && msg.find("rank " + std::to_string(r) + ": ") != std::string::npos;
    world->barrier().wait();  // both ranks got here: nobody hangs
    return all ? 0 : 1;
  }
  std::printf("rank %d: make_nccl_communicator succeeded without a device\n", world->rank());
  return 1;
}
