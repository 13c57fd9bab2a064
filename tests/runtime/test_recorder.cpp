// The span recorder and the NVTX-style ranges (profiler/capture): spans from several threads reach
// the trace file with their stream, nesting and step context; counters; a disabled recorder and an
// absent one record nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "orrery/profiler/ranges.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::profiler {
namespace {

std::string temp_trace(const char* tag) {
  return ::testing::TempDir() + "orrery_recorder_" + tag + "_" + std::to_string(::getpid()) + ".db";
}

TEST(Recorder, SpansFromThreadsReachTheTrace) {
  const std::string path = temp_trace("threads");
  const int threads = 4, per_thread = 1000;  // more than a thread buffer holds: drains mid-run
  {
    traces::TraceWriter writer(path);
    Recorder rec(&writer, 3, /*thread_buffer_spans=*/256);
    rec.add_stream(kComputeStream, "compute");
    rec.add_stream(kCommStream, "comm");
    const traces::NameId name = rec.intern("work");
    EXPECT_EQ(rec.intern("work"), name);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        Recorder::set_thread_stream(t % 2 ? kCommStream : kComputeStream);
        for (int i = 0; i < per_thread; ++i) {
          traces::Span s;
          s.kind = traces::SpanKind::Compute;
          s.name = name;
          s.stream = Recorder::thread_stream();
          s.layer = t;
          s.start_ns = i * 10;
          s.end_ns = i * 10 + 5;
          rec.record(s);
        }
      });
    }
    for (auto& th : pool) th.join();
    rec.counter("mem.parameters", 1024.0, 7);
    EXPECT_EQ(rec.span_count(), threads * per_thread);
    rec.flush();
    writer.close();
  }
  traces::Trace t = traces::load_trace(path);
  std::remove(path.c_str());
  ASSERT_EQ(t.spans.size(), static_cast<size_t>(threads * per_thread));
  std::vector<int> per_layer(threads, 0);
  for (const auto& s : t.spans) {
    EXPECT_EQ(s.rank, 3);
    EXPECT_EQ(t.name_of(s), "work");
    EXPECT_EQ(s.stream, s.layer % 2 ? kCommStream : kComputeStream);
    ++per_layer[s.layer];
  }
  for (int n : per_layer) EXPECT_EQ(n, per_thread);
  ASSERT_EQ(t.counters.size(), 1u);
  EXPECT_EQ(t.strings.str(t.counters[0].name), "mem.parameters");
  EXPECT_EQ(t.counters[0].value, 1024.0);
  EXPECT_EQ(t.counters[0].ts_ns, 7);
  EXPECT_EQ(t.streams.size(), 2u);
}

TEST(Ranges, NestedScopedAndPushedRangesCarryTheStep) {
  const std::string path = temp_trace("ranges");
  {
    traces::TraceWriter writer(path);
    Recorder rec(&writer, 0);
    Recorder::set_current(&rec);
    rec.set_step(5, 2);
    {
      ORRERY_RANGE("outer");
      {
        ScopedRange inner("inner", traces::SpanKind::Data);
      }
      EXPECT_EQ(push_range("pushed"), 1);
      EXPECT_EQ(push_range("pushed.child"), 2);
      EXPECT_TRUE(pop_range());
      EXPECT_TRUE(pop_range());
    }
    EXPECT_FALSE(pop_range());  // nothing open
    Recorder::set_current(nullptr);
    { ORRERY_RANGE("not recorded"); }
    rec.flush();
    writer.close();
  }
  traces::Trace t = traces::load_trace(path);
  std::remove(path.c_str());
  ASSERT_EQ(t.spans.size(), 4u);
  auto find = [&](const std::string& n) {
    return *std::find_if(t.spans.begin(), t.spans.end(),
                         [&](const traces::Span& s) { return t.name_of(s) == n; });
  };
  const auto outer = find("outer"), inner = find("inner"), pushed = find("pushed"),
             child = find("pushed.child");
  EXPECT_EQ(outer.kind, traces::SpanKind::Phase);
  EXPECT_EQ(inner.kind, traces::SpanKind::Data);
  EXPECT_EQ(outer.step, 5);
  EXPECT_EQ(outer.micro_batch, 2);
  // Nesting: children inside their parents.
  EXPECT_LE(outer.start_ns, inner.start_ns);
  EXPECT_LE(inner.end_ns, outer.end_ns);
  EXPECT_LE(pushed.start_ns, child.start_ns);
  EXPECT_LE(child.end_ns, pushed.end_ns);
  EXPECT_LE(pushed.end_ns, outer.end_ns);
  EXPECT_LE(inner.end_ns, pushed.start_ns);
}

TEST(Recorder, DisabledRecordsNothing) {
  Recorder rec(nullptr, 0);
  EXPECT_FALSE(rec.enabled());
  Recorder::set_current(&rec);
  { ORRERY_RANGE("x"); }
  EXPECT_EQ(push_range("y"), 0);
  rec.record(traces::Span{});
  rec.counter("mem.parameters", 1);
  {
    ScopedSpan s(&rec, traces::Span{});
  }
  EXPECT_EQ(rec.span_count(), 0);
  Recorder::set_current(nullptr);
  rec.flush();  // no writer: a no-op
}

TEST(Clock, SteadyAndNanoseconds) {
  const int64_t a = steady_now_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const int64_t b = steady_now_ns();
  EXPECT_GE(b - a, 2'000'000);
}

}  // namespace
}  // namespace orrery::profiler
