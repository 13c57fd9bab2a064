// simulate(): one scenario on one cluster, with the step breakdown and memory; sweep(): the scaling
// table over cluster sizes, with an optional layout search (see sweep.hpp).
#include "orrery/sim/sweep.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "orrery/common/error.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/sim/cost_model.hpp"
#include "orrery/sim/workload.hpp"

namespace orrery::sim {

namespace {

std::string layout_string(const Scenario& s) {
  std::ostringstream o;
  o << "dp=" << s.parallel.dp << " tp=" << s.parallel.tp << " pp=" << s.parallel.pp;
  return o.str();
}

PrecisionConfig precision_for(const SimOptions& opt, const HardwareProfile& prof) {
  if (!opt.precision.empty()) return precision_config(opt.precision);
  return precision_config(prof.precision == "bf16" || prof.precision == "fp16" ? "mixed" : "fp32");
}

double peak_for(const Cluster& c, const HardwareProfile& prof) {
  if (prof.peak_flops > 0) return prof.peak_flops;
  const auto p = precision_from_string(prof.precision);
  return c.device.peak_flops(p ? *p : Precision::FP32);
}

using profiler::Interval;

}  // namespace

Scenario fit_layout(Scenario s, const Cluster& c) {
  const int gpus = c.num_gpus();
  const int tp = s.parallel.tp, pp = s.parallel.pp;
  if (s.world_size() != gpus) {
    if (tp * pp > gpus || gpus % (tp * pp) != 0)
      throw InputError(s.path + ": the layout tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) +
                       " (tp*pp = " + std::to_string(tp * pp) + " GPUs per replica) does not divide cluster '" +
                       c.name + "' of " + std::to_string(gpus) + " GPUs");
    s.parallel.dp = gpus / (tp * pp);
  }
  validate_layout(s);
  return s;
}

HardwareProfile profile_for(const Cluster& c, const std::string& search_dir) {
  if (!search_dir.empty()) {
    const auto file = std::filesystem::path(search_dir) / (c.device.name + ".yaml");
    if (std::filesystem::exists(file)) return load_hardware_profile(file.string());
  }
  return default_hardware_profile(c.device.name, c.device.name != "cpu");
}

SimResult simulate(const Scenario& s, const Cluster& cluster, const SimOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  if (s.world_size() != cluster.num_gpus())
    throw InputError(s.path + ": the layout " + layout_string(s) + " uses " + std::to_string(s.world_size()) +
                     " GPUs but cluster '" + cluster.name + "' has " + std::to_string(cluster.num_gpus()));
  const HardwareProfile prof = opt.profile ? *opt.profile : profile_for(cluster);
  const PrecisionConfig prec = precision_for(opt, prof);
  const double peak = peak_for(cluster, prof);
  const CostModel cost(prof, peak, cluster.device.mem_bandwidth_bytes_per_s);
  const Workload w = build_workload(s, cost, {opt.steps, prec});

  ExecutorOptions eo;
  eo.network = opt.network;
  eo.all_ranks = opt.all_ranks;
  eo.profile = &prof;
  const ExecResult r = execute(w, cluster, eo);

  SimResult out;
  out.dp = s.parallel.dp, out.tp = s.parallel.tp, out.pp = s.parallel.pp, out.zero = s.parallel.zero;
  out.micro_batch = s.training.micro_batch;
  out.micro_batches = w.micro_batches;
  out.schedule = s.parallel.schedule;
  out.precision = prec.name;
  out.profile_name = prof.name;
  out.peak_flops = cost.peak_flops();
  out.simulated_ranks = r.ranks.size();
  out.events = r.events;
  for (const auto& rk : r.ranks) out.ops += rk.ops.size();

  // Step windows over all simulated ranks.
  std::vector<int64_t> step_start(w.steps, INT64_MAX), step_end(w.steps, INT64_MIN);
  for (const auto& rk : r.ranks)
    for (size_t i = 0; i < rk.ops.size(); ++i) {
      const int st = rk.program->ops[i].step;
      if (st < 0) continue;
      step_start[st] = std::min(step_start[st], rk.ops[i].start_ns);
      step_end[st] = std::max(step_end[st], rk.ops[i].end_ns);
    }
  const int first_counted = w.steps > 1 ? 1 : 0;
  const int counted = w.steps - first_counted;
  double step_sum = 0;
  for (int st = first_counted; st < w.steps; ++st) step_sum += double(step_end[st] - step_start[st]);
  out.step_time_ns = static_cast<int64_t>(std::llround(step_sum / counted));

  // Breakdown per rank and counted step (sweep.hpp), averaged.
  StepBreakdown sum;
  for (const auto& rk : r.ranks) {
    for (int st = first_counted; st < w.steps; ++st) {
      const int64_t ws = step_start[st], we = step_end[st];
      std::vector<Interval> comp, tp, pp, dp;
      for (size_t i = 0; i < rk.ops.size(); ++i) {
        const Op& op = rk.program->ops[i];
        if (op.step != st) continue;
        const Interval iv{std::max(ws, rk.ops[i].active_ns), std::min(we, rk.ops[i].end_ns)};
        if (op.kind == traces::SpanKind::Compute || op.kind == traces::SpanKind::Optimizer) comp.push_back(iv);
        else if (op.kind == traces::SpanKind::P2P) pp.push_back(iv);
        else if (op.kind == traces::SpanKind::Collective) (op.group == GroupRole::TP ? tp : dp).push_back(iv);
      }
      const auto C = profiler::merge_intervals(comp);
      const auto TP = profiler::merge_intervals(tp);
      auto cat = [](std::vector<Interval> a, const std::vector<Interval>& b) {
        a.insert(a.end(), b.begin(), b.end());
        return profiler::merge_intervals(std::move(a));
      };
      const auto C_TP = cat(C, TP);
      const auto PP = profiler::merge_intervals(pp);
      const auto C_TP_PP = cat(C_TP, PP);
      const auto DP = profiler::merge_intervals(dp);
      const auto all = cat(C_TP_PP, DP);
      const double window = double(we - ws);
      sum.window_ns += window;
      sum.compute_ns += double(profiler::total_length(C));
      sum.exposed_tp_ns += double(profiler::total_length(TP) - profiler::intersection_length(TP, C));
      sum.exposed_pp_ns += double(profiler::total_length(PP) - profiler::intersection_length(PP, C_TP));
      sum.exposed_dp_ns += double(profiler::total_length(DP) - profiler::intersection_length(DP, C_TP_PP));
      const double rest = window - double(profiler::total_length(all));
      (s.parallel.pp > 1 ? sum.bubble_ns : sum.idle_ns) += rest;
    }
  }
  const double n = double(r.ranks.size()) * counted;
  out.breakdown = {sum.window_ns / n,     sum.compute_ns / n, sum.exposed_tp_ns / n, sum.exposed_dp_ns / n,
                   sum.exposed_pp_ns / n, sum.bubble_ns / n,  sum.idle_ns / n};

  const double step_s = double(out.step_time_ns) * 1e-9;
  if (step_s > 0) {
    out.tokens_per_s = double(w.tokens_per_step) / step_s;
    const double per_gpu = w.model_flops_per_step / step_s / double(s.world_size());
    out.tflops_per_gpu = per_gpu / 1e12;
    out.mfu = out.peak_flops > 0 ? per_gpu / out.peak_flops : 0;
  }

  out.capacity_bytes = cluster.device.mem_capacity_bytes;
  out.memory = estimate_memory(s, prec, out.capacity_bytes);
  for (const auto& m : out.memory) {
    out.peak_memory_bytes = std::max(out.peak_memory_bytes, m.total_bytes);
    out.fits = out.fits && m.fits;
  }
  if (opt.keep_trace) {
    out.trace = make_trace(w, r, cluster, out.peak_flops);
    // Memory counters per simulated rank (the estimate is constant over the step).
    auto& t = *out.trace;
    for (const auto& rk : r.ranks) {
      const MemoryEstimate& m = out.memory[rk.coord.pp];
      const std::pair<const char*, double> cats[] = {{"mem.parameters", m.parameters_bytes},
                                                     {"mem.gradients", m.gradients_bytes},
                                                     {"mem.optimizer", m.optimizer_bytes},
                                                     {"mem.activations", m.activations_bytes}};
      for (const auto& [name, v] : cats) t.counters.push_back({rk.rank, t.strings.intern(name), 0, v});
    }
  }
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

namespace {

// A closed-form step estimate, only to rank the search's candidates before simulating the best few:
// the pipeline (m + p - 1 slots of one micro-batch's stage work, TP all-reduces in line), the head
// on the last stage, and the data-parallel traffic that backward cannot hide.
double estimate_step_ns(const Scenario& s, const Cluster& c, const CostModel& cost, const PrecisionConfig& prec) {
  const Layout l = Layout::from(s);
  const ModelDims d = model_dims(s, prec.act_bytes);
  const double m = s.micro_batches_per_step(), pp = s.parallel.pp, lps = double(s.model.layers) / pp;
  const double tf = double(cost.op_ns(attention_forward_kernels(d)) + cost.op_ns(mlp_forward_kernels(d)));
  const double tb = double(cost.op_ns(attention_backward_kernels(d)) + cost.op_ns(mlp_backward_kernels(d)));
  const double head = double(cost.op_ns(head_forward_kernels(d)) + cost.op_ns(head_backward_kernels(d)));
  const int64_t act = int64_t(s.training.micro_batch) * s.model.seq * s.model.d_model * prec.act_bytes;
  auto coll = [&](traces::CollOp op, std::vector<int32_t> members, int64_t bytes) -> double {
    if (members.size() < 2 || bytes <= 0) return 0.0;
    CollectiveRequest req;
    req.op = op;
    req.members = std::move(members);
    req.bytes = bytes;
    return double(collective_time_ns(c, req, NetworkModel::Analytical));
  };
  const double t_ar = coll(traces::CollOp::AllReduce, group_members(l, 0, GroupRole::TP), act);
  const double t_p2p = s.parallel.pp > 1 ? coll(traces::CollOp::Send, {0, l.rank_of(0, 0, 1)}, act) : 0.0;
  const double slot = lps * (tf + tb + 4 * t_ar) + 2 * t_p2p;
  double est = (m + pp - 1) * slot + m * head;
  int64_t params = 0;
  for (const auto& t : stage_parameters(s, 0)) params += t.count;
  const auto dpg = group_members(l, 0, GroupRole::DP);
  const int z = s.parallel.zero;
  double dp_total = 0;
  const double grads = double(params) * prec.grad_bytes;
  if (z == 0) dp_total = coll(traces::CollOp::AllReduce, dpg, int64_t(grads));
  else dp_total = coll(traces::CollOp::ReduceScatter, dpg, int64_t(grads)) * (z >= 2 ? m : 1.0);
  if (z == 1 || z == 2) dp_total += coll(traces::CollOp::AllGather, dpg, int64_t(double(params) * prec.param_bytes));
  if (z == 3) dp_total += 2 * m * coll(traces::CollOp::AllGather, dpg, int64_t(double(params) * prec.param_bytes));
  // Backward of the last micro-batch hides some of it; the rest is exposed.
  est += std::max(0.0, dp_total - lps * tb);
  return est;
}

struct Candidate {
  Scenario s;
  double estimate = 0;
};

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

}  // namespace

std::vector<SweepRow> sweep(const Scenario& s, const Cluster& cluster, const SweepOptions& opt) {
  std::vector<SweepRow> rows;
  auto say = [&](const std::string& line) {
    if (opt.progress) opt.progress(line);
  };
  for (const int gpus : opt.gpus) {
    SweepRow row;
    row.gpus = gpus;
    if (gpus < 1) throw InputError("--gpus: sizes must be >= 1 (got " + std::to_string(gpus) + ")");
    Cluster c;
    try {
      c = resize_cluster(cluster, gpus);
    } catch (const InputError& e) {
      row.note = e.what();
      rows.push_back(row);
      continue;
    }
    const HardwareProfile prof = opt.sim.profile ? *opt.sim.profile : profile_for(c);
    const PrecisionConfig prec = precision_for(opt.sim, prof);
    const CostModel cost(prof, peak_for(c, prof), c.device.mem_bandwidth_bytes_per_s);
    SimOptions so = opt.sim;
    so.profile = prof;
    so.keep_trace = false;

    if (!opt.search) {
      Scenario x;
      try {
        x = fit_layout(s, c);
      } catch (const InputError& e) {
        row.note = e.what();
        rows.push_back(row);
        say("[" + std::to_string(gpus) + " GPUs] skipped: " + row.note);
        continue;
      }
      say("[" + std::to_string(gpus) + " GPUs] simulating " + layout_string(x));
      row.result = simulate(x, c, so);
      row.ok = true;
      row.candidates = row.simulated = 1;
      if (!row.result.fits) row.note = "does not fit device memory";
      rows.push_back(row);
      continue;
    }

    // Search: every layout that fits memory, ranked by the estimate; simulate the best few.
    std::vector<Candidate> cands;
    const int gb = s.training.global_batch;
    for (int tp = 1; tp <= std::min(gpus, c.gpus_per_node); tp *= 2) {
      if (s.model.heads % tp != 0 || s.model.d_model % tp != 0) continue;
      for (int pp : divisors(s.model.layers)) {
        if (tp * pp > gpus || gpus % (tp * pp) != 0) continue;
        const int dp = gpus / (tp * pp);
        if (gb % dp != 0) continue;
        for (int mb = 1; mb <= gb / dp && mb <= 16; mb *= 2) {
          if ((gb / dp) % mb != 0) continue;
          for (int zero = 0; zero <= 3; ++zero) {
            if (zero > 0 && dp < 2) continue;
            Candidate cd;
            cd.s = s;
            cd.s.parallel.dp = dp, cd.s.parallel.tp = tp, cd.s.parallel.pp = pp, cd.s.parallel.zero = zero;
            cd.s.training.micro_batch = mb;
            try {
              validate_layout(cd.s);
            } catch (const InputError&) {
              continue;
            }
            bool fits = true;
            for (const auto& m : estimate_memory(cd.s, prec, c.device.mem_capacity_bytes)) fits = fits && m.fits;
            if (!fits) continue;
            cd.estimate = estimate_step_ns(cd.s, c, cost, prec);
            cands.push_back(std::move(cd));
          }
        }
      }
    }
    row.candidates = static_cast<int>(cands.size());
    if (cands.empty()) {
      row.note = "no layout fits device memory";
      rows.push_back(row);
      say("[" + std::to_string(gpus) + " GPUs] no layout fits device memory");
      continue;
    }
    // Stable order: estimate, then fewer pipeline stages, lower ZeRO stage (deterministic ties).
    std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
      if (a.estimate != b.estimate) return a.estimate < b.estimate;
      if (a.s.parallel.pp != b.s.parallel.pp) return a.s.parallel.pp < b.s.parallel.pp;
      return a.s.parallel.zero < b.s.parallel.zero;
    });
    const int top = std::min<int>(opt.search_top, static_cast<int>(cands.size()));
    for (int i = 0; i < top; ++i) {
      const Scenario& x = cands[i].s;
      say("[" + std::to_string(gpus) + " GPUs] " + std::to_string(i + 1) + "/" + std::to_string(top) + " (of " +
          std::to_string(cands.size()) + " fitting) " + layout_string(x) + " zero=" +
          std::to_string(x.parallel.zero) + " mb=" + std::to_string(x.training.micro_batch));
      SimResult res = simulate(x, c, so);
      ++row.simulated;
      if (!row.ok || res.tokens_per_s > row.result.tokens_per_s) {
        row.result = std::move(res);
        row.ok = true;
      }
    }
    rows.push_back(row);
  }
  // Efficiency: per-GPU throughput relative to the smallest simulated size.
  const SweepRow* base = nullptr;
  for (const auto& r : rows)
    if (r.ok && (!base || r.gpus < base->gpus)) base = &r;
  if (base) {
    const double per_gpu = base->result.tokens_per_s / base->gpus;
    for (auto& r : rows)
      if (r.ok) r.efficiency = (r.result.tokens_per_s / r.gpus) / per_gpu;
  }
  return rows;
}

}  // namespace orrery::sim
