// Collective annotations under the CUPTI tracer on a device (profiler/range_hooks.hpp): kernels
// launched inside begin_collective_annotation / end_collective_annotation become Collective spans
// with the operation's communicator id, sequence number, op, bytes, peer and step, whether launched
// through the runtime (<<<>>>) or, as NCCL launches its kernels, through the driver's
// cuLaunchKernel; a kernel launched after the bracket stays a plain Compute span. Without a running
// tracer the annotation is refused (begin returns false). Suite names start with Gpu: skipped
// without a device.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "comm_test_kernels.hpp"
#include "driver_launch_kernels.hpp"
#include "orrery/profiler/range_hooks.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/cuda/device.hpp"
#include "orrery/traces/store.hpp"

#if ORRERY_HAVE_CUPTI_TRACER
#include "orrery/profiler/cupti_tracer.hpp"
#include "orrery/profiler/ranges.hpp"

namespace orrery::runtime::cuda {
namespace {

TEST(GpuCuptiCollectives, AnnotatedKernelsCarryTheirOperation) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  select_device(0);
  const std::string path =
      ::testing::TempDir() + "orrery_cupti_coll_" + std::to_string(::getpid()) + ".db";
  const size_t n = 1 << 12;
  DeviceArray<float> dev(n);
  ORRERY_CUDA_CHECK(cudaMemcpy(dev.data(), std::vector<float>(n, 1.0f).data(), n * sizeof(float),
                               cudaMemcpyHostToDevice));
  Stream s;
  std::string driver_error;
  {
    // No tracer yet: nothing takes the annotation.
    profiler::CollectiveAnnotation none;
    EXPECT_FALSE(profiler::begin_collective_annotation(none));

    traces::TraceWriter writer(path);
    profiler::Recorder rec(&writer, 0);
    profiler::Recorder::set_current(&rec);
    auto tracer = profiler::CuptiTracer::start(rec);
    rec.set_step(4);
    {
      ORRERY_RANGE("backward");
      profiler::CollectiveAnnotation a;
      a.kind = traces::SpanKind::Collective;
      a.op = traces::CollOp::AllReduce;
      a.comm = 5;
      a.seq = 9;
      a.bytes = 4096;
      a.step = 4;
      a.micro_batch = 1;
      ASSERT_TRUE(profiler::begin_collective_annotation(a));
      test::launch_scale(dev.data(), n, 2.0f, s.get());
      profiler::end_collective_annotation();

      a.op = traces::CollOp::Broadcast;
      a.seq = 10;
      a.peer = 0;
      a.bytes = 1024;
      ASSERT_TRUE(profiler::begin_collective_annotation(a));
      driver_error = test::launch_scale_by_driver(dev.data(), n, 3.0f, s.get());
      profiler::end_collective_annotation();

      test::launch_scale(dev.data(), n, 5.0f, s.get());  // outside any annotation
      ORRERY_CUDA_CHECK(cudaGetLastError());
    }
    s.synchronize();
    tracer->flush();
    EXPECT_EQ(tracer->dropped_records(), 0u);
    tracer.reset();
    profiler::Recorder::set_current(nullptr);
    rec.flush();
    writer.close();
  }
  ASSERT_EQ(driver_error, "");
  EXPECT_EQ(dev.to_host(), std::vector<float>(n, 30.0f));

  traces::Trace t = traces::load_trace(path);
  std::remove(path.c_str());
  std::vector<traces::Span> k;
  for (const auto& sp : t.spans) {
    if (sp.stream >= profiler::kCudaStreamBase && sp.kind != traces::SpanKind::Memcpy)
      k.push_back(sp);
  }
  std::sort(k.begin(), k.end(), [](auto& x, auto& y) { return x.start_ns < y.start_ns; });
  ASSERT_EQ(k.size(), 3u);
  EXPECT_EQ(k[0].kind, traces::SpanKind::Collective);
  EXPECT_EQ(k[0].op, traces::CollOp::AllReduce);
  EXPECT_EQ(k[0].comm, 5);
  EXPECT_EQ(k[0].seq, 9);
  EXPECT_EQ(k[0].bytes, 4096);
  EXPECT_EQ(k[0].step, 4);
  EXPECT_EQ(k[0].micro_batch, 1);
  EXPECT_EQ(k[1].kind, traces::SpanKind::Collective) << "driver-API launch not attributed";
  EXPECT_EQ(k[1].op, traces::CollOp::Broadcast);
  EXPECT_EQ(k[1].comm, 5);
  EXPECT_EQ(k[1].seq, 10);
  EXPECT_EQ(k[1].peer, 0);
  EXPECT_EQ(k[1].bytes, 1024);
  EXPECT_EQ(k[2].kind, traces::SpanKind::Compute);
  EXPECT_EQ(k[2].comm, -1);
  EXPECT_EQ(k[2].seq, -1);
  EXPECT_EQ(k[2].step, 4);  // still attributed to its range
}

}  // namespace
}  // namespace orrery::runtime::cuda

#endif  // ORRERY_HAVE_CUPTI_TRACER
