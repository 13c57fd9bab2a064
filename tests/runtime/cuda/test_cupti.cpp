// The CUPTI tracer (profiler/cupti_tracer.hpp) on a device: a memset, a host-to-device copy and a
// tiny kernel on one stream become exactly three spans, in that order, on that stream's trace
// stream, with their bytes, the step of the range that launched them, and times on the recorder's
// clock inside the host interval around them. Without a device, start() throws with the reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "comm_test_kernels.hpp"
#include "orrery/common/error.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/cuda/device.hpp"
#include "orrery/traces/store.hpp"

#if ORRERY_HAVE_CUPTI_TRACER
#include "orrery/profiler/cupti_tracer.hpp"
#include "orrery/profiler/ranges.hpp"

namespace orrery::runtime::cuda {
namespace {

TEST(CuptiTracer, MemsetCopyKernelBecomeThreeSpansInOrder) {
  if (device_count() == 0) GTEST_SKIP() << no_device_reason();
  select_device(0);
  const std::string path =
      ::testing::TempDir() + "orrery_cupti_" + std::to_string(::getpid()) + ".db";
  const size_t n = 1 << 16;
  std::vector<float> host(n, 2.0f);
  float* pinned = nullptr;
  ORRERY_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned), n * sizeof(float)));
  std::copy(host.begin(), host.end(), pinned);
  DeviceArray<float> dev(n);
  Stream s;
  int64_t t0 = 0, t1 = 0;
  {
    traces::TraceWriter writer(path);
    profiler::Recorder rec(&writer, 0);
    profiler::Recorder::set_current(&rec);
    auto tracer = profiler::CuptiTracer::start(rec);
    rec.set_step(7);
    t0 = profiler::steady_now_ns();
    {
      ORRERY_RANGE("forward");
      ORRERY_CUDA_CHECK(cudaMemsetAsync(dev.data(), 0, n * sizeof(float), s.get()));
      ORRERY_CUDA_CHECK(cudaMemcpyAsync(dev.data(), pinned, n * sizeof(float),
                                        cudaMemcpyHostToDevice, s.get()));
      test::launch_scale(dev.data(), n, 3.0f, s.get());
      ORRERY_CUDA_CHECK(cudaGetLastError());
    }
    s.synchronize();
    t1 = profiler::steady_now_ns();
    tracer->flush();
    EXPECT_EQ(tracer->dropped_records(), 0u);
    EXPECT_GE(tracer->clock_offset_uncertainty_ns(), 0);
    tracer.reset();
    profiler::Recorder::set_current(nullptr);
    rec.flush();
    writer.close();
  }
  cudaFreeHost(pinned);
  EXPECT_EQ(dev.to_host(), std::vector<float>(n, 6.0f));

  traces::Trace t = traces::load_trace(path);
  std::remove(path.c_str());
  std::vector<traces::Span> gpu;
  for (const auto& sp : t.spans) {
    if (sp.stream >= profiler::kCudaStreamBase) gpu.push_back(sp);
  }
  std::sort(gpu.begin(), gpu.end(), [](auto& a, auto& b) { return a.start_ns < b.start_ns; });
  ASSERT_EQ(gpu.size(), 3u);
  EXPECT_EQ(t.name_of(gpu[0]), "memset");
  EXPECT_EQ(gpu[0].kind, traces::SpanKind::Memcpy);
  EXPECT_EQ(gpu[0].bytes, static_cast<int64_t>(n * sizeof(float)));
  EXPECT_EQ(t.name_of(gpu[1]), "memcpy HtoD");
  EXPECT_EQ(gpu[1].kind, traces::SpanKind::Memcpy);
  EXPECT_EQ(gpu[1].bytes, static_cast<int64_t>(n * sizeof(float)));
  EXPECT_NE(t.name_of(gpu[2]).find("scale"), std::string::npos) << t.name_of(gpu[2]);
  EXPECT_EQ(gpu[2].kind, traces::SpanKind::Compute);
  for (size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_EQ(gpu[i].stream, gpu[0].stream);
    EXPECT_EQ(gpu[i].step, 7) << "span " << i << " not attributed to the range that launched it";
    EXPECT_LE(gpu[i].start_ns, gpu[i].end_ns);
    // On the recorder's clock: inside the host interval (with the offset's uncertainty).
    EXPECT_GE(gpu[i].start_ns, t0 - 100'000);
    EXPECT_LE(gpu[i].end_ns, t1 + 100'000);
    if (i > 0) {
      EXPECT_LE(gpu[i - 1].end_ns, gpu[i].start_ns);  // one stream: in order
    }
  }
  bool named = false;
  for (const auto& st : t.streams) named |= st.stream == gpu[0].stream && st.name.rfind("cuda stream ", 0) == 0;
  EXPECT_TRUE(named);
}

TEST(CuptiTracerNoDevice, StartFailsAtOnceWithTheReason) {
  if (device_count() > 0) GTEST_SKIP() << "a CUDA device is present; this checks the no-device path";
  profiler::Recorder rec(nullptr, 0);
  try {
    profiler::CuptiTracer::start(rec);
    FAIL() << "CuptiTracer::start succeeded without a device";
  } catch (const InternalError& e) {
    std::printf("  the message: %s\n", e.what());
    EXPECT_NE(std::string(e.what()).find("CUPTI tracing needs a CUDA device: "), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace orrery::runtime::cuda
#endif  // ORRERY_HAVE_CUPTI_TRACER
