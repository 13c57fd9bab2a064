// `orrery report` on a huge trace: the in-memory path (load_all + compute_metrics +
// compression_metrics) against the streaming path (load_header + compute_metrics_streamed with the
// compression accumulator), alternated in the same run. Each path runs in a child process of its
// own, so its wall time, CPU time (user + system, all threads) and peak resident set are its
// alone; the children's figures are compared field by field (a fingerprint of the Metrics) and
// the bench fails when they differ. The trace is synthesized and written by a child too, so the
// parent stays small.
//
//   bench_report_stream [SPANS=50000000] [RANKS=8] [LAYERS=48] [ROUNDS=2] [DIR=/tmp]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "orrery/profiler/compression_metrics.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/synth.hpp"

namespace fs = std::filesystem;
using namespace orrery;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Enough of every Metrics field to tell two results apart (printed with full precision).
std::string fingerprint(const profiler::Metrics& m, const profiler::CompressionMetrics& c) {
  char b[512];
  std::snprintf(b, sizeof b,
                "spans %lld ranks %zu steps %zu mean %.17g p90 %.17g flops %.17g mfu %.17g "
                "bubble %.17g stragglers %zu collectives %zu compute %lld comm %lld overlap %lld "
                "idle %lld extent %lld..%lld buckets %lld",
                static_cast<long long>(m.span_count), m.ranks.size(), m.steps.size(),
                m.step_mean_ns, m.step_p90_ns, m.achieved_flops, m.mfu, m.bubble_pct,
                m.stragglers.size(), m.collectives.size(),
                static_cast<long long>(m.total.compute_ns), static_cast<long long>(m.total.comm_ns),
                static_cast<long long>(m.total.overlap_ns), static_cast<long long>(m.total.idle_ns),
                static_cast<long long>(m.start_ns), static_cast<long long>(m.end_ns),
                static_cast<long long>(c.buckets));
  std::string s = b;
  for (const auto& r : m.ranks) {
    std::snprintf(b, sizeof b, " | r%d %lld %lld %.17g %lld %.17g", r.rank,
                  static_cast<long long>(r.total.exposed_comm_ns),
                  static_cast<long long>(r.bubble_ns), r.late_ns_mean,
                  static_cast<long long>(r.collectives_late), r.peak_memory_total_bytes);
    s += b;
  }
  for (const auto& cs : m.collectives) {
    std::snprintf(b, sizeof b, " | %s %d %lld %lld %.17g %lld", cs.op.c_str(), cs.comm,
                  static_cast<long long>(cs.count), static_cast<long long>(cs.bytes), cs.busbw_gbps,
                  static_cast<long long>(cs.ops));
    s += b;
  }
  return s;
}

std::string report_in_memory(const std::string& path) {
  traces::TraceReader reader(path);
  const traces::Trace t = reader.load_all();
  const profiler::Metrics m = profiler::compute_metrics(t);
  return fingerprint(m, profiler::compression_metrics(t));
}

std::string report_streamed(const std::string& path) {
  traces::TraceReader reader(path);
  // As orrery report: the memory counters stay in the file (compute_metrics_streamed reads them).
  const traces::Trace header =
      reader.load_header([](std::string_view name) { return name.rfind("mem.", 0) != 0; });
  profiler::CompressionAccumulator comp(header);
  const profiler::Metrics m = profiler::compute_metrics_streamed(
      reader, header, {}, [&comp](std::span<const traces::Span> spans) {
        for (const auto& s : spans) comp.add(s);
      });
  return fingerprint(m, comp.result());
}

struct ChildRun {
  double wall_s = 0, cpu_s = 0, peak_mib = 0;
  std::string out;  // what the child wrote to its pipe
};

// Runs `work` in a forked child (this process has no threads), its result through a pipe.
template <typename Work>
ChildRun in_child(Work&& work) {
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("pipe");
    std::exit(1);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    std::exit(1);
  }
  if (pid == 0) {
    close(fds[0]);
    int rc = 0;
    try {
      const std::string s = work();
      if (write(fds[1], s.data(), s.size()) != static_cast<ssize_t>(s.size())) rc = 3;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_report_stream: %s\n", e.what());
      rc = 2;
    }
    close(fds[1]);
    _exit(rc);
  }
  close(fds[1]);
  ChildRun run;
  char buf[65536];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) run.out.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  rusage ru{};
  if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "bench_report_stream: a child failed (status %d)\n", status);
    std::exit(1);
  }
  run.wall_s = seconds_since(t0);
  run.cpu_s = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
              1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  run.peak_mib = double(ru.ru_maxrss) / 1024.0;
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t target = argc > 1 ? std::atoll(argv[1]) : 50'000'000;
  traces::SynthOptions o;
  o.ranks = argc > 2 ? std::atoi(argv[2]) : 8;
  o.layers = argc > 3 ? std::atoi(argv[3]) : 48;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 2;
  const fs::path dir = argc > 5 ? argv[5] : "/tmp";
  o.steps = traces::synth_steps_for_spans(o, target);
  const std::string path =
      (dir / ("orrery_bench_report_stream_" + std::to_string(::getpid()) + ".db")).string();

  const ChildRun made = in_child([&] {
    traces::write_trace(traces::synthesize(o), path);
    return std::string();
  });
  std::printf(
      "synthesize + write: %lld spans (%d ranks x %d steps x %d layers), %.1f MB on disk, "
      "%.1f s, peak %.0f MiB\n",
      static_cast<long long>(traces::synth_span_count(o)), o.ranks, o.steps, o.layers,
      double(fs::file_size(path)) / 1e6, made.wall_s, made.peak_mib);
  std::fflush(stdout);

  std::string expected;
  bool identical = true;
  for (int round = 0; round < rounds; ++round) {
    // Alternated: the page cache favours whichever reads second, so each goes first once.
    for (int k = 0; k < 2; ++k) {
      const bool stream = (round + k) % 2 == 1;
      const ChildRun r =
          in_child([&] { return stream ? report_streamed(path) : report_in_memory(path); });
      if (expected.empty()) expected = r.out;
      identical = identical && r.out == expected;
      std::printf("round %d %-10s wall %7.2f s  CPU %7.2f s  peak RSS %8.0f MiB\n", round + 1,
                  stream ? "streamed" : "in-memory", r.wall_s, r.cpu_s, r.peak_mib);
      std::fflush(stdout);
    }
  }
  std::printf("metrics identical across paths and rounds: %s\n", identical ? "yes" : "NO");
  fs::remove(path);
  fs::remove(path + "-wal");
  fs::remove(path + "-shm");
  return identical ? 0 : 1;
}
