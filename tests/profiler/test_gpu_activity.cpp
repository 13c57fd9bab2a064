// GPU activity -> spans without a GPU (the logic the CUPTI tracer relies on, fed by hand): kernel
// names demangled, NCCL kernels classified, timestamps shifted by the clock offset, one trace stream
// per CUDA stream, activities attributed to the range their launch was correlated with (also when
// the correlation arrives after the activity); and the range hooks called balanced per range.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "orrery/profiler/gpu_activity.hpp"
#include "orrery/profiler/range_hooks.hpp"
#include "orrery/profiler/ranges.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::profiler {
namespace {

std::string temp_trace(const char* tag) {
  return ::testing::TempDir() + "orrery_gpu_activity_" + tag + "_" + std::to_string(::getpid()) + ".db";
}

TEST(GpuActivity, KernelDisplayNames) {
  // _Z5saxpyifPfS_ = saxpy(int, float, float*, float*)
  EXPECT_EQ(kernel_display_name("_Z5saxpyifPfS_"), "saxpy");
  // void scale<float>(float*, int)
  EXPECT_EQ(kernel_display_name("_Z5scaleIfEvPfi"), "scale<float>");
  EXPECT_EQ(kernel_display_name("ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
  EXPECT_EQ(kernel_display_name("plain_c_kernel"), "plain_c_kernel");
}

TEST(GpuActivity, NcclKernelsAreCollectives) {
  traces::SpanKind k;
  traces::CollOp op;
  classify_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", k, op);
  EXPECT_EQ(k, traces::SpanKind::Collective);
  EXPECT_EQ(op, traces::CollOp::AllReduce);
  classify_kernel("ncclKernel_ReduceScatter_RING_SIMPLE_Sum_float", k, op);
  EXPECT_EQ(op, traces::CollOp::ReduceScatter);
  classify_kernel("ncclDevKernel_AllGather_RING_LL", k, op);
  EXPECT_EQ(op, traces::CollOp::AllGather);
  classify_kernel("ncclDevKernel_Broadcast_RING_LL", k, op);
  EXPECT_EQ(op, traces::CollOp::Broadcast);
  classify_kernel("ncclDevKernel_Reduce_Sum_f32_RING_LL", k, op);
  EXPECT_EQ(op, traces::CollOp::Reduce);
  classify_kernel("ncclDevKernel_SendRecv", k, op);
  EXPECT_EQ(k, traces::SpanKind::P2P);
  classify_kernel("_Z5saxpyifPfS_", k, op);
  EXPECT_EQ(k, traces::SpanKind::Compute);
  EXPECT_EQ(op, traces::CollOp::None);
}

TEST(GpuActivity, SpansOnTheRecorderClockPerStreamWithTheirRange) {
  const std::string path = temp_trace("map");
  const int64_t offset = 1'000'000;
  {
    traces::TraceWriter writer(path);
    Recorder rec(&writer, 2);
    GpuActivityMapper m(rec, offset);
    m.range_opened(7, /*step=*/3, /*micro_batch=*/1);
    m.correlate(100, 7);  // before its kernel
    m.add({GpuActivity::Kind::Memset, "memset", 10, 20, 13, 99, 4096});
    m.add({GpuActivity::Kind::Memcpy, "HtoD", 30, 50, 13, 100, 4096});
    m.add({GpuActivity::Kind::Kernel, "_Z5saxpyifPfS_", 60, 90, 14, 101, 0});
    m.add({GpuActivity::Kind::Kernel, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 95, 120, 14, 102, 0});
    m.correlate(101, 7);  // after its kernel: still attributed (held until flush)
    m.flush();
    EXPECT_EQ(m.spans_recorded(), 4);
    rec.flush();
    writer.close();
  }
  traces::Trace t = traces::load_trace(path);
  std::remove(path.c_str());
  ASSERT_EQ(t.spans.size(), 4u);
  std::sort(t.spans.begin(), t.spans.end(),
            [](const traces::Span& a, const traces::Span& b) { return a.start_ns < b.start_ns; });
  const auto& ms = t.spans[0];
  EXPECT_EQ(t.name_of(ms), "memset");
  EXPECT_EQ(ms.kind, traces::SpanKind::Memcpy);
  EXPECT_EQ(ms.start_ns, 10 + offset);
  EXPECT_EQ(ms.end_ns, 20 + offset);
  EXPECT_EQ(ms.bytes, 4096);
  EXPECT_EQ(ms.stream, kCudaStreamBase + 13);
  EXPECT_EQ(ms.step, -1);  // correlation 99 has no range
  EXPECT_EQ(ms.rank, 2);
  const auto& cp = t.spans[1];
  EXPECT_EQ(t.name_of(cp), "memcpy HtoD");
  EXPECT_EQ(cp.step, 3);
  EXPECT_EQ(cp.micro_batch, 1);
  const auto& k = t.spans[2];
  EXPECT_EQ(t.name_of(k), "saxpy");
  EXPECT_EQ(k.kind, traces::SpanKind::Compute);
  EXPECT_EQ(k.stream, kCudaStreamBase + 14);
  EXPECT_EQ(k.step, 3);
  const auto& nc = t.spans[3];
  EXPECT_EQ(nc.kind, traces::SpanKind::Collective);
  EXPECT_EQ(nc.op, traces::CollOp::AllReduce);
  EXPECT_EQ(nc.step, -1);
  // One named trace stream per CUDA stream.
  ASSERT_EQ(t.streams.size(), 2u);
  std::vector<std::string> names;
  for (const auto& s : t.streams) names.push_back(s.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names[0], "cuda stream 13");
  EXPECT_EQ(names[1], "cuda stream 14");
}

TEST(GpuActivity, DisabledRecorderRecordsNothing) {
  Recorder rec(nullptr, 0);
  GpuActivityMapper m(rec, 0);
  m.add({GpuActivity::Kind::Kernel, "k", 1, 2, 0, 1, 0});
  m.flush();
  EXPECT_EQ(m.spans_recorded(), 0);
}

struct HookLog {
  static inline std::vector<std::string> events;
  static void open(const char* name, uint64_t len, int32_t step, int32_t micro_batch) {
    events.push_back("open " + std::string(name, len) + " " + std::to_string(step) + "/" +
                     std::to_string(micro_batch));
  }
  static void close() { events.push_back("close"); }
};

TEST(RangeHooks, CalledBalancedForRecordedRanges) {
  const std::string path = temp_trace("hooks");
  const RangeHooks hooks{&HookLog::open, &HookLog::close};
  HookLog::events.clear();
  {
    traces::TraceWriter writer(path);
    Recorder rec(&writer, 0);
    Recorder::set_current(&rec);
    set_range_hooks(&hooks);
    EXPECT_EQ(range_hooks(), &hooks);
    rec.set_step(4, 0);
    {
      ORRERY_RANGE("forward");
      push_range("layer");
      pop_range();
    }
    Recorder::set_current(nullptr);
    { ORRERY_RANGE("unrecorded"); }  // no recorder: no hooks either
    begin_annotation("fwd.block 2", 4, 1);  // annotations call the hooks without a recorder
    end_annotation();
    set_range_hooks(nullptr);
    rec.flush();
    writer.close();
  }
  std::remove(path.c_str());
  const std::vector<std::string> expected = {"open forward 4/0", "open layer 4/0", "close", "close",
                                             "open fwd.block 2 4/1", "close"};
  EXPECT_EQ(HookLog::events, expected);
}

}  // namespace
}  // namespace orrery::profiler
