// main() of the multi-rank runtime tests, run under mpirun (see CMakeLists.txt): creates the world
// communicator once, runs the tests on every rank, prints only rank 0's report plus any failure on
// another rank, and fails the whole run when any rank failed.
#include <gtest/gtest.h>

#include <cstdio>

#include "mpi_env.hpp"

namespace orrery::runtime::testing {
Communicator* g_world = nullptr;
}

namespace {

// On ranks other than 0: print failed assertions only, prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  orrery::runtime::WorldOptions opt;
  opt.watchdog_s = 60;  // a test that loses a rank fails instead of hanging
  auto world = orrery::runtime::make_world_communicator(opt);
  orrery::runtime::testing::g_world = world.get();
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(world->rank()));
  }
  const int rc = RUN_ALL_TESTS();
  int32_t failed = rc != 0 ? 1 : 0;
  world->all_reduce(&failed, 1, orrery::runtime::DType::I32, orrery::runtime::ReduceOp::Max).wait();
  if (world->rank() == 0 && failed && rc == 0) std::fprintf(stderr, "a test failed on another rank\n");
  return failed ? 1 : 0;
}
