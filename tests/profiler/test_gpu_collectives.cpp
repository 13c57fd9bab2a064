// Communication operations under a GPU tracer, without a GPU (profiler/range_hooks.hpp,
// gpu_activity.hpp): the collective hooks are called only when installed and close only what they
// opened; a kernel correlated with a collective annotation gets the operation's identity (comm,
// seq, op, bytes, peer, step), a second kernel of the same operation does not repeat its seq and
// bytes; copies keep their kind; an NCCL kernel without an annotation is recorded as Other once
// annotations are in use (the communicator's own span counts that operation); and a trace holding
// both views of an operation (the NCCL kernel, Collective, and the communicator's CUDA-event span,
// Other) reports each operation once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "builder.hpp"
#include "orrery/profiler/gpu_activity.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/profiler/range_hooks.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::profiler {
namespace {

using traces::CollOp;
using traces::SpanKind;

CollectiveAnnotation all_reduce(int32_t comm, int64_t seq, int64_t bytes, int32_t step) {
  CollectiveAnnotation a;
  a.kind = SpanKind::Collective;
  a.op = CollOp::AllReduce;
  a.comm = comm;
  a.seq = seq;
  a.bytes = bytes;
  a.step = step;
  return a;
}

TEST(GpuCollectives, ApplyCollectiveFirstAndLaterKernels) {
  traces::Span s;
  s.kind = SpanKind::Compute;
  s.step = 1;
  s.micro_batch = 2;
  CollectiveAnnotation a = all_reduce(7, 12, 4096, -1);  // no step: the range's stays
  a.peer = 3;
  apply_collective(s, a, /*first=*/true);
  EXPECT_EQ(s.kind, SpanKind::Collective);
  EXPECT_EQ(s.op, CollOp::AllReduce);
  EXPECT_EQ(s.comm, 7);
  EXPECT_EQ(s.seq, 12);
  EXPECT_EQ(s.bytes, 4096);
  EXPECT_EQ(s.peer, 3);
  EXPECT_EQ(s.step, 1);
  EXPECT_EQ(s.micro_batch, 2);

  traces::Span later;
  a.step = 5;
  a.layer = 4;
  apply_collective(later, a, /*first=*/false);
  EXPECT_EQ(later.kind, SpanKind::Collective);
  EXPECT_EQ(later.comm, 7);
  EXPECT_EQ(later.seq, -1);   // grouped once, by the first kernel
  EXPECT_EQ(later.bytes, 0);  // bytes counted once
  EXPECT_EQ(later.step, 5);
  EXPECT_EQ(later.layer, 4);
}

TEST(GpuCollectives, MapperGivesKernelsTheirOperation) {
  const std::string path =
      ::testing::TempDir() + "orrery_gpu_coll_" + std::to_string(::getpid()) + ".db";
  {
    traces::TraceWriter writer(path);
    Recorder rec(&writer, 1);
    GpuActivityMapper m(rec, 0);
    m.range_opened(1, /*step=*/2, /*micro_batch=*/0);
    m.collective_issued(2, all_reduce(3, 0, 8192, 2));
    CollectiveAnnotation send;
    send.kind = SpanKind::P2P;
    send.op = CollOp::Send;
    send.comm = 3;
    send.seq = 1;
    send.bytes = 256;
    send.peer = 0;
    m.collective_issued(3, send);
    // Kernel 10 inside the range and the all-reduce; 11 a second kernel of the all-reduce; 12 a
    // copy inside it; 13 an NCCL kernel outside any annotation; 14 the send's kernel, whose
    // correlation arrives after it; 15 an ordinary kernel.
    m.correlate(10, 1);
    m.correlate_collective(10, 2);
    m.correlate_collective(11, 2);
    m.correlate_collective(12, 2);
    m.add({GpuActivity::Kind::Kernel, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100, 200, 20, 10,
           0});
    m.add({GpuActivity::Kind::Kernel, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 210, 220, 20, 11,
           0});
    m.add({GpuActivity::Kind::Memcpy, "DtoD", 230, 240, 20, 12, 64});
    m.add({GpuActivity::Kind::Kernel, "ncclDevKernel_AllGather_RING_LL", 250, 260, 20, 13, 0});
    m.add({GpuActivity::Kind::Kernel, "ncclDevKernel_SendRecv", 270, 280, 20, 14, 0});
    m.add({GpuActivity::Kind::Kernel, "_Z5saxpyifPfS_", 290, 300, 21, 15, 0});
    m.correlate_collective(14, 3);
    m.flush();
    EXPECT_EQ(m.spans_recorded(), 6);
    rec.flush();
    writer.close();
  }
  traces::Trace t = traces::load_trace(path);
  std::remove(path.c_str());
  ASSERT_EQ(t.spans.size(), 6u);
  std::sort(t.spans.begin(), t.spans.end(),
            [](auto& a, auto& b) { return a.start_ns < b.start_ns; });
  const auto& ar = t.spans[0];
  EXPECT_EQ(ar.kind, SpanKind::Collective);
  EXPECT_EQ(ar.op, CollOp::AllReduce);
  EXPECT_EQ(ar.comm, 3);
  EXPECT_EQ(ar.seq, 0);
  EXPECT_EQ(ar.bytes, 8192);
  EXPECT_EQ(ar.step, 2);
  EXPECT_EQ(ar.micro_batch, 0);  // from the range
  EXPECT_EQ(ar.rank, 1);
  const auto& ar2 = t.spans[1];
  EXPECT_EQ(ar2.kind, SpanKind::Collective);
  EXPECT_EQ(ar2.comm, 3);
  EXPECT_EQ(ar2.seq, -1);
  EXPECT_EQ(ar2.bytes, 0);
  const auto& cp = t.spans[2];
  EXPECT_EQ(cp.kind, SpanKind::Memcpy);
  EXPECT_EQ(cp.comm, -1);
  EXPECT_EQ(cp.bytes, 64);
  const auto& stray = t.spans[3];
  EXPECT_EQ(stray.kind, SpanKind::Other);
  EXPECT_EQ(stray.comm, -1);
  const auto& sr = t.spans[4];
  EXPECT_EQ(sr.kind, SpanKind::P2P);
  EXPECT_EQ(sr.op, CollOp::Send);
  EXPECT_EQ(sr.comm, 3);
  EXPECT_EQ(sr.seq, 1);
  EXPECT_EQ(sr.peer, 0);
  EXPECT_EQ(sr.bytes, 256);
  const auto& k = t.spans[5];
  EXPECT_EQ(k.kind, SpanKind::Compute);
  EXPECT_EQ(k.comm, -1);
}

struct CollHookLog {
  static inline std::vector<std::string> events;
  static inline bool accept = true;
  static bool open(const CollectiveAnnotation& a) {
    events.push_back("open " + std::to_string(a.comm) + "/" + std::to_string(a.seq) +
                     (accept ? "" : " refused"));
    return accept;
  }
  static void close() { events.push_back("close"); }
};

TEST(GpuCollectives, AnnotationHooksOnlyWhenInstalledAndTaken) {
  CollHookLog::events.clear();
  set_range_hooks(nullptr);
  EXPECT_FALSE(begin_collective_annotation(all_reduce(1, 0, 0, -1)));  // no hooks
  end_collective_annotation();                                         // harmless: nothing open

  const RangeHooks ranges_only{nullptr, nullptr};
  set_range_hooks(&ranges_only);
  EXPECT_FALSE(begin_collective_annotation(all_reduce(1, 1, 0, -1)));

  RangeHooks hooks;
  hooks.collective_open = &CollHookLog::open;
  hooks.collective_close = &CollHookLog::close;
  set_range_hooks(&hooks);
  EXPECT_TRUE(begin_collective_annotation(all_reduce(1, 2, 0, -1)));
  end_collective_annotation();
  CollHookLog::accept = false;
  EXPECT_FALSE(begin_collective_annotation(all_reduce(1, 3, 0, -1)));  // tracer not running
  CollHookLog::accept = true;

  // Hooks replaced between begin and end: the close goes to the hooks that opened.
  EXPECT_TRUE(begin_collective_annotation(all_reduce(1, 4, 0, -1)));
  set_range_hooks(&ranges_only);
  end_collective_annotation();
  set_range_hooks(nullptr);

  const std::vector<std::string> expected = {"open 1/2", "close", "open 1/3 refused", "open 1/4",
                                             "close"};
  EXPECT_EQ(CollHookLog::events, expected);
}

// Two ranks, three all-reduces each (comm 0, seq 0..2, 1 MiB), both views recorded as under the
// tracer: the NCCL kernel (Collective, on a CUDA stream) and the communicator's CUDA-event span
// (Other, on the "nccl" stream, a little wider). The report has one row for comm 0 with 6 calls,
// 3 operations and the bytes of 6 calls; communication time is the kernels' alone.
TEST(GpuCollectives, BothViewsOfAnOperationCountOnce) {
  testing::Builder b(2);
  const int64_t mib = 1 << 20;
  for (int r = 0; r < 2; ++r) {
    for (int s = 0; s < 3; ++s) {
      const int64_t t0 = 1000 + s * 1000;
      b.compute(r, t0 - 500, t0);
      auto& k = b.coll(r, t0 + 10, t0 + 110, CollOp::AllReduce, 0, s, mib);  // the kernel
      k.stream = kCudaStreamBase + 7;
      auto& ev = b.add(r, 2, SpanKind::Other, "grads", t0, t0 + 120);  // the event span
      ev.op = CollOp::AllReduce;
      ev.comm = 0;
      ev.seq = s;
      ev.bytes = mib;
    }
  }
  const Metrics m = compute_metrics(b.t);
  ASSERT_EQ(m.collectives.size(), 1u);
  const auto& c = m.collectives[0];
  EXPECT_EQ(c.comm, 0);
  EXPECT_EQ(c.op, "all_reduce");
  EXPECT_EQ(c.count, 6);
  EXPECT_EQ(c.ops, 3);
  EXPECT_EQ(c.bytes, 6 * mib);
  EXPECT_EQ(c.time_ns, 6 * 100);
  ASSERT_EQ(m.ranks.size(), 2u);
  for (const auto& r : m.ranks) {
    EXPECT_EQ(r.total.comm_ns, 3 * 100);
    EXPECT_EQ(r.collectives_checked, 3);
  }
}

}  // namespace
}  // namespace orrery::profiler
