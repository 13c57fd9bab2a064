// simulate(): one scenario on one cluster, with the step breakdown and memory; sweep(): the scaling
// table over cluster sizes, with an optional layout search (see sweep.hpp).
#include "orrery/sim/sweep.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <sstream>

#include "orrery/common/error.hpp"
#include "orrery/common/host_memory.hpp"
#include "orrery/model/compression.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/sim/calibrate.hpp"
#include "orrery/sim/cost_model.hpp"
#include "orrery/sim/moe_cost.hpp"
#include "orrery/sim/sim_target.hpp"
#include "orrery/sim/workload.hpp"

namespace orrery::sim {

namespace {

std::string layout_string(const Scenario& s) {
  std::ostringstream o;
  o << "dp=" << s.parallel.dp << " tp=" << s.parallel.tp << " pp=" << s.parallel.pp;
  return o.str();
}

std::string offload_label(const Scenario& s) {
  if (host_offload(s)) return "host";
  if (!s.zero.nvme()) return "none";
  return s.zero.offload_params == "nvme" ? "nvme+params" : "nvme";
}

// " +nvme", " +int8", ... : what a layout adds to dp/tp/pp, for the tables.
std::string extras_label(const std::string& offload, const std::string& compression) {
  std::string x;
  if (offload != "none") x += " +" + offload;
  if (compression != "none") x += " +" + compression;
  return x;
}

// The precision choice of sim_target.hpp (one rule for the CLI's checks and the simulation).
PrecisionConfig precision_for(const SimOptions& opt, const HardwareProfile& prof) {
  return precision_config(precision_name(opt.precision, prof));
}

double peak_for(const Cluster& c, const HardwareProfile& prof) {
  if (prof.peak_flops > 0) return prof.peak_flops;
  return c.device.peak_flops(prof.precision);
}

using profiler::Interval;

}  // namespace

Scenario fit_layout(Scenario s, const Cluster& c) {
  const int gpus = c.num_gpus();
  const int tp = s.parallel.tp, pp = s.parallel.pp;
  if (s.world_size() != gpus) {
    if (tp * pp > gpus || gpus % (tp * pp) != 0)
      throw InputError(s.path + ": the layout tp=" + std::to_string(tp) +
                       " pp=" + std::to_string(pp) + " (tp*pp = " + std::to_string(tp * pp) +
                       " GPUs per replica) does not divide cluster '" + c.name + "' of " +
                       std::to_string(gpus) + " GPUs");
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
  return default_hardware_profile(c.device.name, c.device.gpu);
}

namespace {
// Blocks of the largest pipeline stage (parallel.pp_layers, or layers / pp).
int max_stage_layers(const Scenario& s) {
  if (s.parallel.pp_layers.empty()) return s.model.layers / std::max(1, s.parallel.pp);
  return *std::max_element(s.parallel.pp_layers.begin(), s.parallel.pp_layers.end());
}
}  // namespace

SimulationSize estimate_simulation_size(const Scenario& s, int steps, bool every_rank,
                                        bool keep_trace, int rail_copies) {
  SimulationSize z;
  const auto& p = s.parallel;
  z.world = int64_t(std::max(1, p.dp)) * std::max(1, p.tp) * std::max(1, p.pp);
  z.simulated_ranks = every_rank ? z.world / std::max(1, rail_copies) : std::max(1, p.pp);
  const double trace_ranks = double(every_rank ? z.world : z.simulated_ranks);
  z.ops_per_stage = workload_ops_bound(s, steps);
  const double ops = z.ops_per_stage, stages = std::max(1, p.pp);
  // A stage program: the op, up to three deps, its stream entry; vectors up to twice their size
  // while they grow. Its parameter tensors (12 a layer, named) and name table are small next to it.
  const double per_op = 2.0 * (sizeof(Op) + 3 * sizeof(uint32_t) + sizeof(uint32_t));
  const double per_layer = 12.0 * (sizeof(ParamTensor) + 32);
  const double programs = stages * ops * per_op + double(s.model.layers) * per_layer;
  // The executor per stage (reverse deps in CSR) and per simulated rank and op (timing, pending
  // deps); simulate()'s breakdown intervals of one rank and step at a time (four merged copies).
  const double executor = stages * ops * 5 * sizeof(uint32_t) +
                          double(z.simulated_ranks) * ops * (sizeof(OpTiming) + sizeof(uint32_t)) +
                          ops * 4 * 2 * sizeof(int64_t);
  // The trace: every op of every simulated or copied rank a span, with phases and what writing it
  // holds (its blocks, per-(rank, step) aggregates): 1.4 spans an op, measured on GPT-3 175B over
  // 16,384 H100s (every rank, --out): 2.67 GB beyond the bare process literally, 2.19 GB with the
  // rail symmetry, against 2.67 and 2.24 GB estimated.
  const double trace = keep_trace ? trace_ranks * ops * 1.4 * sizeof(traces::Span) : 0.0;
  z.bytes = programs + executor + trace + double(z.world) * 512.0;
  return z;
}

void check_simulation_size(const Scenario& s, int steps, bool every_rank, bool keep_trace,
                           int64_t memory_bytes, int rail_copies) {
  const std::string where = s.path.empty() ? std::string("scenario") : s.path;
  if (s.model.layers > kMaxSimulatedLayers)
    throw InputError(
        where + ": key 'model.layers': " + std::to_string(s.model.layers) +
        " layers; the simulator takes at most " + std::to_string(kMaxSimulatedLayers) +
        " (100 times the deepest published transformer, DeepNet's 1,000; GPT-3 has 96)");
  const SimulationSize z = estimate_simulation_size(s, steps, every_rank, keep_trace, rail_copies);
  const auto& p = s.parallel;
  if (z.world > std::numeric_limits<int32_t>::max())
    throw InputError(
        where + ": keys 'parallel.dp' x 'parallel.tp' x 'parallel.pp' = " + std::to_string(p.dp) +
        " x " + std::to_string(p.tp) + " x " + std::to_string(p.pp) + " = " +
        std::to_string(z.world) + " ranks, more than 2^31 - 1");
  const int64_t limit = memory_bytes > 0 ? memory_bytes : physical_memory_bytes();
  const bool too_many_ops = z.ops_per_stage > double(kMaxStageOps);
  if (!too_many_ops && (limit <= 0 || z.bytes <= double(limit))) return;
  // The factors, with the keys that set them.
  const int64_t m = int64_t(s.training.global_batch) /
                    (int64_t(std::max(1, p.dp)) * std::max(1, s.training.micro_batch));
  char ops[32];
  std::snprintf(ops, sizeof ops, "%.3g", z.ops_per_stage);
  std::string what = where + ": key 'model.layers' (" + std::to_string(s.model.layers) + ", " +
                     std::to_string(max_stage_layers(s)) + " per stage, the largest) x " +
                     std::to_string(m) + " micro-batches per step ('training.global_batch' " +
                     std::to_string(s.training.global_batch) + " / ('parallel.dp' " +
                     std::to_string(p.dp) + " x 'training.micro_batch' " +
                     std::to_string(s.training.micro_batch) + ")) x " + std::to_string(steps) +
                     " steps (--steps) make up to " + ops + " ops per pipeline stage";
  if (too_many_ops)
    throw InputError(what + ", more than the simulator's 32-bit op ids allow (" +
                     std::to_string(kMaxStageOps) + ")");
  what += ", simulated on " + std::to_string(z.simulated_ranks) + " of " + std::to_string(z.world) +
          " ranks";
  if (every_rank) what += " (every rank: --all-ranks or a core-sharing profile)";
  if (every_rank && rail_copies > 1)
    what += " (tp rank 0 of each group simulated for its " + std::to_string(rail_copies) +
            " tp ranks: the rail symmetry)";
  if (keep_trace) what += " with the trace (--out)";
  throw InputError(what + ": about " + format_memory_bytes(z.bytes) + " of memory, more than " +
                   (memory_bytes > 0 ? "the limit of " : "this machine's physical memory, ") +
                   format_memory_bytes(double(limit)));
}

namespace {

// Step windows over all simulated ranks: [earliest op start, latest op end] of the ops of each
// step, as compute_metrics takes them from the trace's "step" spans; the first step is warm-up
// when there are more.
struct StepWindows {
  std::vector<int64_t> start, end;
  int first_counted = 0;
  int64_t mean_ns = 0;  // over the counted steps
};

StepWindows step_windows(const Workload& w, const ExecResult& r) {
  StepWindows sw;
  sw.start.assign(size_t(w.steps), INT64_MAX);
  sw.end.assign(size_t(w.steps), INT64_MIN);
  for (const auto& rk : r.ranks)
    for (size_t i = 0; i < rk.ops.size(); ++i) {
      const int st = rk.program->ops[i].step;
      if (st < 0) continue;
      sw.start[size_t(st)] = std::min(sw.start[size_t(st)], rk.ops[i].start_ns);
      sw.end[size_t(st)] = std::max(sw.end[size_t(st)], rk.ops[i].end_ns);
    }
  sw.first_counted = w.steps > 1 ? 1 : 0;
  double sum = 0;
  for (int st = sw.first_counted; st < w.steps; ++st)
    sum += double(sw.end[size_t(st)] - sw.start[size_t(st)]);
  sw.mean_ns = static_cast<int64_t>(std::llround(sum / (w.steps - sw.first_counted)));
  return sw;
}

// The breakdown (sweep.hpp): profiler::account_step, the definition compute_metrics applies to the
// trace, over each simulated rank's ops from start to end (as the trace's spans), per counted
// step, averaged over ranks and steps.
StepBreakdown mean_breakdown(const ExecResult& r, const StepWindows& win, bool pipeline) {
  profiler::StepAccount sum;
  double ep_ns = 0;
  for (const auto& rk : r.ranks) {
    std::vector<Interval> comp, tp, dp, pp, ep;
    for (size_t i = 0; i < rk.ops.size(); ++i) {
      const Op& op = rk.program->ops[i];
      const Interval iv{rk.ops[i].start_ns, rk.ops[i].end_ns};
      if (op.kind == traces::SpanKind::Compute || op.kind == traces::SpanKind::Optimizer)
        comp.push_back(iv);
      else if (op.kind == traces::SpanKind::P2P)
        pp.push_back(iv);
      else if (op.kind == traces::SpanKind::Collective)
        (op.group == GroupRole::TP ? tp : dp).push_back(iv);
      if (op.kind == traces::SpanKind::Collective && op.group == GroupRole::EP) ep.push_back(iv);
    }
    const auto C = profiler::merge_intervals(std::move(comp));
    const auto TP = profiler::merge_intervals(std::move(tp));
    const auto DP = profiler::merge_intervals(std::move(dp));
    const auto PP = profiler::merge_intervals(std::move(pp));
    const auto EP = profiler::merge_intervals(std::move(ep));
    for (size_t st = size_t(win.first_counted); st < win.start.size(); ++st) {
      sum += profiler::account_step({C, TP, DP, PP}, win.start[st], win.end[st]);
      // |EP \ (C ∪ TP)|: the all-to-alls in the place of the dp set.
      if (!EP.empty())
        ep_ns += double(
            profiler::account_step({C, TP, EP, {}}, win.start[st], win.end[st]).exposed_dp_ns);
    }
  }
  const double n = double(r.ranks.size()) * double(win.start.size() - size_t(win.first_counted));
  StepBreakdown b;
  b.window_ns = double(sum.window_ns) / n;
  b.compute_ns = double(sum.compute_ns) / n;
  b.exposed_tp_ns = double(sum.exposed_tp_ns) / n;
  b.exposed_dp_ns = double(sum.exposed_dp_ns) / n;
  b.exposed_pp_ns = double(sum.p2p_ns) / n;
  b.exposed_ep_ns = ep_ns / n;
  (pipeline ? b.bubble_ns : b.idle_ns) = double(sum.rest_ns) / n;
  return b;
}

// The executor's options for simulate(): `prof` must outlive the result.
ExecutorOptions executor_options(const SimOptions& opt, const HardwareProfile& prof) {
  ExecutorOptions eo;
  eo.network = opt.network;
  eo.all_ranks = opt.all_ranks;
  eo.profile = &prof;
  if (prof.sharing.cores > 0) eo.core_sharing = &prof.sharing;
  eo.rank_jitter = prof.rank_jitter;
  eo.op_jitter = prof.op_jitter;
  eo.comm_compute_share = prof.comm_compute_share;
  eo.rail_symmetry = opt.rail_symmetry;
  return eo;
}

}  // namespace

int rail_copies(const Scenario& s, const Cluster& cluster, const SimOptions& opt,
                const HardwareProfile& profile) {
  if (!opt.all_ranks || s.parallel.tp < 2 || s.world_size() != cluster.num_gpus()) return 1;
  return rail_copies_apply(Layout::from(s), cluster, executor_options(opt, profile)) ? s.parallel.tp
                                                                                     : 1;
}

SimResult simulate(const Scenario& s, const Cluster& cluster, const SimOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  if (s.world_size() != cluster.num_gpus())
    throw InputError(s.path + ": the layout " + layout_string(s) + " uses " +
                     std::to_string(s.world_size()) + " GPUs but cluster '" + cluster.name +
                     "' has " + std::to_string(cluster.num_gpus()));
  // A profile with a core-sharing law (calibrated on a CPU machine): collectives scaled for the
  // ranks on a node here, compute shared among the busy ranks by the executor.
  const HardwareProfile given = opt.profile ? *opt.profile : profile_for(cluster);
  const bool shared_cores = given.sharing.cores > 0;
  check_simulation_size(s, opt.steps, opt.all_ranks || shared_cores, opt.keep_trace, 0,
                        rail_copies(s, cluster, opt, given));
  const HardwareProfile prof =
      shared_cores ? profile_for_ranks(given, ranks_on_node(s, cluster), /*scale_compute=*/false)
                   : given;
  const PrecisionConfig prec = precision_for(opt, prof);
  const double peak = peak_for(cluster, prof);
  const CostModel cost(prof, peak, cluster.device.mem_bandwidth_bytes_per_s);
  const Workload w =
      build_workload(s, cost, {opt.steps, prec, std::min(cluster.gpus_per_node, s.world_size())});
  const ExecResult r = execute(w, cluster, executor_options(opt, prof));

  SimResult out;
  out.dp = s.parallel.dp, out.tp = s.parallel.tp, out.pp = s.parallel.pp,
  out.zero = s.parallel.zero;
  out.offload = offload_label(s);
  out.grad_compression = s.parallel.grad_compression;
  out.ep = s.parallel.ep;
  out.moe = s.model.moe.enabled();
  out.micro_batch = s.training.micro_batch;
  out.micro_batches = w.micro_batches;
  out.schedule = s.parallel.schedule;
  out.precision = prec.name;
  out.profile_name = prof.name;
  out.peak_flops = cost.peak_flops();
  out.simulated_ranks = r.ranks.size();
  out.copied_ranks = r.copies.size();
  out.events = r.events;
  for (const auto& rk : r.ranks) out.ops += rk.ops.size();

  const StepWindows win = step_windows(w, r);
  out.step_time_ns = win.mean_ns;
  out.breakdown = mean_breakdown(r, win, s.parallel.pp > 1);

  const double step_s = double(out.step_time_ns) * 1e-9;
  if (step_s > 0) {
    out.tokens_per_s = double(w.tokens_per_step) / step_s;
    const double per_gpu = w.model_flops_per_step / step_s / double(s.world_size());
    out.tflops_per_gpu = per_gpu / 1e12;
    out.mfu = out.peak_flops > 0 ? per_gpu / out.peak_flops : 0;
  }

  out.stages = stage_compute(w);
  out.capacity_bytes = cluster.device.mem_capacity_bytes;
  out.memory = estimate_memory(s, prec, out.capacity_bytes, device_nvme_offload(s, prof.offload));
  for (const auto& m : out.memory) {
    out.peak_memory_bytes = std::max(out.peak_memory_bytes, m.total_bytes);
    out.fits = out.fits && m.fits;
  }
  if (opt.keep_trace) {
    out.trace = make_trace(w, r, cluster, out.peak_flops);
    // Memory counters per simulated rank (the estimate is constant over the step).
    auto& t = *out.trace;
    std::vector<std::pair<int32_t, int>> ranks;  // (rank, stage), simulated and copied
    for (const auto& rk : r.ranks) ranks.emplace_back(rk.rank, rk.coord.pp);
    for (const auto& [rank, k] : r.copies) ranks.emplace_back(rank, r.ranks[size_t(k)].coord.pp);
    std::sort(ranks.begin(), ranks.end());
    for (const auto& [rank, stage] : ranks) {
      const MemoryEstimate& m = out.memory[size_t(stage)];
      const std::pair<const char*, double> cats[] = {
          {names::kMemParameters.data(), m.parameters_bytes},
          {names::kMemGradients.data(), m.gradients_bytes},
          {names::kMemOptimizer.data(), m.optimizer_bytes},
          {names::kMemActivations.data(), m.activations_bytes}};
      for (const auto& [name, v] : cats) t.counters.push_back({rank, t.strings.intern(name), 0, v});
      if (s.zero.nvme())
        t.counters.push_back(
            {rank, t.strings.intern(names::kMemOffloadNvme.data()), 0, m.offload_nvme_bytes});
      if (host_offload(s) || m.offload_host_bytes > 0)  // host, or nvme on a device
        t.counters.push_back(
            {rank, t.strings.intern(names::kMemOffloadHost.data()), 0, m.offload_host_bytes});
    }
  }
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

namespace {

// Host offload (workload.hpp): the copies and the host steps overlap, so the larger of the link's
// time (gradients down, parameters up, on one copy stream) and the host's bounds the optimizer.
double host_offload_estimate_ns(const Scenario& s, const Cluster& c, const CostModel& cost,
                                const PrecisionConfig& prec, double params) {
  const double updated =
      s.parallel.zero >= 1 && s.parallel.dp > 1 ? params / s.parallel.dp : params;
  const int share = std::min(c.gpus_per_node, s.world_size());
  const OffloadLinks& links = cost.profile().offload;
  const double link = links.host_link_bytes_per_s / host_link_sharers(links, share);
  const double copies = double(offload_io_ns(updated * (prec.grad_bytes + prec.param_bytes), link));
  return std::max(copies, double(host_adamw_ns(updated, links, share)));
}

// A closed-form step estimate, only to rank the search's candidates before simulating the best few:
// the pipeline (m + p - 1 slots of one micro-batch's stage work, TP all-reduces in line; interleaved
// m·v + p - 1 slots of a chunk's), the head
// on the last stage, and the data-parallel traffic that backward cannot hide.
double estimate_step_ns(const Scenario& s, const Cluster& c, const CostModel& cost,
                        const PrecisionConfig& prec) {
  const Layout l = Layout::from(s);
  const ModelDims d = model_dims(s, prec.act_bytes);
  const double m = s.micro_batches_per_step(), pp = s.parallel.pp,
               lps = max_stage_layers(s);  // the slowest stage sets the pipeline's slot
  const double tf = double(cost.named_op_ns(names::kBlockForward, 0, 1, d));
  const double tb = double(cost.named_op_ns(names::kBlockBackward, 0, 1, d));
  const double head = double(cost.named_op_ns(names::kHeadForward, 0, 1, d) +
                             cost.named_op_ns(names::kHeadBackward, 0, 1, d));
  const int64_t act =
      int64_t(s.training.micro_batch) * s.model.seq * s.model.d_model * prec.act_bytes;
  auto coll = [&](traces::CollOp op, std::vector<int32_t> members, int64_t bytes) -> double {
    if (members.size() < 2 || bytes <= 0) return 0.0;
    CollectiveRequest req;
    req.op = op;
    req.members = std::move(members);
    req.bytes = bytes;
    return double(collective_time_ns(c, req, NetworkModel::Analytical));
  };
  const double t_ar = coll(traces::CollOp::AllReduce, group_members(l, 0, GroupRole::TP), act);
  const double t_p2p =
      s.parallel.pp > 1 ? coll(traces::CollOp::Send, {0, l.rank_of(0, 0, 1)}, act) : 0.0;
  // Interleaved 1F1B: m·v + p - 1 slots of one chunk's work (lps / v layers), a transfer each way per chunk.
  const double v = schedule_of(s.parallel) == Schedule::Interleaved && s.parallel.pp > 1
                       ? std::max(1, s.parallel.virtual_stages)
                       : 1;
  double slot = lps / v * (tf + tb + 4 * t_ar) + 2 * t_p2p;
  // MoE blocks: their four all-to-alls over the ep group in line, the experts' compute in the
  // dense MLP's place (moe_cost.hpp).
  if (s.model.moe.enabled()) {
    const MoeLoad ml = moe_load(s, cost.profile().moe_expert_shares);
    const double t_a2a =
        coll(traces::CollOp::AllToAll, group_members(l, 0, GroupRole::EP, s.parallel.ep),
             moe_all_to_all_bytes(ml, s, prec.act_bytes));
    const double moe_ns = double(cost.op_ns(moe_expert_kernels(d, s, ml)) +
                                 cost.op_ns(moe_router_kernels(d, s, ml))) *
                              3 -
                          double(cost.op_ns(mlp_forward_kernels(d))) * 3;
    slot += double(stage_moe_blocks(s, 0)) / v * (4 * t_a2a + moe_ns);
  }
  double est = (m * v + pp - 1) * slot + m * head;
  int64_t params = stage_dense_params(s, 0);
  const auto dpg = group_members(l, 0, GroupRole::DP);
  const int z = s.parallel.zero;
  double dp_total = 0;
  const double grads = double(params) * prec.grad_bytes;
  const std::string& comp = s.parallel.grad_compression;
  if (z <= 1 && (comp == "int8" || comp == "topk")) {
    // The compressed buckets' all-gather (model/compression.hpp); PowerSGD's per-matrix bytes
    // need the shapes: estimated as the fp32 all-reduce below (an upper bound), simulated exactly.
    const size_t n = size_t(params);
    const size_t payload = comp == "int8" ? model::int8_payload_bytes(n)
                                          : model::topk_payload_bytes(n, s.compression.topk_ratio);
    dp_total = coll(traces::CollOp::AllGather, dpg, int64_t(payload) * s.parallel.dp);
  } else if (z == 0)
    dp_total = coll(traces::CollOp::AllReduce, dpg, int64_t(grads));
  else
    dp_total = coll(traces::CollOp::ReduceScatter, dpg, int64_t(grads)) * (z >= 2 ? m : 1.0);
  if (z == 1 || z == 2)
    dp_total += coll(traces::CollOp::AllGather, dpg, int64_t(double(params) * prec.param_bytes));
  if (z == 3)
    dp_total +=
        2 * m * coll(traces::CollOp::AllGather, dpg, int64_t(double(params) * prec.param_bytes));
  if (s.model.moe.enabled()) {  // the expert gradients over the edp group
    const auto edpg = group_members(l, 0, GroupRole::EDP, s.parallel.ep);
    const auto experts = double(stage_expert_params(s, 0));
    if (z == 3)  // ZeRO 3: each block's experts gathered twice and scattered per micro-batch
      dp_total +=
          m * (coll(traces::CollOp::ReduceScatter, edpg, int64_t(experts * prec.grad_bytes)) +
               2 * coll(traces::CollOp::AllGather, edpg, int64_t(experts * prec.param_bytes)));
    else
      dp_total += coll(traces::CollOp::AllReduce, edpg, int64_t(experts * prec.grad_bytes));
  }
  // Backward of the last micro-batch hides some of it; the rest is exposed.
  est += std::max(0.0, dp_total - lps * tb);
  if (s.zero.nvme()) {
    // NVMe offload (workload.hpp): the updated state read and written through the node's disk,
    // shared by its ranks; overlapped with AdamW, so the disk's time is the bound. On a device the
    // moments only go through the file, and the host link's copies and the host's AdamW overlap
    // the disk's: the largest of the three.
    const double updated =
        z >= 1 && s.parallel.dp > 1 ? double(params) / s.parallel.dp : double(params);
    const OffloadLinks& links = cost.profile().offload;
    const bool device = device_nvme_offload(s, links);
    const double bytes =
        (device ? device_nvme_file_bytes(s) : offload_bytes_per_param(s, prec)) * updated;
    const double share = std::min(c.gpus_per_node, s.world_size());
    const double disk = double(offload_io_ns(bytes, links.nvme_read_bytes_per_s / share) +
                               offload_io_ns(bytes, links.nvme_write_bytes_per_s / share));
    est +=
        device ? std::max(disk, host_offload_estimate_ns(s, c, cost, prec, double(params))) : disk;
  }
  if (host_offload(s)) est += host_offload_estimate_ns(s, c, cost, prec, double(params));
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

std::vector<SimResult> run_sweep_jobs(const std::vector<SweepJob>& jobs,
                                      const std::function<void(const std::string&)>& progress) {
  std::vector<SimResult> out;
  out.reserve(jobs.size());
  for (const SweepJob& job : jobs) {
    if (progress) progress(job.label);
    out.push_back(simulate(job.scenario, *job.cluster, job.options));
  }
  return out;
}

namespace {

// `host_link`: the profile has one (NVMe offload then runs the device's path, memory.hpp).
bool fits_memory(const Scenario& s, const Cluster& c, const PrecisionConfig& prec, bool host_link) {
  bool fits = true;
  for (const auto& m : estimate_memory(s, prec, c.device.mem_capacity_bytes, host_link))
    fits = fits && m.fits;
  return fits;
}

// The variants of one layout a search considers: as given if it fits memory, else with the
// optimizer state (ZeRO 3: and the parameter shards) offloaded to NVMe if that fits (memory
// short); with `compression` (the scenario has none) also int8 gradient compression on ZeRO 0/1
// with dp > 1 (bandwidth short: the estimate and the simulation decide whether it pays).
std::vector<Candidate> search_variants(const Candidate& cd, const Cluster& c,
                                       const PrecisionConfig& prec, bool compression,
                                       const OffloadLinks& links) {
  // ZeRO-Offload needs a GPU profile with a host link and a host AdamW rate; with a host link NVMe
  // offload runs the device's path (workload.hpp), its memory too.
  const bool link = links.host_link_bytes_per_s > 0;
  const bool host = link && links.host_adamw_bytes_per_s > 0;
  std::vector<Candidate> out;
  std::vector<Candidate> base{cd};
  if (compression && cd.s.parallel.grad_compression == "none" && cd.s.parallel.zero <= 1 &&
      cd.s.parallel.dp > 1) {
    base.push_back(cd);
    base.back().s.parallel.grad_compression = "int8";
  }
  for (Candidate& b : base) {
    if (fits_memory(b.s, c, prec, link)) {
      out.push_back(b);
      continue;
    }
    if (b.s.zero.offload_optimizer != "none") continue;
    if (host) {  // ZeRO-Offload (a GPU profile with a host link): both it and nvme are candidates
      Candidate h = b;
      h.s.zero.offload_optimizer = "host";
      if (fits_memory(h.s, c, prec, link)) out.push_back(h);
    }
    b.s.zero.offload_optimizer = "nvme";
    if (b.s.zero.nvme_path.empty()) b.s.zero.nvme_path = "nvme";  // simulated: any directory
    if (fits_memory(b.s, c, prec, link)) {
      out.push_back(b);
      continue;
    }
    if (b.s.parallel.zero != 3) continue;
    b.s.zero.offload_params = "nvme";
    if (fits_memory(b.s, c, prec, link)) out.push_back(b);
  }
  return out;
}

// The layouts of a --search row that fit device memory, best closed-form estimate first.
std::vector<Candidate> search_candidates(const Scenario& s, const Cluster& c, int gpus,
                                         const CostModel& cost, const PrecisionConfig& prec,
                                         bool search_compression) {
  std::vector<Candidate> cands;
  const int gb = s.training.global_batch;
  const OffloadLinks& links = cost.profile().offload;
  for (int tp = 1; tp <= std::min(gpus, c.gpus_per_node); tp *= 2) {
    if (s.model.heads % tp != 0 || s.model.d_model % tp != 0) continue;
    for (int pp : divisors(s.model.layers)) {
      if (tp * pp > gpus || gpus % (tp * pp) != 0) continue;
      const int dp = gpus / (tp * pp);
      if (gb % dp != 0) continue;
      for (int mb = 1; mb <= gb / dp && mb <= 16; mb *= 2) {
        if ((gb / dp) % mb != 0) continue;
        // MoE: every ep dividing dp and the experts (model/moe.hpp), ZeRO 0-3.
        std::vector<int> eps{1};
        if (s.model.moe.enabled()) {
          eps.clear();
          for (int ep : divisors(dp))
            if (s.model.moe.experts % ep == 0) eps.push_back(ep);
        }
        for (int ep : eps)
          for (int zero = 0; zero <= 3; ++zero) {
            if (zero > 0 && dp < 2) continue;
            // Gradient compression replaces the dp all-reduce, which ZeRO 2/3 do not have.
            if (zero >= 2 && s.parallel.grad_compression != "none") continue;
            Candidate cd;
            cd.s = s;
            cd.s.parallel.dp = dp, cd.s.parallel.tp = tp, cd.s.parallel.pp = pp,
            cd.s.parallel.zero = zero, cd.s.parallel.ep = ep;
            // The scenario's layers per stage fit its own pp only; other pp split evenly.
            if (int(s.parallel.pp_layers.size()) != pp) cd.s.parallel.pp_layers.clear();
            cd.s.training.micro_batch = mb;
            try {
              validate_layout(cd.s);
            } catch (const InputError&) {
              continue;
            }
            for (Candidate& v : search_variants(cd, c, prec, search_compression, links)) {
              v.estimate = estimate_step_ns(v.s, c, cost, prec);
              cands.push_back(std::move(v));
            }
          }
      }
    }
  }
  // Stable order: estimate, then fewer pipeline stages, lower ZeRO stage (deterministic ties).
  std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
    if (a.estimate != b.estimate) return a.estimate < b.estimate;
    if (a.s.parallel.pp != b.s.parallel.pp) return a.s.parallel.pp < b.s.parallel.pp;
    return a.s.parallel.zero < b.s.parallel.zero;
  });
  return cands;
}

// The cluster of `gpus` GPUs like `cluster` (a crossbar node scaled out on a default fat-tree, said
// in `note`), or the reason it cannot be built.
std::optional<Cluster> sized_cluster(const Cluster& cluster, int gpus, std::string& note) {
  Cluster base = cluster;
  if (base.topo.kind == TopologyKind::Crossbar && gpus > base.gpus_per_node) {
    // One crossbar node scales out as DGX-style nodes: one NIC per GPU on a rail-optimized
    // fat-tree with the topology defaults (cluster.hpp), stated in the row's note.
    base.topo.kind = TopologyKind::FatTree;
    note = "nodes of " + cluster.name + " on a default rail-optimized fat-tree";
  }
  try {
    return resize_cluster(base, gpus);
  } catch (const InputError& e) {
    note = e.what();
    return std::nullopt;
  }
}

}  // namespace

std::vector<SweepRow> sweep(const Scenario& s, const Cluster& cluster, const SweepOptions& opt) {
  // The scenario as given (each row's simulate() checks its own size): refuses model.layers above
  // kMaxSimulatedLayers before the search sizes the stages of every candidate layout (with every
  // rank, the rail symmetry assumed: the smallest size).
  check_simulation_size(s, opt.sim.steps, opt.sim.all_ranks, false, 0,
                        opt.sim.all_ranks ? std::max(1, s.parallel.tp) : 1);
  std::vector<SweepRow> rows;
  std::vector<SweepJob> jobs;  // every simulation of the sweep, planned first
  auto say = [&](const std::string& line) {
    if (opt.progress) opt.progress(line);
  };
  for (const int gpus : opt.gpus) {
    SweepRow row;
    row.gpus = gpus;
    if (gpus < 1) throw InputError("--gpus: sizes must be >= 1 (got " + std::to_string(gpus) + ")");
    std::string scaled_note;
    const std::optional<Cluster> sized = sized_cluster(cluster, gpus, scaled_note);
    if (!sized) {
      row.note = scaled_note;
      rows.push_back(row);
      continue;
    }
    const auto c = std::make_shared<const Cluster>(*sized);
    const HardwareProfile prof = opt.sim.profile ? *opt.sim.profile : profile_for(*c);
    const PrecisionConfig prec = precision_for(opt.sim, prof);
    const CostModel cost(prof, peak_for(*c, prof), c->device.mem_bandwidth_bytes_per_s);
    SimOptions so = opt.sim;
    so.profile = prof;
    so.keep_trace = false;
    const int index = static_cast<int>(rows.size());
    const std::string at = "[" + std::to_string(gpus) + " GPUs] ";
    row.note = scaled_note;

    if (!opt.search) {
      Scenario x;
      try {
        x = fit_layout(s, *c);
      } catch (const InputError& e) {
        row.note = e.what();
        rows.push_back(row);
        say(at + "skipped: " + row.note);
        continue;
      }
      jobs.push_back({index, x, c, so, at + "simulating " + layout_string(x)});
      row.candidates = row.simulated = 1;
      rows.push_back(row);
      continue;
    }

    // Search: every layout that fits memory, ranked by the estimate; simulate the best few.
    const std::vector<Candidate> cands =
        search_candidates(s, *c, gpus, cost, prec, opt.search_compression);
    row.candidates = static_cast<int>(cands.size());
    if (cands.empty()) {
      row.note = "no layout fits device memory";
      rows.push_back(row);
      say(at + "no layout fits device memory");
      continue;
    }
    const int top = std::min<int>(opt.search_top, static_cast<int>(cands.size()));
    for (int i = 0; i < top; ++i) {
      const Scenario& x = cands[size_t(i)].s;
      jobs.push_back({index, x, c, so,
                      at + std::to_string(i + 1) + "/" + std::to_string(top) + " (of " +
                          std::to_string(cands.size()) + " fitting) " + layout_string(x) +
                          (x.model.moe.enabled() ? " ep=" + std::to_string(x.parallel.ep) : "") +
                          " zero=" + std::to_string(x.parallel.zero) +
                          " mb=" + std::to_string(x.training.micro_batch)});
      ++row.simulated;
    }
    rows.push_back(row);
  }

  const std::vector<SimResult> results = opt.runner ? opt.runner(jobs) : run_sweep_jobs(jobs, say);
  if (results.size() != jobs.size()) {
    throw InternalError("sweep: " + std::to_string(jobs.size()) + " simulations planned, " +
                        std::to_string(results.size()) + " results returned");
  }
  // Per row the best tokens/s, the first of equals (job order: the estimate's); the others kept,
  // fastest first (stable: equals in job order), for explain_choice.
  for (size_t j = 0; j < jobs.size(); ++j) {
    SweepRow& row = rows[size_t(jobs[j].row)];
    if (!row.ok || results[j].tokens_per_s > row.result.tokens_per_s) {
      if (row.ok && opt.search) row.others.push_back(row.result);
      row.result = results[j];
      row.ok = true;
    } else if (opt.search) {
      row.others.push_back(results[j]);
    }
  }
  for (auto& row : rows)
    std::stable_sort(
        row.others.begin(), row.others.end(),
        [](const SimResult& a, const SimResult& b) { return a.tokens_per_s > b.tokens_per_s; });
  if (!opt.search) {
    for (auto& row : rows) {
      if (row.ok && !row.result.fits)
        row.note += std::string(row.note.empty() ? "" : "; ") + "does not fit device memory";
    }
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

// ---- the wire format of a distributed sweep

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(StepBreakdown, window_ns, compute_ns, exposed_tp_ns,
                                   exposed_dp_ns, exposed_pp_ns, exposed_ep_ns, bubble_ns, idle_ns)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MemoryEstimate, stage, layers, param_count, parameters_bytes,
                                   gradients_bytes, optimizer_bytes, offload_nvme_bytes,
                                   offload_host_bytes, activations_bytes, micro_batches_in_flight,
                                   total_bytes, capacity_bytes, fits)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(StageCompute, stage, layers, compute_ns, flops, block_flops)

std::string results_to_wire(const std::vector<SimResult>& results) {
  nlohmann::json a = nlohmann::json::array();
  for (const SimResult& r : results) {
    a.push_back({{"dp", r.dp},
                 {"tp", r.tp},
                 {"pp", r.pp},
                 {"zero", r.zero},
                 {"offload", r.offload},
                 {"grad_compression", r.grad_compression},
                 {"ep", r.ep},
                 {"moe", r.moe},
                 {"micro_batch", r.micro_batch},
                 {"micro_batches", r.micro_batches},
                 {"schedule", r.schedule},
                 {"precision", r.precision},
                 {"profile_name", r.profile_name},
                 {"step_time_ns", r.step_time_ns},
                 {"tokens_per_s", r.tokens_per_s},
                 {"tflops_per_gpu", r.tflops_per_gpu},
                 {"mfu", r.mfu},
                 {"peak_flops", r.peak_flops},
                 {"breakdown", r.breakdown},
                 {"memory", r.memory},
                 {"stages", r.stages},
                 {"peak_memory_bytes", r.peak_memory_bytes},
                 {"fits", r.fits},
                 {"capacity_bytes", r.capacity_bytes},
                 {"simulated_ranks", r.simulated_ranks},
                 {"copied_ranks", r.copied_ranks},
                 {"ops", r.ops},
                 {"events", r.events},
                 {"wall_s", r.wall_s}});
  }
  return nlohmann::json{{"orrery_sweep_results", 1}, {"results", a}}.dump();
}

std::vector<SimResult> results_from_wire(const std::string& bytes) {
  std::vector<SimResult> out;
  try {
    const auto j = nlohmann::json::parse(bytes);
    if (j.value("orrery_sweep_results", 0) != 1) throw InputError("not sweep results");
    for (const auto& x : j.at("results")) {
      SimResult r;
      x.at("dp").get_to(r.dp), x.at("tp").get_to(r.tp), x.at("pp").get_to(r.pp);
      x.at("zero").get_to(r.zero), x.at("micro_batch").get_to(r.micro_batch);
      x.at("offload").get_to(r.offload), x.at("grad_compression").get_to(r.grad_compression);
      x.at("ep").get_to(r.ep), x.at("moe").get_to(r.moe);
      x.at("micro_batches").get_to(r.micro_batches), x.at("schedule").get_to(r.schedule);
      x.at("precision").get_to(r.precision), x.at("profile_name").get_to(r.profile_name);
      x.at("step_time_ns").get_to(r.step_time_ns), x.at("tokens_per_s").get_to(r.tokens_per_s);
      x.at("tflops_per_gpu").get_to(r.tflops_per_gpu), x.at("mfu").get_to(r.mfu);
      x.at("peak_flops").get_to(r.peak_flops), x.at("breakdown").get_to(r.breakdown);
      x.at("memory").get_to(r.memory), x.at("stages").get_to(r.stages);
      x.at("peak_memory_bytes").get_to(r.peak_memory_bytes), x.at("fits").get_to(r.fits);
      x.at("capacity_bytes").get_to(r.capacity_bytes);
      x.at("simulated_ranks").get_to(r.simulated_ranks), x.at("ops").get_to(r.ops);
      x.at("copied_ranks").get_to(r.copied_ranks);
      x.at("events").get_to(r.events), x.at("wall_s").get_to(r.wall_s);
      out.push_back(std::move(r));
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("sweep results: malformed (") + e.what() + ")");
  }
  return out;
}

}  // namespace orrery::sim

// ---------------------------------------------------------------------------------------------
// Output

namespace orrery::sim {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string gb(double bytes) { return fmt("%.1f GB", bytes / 1e9); }
// Sizes and rates in the unit that keeps three significant digits visible: a CPU profile's 20 MB of
// model states or 25 GFLOP/s peak must not print as "0.0 GB" and "0 TFLOP/s".
std::string bytes_str(double bytes) {
  if (bytes >= 1e9) return fmt("%.1f GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt("%.1f MB", bytes / 1e6);
  return fmt("%.1f kB", bytes / 1e3);
}
std::string flops_str(double flops_per_s) {
  if (flops_per_s >= 1e12) return fmt("%.1f TFLOP/s", flops_per_s / 1e12);
  if (flops_per_s >= 1e9) return fmt("%.2f GFLOP/s", flops_per_s / 1e9);
  return fmt("%.1f MFLOP/s", flops_per_s / 1e6);
}

std::string seconds(double ns) {
  if (ns >= 1e9) return fmt("%.3f s", ns / 1e9);
  if (ns >= 1e6) return fmt("%.2f ms", ns / 1e6);
  return fmt("%.1f us", ns / 1e3);
}

// Each stage's layers and compute (one rank, one step), so an uneven pipeline shows: all stages up
// to 8, else the first, the slowest, the fastest and the last.
void format_stage_compute(std::ostringstream& o, const std::vector<StageCompute>& stages) {
  if (stages.size() < 2) return;
  size_t slow = 0, fast = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages[i].compute_ns > stages[slow].compute_ns) slow = i;
    if (stages[i].compute_ns < stages[fast].compute_ns) fast = i;
  }
  const double ratio =
      stages[fast].compute_ns > 0 ? stages[slow].compute_ns / stages[fast].compute_ns : 0.0;
  o << "compute per stage (one rank, one step; slowest / fastest " << fmt("%.2f", ratio) << ")\n";
  auto line = [&](size_t i) {
    const StageCompute& c = stages[i];
    o << "  stage " << c.stage << ": " << c.layers << (c.layers == 1 ? " layer, " : " layers, ")
      << seconds(c.compute_ns) << ", " << fmt("%.4g", c.flops) << " FLOP"
      << (i == slow ? "  slowest" : "") << "\n";
  };
  if (stages.size() <= 8) {
    for (size_t i = 0; i < stages.size(); ++i) line(i);
    return;
  }
  std::vector<size_t> shown{0, slow, fast, stages.size() - 1};
  std::sort(shown.begin(), shown.end());
  shown.erase(std::unique(shown.begin(), shown.end()), shown.end());
  for (size_t i : shown) line(i);
  o << "  (" << stages.size() - shown.size() << " other stages in --json)\n";
}

}  // namespace

nlohmann::json to_json(const SimResult& r) {
  nlohmann::json j;
  j["layout"] = {{"dp", r.dp},
                 {"tp", r.tp},
                 {"pp", r.pp},
                 {"zero", r.zero},
                 {"offload", r.offload},
                 {"grad_compression", r.grad_compression},
                 {"micro_batch", r.micro_batch},
                 {"micro_batches_per_step", r.micro_batches},
                 {"schedule", r.schedule}};
  if (r.moe) j["layout"]["ep"] = r.ep;
  j["precision"] = r.precision;
  j["hardware_profile"] = r.profile_name;
  j["step_time_ns"] = r.step_time_ns;
  j["step_time_s"] = double(r.step_time_ns) * 1e-9;
  j["tokens_per_s"] = r.tokens_per_s;
  j["tflops_per_gpu"] = r.tflops_per_gpu;
  j["mfu"] = r.mfu;
  j["peak_flops_per_gpu"] = r.peak_flops;
  const auto& b = r.breakdown;
  j["breakdown_ns"] = {{"window", b.window_ns},
                       {"compute", b.compute_ns},
                       {"exposed_tp_comm", b.exposed_tp_ns},
                       {"exposed_dp_comm", b.exposed_dp_ns},
                       {"exposed_pp_comm", b.exposed_pp_ns},
                       {"bubble", b.bubble_ns},
                       {"idle", b.idle_ns}};
  if (r.moe) j["breakdown_ns"]["exposed_ep_all_to_all"] = b.exposed_ep_ns;
  j["memory"] = nlohmann::json::array();
  for (const auto& m : r.memory) {
    j["memory"].push_back({{"stage", m.stage},
                           {"layers", m.layers},
                           {"parameters", m.param_count},
                           {"parameters_bytes", m.parameters_bytes},
                           {"gradients_bytes", m.gradients_bytes},
                           {"optimizer_bytes", m.optimizer_bytes},
                           {"activations_bytes", m.activations_bytes},
                           {"micro_batches_in_flight", m.micro_batches_in_flight},
                           {"total_bytes", m.total_bytes},
                           {"fits", m.fits}});
    // Outside the device's total: the NVMe file and host offload's pinned host memory.
    if (m.offload_nvme_bytes > 0) j["memory"].back()["offload_nvme_bytes"] = m.offload_nvme_bytes;
    if (m.offload_host_bytes > 0) j["memory"].back()["offload_host_bytes"] = m.offload_host_bytes;
  }
  j["stages"] = nlohmann::json::array();
  for (const auto& c : r.stages)
    j["stages"].push_back({{"stage", c.stage},
                           {"layers", c.layers},
                           {"compute_ns", c.compute_ns},
                           {"flops", c.flops},
                           {"block_flops", c.block_flops}});
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["capacity_bytes"] = r.capacity_bytes;
  j["fits"] = r.fits;
  j["simulated_ranks"] = r.simulated_ranks;
  j["copied_ranks"] = r.copied_ranks;
  j["ops"] = r.ops;
  j["events"] = r.events;
  j["wall_s"] = r.wall_s;
  return j;
}

std::string format_report(const SimResult& r, const Scenario& s, const Cluster& c,
                          NetworkModel model) {
  std::ostringstream o;
  const double step = double(r.step_time_ns);
  o << "orrery sim: " << s.name << " on " << c.name << " (" << c.num_gpus() << " x "
    << c.device.name << ", " << c.topology->describe() << ")\n";
  o << "  network model " << to_string(model) << ", hardware profile " << r.profile_name << ", "
    << r.precision << " precision\n";
  o << "layout        dp=" << r.dp << " tp=" << r.tp << " pp=" << r.pp
    << (r.moe ? " ep=" + std::to_string(r.ep) : std::string()) << " zero=" << r.zero
    << extras_label(r.offload, r.grad_compression) << ", " << r.schedule << ", micro-batch "
    << r.micro_batch << " x " << r.micro_batches << " per replica per step\n";
  o << "step time     " << seconds(step) << "\n";
  o << "tokens/s      " << fmt("%.0f", r.tokens_per_s) << "\n";
  o << "per GPU       " << flops_str(r.tflops_per_gpu * 1e12) << ", MFU "
    << fmt("%.1f %%", 100 * r.mfu) << " (peak " << flops_str(r.peak_flops) << ")\n";
  const auto& b = r.breakdown;
  o << "breakdown (one step, mean over ranks)\n";
  auto line = [&](const char* name, double ns) {
    o << "  " << name << std::string(18 - std::string(name).size(), ' ') << seconds(ns)
      << std::string(std::max<int>(1, 12 - int(seconds(ns).size())), ' ')
      << fmt("%5.1f %%", b.window_ns > 0 ? 100 * ns / b.window_ns : 0.0) << "\n";
  };
  line("compute", b.compute_ns);
  line("exposed tp comm", b.exposed_tp_ns);
  line("exposed dp comm", b.exposed_dp_ns);
  if (r.moe) line("  of which ep a2a", b.exposed_ep_ns);
  line("pipeline bubble", b.bubble_ns);
  if (r.pp > 1) line("  of which pp p2p", b.exposed_pp_ns);
  line("idle", b.idle_ns);
  format_stage_compute(o, r.stages);
  o << "memory per GPU (parameters + gradients + optimizer + activations = total, capacity "
    << bytes_str(double(r.capacity_bytes)) << ")\n";
  auto mem_line = [&](const MemoryEstimate& m) {
    o << "  stage " << m.stage << " (" << m.layers << (m.layers == 1 ? " layer" : " layers")
      << "): " << bytes_str(m.parameters_bytes) << " + " << bytes_str(m.gradients_bytes) << " + "
      << bytes_str(m.optimizer_bytes) << " + " << bytes_str(m.activations_bytes) << " ("
      << m.micro_batches_in_flight << " micro-batches in flight) = " << bytes_str(m.total_bytes)
      << (m.fits ? "  fits" : "  DOES NOT FIT")
      << (m.offload_host_bytes > 0 ? "; pinned host " + bytes_str(m.offload_host_bytes) : "")
      << "\n";
  };
  if (r.memory.size() <= 4) {
    for (const auto& m : r.memory) mem_line(m);
  } else {
    size_t peak = 0;
    for (size_t i = 0; i < r.memory.size(); ++i)
      if (r.memory[i].total_bytes > r.memory[peak].total_bytes) peak = i;
    mem_line(r.memory.front());
    if (peak != 0 && peak + 1 != r.memory.size()) mem_line(r.memory[peak]);
    mem_line(r.memory.back());
    o << "  (" << r.memory.size() - (peak != 0 && peak + 1 != r.memory.size() ? 3 : 2)
      << " other stages in --json)\n";
  }
  o << "simulated " << r.simulated_ranks << " of " << r.dp * r.tp * r.pp << " ranks";
  if (r.copied_ranks > 0)
    o << " (tp rank 0 of each group: its tp peers on the other rails run copies of its timeline)";
  else if (r.simulated_ranks < size_t(r.dp * r.tp * r.pp))
    o << " (one per pipeline stage: the other dp x tp ranks of a stage run the same timeline)";
  o << ", " << r.ops << " ops, " << r.events << " events in " << fmt("%.2f s", r.wall_s) << "\n";
  return o.str();
}

nlohmann::json to_json(const std::vector<SweepRow>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json x;
    x["gpus"] = r.gpus;
    x["ok"] = r.ok;
    x["note"] = r.note;
    x["candidates"] = r.candidates;
    x["why"] = explain_choice(r);
    x["simulated"] = r.simulated;
    if (r.ok) {
      x["result"] = to_json(r.result);
      x["efficiency"] = r.efficiency;
    }
    j.push_back(x);
  }
  return j;
}

namespace {

double pct_of_step(double ns, const StepBreakdown& b) {
  return b.window_ns > 0 ? 100.0 * ns / b.window_ns : 0.0;
}

std::string layout_label(const SimResult& x) {
  return "dp=" + std::to_string(x.dp) + " tp=" + std::to_string(x.tp) +
         " pp=" + std::to_string(x.pp) + (x.moe ? " ep=" + std::to_string(x.ep) : "") + " zero " +
         std::to_string(x.zero) + " mb " + std::to_string(x.micro_batch) +
         extras_label(x.offload, x.grad_compression);
}
// MoE layouts: the exposed all-to-all share (part of exposed dp), for the why line.
std::string a2a_note(const SimResult& x) {
  if (!x.moe) return "";
  char buf[96];
  std::snprintf(buf, sizeof buf, " (of which ep all-to-all %.1f %%)",
                pct_of_step(x.breakdown.exposed_ep_ns, x.breakdown));
  return buf;
}

}  // namespace

std::string explain_choice(const SweepRow& row) {
  if (!row.ok || row.candidates <= 1) return "";
  const SimResult& x = row.result;
  const StepBreakdown& b = x.breakdown;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%d layouts fit memory, %d simulated; picked %s: bubble %.1f %%, exposed tp %.1f "
                "%%, exposed dp %.1f %%%s of the step, %s of %s per GPU",
                row.candidates, row.simulated, layout_label(x).c_str(), pct_of_step(b.bubble_ns, b),
                pct_of_step(b.exposed_tp_ns, b), pct_of_step(b.exposed_dp_ns, b),
                a2a_note(x).c_str(), gb(x.peak_memory_bytes).c_str(),
                gb(double(x.capacity_bytes)).c_str());
  std::string out = buf;
  if (!row.others.empty()) {
    const SimResult& y = row.others.front();
    const StepBreakdown& c = y.breakdown;
    std::snprintf(
        buf, sizeof buf,
        "; next %s: step %+.1f %% (bubble %.1f %%, exposed tp %.1f %%, exposed dp "
        "%.1f %%%s, %s)",
        layout_label(y).c_str(),
        x.step_time_ns > 0
            ? 100.0 * (double(y.step_time_ns) - double(x.step_time_ns)) / double(x.step_time_ns)
            : 0.0,
        pct_of_step(c.bubble_ns, c), pct_of_step(c.exposed_tp_ns, c),
        pct_of_step(c.exposed_dp_ns, c), a2a_note(y).c_str(), gb(y.peak_memory_bytes).c_str());
    out += buf;
  }
  return out;
}

std::string format_sweep_table(const std::vector<SweepRow>& rows) {
  std::ostringstream o;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%7s  %-22s %4s %3s  %11s  %12s  %11s  %6s  %6s  %10s  %s\n",
                "gpus", "layout", "zero", "mb", "step time", "tokens/s", "TFLOP/s/GPU", "MFU",
                "eff.", "mem/GPU", "fits");
  o << buf;
  for (const auto& r : rows) {
    if (!r.ok) {
      std::snprintf(buf, sizeof buf, "%7d  %s\n", r.gpus, r.note.c_str());
      o << buf;
      continue;
    }
    const auto& x = r.result;
    const std::string layout = "dp=" + std::to_string(x.dp) + " tp=" + std::to_string(x.tp) +
                               " pp=" + std::to_string(x.pp) +
                               (x.moe ? " ep=" + std::to_string(x.ep) : "") +
                               extras_label(x.offload, x.grad_compression);
    std::snprintf(buf, sizeof buf,
                  "%7d  %-22s %4d %3d  %11s  %12.0f  %11.1f  %5.1f%%  %5.1f%%  %10s  %s\n", r.gpus,
                  layout.c_str(), x.zero, x.micro_batch, seconds(double(x.step_time_ns)).c_str(),
                  x.tokens_per_s, x.tflops_per_gpu, 100 * x.mfu, 100 * r.efficiency,
                  gb(x.peak_memory_bytes).c_str(), x.fits ? "yes" : "NO");
    o << buf;
  }
  return o.str();
}

std::string format_sweep_csv(const std::vector<SweepRow>& rows) {
  std::ostringstream o;
  o << "gpus,dp,tp,pp,zero,micro_batch,step_time_s,tokens_per_s,tflops_per_gpu,mfu,efficiency,peak_"
       "memory_bytes,fits,"
       "note\n";
  for (const auto& r : rows) {
    std::string note = r.note;
    for (char& ch : note)
      if (ch == '"') ch = '\'';
    if (!r.ok) {
      o << r.gpus << ",,,,,,,,,,,,,\"" << note << "\"\n";
      continue;
    }
    const auto& x = r.result;
    o << r.gpus << "," << x.dp << "," << x.tp << "," << x.pp << "," << x.zero << ","
      << x.micro_batch << "," << fmt("%.9g", double(x.step_time_ns) * 1e-9) << ","
      << fmt("%.6g", x.tokens_per_s) << "," << fmt("%.6g", x.tflops_per_gpu) << ","
      << fmt("%.6g", x.mfu) << "," << fmt("%.6g", r.efficiency) << ","
      << fmt("%.0f", x.peak_memory_bytes) << "," << (x.fits ? "true" : "false") << ",\"" << note
      << "\"\n";
  }
  return o.str();
}

std::string hardware_dir_for(const std::string& cluster_path) {
  namespace fs = std::filesystem;
  if (!cluster_path.empty()) {
    const fs::path d = fs::path(cluster_path).parent_path().parent_path() / "hardware";
    if (fs::is_directory(d)) return d.string();
  }
  if (fs::is_directory("scenarios/hardware")) return "scenarios/hardware";
  return "";
}

}  // namespace orrery::sim
