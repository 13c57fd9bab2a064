// Fixtures shared by the calibration tests (test_calibrate.cpp, test_calibrate_bench.cpp,
// test_sharing_weights.cpp, test_rank_jitter.cpp): scenarios, synthetic "real" traces with known
// costs, and small helpers.
//   Truth            seconds per FLOP (gemm, attention) and per byte (elementwise, layernorm,
//                    softmax, optimizer) plus a per-kernel overhead: op_ns(kernels) is linear in them.
//   tiny(dp, mb, seq) a 2-layer GPT (d_model 64, 2 heads, vocab 512), 4 steps, on dp CPU ranks of one
//                    thread, micro-batch mb (global batch dp · mb), sequence seq, 1 MB buckets.
//   real_run(s, path) an empty real trace of scenario s: its meta (scenario text and name, world size
//                    = dp), dp ranks on "host" and, for dp > 1, the DP communicator (id 0, "dp").
//   add_step_phases  the "step" Phase spans (stream 2) of every rank over [start, end].
//   make_run(s, truth, slowdown, alpha_ns, busbw)
//                    a 4-step training run of s on dp ranks (path "run-dp<dp>-b<mb>.db"): per step a
//                    5 us data span, the forward and backward ops and adamw at truth.op_ns x slowdown,
//                    and (dp > 1) two all-reduces before adamw of 2^20 · (1 + k + 2 step) bytes, each
//                    alpha_ns + bytes · busbw_factor / busbw (busbw in bytes per ns); steps 1 us apart.
//   parse_error(yaml) the message of the InputError that parse_hardware_profile(yaml, "bad.yaml")
//                    throws, or "no error".
//   plain_cluster(gpus, per_node)
//                    a Cluster "plain" of gpus / per_node nodes (only the rank-to-node map; no network).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"
#include "orrery/sim/calibrate.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/cost_model.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/sim/workload.hpp"

namespace orrery::sim::testing_fixtures {

struct Truth {
  double s_flop[2] = {1.0 / 12e9, 1.0 / 6e9};                       // gemm, attention
  double s_byte[4] = {1.0 / 4e9, 1.0 / 3e9, 1.0 / 2e9, 1.0 / 5e9};  // elementwise, layernorm, softmax, optimizer
  double overhead_s = 2e-6;
  double op_ns(const std::vector<Kernel>& ks) const {
    double t = 0;
    for (const auto& k : ks) {
      const int c = static_cast<int>(k.cls);
      t += (c < 2 ? k.flops * s_flop[c] : k.bytes * s_byte[c - 2]) + overhead_s;
    }
    return t * 1e9;
  }
};

inline Scenario tiny(int dp, int micro_batch = 4, int seq = 64) {
  std::string y = "name: t\nmodel: {layers: 2, d_model: 64, heads: 2, vocab: 512, seq: " + std::to_string(seq) +
                  "}\ntraining: {steps: 4, global_batch: " + std::to_string(dp * micro_batch) +
                  ", micro_batch: " + std::to_string(micro_batch) + "}\nparallel: {dp: " + std::to_string(dp) +
                  ", bucket_mb: 1}\nruntime: {device: cpu, threads: 1}\n";
  return parse_scenario(y, "test.yaml");
}

inline traces::Trace real_run(const Scenario& s, const std::string& path) {
  traces::Trace t;
  t.meta.source = traces::TraceSource::Real;
  t.meta.scenario_text = to_yaml(s);
  t.meta.scenario_name = s.name;
  t.meta.world_size = s.parallel.dp;
  t.meta.dp = s.parallel.dp;
  t.path = path;
  const int dp = s.parallel.dp;
  for (int r = 0; r < dp; ++r) t.ranks.push_back({r, "host", "cpu", r, 0, 0});
  if (dp > 1) {
    traces::CommunicatorInfo c;
    c.id = 0;
    c.kind = traces::CommKind::DP;
    c.name = "dp";
    for (int r = 0; r < dp; ++r) c.ranks.push_back(r);
    t.comms.push_back(c);
  }
  return t;
}

inline void add_step_phases(traces::Trace& t, int ranks, traces::NameId step_name, int step, int64_t start,
                            int64_t end) {
  for (int r = 0; r < ranks; ++r) {
    traces::Span ph;
    ph.rank = r, ph.stream = 2, ph.kind = traces::SpanKind::Phase, ph.name = step_name;
    ph.start_ns = start, ph.end_ns = end, ph.step = step;
    t.spans.push_back(ph);
  }
}

inline traces::Trace make_run(const Scenario& s, const Truth& truth, double slowdown, int64_t alpha_ns = 25'000,
                              double busbw = 3.0) {
  const int dp = s.parallel.dp;
  traces::Trace t =
      real_run(s, "run-dp" + std::to_string(dp) + "-b" + std::to_string(s.training.micro_batch) + ".db");
  const ModelDims d = model_dims(s, 4);
  int64_t params = 0;
  for (const auto& p : stage_parameters(s, 0)) params += p.count;
  auto cat = [](std::vector<Kernel> a, const std::vector<Kernel>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  struct OpDef {
    const char* name;
    std::vector<Kernel> ks;
    int layer;
    traces::SpanKind kind;
  };
  std::vector<OpDef> ops;
  ops.push_back({"fwd.embed", embedding_forward_kernels(d), -1, traces::SpanKind::Compute});
  for (int l = 0; l < s.model.layers; ++l)
    ops.push_back({"fwd.block", cat(attention_forward_kernels(d), mlp_forward_kernels(d)), l, traces::SpanKind::Compute});
  ops.push_back({"fwd.head", head_forward_kernels(d), s.model.layers, traces::SpanKind::Compute});
  ops.push_back({"bwd.head", head_backward_kernels(d), s.model.layers, traces::SpanKind::Compute});
  for (int l = s.model.layers - 1; l >= 0; --l)
    ops.push_back({"bwd.block", cat(mlp_backward_kernels(d), attention_backward_kernels(d)), l, traces::SpanKind::Compute});
  ops.push_back({"bwd.embed", embedding_backward_kernels(d), -1, traces::SpanKind::Compute});
  ops.push_back({"adamw", optimizer_kernels(double(params), 28.0), -1, traces::SpanKind::Optimizer});
  const auto step_name = t.strings.intern("step");
  const auto data_name = t.strings.intern("data");
  const auto ar_name = t.strings.intern("ddp.all_reduce");
  int64_t now = 0;
  const int64_t data_ns = 5000;
  for (int step = 0; step < 4; ++step) {
    const int64_t step_start = now;
    int64_t end = now;
    for (int r = 0; r < dp; ++r) {
      int64_t tt = step_start;
      auto add = [&](traces::SpanKind kind, traces::NameId name, int64_t dur, int layer, double flops) {
        traces::Span sp;
        sp.rank = r, sp.stream = 0, sp.kind = kind, sp.name = name, sp.start_ns = tt, sp.end_ns = tt + dur;
        sp.step = step, sp.micro_batch = 0, sp.layer = layer, sp.flops = flops;
        t.spans.push_back(sp);
        tt += dur;
      };
      add(traces::SpanKind::Data, data_name, std::llround(data_ns * slowdown), -1, 0);
      for (const auto& o : ops) {
        if (std::string(o.name) == "adamw" && dp > 1) {
          // Two all-reduces of different sizes before the optimizer (on the comm stream).
          for (int k = 0; k < 2; ++k) {
            const int64_t bytes = (int64_t(1) << 20) * (1 + k + 2 * step);
            const int64_t dur =
                alpha_ns + std::llround(double(bytes) * traces::busbw_factor(traces::CollOp::AllReduce, dp) / busbw);
            traces::Span sp;
            sp.rank = r, sp.stream = 1, sp.kind = traces::SpanKind::Collective, sp.name = ar_name;
            sp.start_ns = tt, sp.end_ns = tt + dur, sp.step = step, sp.bytes = bytes, sp.comm = 0;
            sp.seq = step * 2 + k, sp.op = traces::CollOp::AllReduce;
            t.spans.push_back(sp);
            tt += dur;
          }
        }
        add(o.kind, t.strings.intern(o.name), std::llround(truth.op_ns(o.ks) * slowdown), o.layer, total_flops(o.ks));
      }
      end = std::max(end, tt);
    }
    add_step_phases(t, dp, step_name, step, step_start, end);
    now = end + 1000;
  }
  t.sort_spans();
  return t;
}

inline std::string parse_error(const std::string& yaml) {
  try {
    parse_hardware_profile(yaml, "bad.yaml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

inline Cluster plain_cluster(int gpus, int per_node) {
  Cluster c;
  c.name = "plain";
  c.gpus_per_node = per_node;
  c.nodes = gpus / per_node;
  return c;
}

}  // namespace orrery::sim::testing_fixtures
