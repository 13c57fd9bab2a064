// A program for the "no hang" tests (run under mpirun by CTest, see CMakeLists.txt): one rank
// fails while the others wait in a collective, and the job must end with the failing rank's code.
//   abort_check abort     rank 1 calls Communicator::abort(2) while rank 0 waits in an all-reduce
//   abort_check watchdog  rank 0 waits in an all-reduce rank 1 never joins; the 1 s watchdog fails
//                         the wait, rank 0 reports it and aborts with 3
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>

#include "orrery/runtime/comm.hpp"

using namespace orrery::runtime;

int main(int argc, char** argv) {
  const bool watchdog = argc > 1 && std::strcmp(argv[1], "watchdog") == 0;
  WorldOptions opt;
  opt.watchdog_s = watchdog ? 1.0 : 60.0;
  auto world = make_world_communicator(opt);
  float x = 1.0f;
  if (!watchdog) {
    if (world->rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::fprintf(stderr, "rank 1: failing\n");
      world->abort(2);
    }
    world->all_reduce(&x, 1, DType::F32, ReduceOp::Sum).wait();
    return 0;  // not reached: the abort ends the job
  }
  if (world->rank() == 0) {
    try {
      world->all_reduce(&x, 1, DType::F32, ReduceOp::Sum).wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank 0: %s\n", e.what());
      world->abort(3);
    }
    return 0;
  }
  // The other ranks never join rank 0's all-reduce; they wait until the abort ends them.
  std::this_thread::sleep_for(std::chrono::seconds(30));
  return 0;
}
