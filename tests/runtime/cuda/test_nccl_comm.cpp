// The device communicators (runtime/cuda/nccl_comm.hpp): an NCCL world of 1 bootstrapped through
// the local communicator, and the host-staged communicator over it.
//  - exact results of all-reduce (sum, avg, max), all-gather, reduce-scatter, broadcast;
//  - ordering against the compute stream: a kernel that writes the input late (it spins first) is
//    issued before the operation, and the operation must see its values;
//  - spans on their group's trace stream (the world's: comm.dp) with op, bytes, comm id and sequence numbers, timed inside the
//    host interval that issued and completed them (the CUDA-event -> steady-clock mapping);
//  - split (color -1: not a member);
//  - without a device: both factories throw with the reason, at once (no hang).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "comm_test_kernels.hpp"
#include "orrery/common/error.hpp"
#include "orrery/model/names.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/cuda/device.hpp"
#include "orrery/runtime/cuda/nccl_comm.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime::cuda {
namespace {

constexpr long long kSpinCycles = 20'000'000;  // ~10 ms at 2 GHz: far longer than an enqueue

#define SKIP_WITHOUT_DEVICE()                                    \
  do {                                                           \
    if (device_count() == 0) GTEST_SKIP() << no_device_reason(); \
  } while (0)

std::vector<float> to_host(const float* dev, size_t n, cudaStream_t s) {
  std::vector<float> h(n);
  ORRERY_CUDA_CHECK(cudaMemcpyAsync(h.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  ORRERY_CUDA_CHECK(cudaStreamSynchronize(s));
  return h;
}

void from_host(float* dev, const std::vector<float>& h, cudaStream_t s) {
  ORRERY_CUDA_CHECK(
      cudaMemcpyAsync(dev, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  ORRERY_CUDA_CHECK(cudaStreamSynchronize(s));
}

// The same checks for both device communicators (a world of one rank).
void check_collectives(Communicator& c, cudaStream_t s) {
  const size_t n = 1000;
  DeviceArray<float> a(n), b(n);
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = 0.5f * static_cast<float>(i) - 7.0f;

  from_host(a.data(), h, s);
  c.all_reduce(a.data(), n, DType::F32, ReduceOp::Sum).wait();
  EXPECT_EQ(to_host(a.data(), n, s), h);
  c.all_reduce(a.data(), n, DType::F32, ReduceOp::Avg).wait();
  EXPECT_EQ(to_host(a.data(), n, s), h);
  c.all_reduce(a.data(), n, DType::F32, ReduceOp::Max).wait();
  EXPECT_EQ(to_host(a.data(), n, s), h);

  from_host(b.data(), std::vector<float>(n, 0.0f), s);
  c.all_gather(a.data(), b.data(), n, DType::F32).wait();
  EXPECT_EQ(to_host(b.data(), n, s), h);

  from_host(b.data(), std::vector<float>(n, 0.0f), s);
  c.reduce_scatter(a.data(), b.data(), n, DType::F32, ReduceOp::Sum).wait();
  EXPECT_EQ(to_host(b.data(), n, s), h);

  c.broadcast(a.data(), n, DType::F32, 0).wait();
  EXPECT_EQ(to_host(a.data(), n, s), h);
  c.barrier().wait();
  c.synchronize();

  // Ordering: the late kernel writes `a` on the compute stream; the gather issued after it must
  // copy the new values into `b` (without the event wait it would copy the old ones).
  from_host(b.data(), std::vector<float>(n, 0.0f), s);
  test::launch_late_fill(a.data(), n, 100.0f, kSpinCycles, s);
  c.all_gather(a.data(), b.data(), n, DType::F32).wait();
  const std::vector<float> got = to_host(b.data(), n, s);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(got[i], 100.0f + static_cast<float>(i)) << "element " << i;
}

TEST(NcclComm, WorldOfOneExactResultsAndOrdering) {
  SKIP_WITHOUT_DEVICE();
  select_device(0);
  Stream compute;
  auto boot = make_local_communicator();
  auto nccl = make_nccl_communicator(*boot, compute.get());
  ASSERT_EQ(nccl->size(), 1);
  EXPECT_EQ(nccl->rank(), 0);
  EXPECT_EQ(nccl->info().name, boot->info().name);
  check_collectives(*nccl, compute.get());
}

TEST(NcclComm, SpansOnTheNcclStreamInsideTheHostInterval) {
  SKIP_WITHOUT_DEVICE();
  select_device(0);
  const std::string path =
      ::testing::TempDir() + "orrery_nccl_spans_" + std::to_string(::getpid()) + ".db";
  Stream compute;
  auto boot = make_local_communicator();
  int64_t t0 = 0, t1 = 0, clock_error = -1;
  {
    traces::TraceWriter writer(path);
    profiler::Recorder rec(&writer, 0);
    auto nccl = make_nccl_communicator(*boot, compute.get());
    nccl->set_recorder(&rec);
    DeviceArray<float> a(4096);
    t0 = profiler::steady_now_ns();
    nccl->all_reduce(a.data(), 4096, DType::F32, ReduceOp::Sum, OpLabel{"grads", 3, -1, 5}).wait();
    nccl->broadcast(a.data(), 1024, DType::F32, 0).wait();
    nccl->synchronize();
    t1 = profiler::steady_now_ns();
    clock_error = nccl_clock_error_ns(*nccl);
    nccl->set_recorder(nullptr);
    nccl.reset();  // resolves what is left
    rec.flush();
    writer.close();
  }
  traces::Trace t = traces::load_trace(path);
  std::remove(path.c_str());
  ASSERT_EQ(t.spans.size(), 2u);
  std::sort(t.spans.begin(), t.spans.end(), [](auto& x, auto& y) { return x.seq < y.seq; });
  const auto& ar = t.spans[0];
  EXPECT_EQ(ar.stream, model::names::kStreamDp);  // the world's operations, as on the CPU
  EXPECT_EQ(ar.kind, traces::SpanKind::Collective);
  EXPECT_EQ(ar.op, traces::CollOp::AllReduce);
  EXPECT_EQ(t.name_of(ar), "grads");
  EXPECT_EQ(ar.bytes, 4096 * 4);
  EXPECT_EQ(ar.seq, 0);
  EXPECT_EQ(ar.step, 3);
  EXPECT_EQ(ar.layer, 5);
  EXPECT_EQ(ar.comm, boot->info().id);
  const auto& bc = t.spans[1];
  EXPECT_EQ(bc.op, traces::CollOp::Broadcast);
  EXPECT_EQ(bc.seq, 1);
  EXPECT_EQ(bc.peer, 0);
  EXPECT_EQ(bc.bytes, 1024 * 4);
  // Event times mapped onto the steady clock fall inside the host interval (the interval is the
  // issue-to-synchronize window), off by at most the anchor's own error, which the communicator
  // measured (its host bracket: microseconds on bare metal, longer where driver calls are slow),
  // plus 2 us for cudaEventElapsedTime's resolution. Two events of one anchor are ordered exactly.
  ASSERT_GE(clock_error, 0);
  const int64_t tol = clock_error + 2'000;
  for (const auto& s : t.spans) {
    EXPECT_LE(s.start_ns, s.end_ns);
    EXPECT_GE(s.start_ns, t0 - tol);
    EXPECT_LE(s.end_ns, t1 + tol);
  }
  EXPECT_LE(ar.end_ns, bc.start_ns + 2'000);
  bool named = false;
  for (const auto& st : t.streams)
    named |= st.stream == model::names::kStreamDp && st.name == "comm.dp";
  EXPECT_TRUE(named);
}

TEST(NcclComm, SplitKeepsMembersAndSkipsNonMembers) {
  SKIP_WITHOUT_DEVICE();
  select_device(0);
  Stream compute;
  auto boot = make_local_communicator();
  auto nccl = make_nccl_communicator(*boot, compute.get());
  auto dp = nccl->split(0, 0, traces::CommKind::DP, "dp[0]");
  ASSERT_NE(dp, nullptr);
  EXPECT_EQ(dp->size(), 1);
  EXPECT_EQ(dp->info().name, "dp[0]");
  EXPECT_EQ(dp->info().kind, traces::CommKind::DP);
  EXPECT_EQ(dp->info().ranks, std::vector<int32_t>{0});
  EXPECT_NE(dp->info().id, nccl->info().id);
  check_collectives(*dp, compute.get());
  EXPECT_EQ(nccl->split(-1, 0, traces::CommKind::TP, "none"), nullptr);
}

TEST(StagedComm, WorldOfOneExactResultsAndOrdering) {
  SKIP_WITHOUT_DEVICE();
  select_device(0);
  Stream compute;
  auto host = make_local_communicator();
  auto staged = make_staged_communicator(*host, compute.get());
  check_collectives(*staged, compute.get());
  // Send to oneself, then receive (the local communicator buffers the send).
  const size_t n = 333;
  DeviceArray<float> a(n), b(n);
  test::launch_late_fill(a.data(), n, 5.0f, kSpinCycles, compute.get());
  Handle hs = staged->send(a.data(), n, DType::F32, 0);
  Handle hr = staged->recv(b.data(), n, DType::F32, 0);
  hs.wait();
  hr.wait();
  const std::vector<float> got = to_host(b.data(), n, compute.get());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 5.0f + static_cast<float>(i));
  auto sub = staged->split(0, 0, traces::CommKind::TP, "tp[0]");
  ASSERT_NE(sub, nullptr);
  check_collectives(*sub, compute.get());
}

TEST(NcclCommNoDevice, FailsAtOnceWithTheReason) {
  if (device_count() > 0)
    GTEST_SKIP() << "a CUDA device is present; this checks the no-device path";
  auto boot = make_local_communicator();
  try {
    make_nccl_communicator(*boot, nullptr);
    FAIL() << "make_nccl_communicator succeeded without a device";
  } catch (const InternalError& e) {
    const std::string msg = e.what();
    std::printf("  the message: %s\n", msg.c_str());
    EXPECT_NE(msg.find("NCCL cannot start: rank 0: "), std::string::npos) << msg;
    EXPECT_NE(msg.find(no_device_reason()), std::string::npos) << msg;
  }
}

TEST(StagedCommNoDevice, FailsAtOnceWithTheReason) {
  if (device_count() > 0)
    GTEST_SKIP() << "a CUDA device is present; this checks the no-device path";
  auto host = make_local_communicator();
  try {
    make_staged_communicator(*host, nullptr);
    FAIL() << "make_staged_communicator succeeded without a device";
  } catch (const InternalError& e) {
    std::printf("  the message: %s\n", e.what());
    EXPECT_NE(std::string(e.what()).find(no_device_reason()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace orrery::runtime::cuda
