// The synthetic DDP trace generator (see synth.hpp for the schedule and its closed-form totals).
// The schedule is computed step by step for all ranks (the all-reduce synchronises them), then the
// spans are emitted rank by rank and stream by stream, so they come out already sorted.
#include "orrery/traces/synth.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"

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
}

}  // namespace

SynthTotals synth_totals(const SynthOptions& o) {
  validate(o);
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
  x.peak_memory_bytes =
      3 * params + double(L) * double(std::max(o.activation_bytes_per_layer, o.grad_bytes_per_layer));
  return x;
}

int64_t synth_span_count(const SynthOptions& o) {
  const int64_t nb = o.layers_per_bucket > 0 ? o.layers / o.layers_per_bucket : 0;
  return int64_t(o.ranks) * o.steps * (2LL * o.layers + nb + 6);
}

int32_t synth_steps_for_spans(const SynthOptions& o, int64_t target_spans) {
  SynthOptions one = o;
  one.steps = 1;
  const int64_t per_step = synth_span_count(one);
  if (per_step <= 0) throw InputError("synth: options produce no spans");
  return int32_t(std::max<int64_t>(1, (target_spans + per_step - 1) / per_step));
}

Trace synthesize(const SynthOptions& o) {
  validate(o);
  const int32_t R = o.ranks, S = o.steps, L = o.layers, k = o.layers_per_bucket;
  const int32_t nb = L / k;
  const int64_t c = int64_t(k) * o.comm_ns_per_layer;

  Trace t;
  t.meta.source = TraceSource::Synth;
  t.meta.scenario_name = "synth";
  t.meta.host = "synth";
  t.meta.world_size = R;
  t.meta.dp = R;
  t.meta.tokens_per_step = o.tokens_per_step > 0 ? o.tokens_per_step : int64_t(R) * 8 * 1024;
  t.meta.model_flops_per_step = double(R) * L * (o.forward_flops + o.backward_flops);
  t.meta.peak_flops_per_rank = o.peak_flops_per_rank;
  t.meta.extra_json = "{\"synth\":{\"ranks\":" + std::to_string(R) + ",\"steps\":" +
                      std::to_string(S) + ",\"layers\":" + std::to_string(L) +
                      ",\"layers_per_bucket\":" + std::to_string(k) +
                      ",\"seed\":" + std::to_string(o.seed) + "}}";
  CommunicatorInfo world;
  world.id = 0;
  world.kind = CommKind::World;
  world.name = "world";
  for (int32_t r = 0; r < R; ++r) {
    t.ranks.push_back({r, "synth", "cpu", r, 0, 0});
    t.streams.push_back({r, 0, "compute"});
    t.streams.push_back({r, 1, "comm"});
    t.streams.push_back({r, 2, "phases"});
    world.ranks.push_back(r);
  }
  t.comms.push_back(world);

  // ---- Schedule. All ranks start every step together (the previous step ended together).
  std::vector<int64_t> step_start(size_t(S) + 1, 0);
  std::vector<int64_t> extra(size_t(S) * R, 0);           // extra data time per (step, rank)
  std::vector<int64_t> bucket_end(size_t(S) * nb, 0);     // common end of each bucket
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
  const auto span = [&](int32_t r, int32_t stream, SpanKind kind, NameId name, int64_t a, int64_t b,
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
  };
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
      t.spans.push_back(span(r, 0, SpanKind::Optimizer, n_opt, opt_start(s),
                             opt_start(s) + o.optimizer_ns, s));
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
      t.counters.push_back({r, m_act, bwd_start(s), double(L) * double(o.activation_bytes_per_layer)});
      t.counters.push_back({r, m_act, bwd_end, 0});
      t.counters.push_back({r, m_grad, bwd_end, param_bytes});
      t.counters.push_back({r, m_grad, opt_start(s) + o.optimizer_ns, 0});
    }
  }
  return t;
}

}  // namespace orrery::traces
