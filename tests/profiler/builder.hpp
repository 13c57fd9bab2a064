// Helpers for the profiler tests: a small builder for hand-made traces with exactly known answers.
#pragma once

#include <string>

#include "orrery/traces/trace.hpp"

namespace orrery::profiler::testing {

using traces::CollOp;
using traces::Span;
using traces::SpanKind;

struct Builder {
  traces::Trace t;

  explicit Builder(int ranks, int pp = 1) {
    t.meta.world_size = ranks;
    t.meta.pp = pp;
    t.meta.dp = ranks / pp;
    traces::CommunicatorInfo world{0, traces::CommKind::World, "world", {}};
    for (int r = 0; r < ranks; ++r) {
      t.ranks.push_back({r, "host", "cpu", r / pp, 0, r % pp});
      world.ranks.push_back(r);
    }
    t.comms.push_back(world);
  }
  Span& add(int rank, int stream, SpanKind kind, const std::string& name, int64_t a, int64_t b,
            int step = -1) {
    Span s;
    s.rank = rank;
    s.stream = stream;
    s.kind = kind;
    s.name = t.strings.intern(name);
    s.start_ns = a;
    s.end_ns = b;
    s.step = step;
    t.spans.push_back(s);
    return t.spans.back();
  }
  Span& compute(int rank, int64_t a, int64_t b, int step = -1) {
    return add(rank, 0, SpanKind::Compute, "gemm", a, b, step);
  }
  Span& coll(int rank, int64_t a, int64_t b, CollOp op = CollOp::AllReduce, int comm = 0,
             int64_t seq = -1, int64_t bytes = 0, int step = -1) {
    Span& s = add(rank, 1, SpanKind::Collective, std::string(traces::to_string(op)), a, b, step);
    s.op = op;
    s.comm = comm;
    s.seq = seq;
    s.bytes = bytes;
    return s;
  }
  void counter(int rank, const std::string& name, int64_t ts, double v) {
    t.counters.push_back({rank, t.strings.intern(name), ts, v});
  }
};

}  // namespace orrery::profiler::testing
