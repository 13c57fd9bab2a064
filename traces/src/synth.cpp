// The synthetic DDP trace generator (see synth.hpp for the schedule and its closed-form totals).
// The schedule is computed step by step for all ranks (the all-reduce synchronises them), then the
// spans are emitted rank by rank and stream by stream, so they come out already sorted.
#include "orrery/traces/synth.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/common/host_memory.hpp"

namespace orrery::traces {
namespace {

// splitmix64: a fixed, portable generator (std:: distributions differ between libraries).
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

void validate(const SynthOptions& o) {
  const auto need = [](bool ok, const std::string& what) {
    if (!ok) throw InputError("synth: " + what);
  };
  need(o.ranks >= 1, "ranks must be >= 1");
  need(o.steps >= 1, "steps must be >= 1");
  need(o.layers >= 1, "layers must be >= 1");
  need(o.layers_per_bucket >= 1 && o.layers % o.layers_per_bucket == 0,
       "layers_per_bucket (" + std::to_string(o.layers_per_bucket) + ") must divide layers (" +
           std::to_string(o.layers) + ")");
  need(o.data_ns >= 0 && o.forward_ns >= 0 && o.backward_ns >= 0 && o.optimizer_ns >= 0 &&
           o.comm_ns_per_layer >= 0 && o.jitter_ns >= 0 && o.straggler_delay_ns >= 0,
       "durations must be >= 0");
  need(o.grad_bytes_per_layer >= 0 && o.activation_bytes_per_layer >= 0, "byte sizes must be >= 0");
  need(o.straggler_rank < o.ranks, "straggler_rank must be < ranks (or -1)");
  need(o.pp >= 1, "pp must be >= 1");
  if (o.pp > 1) {
    need(o.ranks % o.pp == 0,
         "pp (" + std::to_string(o.pp) + ") must divide ranks (" + std::to_string(o.ranks) + ")");
    need(o.layers % o.pp == 0,
         "pp (" + std::to_string(o.pp) + ") must divide layers (" + std::to_string(o.layers) + ")");
    need((o.layers / o.pp) % o.layers_per_bucket == 0,
         "layers_per_bucket (" + std::to_string(o.layers_per_bucket) +
             ") must divide the layers per stage (" + std::to_string(o.layers / o.pp) + ")");
    need(o.micro_batches >= 1, "micro_batches must be >= 1");
    need(o.jitter_ns == 0 && (o.straggler_rank < 0 || o.straggler_delay_ns == 0),
         "jitter and stragglers are not supported with pp > 1");
  }
  // The schedule adds these durations up in int64 ns: a bound of the trace's length (in double,
  // generous for the pipeline schedule) keeps every sum far from overflow (UBSan: signed integer
  // overflow on --jitter-ns or --straggler-delay-ns near 2^63).
  const double per_layer =
      double(o.forward_ns) + double(o.backward_ns) + double(o.comm_ns_per_layer);
  const double waves = o.pp > 1 ? 2.0 * (double(o.micro_batches) + o.pp) : 1.0;
  const double step_ns = double(o.data_ns) + double(o.jitter_ns) + double(o.straggler_delay_ns) +
                         double(o.optimizer_ns) + waves * o.layers * per_layer;
  char length[32];
  std::snprintf(length, sizeof length, "%.3g", step_ns * o.steps);
  need(step_ns * (double(o.steps) + 1) <= 1e18,
       std::string("the trace would last about ") + length +
           " ns (steps x the step's durations); at most 1e18 ns");
}

// Metadata, ranks, streams and communicators. Communicators: 0 "world"; with pp > 1 also
// 1 + i = "dp[pp=i]" (the stage's data-parallel group) and 1 + pp + d = "pp[dp=d]" (pipeline d).
void init_trace(const SynthOptions& o, Trace& t) {
  const int32_t R = o.ranks, pp = o.pp, dp = R / pp;
  t.meta.source = TraceSource::Synth;
  t.meta.origin = TraceOrigin::Synth;
  t.meta.layout.micro_batches = o.micro_batches;
  t.meta.scenario_name = "synth";
  t.meta.host = "synth";
  t.meta.world_size = R;
  t.meta.dp = dp;
  t.meta.pp = pp;
  t.meta.tokens_per_step = o.tokens_per_step > 0 ? o.tokens_per_step : int64_t(dp) * 8 * 1024;
  t.meta.peak_flops_per_rank = o.peak_flops_per_rank;
  t.meta.extra_json = nlohmann::json{{"synth",
                                      {{"ranks", R},
                                       {"steps", o.steps},
                                       {"layers", o.layers},
                                       {"layers_per_bucket", o.layers_per_bucket},
                                       {"pp", pp},
                                       {"micro_batches", o.micro_batches},
                                       {"seed", o.seed}}}}
                          .dump();
  CommunicatorInfo world;
  world.id = 0;
  world.kind = CommKind::World;
  world.name = "world";
  for (int32_t r = 0; r < R; ++r) {
    t.ranks.push_back({r, "synth", "cpu", r / pp, 0, r % pp});
    t.streams.push_back({r, 0, "compute"});
    t.streams.push_back({r, 1, "comm"});
    t.streams.push_back({r, 2, "phases"});
    world.ranks.push_back(r);
  }
  t.comms.push_back(world);
  if (pp == 1) return;
  for (int32_t i = 0; i < pp; ++i) {
    CommunicatorInfo c{1 + i, CommKind::DP, "dp[pp=" + std::to_string(i) + "]", {}};
    for (int32_t d = 0; d < dp; ++d) c.ranks.push_back(d * pp + i);
    t.comms.push_back(c);
  }
  for (int32_t d = 0; d < dp; ++d) {
    CommunicatorInfo c{1 + pp + d, CommKind::PP, "pp[dp=" + std::to_string(d) + "]", {}};
    for (int32_t i = 0; i < pp; ++i) c.ranks.push_back(d * pp + i);
    t.comms.push_back(c);
  }
}

Span make_span(int32_t r, int32_t stream, SpanKind kind, NameId name, int64_t a, int64_t b,
               int32_t s) {
  Span x;
  x.rank = r;
  x.stream = stream;
  x.kind = kind;
  x.name = name;
  x.start_ns = a;
  x.end_ns = b;
  x.step = s;
  return x;
}

// GPipe (see synth.hpp): the schedule is closed-form, so spans are emitted directly.
Trace synthesize_pipeline(const SynthOptions& o) {
  Trace t;
  init_trace(o, t);
  const int32_t R = o.ranks, S = o.steps, pp = o.pp, dp = R / pp, m = o.micro_batches;
  const int32_t Ls = o.layers / pp, k = o.layers_per_bucket, nb = dp > 1 ? Ls / k : 0;
  const int64_t F = Ls * o.forward_ns, B = Ls * o.backward_ns;
  const int64_t c = int64_t(k) * o.comm_ns_per_layer;
  const int64_t step_ns =
      o.data_ns + int64_t(m + pp - 1) * (F + B) + int64_t(nb) * c + o.optimizer_ns;
  t.meta.model_flops_per_step = double(dp) * m * o.layers * (o.forward_flops + o.backward_flops);

  const NameId n_data = t.strings.intern("data_load");
  std::vector<NameId> n_fwd, n_bwd;
  for (int32_t l = 0; l < o.layers; ++l) {
    n_fwd.push_back(t.strings.intern("layers." + std::to_string(l) + ".forward"));
    n_bwd.push_back(t.strings.intern("layers." + std::to_string(l) + ".backward"));
  }
  const NameId n_opt = t.strings.intern("optimizer");
  const NameId n_ar = t.strings.intern("all_reduce");
  const NameId n_send = t.strings.intern("send");
  const NameId n_recv = t.strings.intern("recv");
  const NameId n_step = t.strings.intern("step");
  const NameId n_forward = t.strings.intern("forward");
  const NameId n_backward = t.strings.intern("backward");
  const NameId m_params = t.strings.intern("mem.parameters");
  const NameId m_optim = t.strings.intern("mem.optimizer");
  const NameId m_act = t.strings.intern("mem.activations");
  const NameId m_grad = t.strings.intern("mem.gradients");
  const double stage_params = double(Ls) * double(o.grad_bytes_per_layer);
  t.spans.reserve(size_t(synth_span_count(o)));

  std::vector<Span> comm;  // one rank's stream-1 spans of one step, sorted before emission
  for (int32_t r = 0; r < R; ++r) {
    const int32_t i = r % pp, d = r / pp;
    const int32_t pp_comm = 1 + pp + d;
    const auto fwd_at = [&](int64_t t0, int32_t j) { return t0 + o.data_ns + (i + j) * F; };
    const auto bwd_at = [&](int64_t t0, int32_t j) {
      return t0 + o.data_ns + int64_t(m + pp - 1) * F + (pp - 1 - i + j) * B;
    };
    // Transfer sequence numbers within the pipeline's communicator, per step: forward hop from
    // stage h to h+1 of micro-batch j, then backward hop from stage h to h-1.
    const int64_t per_step = 2LL * m * (pp - 1);
    const auto fwd_seq = [&](int32_t s, int32_t j, int32_t h) {
      return s * per_step + int64_t(j) * (pp - 1) + h;
    };
    const auto bwd_seq = [&](int32_t s, int32_t j, int32_t h) {
      return s * per_step + int64_t(m) * (pp - 1) + int64_t(j) * (pp - 1) + (h - 1);
    };
    const auto p2p = [&](CollOp op, int64_t at, int32_t peer, int64_t seq, int32_t s, int32_t j) {
      Span x = make_span(r, 1, SpanKind::P2P, op == CollOp::Send ? n_send : n_recv, at, at, s);
      x.op = op;
      x.peer = peer;
      x.comm = pp_comm;
      x.seq = seq;
      x.micro_batch = j;
      x.bytes = o.activation_bytes_per_layer;
      comm.push_back(x);
    };
    // stream 0: compute
    for (int32_t s = 0; s < S; ++s) {
      const int64_t t0 = int64_t(s) * step_ns;
      t.spans.push_back(make_span(r, 0, SpanKind::Data, n_data, t0, t0 + o.data_ns, s));
      for (int32_t j = 0; j < m; ++j) {
        int64_t now = fwd_at(t0, j);
        for (int32_t q = 0; q < Ls; ++q) {
          const int32_t l = i * Ls + q;
          Span x = make_span(r, 0, SpanKind::Compute, n_fwd[size_t(l)], now, now + o.forward_ns, s);
          x.layer = l;
          x.micro_batch = j;
          x.flops = o.forward_flops;
          t.spans.push_back(x);
          now += o.forward_ns;
        }
      }
      for (int32_t j = 0; j < m; ++j) {
        int64_t now = bwd_at(t0, j);
        for (int32_t q = Ls - 1; q >= 0; --q) {
          const int32_t l = i * Ls + q;
          Span x =
              make_span(r, 0, SpanKind::Compute, n_bwd[size_t(l)], now, now + o.backward_ns, s);
          x.layer = l;
          x.micro_batch = j;
          x.flops = o.backward_flops;
          t.spans.push_back(x);
          now += o.backward_ns;
        }
      }
      const int64_t opt_at = bwd_at(t0, m) + int64_t(nb) * c;
      t.spans.push_back(
          make_span(r, 0, SpanKind::Optimizer, n_opt, opt_at, opt_at + o.optimizer_ns, s));
    }
    // stream 1: transfers between stages and the stage's gradient all-reduce
    for (int32_t s = 0; s < S; ++s) {
      const int64_t t0 = int64_t(s) * step_ns;
      comm.clear();
      for (int32_t j = 0; j < m; ++j) {
        if (i > 0) p2p(CollOp::Recv, fwd_at(t0, j), r - 1, fwd_seq(s, j, i - 1), s, j);
        if (i < pp - 1) p2p(CollOp::Send, fwd_at(t0, j + 1), r + 1, fwd_seq(s, j, i), s, j);
        if (i < pp - 1) p2p(CollOp::Recv, bwd_at(t0, j), r + 1, bwd_seq(s, j, i + 1), s, j);
        if (i > 0) p2p(CollOp::Send, bwd_at(t0, j + 1), r - 1, bwd_seq(s, j, i), s, j);
      }
      std::stable_sort(comm.begin(), comm.end(),
                       [](const Span& a, const Span& b) { return a.start_ns < b.start_ns; });
      for (const Span& x : comm) t.spans.push_back(x);
      const int64_t ar_at = bwd_at(t0, m);
      for (int32_t j = 0; j < nb; ++j) {
        Span x = make_span(r, 1, SpanKind::Collective, n_ar, ar_at + j * c, ar_at + (j + 1) * c, s);
        x.layer = i * Ls + Ls - 1 - j * k;
        x.bytes = int64_t(k) * o.grad_bytes_per_layer;
        x.comm = 1 + i;
        x.seq = int64_t(s) * nb + j;
        x.op = CollOp::AllReduce;
        t.spans.push_back(x);
      }
    }
    // stream 2: phases
    for (int32_t s = 0; s < S; ++s) {
      const int64_t t0 = int64_t(s) * step_ns;
      const int64_t opt_at = bwd_at(t0, m) + int64_t(nb) * c;
      t.spans.push_back(make_span(r, 2, SpanKind::Phase, n_step, t0, t0 + step_ns, s));
      t.spans.push_back(
          make_span(r, 2, SpanKind::Phase, n_forward, fwd_at(t0, 0), fwd_at(t0, m), s));
      t.spans.push_back(
          make_span(r, 2, SpanKind::Phase, n_backward, bwd_at(t0, 0), bwd_at(t0, m), s));
      t.spans.push_back(
          make_span(r, 2, SpanKind::Phase, n_opt, opt_at, opt_at + o.optimizer_ns, s));
    }
    // counters
    for (int32_t s = 0; s < S; ++s) {
      const int64_t t0 = int64_t(s) * step_ns;
      const int64_t opt_end = bwd_at(t0, m) + int64_t(nb) * c + o.optimizer_ns;
      t.counters.push_back({r, m_params, t0, stage_params});
      t.counters.push_back({r, m_optim, t0, 2 * stage_params});
      t.counters.push_back({r, m_grad, t0, 0});
      t.counters.push_back(
          {r, m_act, fwd_at(t0, m), double(m) * Ls * double(o.activation_bytes_per_layer)});
      t.counters.push_back({r, m_act, bwd_at(t0, m), 0});
      t.counters.push_back({r, m_grad, bwd_at(t0, m), stage_params});
      t.counters.push_back({r, m_grad, opt_end, 0});
    }
  }
  return t;
}

// synth_span_count in double: the counts of absurd options (2^31 ranks x 2^31 layers) overflow int64.
double span_estimate(const SynthOptions& o) {
  const double R = o.ranks, S = o.steps, L = o.layers, pp = std::max(1, o.pp);
  const double k = std::max(1, o.layers_per_bucket), m = std::max(1, o.micro_batches);
  if (o.pp > 1) {
    const double dp = std::max(1.0, R / pp), Ls = L / pp;
    return S * (R * (2 * m * Ls + 6 + (dp > 1 ? Ls / k : 0)) + dp * 4 * m * (pp - 1));
  }
  return R * S * (2 * L + L / k + 6);
}

}  // namespace

SynthTotals synth_totals(const SynthOptions& o) {
  validate(o);
  if (o.pp > 1) {
    const int64_t pp = o.pp, dp = o.ranks / pp, m = o.micro_batches, Ls = o.layers / pp;
    const int64_t k = o.layers_per_bucket, nb = dp > 1 ? Ls / k : 0;
    const int64_t F = Ls * o.forward_ns, B = Ls * o.backward_ns;
    const int64_t C = nb * k * o.comm_ns_per_layer;
    SynthTotals x;
    x.compute_ns = m * (F + B) + o.optimizer_ns;
    x.comm_ns = C;
    x.exposed_comm_ns = C;
    x.overlap_ns = 0;
    x.bubble_ns = o.data_ns + (pp - 1) * (F + B);
    x.idle_ns = x.bubble_ns;
    x.step_ns = o.data_ns + (m + pp - 1) * (F + B) + C + o.optimizer_ns;
    x.allreduce_bytes = nb > 0 ? Ls * o.grad_bytes_per_layer : 0;
    x.allreduce_calls = nb;
    x.flops = double(dp) * double(m) * o.layers * (o.forward_flops + o.backward_flops);
    const double g = double(Ls) * double(o.grad_bytes_per_layer);
    x.peak_memory_bytes =
        3 * g + std::max(double(m) * double(Ls) * double(o.activation_bytes_per_layer), g);
    return x;
  }
  const int64_t L = o.layers, k = o.layers_per_bucket, nb = L / k;
  const int64_t c = k * o.comm_ns_per_layer;
  SynthTotals x;
  x.compute_ns = L * (o.forward_ns + o.backward_ns) + o.optimizer_ns;
  x.comm_ns = nb * c;
  x.exposed_comm_ns = c + (nb - 1) * std::max<int64_t>(0, c - k * o.backward_ns);
  x.overlap_ns = x.comm_ns - x.exposed_comm_ns;
  x.idle_ns = o.data_ns;
  x.step_ns = o.data_ns + L * (o.forward_ns + o.backward_ns) + x.exposed_comm_ns + o.optimizer_ns;
  x.allreduce_bytes = L * o.grad_bytes_per_layer;
  x.allreduce_calls = nb;
  x.flops = double(o.ranks) * double(L) * (o.forward_flops + o.backward_flops);
  const double params = double(L) * double(o.grad_bytes_per_layer);
  x.peak_memory_bytes = 3 * params + double(L) * double(std::max(o.activation_bytes_per_layer,
                                                                 o.grad_bytes_per_layer));
  return x;
}

int64_t synth_span_count(const SynthOptions& o) {
  if (o.pp > 1 && o.ranks % o.pp == 0 && o.layers % o.pp == 0 && o.layers_per_bucket > 0) {
    const int64_t pp = o.pp, dp = o.ranks / pp, m = o.micro_batches, Ls = o.layers / pp;
    const int64_t per_step = o.ranks * (2 * m * Ls + 6 + (dp > 1 ? Ls / o.layers_per_bucket : 0)) +
                             dp * 4 * m * (pp - 1);
    return per_step * o.steps;
  }
  const int64_t nb = o.layers_per_bucket > 0 ? o.layers / o.layers_per_bucket : 0;
  return int64_t(o.ranks) * o.steps * (2LL * o.layers + nb + 6);
}

int32_t synth_steps_for_spans(const SynthOptions& o, int64_t target_spans) {
  SynthOptions one = o;
  one.steps = 1;
  if (span_estimate(one) > 1e18)  // synth_span_count would overflow int64
    throw InputError("synth: the options make more than 1e18 spans per step");
  const int64_t per_step = synth_span_count(one);
  if (per_step <= 0) throw InputError("synth: options produce no spans");
  // Rounded up without forming target_spans + per_step (UBSan: signed overflow near 2^63).
  const int64_t steps = target_spans / per_step + (target_spans % per_step != 0 ? 1 : 0);
  if (steps > std::numeric_limits<int32_t>::max())
    throw InputError("synth: " + std::to_string(target_spans) + " spans need " +
                     std::to_string(steps) + " steps, more than 2^31 - 1");
  return int32_t(std::max<int64_t>(1, steps));
}

double synth_memory_bytes(const SynthOptions& o) {
  const double R = o.ranks, S = o.steps, L = o.layers, k = std::max(1, o.layers_per_bucket);
  const double counters = R * S * 7;
  // Per layer two interned names ("layers.<l>.forward"): the table's string and its hash-map node
  // with a second copy (both on the heap past 15 characters), and the generator's NameId.
  const double names = 2 * L * (2 * double(sizeof(std::string)) + 2 * 32 + 32 + sizeof(NameId));
  // Per rank: its RankInfo, three StreamInfo, its communicator memberships.
  const double per_rank = double(sizeof(RankInfo) + 3 * sizeof(StreamInfo) + 3 * sizeof(int32_t));
  // The schedule (pp = 1): step starts, per (step, rank) extra time, per (step, bucket) ends.
  const double schedule = o.pp > 1 ? 0 : 8 * (S + 1 + S * R + S * (L / k));
  return span_estimate(o) * double(sizeof(Span)) + counters * double(sizeof(CounterSample)) +
         names + R * per_rank + schedule;
}

void check_synth_size(const SynthOptions& o, int64_t memory_bytes) {
  const int64_t limit = memory_bytes > 0 ? memory_bytes : physical_memory_bytes();
  const double need = synth_memory_bytes(o);
  if (limit <= 0 || need <= double(limit)) return;
  char spans[32];
  std::snprintf(spans, sizeof spans, "%.3g", span_estimate(o));
  std::string what = "--ranks " + std::to_string(o.ranks) + " x --steps " +
                     std::to_string(o.steps) + " with --layers " + std::to_string(o.layers);
  if (o.pp > 1)
    what += " (--pp " + std::to_string(o.pp) + ", --micro-batches " +
            std::to_string(o.micro_batches) + ")";
  throw InputError("synth: " + what + " make about " + spans + " spans, about " +
                   format_memory_bytes(need) + " in memory, more than " +
                   (memory_bytes > 0 ? "the limit of " : "this machine's physical memory, ") +
                   format_memory_bytes(double(limit)) + "; use fewer layers, ranks or steps");
}

Trace synthesize(const SynthOptions& o) {
  validate(o);
  check_synth_size(o);
  const int32_t R = o.ranks, S = o.steps, L = o.layers, k = o.layers_per_bucket;
  const int32_t nb = L / k;
  const int64_t c = int64_t(k) * o.comm_ns_per_layer;

  if (o.pp > 1) return synthesize_pipeline(o);
  Trace t;
  init_trace(o, t);
  t.meta.model_flops_per_step = double(R) * L * (o.forward_flops + o.backward_flops);

  // ---- Schedule. All ranks start every step together (the previous step ended together).
  std::vector<int64_t> step_start(size_t(S) + 1, 0);
  std::vector<int64_t> extra(size_t(S) * R, 0);        // extra data time per (step, rank)
  std::vector<int64_t> bucket_end(size_t(S) * nb, 0);  // common end of each bucket
  uint64_t rng = o.seed;
  for (int32_t s = 0; s < S; ++s) {
    for (int32_t r = 0; r < R; ++r) {
      int64_t e = 0;
      if (o.jitter_ns > 0) e += int64_t(splitmix64(rng) % uint64_t(o.jitter_ns + 1));
      if (r == o.straggler_rank) e += o.straggler_delay_ns;
      extra[size_t(s) * R + r] = e;
    }
    int64_t end = INT64_MIN;
    for (int32_t j = 0; j < nb; ++j) {
      int64_t last_start = INT64_MIN;
      for (int32_t r = 0; r < R; ++r) {
        const int64_t ready = step_start[size_t(s)] + o.data_ns + extra[size_t(s) * R + r] +
                              L * o.forward_ns + int64_t(j + 1) * k * o.backward_ns;
        last_start = std::max(last_start, std::max(ready, end));
      }
      end = last_start + c;
      bucket_end[size_t(s) * nb + j] = end;
    }
    step_start[size_t(s) + 1] = end + o.optimizer_ns;
  }

  // ---- Names.
  const NameId n_data = t.strings.intern("data_load");
  std::vector<NameId> n_fwd(static_cast<size_t>(L)), n_bwd(static_cast<size_t>(L));
  for (int32_t l = 0; l < L; ++l) {
    n_fwd[size_t(l)] = t.strings.intern("layers." + std::to_string(l) + ".forward");
    n_bwd[size_t(l)] = t.strings.intern("layers." + std::to_string(l) + ".backward");
  }
  const NameId n_opt = t.strings.intern("optimizer");
  const NameId n_ar = t.strings.intern("all_reduce");
  const NameId n_step = t.strings.intern("step");
  const NameId n_forward = t.strings.intern("forward");
  const NameId n_backward = t.strings.intern("backward");
  const NameId m_params = t.strings.intern("mem.parameters");
  const NameId m_optim = t.strings.intern("mem.optimizer");
  const NameId m_act = t.strings.intern("mem.activations");
  const NameId m_grad = t.strings.intern("mem.gradients");
  const double param_bytes = double(L) * double(o.grad_bytes_per_layer);

  t.spans.reserve(size_t(synth_span_count(o)));
  t.counters.reserve(size_t(R) * S * 7);
  const auto span = make_span;
  for (int32_t r = 0; r < R; ++r) {
    // Per step: data end (forward start) and backward end on this rank.
    const auto fwd_start = [&](int32_t s) {
      return step_start[size_t(s)] + o.data_ns + extra[size_t(s) * R + r];
    };
    const auto bwd_start = [&](int32_t s) { return fwd_start(s) + L * o.forward_ns; };
    const auto opt_start = [&](int32_t s) { return bucket_end[size_t(s) * nb + nb - 1]; };
    // stream 0: compute
    for (int32_t s = 0; s < S; ++s) {
      t.spans.push_back(span(r, 0, SpanKind::Data, n_data, step_start[size_t(s)], fwd_start(s), s));
      int64_t now = fwd_start(s);
      for (int32_t l = 0; l < L; ++l) {
        Span x = span(r, 0, SpanKind::Compute, n_fwd[size_t(l)], now, now + o.forward_ns, s);
        x.layer = l;
        x.flops = o.forward_flops;
        t.spans.push_back(x);
        now += o.forward_ns;
      }
      for (int32_t l = L - 1; l >= 0; --l) {
        Span x = span(r, 0, SpanKind::Compute, n_bwd[size_t(l)], now, now + o.backward_ns, s);
        x.layer = l;
        x.flops = o.backward_flops;
        t.spans.push_back(x);
        now += o.backward_ns;
      }
      t.spans.push_back(
          span(r, 0, SpanKind::Optimizer, n_opt, opt_start(s), opt_start(s) + o.optimizer_ns, s));
    }
    // stream 1: bucketed all-reduce
    for (int32_t s = 0; s < S; ++s) {
      int64_t prev_end = INT64_MIN;
      for (int32_t j = 0; j < nb; ++j) {
        const int64_t ready = bwd_start(s) + int64_t(j + 1) * k * o.backward_ns;
        const int64_t start = std::max(ready, prev_end);
        const int64_t end = bucket_end[size_t(s) * nb + j];
        Span x = span(r, 1, SpanKind::Collective, n_ar, start, end, s);
        x.layer = L - 1 - j * k;  // the bucket's first layer in backward order
        x.bytes = int64_t(k) * o.grad_bytes_per_layer;
        x.comm = 0;
        x.seq = int64_t(s) * nb + j;
        x.op = CollOp::AllReduce;
        t.spans.push_back(x);
        prev_end = end;
      }
    }
    // stream 2: phases
    for (int32_t s = 0; s < S; ++s) {
      const int64_t step_end = opt_start(s) + o.optimizer_ns;
      t.spans.push_back(span(r, 2, SpanKind::Phase, n_step, step_start[size_t(s)], step_end, s));
      t.spans.push_back(span(r, 2, SpanKind::Phase, n_forward, fwd_start(s), bwd_start(s), s));
      t.spans.push_back(span(r, 2, SpanKind::Phase, n_backward, bwd_start(s),
                             bwd_start(s) + L * o.backward_ns, s));
      t.spans.push_back(span(r, 2, SpanKind::Phase, n_opt, opt_start(s), step_end, s));
    }
    // counters
    for (int32_t s = 0; s < S; ++s) {
      const int64_t t0 = step_start[size_t(s)];
      const int64_t bwd_end = bwd_start(s) + L * o.backward_ns;
      t.counters.push_back({r, m_params, t0, param_bytes});
      t.counters.push_back({r, m_optim, t0, 2 * param_bytes});
      t.counters.push_back({r, m_grad, t0, 0});
      t.counters.push_back(
          {r, m_act, bwd_start(s), double(L) * double(o.activation_bytes_per_layer)});
      t.counters.push_back({r, m_act, bwd_end, 0});
      t.counters.push_back({r, m_grad, bwd_end, param_bytes});
      t.counters.push_back({r, m_grad, opt_start(s) + o.optimizer_ns, 0});
    }
  }
  return t;
}

}  // namespace orrery::traces
