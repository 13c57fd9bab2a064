// Helpers for the trace tests: temporary files and a deterministic random trace.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

#include "orrery/traces/store.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::traces::testing {

// A fresh directory per test, removed at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("orrery_traces_" + std::to_string(::getpid()) + "_" +
            (info ? std::string(info->test_suite_name()) + "_" + info->name() : "x"));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

// A trace with `ranks` ranks, 2 streams each (compute, comm), `per_stream` spans per stream,
// random durations and gaps, collectives with sequence numbers on a world communicator, some
// overlapping spans on the compute stream and memory counters.
inline Trace make_trace(int ranks, int per_stream, uint64_t seed = 1) {
  Trace t;
  std::mt19937_64 rng(seed);
  t.meta.source = TraceSource::Synth;
  t.meta.scenario_name = "test";
  t.meta.scenario_text = "model: gpt-tiny\nsteps: 3\n";
  t.meta.host = "testhost";
  t.meta.start_time_unix_ns = 1700000000123456789;
  t.meta.world_size = ranks;
  t.meta.dp = ranks;
  t.meta.tokens_per_step = 4096;
  t.meta.model_flops_per_step = 1.5e12;
  t.meta.peak_flops_per_rank = 3.125e11;
  t.meta.extra_json = R"({"note":"unit test"})";
  t.meta.origin = TraceOrigin::Run;
  t.meta.layout = {1, 4, "1f1b", "tp,dp,pp", "selective", "cpu", "fp32"};
  t.meta.failure = {true, {1, 3}, 2, "rank 1 and rank 3 were lost \"somewhere\"\n"};
  CommunicatorInfo world{0, CommKind::World, "world", {}};
  for (int r = 0; r < ranks; ++r) {
    world.ranks.push_back(r);
    t.ranks.push_back({r, "host" + std::to_string(r / 2), "cpu", r, 0, 0});
    t.streams.push_back({r, 0, "compute"});
    t.streams.push_back({r, 1, "comm"});
  }
  t.comms.push_back(world);
  t.comms.push_back({1, CommKind::DP, "dp[tp=0,pp=0]", world.ranks});
  const NameId fwd = t.strings.intern("forward");
  const NameId bwd = t.strings.intern("backward \"quoted\"\\ name");
  const NameId ar = t.strings.intern("all_reduce");
  const NameId mem = t.strings.intern("mem.activations");
  for (int r = 0; r < ranks; ++r) {
    int64_t now = 1000 + r;
    for (int i = 0; i < per_stream; ++i) {
      Span s;
      s.rank = r;
      s.stream = 0;
      s.kind = (i % 2) ? SpanKind::Compute : SpanKind::Optimizer;
      s.name = (i % 2) ? fwd : bwd;
      s.start_ns = now;
      // Every 10th span is long and overlaps the next ones (a phase range), the rest are short.
      s.end_ns = now + ((i % 10 == 0) ? 5000 + static_cast<int64_t>(rng() % 5000)
                                      : 1 + static_cast<int64_t>(rng() % 900));
      if (i % 10 == 0) s.kind = SpanKind::Phase;
      s.step = i / 50;
      s.micro_batch = i % 4;
      s.layer = i % 7;
      s.flops = static_cast<double>(rng() % 1000000) * 0.5;
      t.spans.push_back(s);
      now += 1 + static_cast<int64_t>(rng() % 1000);
    }
    now = 2000;
    for (int i = 0; i < per_stream; ++i) {
      Span s;
      s.rank = r;
      s.stream = 1;
      s.kind = SpanKind::Collective;
      s.name = ar;
      s.op = CollOp::AllReduce;
      s.start_ns = now + static_cast<int64_t>(rng() % 100);
      s.end_ns = s.start_ns + 100 + static_cast<int64_t>(rng() % 2000);
      s.step = i / 50;
      s.bytes = 1 << 20;
      s.comm = i % 2;
      s.seq = i / 2;
      t.spans.push_back(s);
      now = s.end_ns + static_cast<int64_t>(rng() % 50);
    }
    for (int i = 0; i < 20; ++i) {
      t.counters.push_back({r, mem, 1000 + 100 * i, 1024.0 * (i + r) + 0.25});
    }
  }
  t.sort_spans();
  return t;
}

// A child process writes t.spans[0, flushed) to `path` (batches of 100), flushes, adds `held`
// more spans that stay in its buffer, and dies without close(), as a crashed run would. Returns
// whether the child exited normally.
inline bool write_then_die(const std::string& path, const Trace& t, size_t flushed, size_t held) {
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    auto* w = new TraceWriter(path, 100);
    w->set_meta(t.meta);
    for (const auto& s : t.strings.all()) w->intern(s);
    for (size_t i = 0; i < flushed; ++i) w->add_span(t.spans[i]);
    w->flush();
    for (size_t i = flushed; i < flushed + held; ++i) w->add_span(t.spans[i]);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

inline bool same_span(const Span& a, const Span& b) {
  return a.rank == b.rank && a.stream == b.stream && a.kind == b.kind && a.name == b.name &&
         a.start_ns == b.start_ns && a.end_ns == b.end_ns && a.step == b.step &&
         a.micro_batch == b.micro_batch && a.layer == b.layer && a.bytes == b.bytes &&
         a.flops == b.flops && a.comm == b.comm && a.peer == b.peer && a.seq == b.seq &&
         a.op == b.op;
}

}  // namespace orrery::traces::testing
