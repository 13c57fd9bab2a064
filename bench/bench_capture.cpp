// Cost of profiling a real run: nanoseconds per recorded span and per range (into a real SQLite
// trace file, flush included), and the step time of gpt-tiny with profiling on versus off, measured
// by two trainers stepping alternately in one process so that machine load hits both alike.
//   bench_capture [--steps N] [--config tiny|small] [--threads T]
// Prints figures; asserts nothing.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "orrery/profiler/ranges.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/traces/store.hpp"

#if defined(ORRERY_RUNTIME_AVAILABLE)
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/trainer.hpp"
#endif

using namespace orrery;
using Clock = std::chrono::steady_clock;

namespace {

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

// CPU time of the calling thread: with one compute thread (OpenBLAS and OpenMP run in the caller)
// it is the step's own work, much less sensitive than wall time to other processes on the machine.
double thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void bench_spans() {
  const std::string path = "/tmp/orrery_bench_capture_" + std::to_string(::getpid()) + ".db";
  const int n = 1'000'000;
  double record_ns = 0, range_ns = 0, off_ns = 0;
  {
    traces::TraceWriter writer(path);
    profiler::Recorder rec(&writer, 0);
    const traces::NameId name = rec.intern("fwd.block");
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      traces::Span s;
      s.name = name;
      s.layer = i & 7;
      s.start_ns = profiler::steady_now_ns();
      s.end_ns = profiler::steady_now_ns();
      rec.record(s);
    }
    rec.flush();
    record_ns = ns_since(t0) / n;
    profiler::Recorder::set_current(&rec);
    t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      ORRERY_RANGE("user.range");
    }
    rec.flush();
    range_ns = ns_since(t0) / n;
    profiler::Recorder::set_current(nullptr);
    writer.close();
  }
  std::remove(path.c_str());
  {
    profiler::Recorder off(nullptr, 0);
    profiler::Recorder::set_current(&off);
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      ORRERY_RANGE("user.range");
    }
    off_ns = ns_since(t0) / n;
    profiler::Recorder::set_current(nullptr);
  }
  std::printf("span recorded (two clock reads + buffer + SQLite, flush included): %7.1f ns\n",
              record_ns);
  std::printf("ORRERY_RANGE, profiling on (intern + two clock reads + record):    %7.1f ns\n",
              range_ns);
  std::printf("ORRERY_RANGE, profiling off:                                       %7.1f ns\n",
              off_ns);
}

#if defined(ORRERY_RUNTIME_AVAILABLE)
void bench_steps(int steps, const std::string& config, int threads) {
  Scenario s;
  if (config == "small") {
    s.model = ModelConfig{6, 384, 6, 8192, 256, "gpt-small-ish"};
    s.training.micro_batch = s.training.global_batch = 4;
  } else {
    s.model = ModelConfig{4, 256, 4, 8192, 128, "gpt-tiny"};
    s.training.micro_batch = s.training.global_batch = 8;
  }
  s.runtime.threads = threads;
  const std::string path = "/tmp/orrery_bench_capture_steps_" + std::to_string(::getpid()) + ".db";
  traces::TraceWriter writer(path);
  profiler::Recorder rec(&writer, 0);
  auto comm_on = runtime::make_local_communicator();
  auto comm_off = runtime::make_local_communicator();
  runtime::Trainer on(s, *comm_on, &rec);
  runtime::Trainer off(s, *comm_off, nullptr);
  on.prepare();
  off.prepare();
  on.step();  // warm-up, both
  off.step();
  std::vector<double> t_on, t_off, c_on, c_off;
  auto timed = [](runtime::Trainer& t, std::vector<double>& wall, std::vector<double>& cpu) {
    const double c0 = thread_cpu_ns();
    wall.push_back(static_cast<double>(t.step().duration_ns));
    cpu.push_back(thread_cpu_ns() - c0);
  };
  for (int i = 0; i < steps; ++i) {
    // Alternate which goes first, so neither always follows the other's cache state.
    if (i % 2) {
      timed(on, t_on, c_on);
      timed(off, t_off, c_off);
    } else {
      timed(off, t_off, c_off);
      timed(on, t_on, c_on);
    }
  }
  rec.flush();
  writer.close();
  const int64_t spans = rec.span_count();
  std::remove(path.c_str());
  const double m_on = median(t_on), m_off = median(t_off);
  const double cpu_on = median(c_on), cpu_off = median(c_off);
  std::printf("%s, %d thread(s), %d alternating steps, %.0f spans per step:\n",
              s.model.name.c_str(), threads, steps, static_cast<double>(spans) / (steps + 1));
  std::printf("  wall median step  %9.2f ms profiled  %9.2f ms not profiled  overhead %+6.2f %%\n",
              m_on * 1e-6, m_off * 1e-6, 100.0 * (m_on - m_off) / m_off);
  if (threads == 1) {
    std::printf("  thread CPU time   %9.2f ms profiled  %9.2f ms not profiled  overhead %+6.2f %%\n",
                cpu_on * 1e-6, cpu_off * 1e-6, 100.0 * (cpu_on - cpu_off) / cpu_off);
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  int steps = 10, threads = 1;
  std::string config = "tiny";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--config")) config = argv[i + 1];
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
  }
  bench_spans();
#if defined(ORRERY_RUNTIME_AVAILABLE)
  bench_steps(steps, config, threads);
#else
  std::printf("(runtime not built: no step-time overhead figure)\n");
#endif
  return 0;
}
