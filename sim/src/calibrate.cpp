// Calibration of a hardware profile from real traces: the fitting maths (NNLS, affine fits), the
// calibrated profile as the simulator uses it (profile_for_ranks, cluster_from_profile), and the
// fit itself, as named steps (see calibrate.hpp for the model; the core-sharing law it fits is
// core_sharing.hpp).
#include "orrery/sim/calibrate.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "calibrate_gpu.hpp"
#include "calibrate_offload.hpp"
#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"
#include "orrery/common/stats.hpp"
#include "orrery/sim/core_sharing.hpp"
#include "orrery/sim/moe_cost.hpp"
#include "orrery/sim/workload.hpp"
#include "orrery/traces/collective_instances.hpp"

namespace orrery::sim {

// ---------------------------------------------------------------------------------------------
// Fitting maths

namespace {

// Solves the normal equations of A restricted to columns `cols` (Gaussian elimination with partial
// pivoting); singular directions get 0.
std::vector<double> ls_on(const std::vector<double>& a, int rows, int ncols,
                          const std::vector<double>& b, const std::vector<int>& cols) {
  const int k = static_cast<int>(cols.size());
  std::vector<double> m(k * (k + 1), 0.0);
  for (int i = 0; i < k; ++i) {
    for (int j = 0; j < k; ++j) {
      double s = 0;
      for (int r = 0; r < rows; ++r) s += a[r * ncols + cols[i]] * a[r * ncols + cols[j]];
      m[i * (k + 1) + j] = s;
    }
    double s = 0;
    for (int r = 0; r < rows; ++r) s += a[r * ncols + cols[i]] * b[r];
    m[i * (k + 1) + k] = s;
  }
  double scale = 0;
  for (int i = 0; i < k; ++i) scale = std::max(scale, std::abs(m[i * (k + 1) + i]));
  const double eps = std::max(scale, 1e-300) * 1e-13;
  std::vector<int> piv_row(k, -1);
  std::vector<bool> used(k, false);
  for (int c = 0; c < k; ++c) {
    int best = -1;
    double bv = eps;
    for (int r = 0; r < k; ++r)
      if (!used[r] && std::abs(m[r * (k + 1) + c]) > bv)
        best = r, bv = std::abs(m[r * (k + 1) + c]);
    if (best < 0) continue;  // singular direction
    used[best] = true;
    piv_row[c] = best;
    for (int r = 0; r < k; ++r) {
      if (r == best) continue;
      const double f = m[r * (k + 1) + c] / m[best * (k + 1) + c];
      if (f == 0) continue;
      for (int j = c; j <= k; ++j) m[r * (k + 1) + j] -= f * m[best * (k + 1) + j];
    }
  }
  std::vector<double> x(k, 0.0);
  for (int c = 0; c < k; ++c)
    if (piv_row[c] >= 0) x[c] = m[piv_row[c] * (k + 1) + k] / m[piv_row[c] * (k + 1) + c];
  return x;
}

}  // namespace

std::vector<double> nnls(const std::vector<double>& a, int rows, int cols,
                         const std::vector<double>& b) {
  if (rows < 0 || cols < 0 || a.size() != size_t(rows) * size_t(cols) || b.size() != size_t(rows))
    throw InternalError("nnls: matrix and vector sizes disagree");
  std::vector<double> x(cols, 0.0);
  std::vector<bool> passive(cols, false);
  auto gradient = [&]() {  // w = A^T (b - A x)
    std::vector<double> r(rows), w(cols, 0.0);
    for (int i = 0; i < rows; ++i) {
      double s = b[i];
      for (int j = 0; j < cols; ++j) s -= a[i * cols + j] * x[j];
      r[i] = s;
    }
    for (int j = 0; j < cols; ++j)
      for (int i = 0; i < rows; ++i) w[j] += a[i * cols + j] * r[i];
    return w;
  };
  double bnorm = 0;
  for (double v : b) bnorm += v * v;
  // A column enters when its gradient is significant against its own norm and |b|.
  std::vector<double> colnorm(cols, 0.0);
  for (int j = 0; j < cols; ++j) {
    for (int i = 0; i < rows; ++i) colnorm[j] += a[i * cols + j] * a[i * cols + j];
    colnorm[j] = std::sqrt(colnorm[j]);
  }
  for (int outer = 0; outer < 3 * cols + 10; ++outer) {
    const auto w = gradient();
    int t = -1;
    double wmax = 0;
    for (int j = 0; j < cols; ++j) {
      const double tol = 1e-12 * colnorm[j] * std::sqrt(bnorm);
      if (!passive[j] && w[j] > tol && (t < 0 || w[j] / colnorm[j] > wmax))
        wmax = w[j] / colnorm[j], t = j;
    }
    if (t < 0) break;
    passive[t] = true;
    for (int inner = 0; inner < 3 * cols + 10; ++inner) {
      std::vector<int> pcols;
      for (int j = 0; j < cols; ++j)
        if (passive[j]) pcols.push_back(j);
      const auto z = ls_on(a, rows, cols, b, pcols);
      bool feasible = true;
      for (size_t i = 0; i < pcols.size(); ++i)
        if (z[i] <= 0) feasible = false;
      if (feasible) {
        std::fill(x.begin(), x.end(), 0.0);
        for (size_t i = 0; i < pcols.size(); ++i) x[pcols[i]] = z[i];
        break;
      }
      // Step towards z as far as feasibility allows, then drop the columns that reached zero.
      double alpha = 1.0;
      for (size_t i = 0; i < pcols.size(); ++i)
        if (z[i] <= 0) alpha = std::min(alpha, x[pcols[i]] / (x[pcols[i]] - z[i]));
      for (size_t i = 0; i < pcols.size(); ++i) {
        x[pcols[i]] += alpha * (z[i] - x[pcols[i]]);
        if (x[pcols[i]] <= 1e-300 ||
            (z[i] <= 0 && std::abs(x[pcols[i]]) < 1e-15 * (1 + std::abs(z[i])))) {
          x[pcols[i]] = 0;
          passive[pcols[i]] = false;
        }
      }
    }
  }
  return x;
}

AffineFit fit_affine_nonneg(const std::vector<double>& x, const std::vector<double>& y,
                            const std::vector<double>& w) {
  if (x.size() != y.size() || (!w.empty() && w.size() != x.size()))
    throw InternalError("fit_affine_nonneg: sizes disagree");
  AffineFit f;
  f.points = static_cast<int>(x.size());
  if (x.empty()) return f;
  const int n = f.points;
  // x scaled to at most 1 so that both columns weigh alike in the solver.
  double xmax = 0;
  for (double v : x) xmax = std::max(xmax, std::abs(v));
  if (xmax <= 0) xmax = 1;
  std::vector<double> a(2 * n), b(n);
  for (int i = 0; i < n; ++i) {
    const double s = w.empty() ? 1.0 : std::sqrt(std::max(0.0, w[i]));
    a[2 * i] = s;
    a[2 * i + 1] = s * x[i] / xmax;
    b[i] = s * y[i];
  }
  const auto p = nnls(a, n, 2, b);
  f.intercept = p[0];
  f.slope = p[1] / xmax;
  double ybar = 0, wsum = 0;
  for (int i = 0; i < n; ++i) {
    const double wi = w.empty() ? 1.0 : w[i];
    ybar += wi * y[i], wsum += wi;
  }
  ybar /= wsum > 0 ? wsum : 1.0;
  double ss_res = 0, ss_tot = 0;
  for (int i = 0; i < n; ++i) {
    const double wi = w.empty() ? 1.0 : w[i];
    const double e = y[i] - (f.intercept + f.slope * x[i]);
    ss_res += wi * e * e;
    ss_tot += wi * (y[i] - ybar) * (y[i] - ybar);
  }
  f.r2 = ss_tot > 0 ? 1.0 - ss_res / ss_tot : (ss_res <= 1e-18 * (1 + ybar * ybar) ? 1.0 : 0.0);
  return f;
}

int latency_steps(traces::CollOp op, int n) {
  using traces::CollOp;
  if (n < 2) return 0;
  switch (op) {
    case CollOp::AllReduce:
      return 2 * (n - 1);
    case CollOp::ReduceScatter:
    case CollOp::AllGather:
    case CollOp::Broadcast:
    case CollOp::Reduce:
      return n - 1;
    default:
      return 1;
  }
}

// ---------------------------------------------------------------------------------------------
// A calibrated profile as the simulator uses it (the law itself: core_sharing.cpp)

HardwareProfile profile_for_ranks(const HardwareProfile& p, int ranks_on_node, bool scale_compute) {
  if (p.sharing.cores <= 0) return p;
  HardwareProfile q = p;
  const double f = scale_compute ? compute_slowdown(p.sharing, ranks_on_node) : 1.0;
  const double fc = comm_slowdown(p.sharing, ranks_on_node);
  // Efficiencies stay within (0, 1]: a speed-up (f < 1, see contention_at_full) goes into the
  // profile's rates instead when it has them.
  const bool into_rates = f < 1.0 && q.peak_flops > 0 && q.memory_bandwidth_bytes_per_s > 0;
  if (into_rates) {
    q.peak_flops /= f;
    q.memory_bandwidth_bytes_per_s /= f;
  }
  for (auto& c : q.classes) {
    if (!into_rates) {
      c.flops_efficiency /= f;
      c.bandwidth_efficiency /= f;
    }
    c.overhead_ns = static_cast<int64_t>(std::llround(double(c.overhead_ns) * f));
  }
  q.data_load_ns = static_cast<int64_t>(std::llround(double(q.data_load_ns) * f));
  for (auto& o : q.ops) o.time_ns = static_cast<int64_t>(std::llround(double(o.time_ns) * f));
  // Collectives, per (op, group size, scope): the entries measured at this crowding when there are
  // any, as measured; else those for any crowding, slowed by comm_slowdown; else those of the
  // nearest measured crowding R', by comm_slowdown(R) / comm_slowdown(R').
  std::vector<CollectiveOverride> kept;
  std::map<std::tuple<int, int, int>, std::set<int>> crowdings;
  for (const auto& o : p.collectives)
    crowdings[{static_cast<int>(o.op), o.ranks, static_cast<int>(o.scope)}].insert(o.ranks_on_node);
  for (const auto& o : p.collectives) {
    const auto& rs = crowdings[{static_cast<int>(o.op), o.ranks, static_cast<int>(o.scope)}];
    int chosen = 0;
    if (rs.count(ranks_on_node)) {
      chosen = ranks_on_node;
    } else if (!rs.count(0)) {
      double best = 1e300;
      for (int r : rs) {
        const double d = std::fabs(std::log(double(r) / double(std::max(1, ranks_on_node))));
        if (d < best) best = d, chosen = r;
      }
    }
    if (o.ranks_on_node != chosen) continue;
    CollectiveOverride c = o;
    const double scale =
        chosen == ranks_on_node ? 1.0 : fc / (chosen > 0 ? comm_slowdown(p.sharing, chosen) : 1.0);
    c.latency_ns = static_cast<int64_t>(std::llround(double(c.latency_ns) * scale));
    c.bus_bandwidth_bytes_per_s /= scale;
    for (auto& [b, ns] : c.table) ns = static_cast<int64_t>(std::llround(double(ns) * scale));
    c.ranks_on_node = 0;
    kept.push_back(std::move(c));
  }
  q.collectives = std::move(kept);
  char buf[96];
  if (scale_compute)
    std::snprintf(buf, sizeof buf, " (%d ranks on %d cores: compute x%.3f, comm x%.3f)",
                  ranks_on_node, p.sharing.cores, f, fc);
  else
    std::snprintf(buf, sizeof buf,
                  " (%d ranks on %d cores: compute shared by the busy ranks, comm x%.3f)",
                  ranks_on_node, p.sharing.cores, fc);
  q.name += buf;
  return q;
}

int ranks_on_node(const Scenario& s, const Cluster& c) {
  return std::max(1, std::min(s.world_size(), c.gpus_per_node));
}

Cluster cluster_from_profile(const HardwareProfile& p, int min_ranks) {
  const MachineDescription& m = p.cluster;
  if (m.nodes <= 0)
    throw InputError(
        (p.path.empty() ? p.name : p.path) +
        ": the hardware profile has no 'cluster:' section describing its machine (calibrated "
        "profiles from `orrery calibrate` have one); give --cluster");
  const int slots = m.nodes * m.ranks_per_node;
  if (min_ranks > slots)
    throw InputError((p.path.empty() ? p.name : p.path) + ": the machine it describes has " +
                     std::to_string(slots) +
                     " rank slots (cluster.nodes x cluster.ranks_per_node) but the run needs " +
                     std::to_string(min_ranks));
  Cluster c;
  c.name = p.name + "-machine";
  c.path = p.path;
  auto dev = device_preset(m.device);
  if (!dev)
    throw InputError((p.path.empty() ? p.name : p.path) +
                     ": key 'cluster.device': unknown device '" + m.device + "'");
  c.device = *dev;
  if (m.peak_flops > 0)
    c.device.peak_fp32_flops = c.device.peak_tf32_flops = c.device.peak_bf16_flops = m.peak_flops;
  if (m.memory_bandwidth_bytes_per_s > 0)
    c.device.mem_bandwidth_bytes_per_s = m.memory_bandwidth_bytes_per_s;
  if (m.memory_capacity_bytes > 0) c.device.mem_capacity_bytes = m.memory_capacity_bytes;
  // One node sized to the run: the ranks of a run on this machine are all on one host (the sharing
  // law, not the slot count, says what crowding costs).
  c.nodes = 1;
  c.gpus_per_node = min_ranks > 0 ? min_ranks : m.ranks_per_node;
  c.topo.kind = TopologyKind::Crossbar;
  if (m.link_bytes_per_s > 0) c.topo.nvlink_gb_per_s = m.link_bytes_per_s / 1e9;
  c.topo.nvlink_latency_ns = m.link_latency_ns / 2;  // two hops through the crossbar per transfer
  c.coll.step_latency_ns = 0;
  build_topology(c);
  return c;
}

// ---------------------------------------------------------------------------------------------
// Calibration: calibrate() composes the fit steps below, each a function of the traces and of the
// steps before it (calibrate.hpp numbers them).

namespace {

// Columns: gemm, attention (s/FLOP); elementwise, layernorm, softmax_loss, optimizer (s/byte); then
// one per-kernel overhead per class (kernel counts).
constexpr int kCols = 2 * kOpClassCount;
int column_of(OpClass c) { return static_cast<int>(c); }
bool flop_class(OpClass c) { return c == OpClass::Gemm || c == OpClass::Attention; }
bool is_compute(const traces::Span& sp) {
  return sp.kind == traces::SpanKind::Compute || sp.kind == traces::SpanKind::Optimizer;
}

void append(std::vector<std::string>& notes, const std::vector<std::string>& more) {
  notes.insert(notes.end(), more.begin(), more.end());
}

struct TraceInfo {
  const traces::Trace* t = nullptr;
  bool bench = false;  // an `orrery commbench` sweep: collectives only
  Scenario s;
  int ranks = 1;
  int ranks_on_node = 1;
  int first_counted_step = 0;
  std::string label;
  // runtime.precision bf16 / fp16 on the CPU: its ops include the emulated rounding, so they fit
  // only the rounding rate (fit_rounding), nothing of the fp32 profile.
  bool emulated_16bit = false;
  // A run that fits only host compute (HostComputeRates): a 16-bit run, or one with gradient
  // compression (fit_compression; its own slowdown measured, to normalise its spans). Neither
  // enters the sharing law, the class fit, the measured ops, the spread or the collectives, so the
  // fp32 profile is the same with or without them.
  bool host_only = false;
};

// The kernels of a compute span of the runtime (nullopt for names the simulator does not model).
// adamw: the parameters the rank updates; zero_grad: the gradient elements it zeroes (its stage's
// gradients and, under ZeRO, its padded shard accumulator, as workload.cpp counts them).
double held_params(const std::string& name, const Scenario& s, const traces::RankInfo* coord) {
  if (name != names::kOptimizerStep && name != names::kZeroGrad) return 0;
  int64_t params = 0;
  for (const auto& p : stage_parameters(s, coord ? coord->pp : 0)) params += p.count;
  const int dp = std::max(1, s.parallel.dp);
  if (name == names::kZeroGrad)
    return double(params) + (s.parallel.zero >= 1 ? double((params + dp - 1) / dp) : 0.0);
  return s.parallel.zero >= 1 ? double(params) / dp : double(params);
}
std::optional<std::vector<Kernel>> kernels_of(const std::string& name, int piece, const Scenario& s,
                                              const traces::RankInfo* coord) {
  ModelDims d = model_dims(s, 4);  // the CPU runtime is fp32
  d.emulated_16bit = false;        // a 16-bit run's rounding is fitted apart (fit_rounding)
  const int pieces =
      (name == names::kBlockForward || name == names::kBlockBackward) && d.tp > 1 ? 3 : 1;
  return op_kernels(name, piece, pieces, d, held_params(name, s, coord));
}

std::string shape_of(const Scenario& s) {
  std::ostringstream o;
  o << "b" << s.training.micro_batch << " t" << s.model.seq << " c" << s.model.d_model << " v"
    << s.model.vocab << " tp" << s.parallel.tp;
  if (s.parallel.zero) o << " zero" << s.parallel.zero;
  if (s.parallel.pp > 1) o << " pp" << s.parallel.pp;
  return o.str();
}

// Per trace: median duration of each compute op (name, piece, shape).
struct OpKey {
  std::string name;
  int piece = 0;
  int pieces = 1;
  std::string shape;
  int stage = 0;
  bool operator<(const OpKey& o) const {
    return std::tie(name, piece, shape, stage) < std::tie(o.name, o.piece, o.shape, o.stage);
  }
};
struct OpObs {
  std::vector<double> durations;
  // Per span: the run's collective/transfer spans in flight at its midpoint
  std::vector<int> in_flight;
  std::vector<Kernel> kernels;
  ModelDims dims;
  double params = 0;  // adamw: parameters held
};

int64_t this_machine_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t(pages) * page : 8LL << 30;
}

// ---- options and the runs

void check_options(const std::vector<traces::Trace>& traces_in, const CalibrationOptions& opt) {
  if (traces_in.empty()) throw InputError("orrery calibrate: give at least one trace");
  if (opt.cores < 0)
    throw InputError("orrery calibrate: --cores must be >= 0 (0: this machine's), got " +
                     std::to_string(opt.cores));
  if (opt.threads_per_rank < 0)
    throw InputError("orrery calibrate: --threads must be >= 0 (0: the scenario's), got " +
                     std::to_string(opt.threads_per_rank));
  if (opt.skip_steps < 0)
    throw InputError("orrery calibrate: --skip-steps must be >= 0, got " +
                     std::to_string(opt.skip_steps));
  if (opt.ranks_per_node < 1)
    throw InputError("orrery calibrate: --ranks-per-node must be >= 1, got " +
                     std::to_string(opt.ranks_per_node));
}

// A commbench trace (runtime/commbench.hpp: meta extra_json kind "commbench").
bool is_commbench(const traces::Trace& t) { return traces::is_commbench(t.meta); }

TraceInfo trace_info(const traces::Trace& t, int skip_steps) {
  TraceInfo ti;
  ti.t = &t;
  ti.label = t.path.empty() ? t.meta.scenario_name : t.path;
  if (t.meta.scenario_text.empty())
    throw InputError(ti.label +
                     ": the trace carries no scenario (calibration needs traces of `orrery run`)");
  ti.s = parse_scenario(t.meta.scenario_text, ti.label + " (scenario)");
  ti.ranks = std::max<int>(1, t.meta.world_size);
  std::map<std::string, int> per_host;
  for (const auto& r : t.ranks) per_host[r.host]++;
  ti.ranks_on_node = ti.ranks;
  if (per_host.size() > 1) {
    ti.ranks_on_node = 0;
    for (const auto& [h, n] : per_host) ti.ranks_on_node = std::max(ti.ranks_on_node, n);
  }
  int min_step = INT32_MAX;
  for (const auto& sp : t.spans)
    if (sp.step >= 0) min_step = std::min(min_step, sp.step);
  ti.first_counted_step = (min_step == INT32_MAX ? 0 : min_step) + skip_steps;
  // A commbench trace's timed iterations are steps 0.. and its warm-up step -1, so every step >= 0
  // counts.
  ti.bench = is_commbench(t);
  if (ti.bench) ti.first_counted_step = 0;
  ti.emulated_16bit = !ti.bench && model_dims(ti.s, 4).emulated_16bit;
  ti.host_only = ti.emulated_16bit ||
                 (!ti.bench && ti.s.parallel.grad_compression != "none" && ti.s.parallel.dp > 1);
  return ti;
}

std::vector<TraceInfo> collect_runs(const std::vector<traces::Trace>& traces_in, int skip_steps) {
  std::vector<TraceInfo> infos;
  for (const auto& t : traces_in) infos.push_back(trace_info(t, skip_steps));
  return infos;
}

// ---- compute observations per trace

// The run's communication spans (every rank) in flight at an instant: started at or before it and
// not ended by it (two sorted lists, binary search). A compute span with m of them in flight shares
// the cores with m progress threads (CoreSharing::comm_thread_weight).
class CommInFlight {
 public:
  explicit CommInFlight(const TraceInfo& info) {
    for (const auto& sp : info.t->spans)
      if ((sp.kind == traces::SpanKind::Collective || sp.kind == traces::SpanKind::P2P) &&
          sp.step >= info.first_counted_step)
        starts_.push_back(sp.start_ns), ends_.push_back(sp.end_ns);
    std::sort(starts_.begin(), starts_.end());
    std::sort(ends_.begin(), ends_.end());
  }
  int at(int64_t t) const {
    if (starts_.empty()) return 0;
    const auto started = std::upper_bound(starts_.begin(), starts_.end(), t) - starts_.begin();
    const auto ended = std::upper_bound(ends_.begin(), ends_.end(), t) - ends_.begin();
    return static_cast<int>(std::max<std::ptrdiff_t>(0, started - ended));
  }

 private:
  std::vector<int64_t> starts_, ends_;
};

struct TraceOps {
  std::map<OpKey, OpObs> ops;
  std::set<std::string> unknown;  // compute span names the simulator has no op for
};

TraceOps observe_compute(const TraceInfo& info) {
  TraceOps out;
  const auto& t = *info.t;
  std::map<int32_t, const traces::RankInfo*> coords;
  for (const auto& r : t.ranks) coords[r.rank] = &r;
  // Piece ordinal of a span within (rank, step, micro-batch, layer, name).
  std::map<std::tuple<int, int, int, int, uint32_t>, int> ordinal;
  std::vector<size_t> order(t.spans.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto& x = t.spans[a];
    const auto& y = t.spans[b];
    return std::tie(x.rank, x.start_ns) < std::tie(y.rank, y.start_ns);
  });
  const CommInFlight in_flight(info);
  for (size_t i : order) {
    const auto& sp = t.spans[i];
    if (!is_compute(sp)) continue;
    const std::string& name = t.name_of(sp);
    const int piece = ordinal[{sp.rank, sp.step, sp.micro_batch, sp.layer, sp.name}]++;
    if (sp.step < info.first_counted_step) continue;
    const auto it = coords.find(sp.rank);
    const traces::RankInfo* coord = it == coords.end() ? nullptr : it->second;
    const int pieces =
        (name == names::kBlockForward || name == names::kBlockBackward) && info.s.parallel.tp > 1
            ? 3
            : 1;
    auto ks = kernels_of(name, piece % pieces, info.s, coord);
    if (!ks) {
      out.unknown.insert(name);
      continue;
    }
    OpKey key{name, piece % pieces, pieces, shape_of(info.s),
              (name == names::kOptimizerStep || name == names::kZeroGrad) && coord ? coord->pp : 0};
    auto& o = out.ops[key];
    if (o.kernels.empty()) {
      o.kernels = std::move(*ks);
      o.dims = model_dims(info.s, 4);
      o.dims.emulated_16bit = false;
      o.params = held_params(name, info.s, coord);
    }
    o.durations.push_back(double(sp.duration_ns()));
    o.in_flight.push_back(in_flight.at(sp.start_ns + sp.duration_ns() / 2));
  }
  return out;
}

struct ComputeObs {
  // Empty for commbench traces and 16-bit runs (those in per_trace_16bit).
  std::vector<std::map<OpKey, OpObs>> per_trace;
  std::vector<std::map<OpKey, OpObs>> per_trace_16bit;  // the 16-bit runs' ops (fit_rounding)
  std::vector<std::string> notes;
};

ComputeObs collect_compute(const std::vector<TraceInfo>& infos) {
  ComputeObs out;
  out.per_trace.resize(infos.size());
  out.per_trace_16bit.resize(infos.size());
  std::set<std::string> unknown;
  for (size_t ti = 0; ti < infos.size(); ++ti) {
    if (infos[ti].bench) continue;
    TraceOps o = observe_compute(infos[ti]);
    (infos[ti].emulated_16bit ? out.per_trace_16bit : out.per_trace)[ti] = std::move(o.ops);
    unknown.insert(o.unknown.begin(), o.unknown.end());
  }
  // Gradient compression's compute: fitted apart (fit_compression).
  unknown.erase(std::string(names::kDpCompress));
  unknown.erase(std::string(names::kDpDecompress));
  for (const auto& u : unknown)
    out.notes.push_back("compute spans named '" + u + "' have no simulator op: not fitted");
  return out;
}

// The median of an op's spans with (overlapped = true) or without communication in flight, their
// count and their mean number of communication spans in flight.
struct SplitMedian {
  double median = 0;
  size_t count = 0;
  double mean_in_flight = 0;
};
SplitMedian split_median(const OpObs& o, bool overlapped) {
  std::vector<double> v;
  double ms = 0;
  for (size_t j = 0; j < o.durations.size(); ++j)
    if ((o.in_flight[j] > 0) == overlapped) v.push_back(o.durations[j]), ms += o.in_flight[j];
  SplitMedian s;
  s.mean_in_flight = v.empty() ? 0 : ms / double(v.size());
  s.median = v.empty() ? 0.0 : median(v);
  s.count = v.size();
  return s;
}

// ---- 1. core sharing: slowdown of each trace against the lone-rank (or the least crowded) trace

// The least crowded run of `orrery run` (the first of them on a tie).
size_t reference_run(const std::vector<TraceInfo>& infos) {
  size_t ref = 0;
  while (ref + 1 < infos.size() && infos[ref].bench) ++ref;
  if (infos[ref].bench)
    throw InputError(
        "orrery calibrate: only commbench traces given; add traces of `orrery run` (e.g. a "
        "serial run and a dp2 run) for the compute ops");
  for (size_t i = 0; i < infos.size(); ++i)
    if (!infos[i].bench && infos[i].ranks_on_node < infos[ref].ranks_on_node) ref = i;
  // An fp32 run of that crowding rather than a 16-bit one (whose ops include the rounding).
  for (size_t i = 0; i < infos.size() && infos[ref].emulated_16bit; ++i)
    if (!infos[i].bench && !infos[i].emulated_16bit &&
        infos[i].ranks_on_node == infos[ref].ranks_on_node)
      ref = i;
  if (infos[ref].emulated_16bit)
    throw InputError(
        "orrery calibrate: every run given is at a 16-bit runtime.precision; add an "
        "fp32 run (e.g. a serial one): the 16-bit runs fit only their rounding");
  return ref;
}

struct Slowdowns {
  size_t ref = 0;  // reference_run
  // Per trace: its compute slowdown against ref (1 for ref, commbench and runs as crowded as ref)
  std::vector<double> factor;
  std::vector<std::string> notes;
};

Slowdowns measure_slowdowns(const std::vector<TraceInfo>& infos,
                            const std::vector<std::map<OpKey, OpObs>>& obs) {
  Slowdowns out;
  const size_t ref = out.ref = reference_run(infos);
  if (infos[ref].ranks_on_node > 1)
    out.notes.push_back("no single-rank trace: slowdowns are relative to " + infos[ref].label +
                        " (" + std::to_string(infos[ref].ranks_on_node) + " ranks)");
  out.factor.assign(infos.size(), 1.0);
  for (size_t i = 0; i < infos.size(); ++i) {
    if (infos[i].bench || infos[i].emulated_16bit ||
        infos[i].ranks_on_node == infos[ref].ranks_on_node)
      continue;
    double num = 0, den = 0;
    // Only the spans with no communication in flight: what sharing the cores among the ranks costs.
    for (const auto& [k, o] : obs[i]) {
      const auto r = obs[ref].find(k);
      if (r == obs[ref].end()) continue;
      const SplitMedian m = split_median(o, false);
      if (m.count == 0) continue;
      num += double(m.count) * m.median;
      den += double(m.count) * median(r->second.durations);
    }
    if (den > 0)
      out.factor[i] = num / den;
    else
      out.notes.push_back(infos[i].label +
                          ": no compute op in common with the reference trace; slowdown 1 assumed");
  }
  return out;
}

struct SharingFit {
  CoreSharing sharing;  // cores, threads_per_rank, contention_at_full, oversubscription_exponent
  std::vector<std::string> notes;
};

// The law's c and e from the runs' slowdowns (core_sharing.hpp).
SharingFit fit_sharing_law(const std::vector<TraceInfo>& infos, const std::vector<double>& factor,
                           int cores, int threads) {
  SharingFit out;
  CoreSharing& sharing = out.sharing;
  sharing.cores = cores;
  sharing.threads_per_rank = threads;
  // Contention below the cores: f − 1 = (c − 1)(busy − 1)/(cores − 1), least squares through 0.
  double sxy = 0, sxx = 0;
  std::vector<std::pair<double, double>> over;  // (u, f)
  for (size_t i = 0; i < infos.size(); ++i) {
    const double busy = double(infos[i].ranks_on_node) * threads;
    const double u = busy / cores;
    if (busy <= 1.0 || infos[i].bench || infos[i].host_only) continue;
    if (u <= 1.0 + 1e-9) {
      const double x = cores > 1 ? (busy - 1.0) / (cores - 1.0) : 1.0;
      sxy += x * (factor[i] - 1.0), sxx += x * x;
    } else {
      over.emplace_back(u, factor[i]);
    }
  }
  // Not clamped at 1: on a machine shared with other work a crowded run can measure faster than the
  // lone one (the other work changed); the profile then predicts what the calibration runs showed.
  if (sxx > 0)
    sharing.contention_at_full = std::max(0.25, 1.0 + sxy / sxx);
  else if (!over.empty())
    out.notes.push_back("no trace with ranks x threads <= cores: contention_at_full = 1 assumed");
  if (!over.empty()) {
    double num = 0, den = 0;
    for (auto [u, f] : over) {
      num += std::log(u) * std::log(std::max(1e-9, f / sharing.contention_at_full));
      den += std::log(u) * std::log(u);
    }
    sharing.oversubscription_exponent = std::max(0.0, num / den);
  } else {
    out.notes.push_back(
        "no oversubscribed trace (ranks x threads > cores): oversubscription_exponent = 1 "
        "(fair time slicing) assumed");
  }
  return out;
}

std::vector<SharingRow> sharing_rows(const std::vector<TraceInfo>& infos, const Slowdowns& sl,
                                     const CoreSharing& sharing) {
  std::vector<SharingRow> rows;
  for (size_t i = 0; i < infos.size(); ++i)
    if (!infos[i].bench && !infos[i].host_only)
      rows.push_back({infos[i].label, infos[i].ranks_on_node, sl.factor[i],
                      compute_slowdown(sharing, infos[i].ranks_on_node) /
                          compute_slowdown(sharing, infos[sl.ref].ranks_on_node)});
  return rows;
}

// A fitted weight of the sharing law (nullopt: not fitted, the default stays).
struct WeightFit {
  std::optional<double> weight;
  std::vector<std::string> notes;
};

// ---- 3b. progress threads: compute that ran while m collectives or transfers of its run were in
// flight ran as if (ranks · threads + v · m) threads shared the cores. Per multi-rank run, the
// overlapped spans' time against the same ops without communication (the reference's median times
// the run's slowdown) gives the law's busy count, hence v; runs are weighted by their overlapped
// spans.

// The busy count b >= base with law(b) = ratio · law(base) (base itself when ratio <= 1).
double busy_for_ratio(const CoreSharing& sharing, double base, double ratio) {
  if (ratio <= 1.0) return base;
  const double f0 = busy_slowdown(sharing, base);
  // The law is increasing in the busy count: bisect.
  double lo = base, hi = base + 64.0 * sharing.cores;
  for (int it = 0; it < 60; ++it) {
    const double mid = 0.5 * (lo + hi);
    (busy_slowdown(sharing, mid) < ratio * f0 ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

WeightFit fit_comm_thread_weight(const std::vector<TraceInfo>& infos,
                                 const std::vector<std::map<OpKey, OpObs>>& obs,
                                 const Slowdowns& sl, const CoreSharing& sharing, int threads) {
  WeightFit out;
  double v_sum = 0, w_sum = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    if (infos[i].bench || infos[i].host_only || i == sl.ref) continue;
    double num = 0, den = 0, m_sum = 0, n_sum = 0;
    for (const auto& [k, o] : obs[i]) {
      const auto r = obs[sl.ref].find(k);
      if (r == obs[sl.ref].end()) continue;
      const SplitMedian m = split_median(o, true);
      if (m.count == 0) continue;
      num += double(m.count) * m.median;
      den += double(m.count) * median(r->second.durations) * sl.factor[i];
      m_sum += double(m.count) * m.mean_in_flight, n_sum += double(m.count);
    }
    if (den <= 0 || n_sum <= 0) continue;
    const double ratio = num / den, m_mean = m_sum / n_sum;
    const double base = double(infos[i].ranks_on_node) * threads;
    const double busy = busy_for_ratio(sharing, base, ratio);
    v_sum += n_sum * (busy - base) / m_mean;
    w_sum += n_sum;
  }
  if (w_sum > 0) {
    out.weight = v_sum / w_sum;
    out.notes.push_back("comm_thread_weight " + std::to_string(*out.weight) +
                        " (compute with collectives in flight against compute without)");
  }
  return out;
}

// ---- 3b. the ranks' spread

// Per multi-rank run and counted step, each rank's compute total against the step's mean over its
// ranks: the pooled sum of squared relative deviations and its degrees of freedom (R − 1 per step).
std::pair<double, double> rank_spread(const std::vector<TraceInfo>& infos) {
  double ss = 0, dof = 0;
  for (const auto& info : infos) {
    if (info.bench || info.host_only || info.ranks < 2) continue;
    std::map<int32_t, std::map<int32_t, double>> per_step;  // step -> rank -> compute ns
    for (const auto& sp : info.t->spans)
      if (is_compute(sp) && sp.step >= info.first_counted_step)
        per_step[sp.step][sp.rank] += double(sp.duration_ns());
    for (const auto& [st, by_rank] : per_step) {
      if (int(by_rank.size()) != info.ranks) continue;
      double mean = 0;
      for (const auto& [r, x] : by_rank) mean += x;
      mean /= double(by_rank.size());
      if (mean <= 0) continue;
      for (const auto& [r, x] : by_rank) ss += (x / mean - 1.0) * (x / mean - 1.0);
      dof += double(by_rank.size() - 1);
    }
  }
  return {ss, dof};
}

// Per multi-rank run, rank and op (name, layer; every counted step and micro-batch), the relative
// standard deviation of its times: their sum weighted by the ops' total times, and that weight.
std::pair<double, double> op_spread(const std::vector<TraceInfo>& infos) {
  double wsum = 0, cvsum = 0;
  for (const auto& info : infos) {
    if (info.bench || info.host_only || info.ranks < 2) continue;
    std::map<std::tuple<int32_t, uint32_t, int32_t>, std::vector<double>> reps;
    for (const auto& sp : info.t->spans)
      if (is_compute(sp) && sp.step >= info.first_counted_step)
        reps[{sp.rank, sp.name, sp.layer}].push_back(double(sp.duration_ns()));
    for (const auto& [k, v] : reps) {
      if (v.size() < 3) continue;
      double mean = 0, sq = 0;
      for (double x : v) mean += x;
      mean /= double(v.size());
      for (double x : v) sq += (x - mean) * (x - mean);
      if (mean <= 0) continue;
      const double sd = std::sqrt(sq / double(v.size() - 1));
      cvsum += mean * double(v.size()) * sd / mean;
      wsum += mean * double(v.size());
    }
  }
  return {cvsum, wsum};
}

struct JitterFit {
  std::optional<double> op_jitter, rank_jitter;  // nullopt: not fitted (0)
  std::vector<std::string> notes;
};

JitterFit fit_jitter(const std::vector<TraceInfo>& infos) {
  JitterFit out;
  const auto [ss, dof] = rank_spread(infos);
  const auto [cvsum, wsum] = op_spread(infos);
  if (wsum > 0) {
    out.op_jitter = std::min(0.5, cvsum / wsum);
    out.notes.push_back("op_jitter " + std::to_string(*out.op_jitter) +
                        " (time-weighted relative spread of repeated ops in the multi-rank runs)");
  }
  if (dof > 0) {
    out.rank_jitter = std::min(0.5, std::sqrt(ss / dof));
    out.notes.push_back("rank_jitter " + std::to_string(*out.rank_jitter) + " from " +
                        std::to_string(static_cast<int>(dof)) +
                        " rank-steps of the multi-rank runs");
  }
  return out;
}

// ---- 2. compute: NNLS over normalised medians

// One op (name, piece, shape, stage) over every trace: its kernels and its lone-rank time.
struct Row {
  OpKey key;
  std::vector<Kernel> kernels;
  ModelDims dims;
  double params = 0;
  double measured = 0;
  int64_t count = 0;
};

struct PooledOps {
  std::vector<Row> rows;           // the class fit's ops
  std::vector<Row> measured_only;  // zero_grad: costed from its measured time only
};

// A span's slowdown against the lone rank: its run's (measured) times the law's extra for the
// progress threads in flight (m on average).
double span_factor(const TraceInfo& info, double run_factor, const CoreSharing& sharing,
                   int threads, double m) {
  if (m <= 0 || sharing.comm_thread_weight <= 0) return run_factor;
  const double base = double(info.ranks_on_node) * threads;
  return run_factor * busy_slowdown(sharing, base + sharing.comm_thread_weight * m) /
         busy_slowdown(sharing, base);
}

PooledOps pool_ops(const std::vector<TraceInfo>& infos,
                   const std::vector<std::map<OpKey, OpObs>>& obs,
                   const std::vector<double>& factor, const CoreSharing& sharing, int threads,
                   int skip_steps) {
  std::map<OpKey, Row> rows_by_key;
  for (size_t i = 0; i < infos.size(); ++i) {
    if (infos[i].host_only) continue;
    for (const auto& [k, o] : obs[i]) {
      Row& r = rows_by_key[k];
      r.key = k;
      r.kernels = o.kernels;
      r.dims = o.dims;
      r.params = o.params;
      // Pool the normalised durations of every trace (spans with and without communication in
      // flight normalised apart).
      for (const bool overlapped : {false, true}) {
        const SplitMedian m = split_median(o, overlapped);
        if (m.count == 0) continue;
        const double n = double(m.count);
        const double f = span_factor(infos[i], factor[i], sharing, threads, m.mean_in_flight);
        r.measured = (r.measured * double(r.count) + m.median / f * n) / (double(r.count) + n);
        r.count += static_cast<int64_t>(n);
      }
    }
  }
  if (rows_by_key.empty())
    throw InputError(
        "orrery calibrate: the traces have no compute spans the simulator models (fwd.block, "
        "bwd.block, fwd.head, ...) in their counted steps (steps after --skip-steps " +
        std::to_string(skip_steps) + ")");
  // zero_grad (a memset) is no class's typical kernel: it stays out of the class fit and is costed
  // from its measured time (`ops:`) or, in profiles without it, at the elementwise rate.
  PooledOps out;
  for (auto& [k, r] : rows_by_key)
    (k.name == names::kZeroGrad ? out.measured_only : out.rows).push_back(std::move(r));
  if (out.rows.empty())
    throw InputError(
        "orrery calibrate: the traces have no compute spans the simulator models besides "
        "zero_grad");
  return out;
}

struct ClassFit {
  std::vector<double> x;  // kCols: s/FLOP or s/byte per class, then s per kernel per class
  std::vector<std::string> notes;
};

// `gemm_shape`: the device's GEMM shape model (off for CPUs): a GEMM's FLOPs enter the fit divided
// by its shape efficiency, so the gemm rate fitted is the ceiling of a well-shaped GEMM, the number
// the profile's flops_efficiency holds under that model (cost_model.hpp).
ClassFit fit_class_costs(const std::vector<Row>& rows, const GemmShapeModel& gemm_shape = {}) {
  ClassFit out;
  const int nr = static_cast<int>(rows.size());
  std::vector<double> a(nr * kCols, 0.0), b(nr, 0.0);
  std::vector<double> colscale(kCols, 0.0);
  for (int i = 0; i < nr; ++i) {
    for (const auto& k : rows[i].kernels) {
      a[i * kCols + column_of(k.cls)] +=
          flop_class(k.cls) ? k.flops / gemm_shape_efficiency(gemm_shape, k) : k.bytes;
      a[i * kCols + kOpClassCount + column_of(k.cls)] += 1.0;
    }
  }
  // Weights: minimise Σ count · (pred − meas)² / meas (relative errors weighted by time); columns
  // scaled to unit norm for conditioning.
  for (int i = 0; i < nr; ++i) {
    const double w = std::sqrt(double(rows[i].count) / std::max(1.0, rows[i].measured));
    for (int j = 0; j < kCols; ++j) a[i * kCols + j] *= w;
    b[i] = rows[i].measured * 1e-9 * w;  // seconds
  }
  for (int j = 0; j < kCols; ++j) {
    double s = 0;
    for (int i = 0; i < nr; ++i) s += a[i * kCols + j] * a[i * kCols + j];
    colscale[j] = s > 0 ? std::sqrt(s) : 0.0;
    for (int i = 0; i < nr; ++i)
      if (colscale[j] > 0) a[i * kCols + j] /= colscale[j];
  }
  // Per-kernel overheads are only identifiable when the traces hold an op at more than one shape
  // (a rate and an overhead cannot be told apart from one size): with a single shape the overhead
  // columns are left out and every op's time is FLOPs or bytes over its class's rate, so smaller
  // kernels (tp shards, smaller micro-batches) are predicted at the same rate.
  std::set<std::string> shapes;
  for (const auto& r : rows) shapes.insert(r.key.shape);
  if (shapes.size() <= 1) {
    for (int i = 0; i < nr; ++i)
      for (int c = 0; c < kOpClassCount; ++c) a[i * kCols + kOpClassCount + c] = 0.0;
    for (int c = 0; c < kOpClassCount; ++c) colscale[kOpClassCount + c] = 0.0;
    out.notes.push_back(
        "the traces hold every op at one shape only: per-kernel overheads not fitted (0)");
  }
  // A mild ridge on the overheads: rates explain what scales with FLOPs and bytes, overheads the
  // rest (with fewer ops than unknowns the fit would otherwise pick any vertex, e.g. all overhead).
  const double kRidge = 1e-3;
  for (int c = 0; c < kOpClassCount; ++c) {
    std::vector<double> row(kCols, 0.0);
    row[kOpClassCount + c] = colscale[kOpClassCount + c] > 0 ? kRidge : 0.0;
    a.insert(a.end(), row.begin(), row.end());
    b.push_back(0.0);
  }
  out.x = nnls(a, nr + kOpClassCount, kCols, b);
  for (int j = 0; j < kCols; ++j) out.x[j] = colscale[j] > 0 ? out.x[j] / colscale[j] : 0.0;
  return out;
}

// The profile's rates: peak_flops = 1 / min s (compute classes) with each class's efficiency
// relative to it, memory bandwidth likewise, and the per-kernel overheads.
struct ClassRates {
  double peak_flops = 0;
  double memory_bandwidth_bytes_per_s = 0;
  std::array<ClassCost, kOpClassCount> classes{};
  std::vector<std::string> notes;
};

ClassRates class_rates(const std::vector<double>& x, const std::vector<Row>& rows) {
  ClassRates out;
  const double s_gemm = x[0], s_attn = x[1];
  double s_flop_min = 0;
  for (double v : {s_gemm, s_attn})
    if (v > 0) s_flop_min = s_flop_min > 0 ? std::min(s_flop_min, v) : v;
  if (s_flop_min <= 0) {
    s_flop_min = 1.0 / 10e9;
    out.notes.push_back(
        "no FLOP cost could be fitted (no GEMM or attention ops?): peak 10 GFLOP/s assumed");
  }
  double s_byte_min = 0;
  for (int j = 2; j < 6; ++j)
    if (x[j] > 0) s_byte_min = s_byte_min > 0 ? std::min(s_byte_min, x[j]) : x[j];
  if (s_byte_min <= 0) {
    s_byte_min = 1.0 / 5e9;
    out.notes.push_back("no memory cost could be fitted: 5 GB/s assumed");
  }
  out.peak_flops = 1.0 / s_flop_min;
  out.memory_bandwidth_bytes_per_s = 1.0 / s_byte_min;
  std::vector<bool> seen(kOpClassCount, false);
  for (const auto& r : rows)
    for (const auto& k : r.kernels) seen[column_of(k.cls)] = true;
  for (int c = 0; c < kOpClassCount; ++c) {
    ClassCost cc;
    cc.overhead_ns = static_cast<int64_t>(std::llround(x[kOpClassCount + c] * 1e9));
    const OpClass cls = static_cast<OpClass>(c);
    if (flop_class(cls)) {
      cc.flops_efficiency = x[c] > 0 ? std::min(1.0, s_flop_min / x[c]) : 1.0;
      cc.bandwidth_efficiency = 1.0;
    } else {
      cc.flops_efficiency = 1.0;
      cc.bandwidth_efficiency = x[c] > 0 ? std::min(1.0, s_byte_min / x[c]) : 1.0;
    }
    if (!seen[c])
      out.notes.push_back(std::string("op class '") + std::string(to_string(cls)) +
                          "' does not occur in the traces: peak efficiency assumed");
    out.classes[c] = cc;
  }
  return out;
}

struct DataLoad {
  int64_t ns = 0;
  std::vector<std::string> notes;
};

// Host time per micro-batch not covered by ops (data loading, work between ops): from the least
// crowded trace, step window minus its compute, per micro-batch, normalised by its slowdown.
DataLoad fit_data_load(const TraceInfo& info, double slowdown) {
  DataLoad out;
  const auto& t = *info.t;
  // (rank, step) -> [start, end]: the step window.
  std::map<std::pair<int, int>, std::pair<int64_t, int64_t>> window;
  std::map<std::pair<int, int>, int64_t> busy;
  for (const auto& sp : t.spans) {
    if (sp.step < info.first_counted_step) continue;
    const auto key = std::make_pair(sp.rank, sp.step);
    const bool is_step = sp.kind == traces::SpanKind::Phase && t.name_of(sp) == names::kStep;
    auto& w = window.try_emplace(key, INT64_MAX, INT64_MIN).first->second;
    if (is_step || sp.kind != traces::SpanKind::Phase) {
      w.first = std::min(w.first, sp.start_ns);
      w.second = std::max(w.second, sp.end_ns);
    }
    if (is_compute(sp)) busy[key] += sp.duration_ns();
  }
  std::vector<double> gaps;
  for (const auto& [k, w] : window)
    if (w.second > w.first) gaps.push_back(double(w.second - w.first - busy[k]));
  const double per_mb = median(gaps) / std::max(1, info.s.micro_batches_per_step()) / slowdown;
  out.ns = static_cast<int64_t>(std::llround(std::max(0.0, per_mb)));
  if (info.ranks_on_node > 1)
    out.notes.push_back(
        "data_load_us taken from a multi-rank trace: it includes that run's exposed communication");
  return out;
}

// ---- 3. collectives

struct CollKey {
  traces::CollOp op;
  int n;  // group size
  int r;  // ranks of the run on the node
  bool operator<(const CollKey& o) const { return std::tie(op, n, r) < std::tie(o.op, o.n, o.r); }
};

// A training run's collective with how many ranks of the node were computing meanwhile (for
// comm_compute_weight, fitted against the commbench tables).
struct Overlapped {
  CollKey key;
  int64_t bytes = 0;
  double time_ns = 0;  // max(end) - max(start)
  int computing = 0;   // its members inside a compute span at its midpoint
};

struct CollectiveObs {
  // Per (op, n, R): x = bytes · busbw_factor, y = ns.
  std::map<CollKey, std::pair<std::vector<double>, std::vector<double>>> points;
  // Commbench: per (op, n, R), bytes -> transfer times.
  std::map<CollKey, std::map<int64_t, std::vector<double>>> bench_times;
  std::vector<Overlapped> overlapped;
};

// One collective: its members' spans in a run's counted steps (op and bytes of the last one seen).
struct CollGroup {
  int32_t comm = -1;
  traces::CollOp op = traces::CollOp::None;
  int64_t bytes = 0;
  int64_t max_start = INT64_MIN, min_end = INT64_MAX, max_end = INT64_MIN;
  int members = 0;
};

// The collectives of a run's counted steps: its collective spans grouped by (communicator,
// sequence number) across ranks (traces::collective_instances), in that order.
std::vector<CollGroup> collective_groups(const TraceInfo& info) {
  const std::vector<traces::Span>& spans = info.t->spans;
  traces::CollectiveOptions opt;
  opt.keep = [&](const traces::Span& sp) { return sp.step >= info.first_counted_step; };
  std::vector<CollGroup> groups;
  for (const traces::CollectiveInstance& ci : traces::collective_instances(spans, opt)) {
    CollGroup g;
    g.comm = ci.comm;
    // The op and size of the member that comes last in the trace (all members agree in a
    // well-formed trace).
    const traces::Span& last = spans[*std::max_element(ci.members.begin(), ci.members.end())];
    g.op = last.op;
    g.bytes = last.bytes;
    for (uint32_t m : ci.members) {
      g.max_start = std::max(g.max_start, spans[m].start_ns);
      g.min_end = std::min(g.min_end, spans[m].end_ns);
      g.max_end = std::max(g.max_end, spans[m].end_ns);
    }
    g.members = static_cast<int>(ci.members.size());
    groups.push_back(g);
  }
  return groups;
}

// Per rank, the compute intervals (sorted) of a training run's counted steps: who computes at an
// instant.
class ComputeIntervals {
 public:
  explicit ComputeIntervals(const TraceInfo& info) {
    if (!info.bench)
      for (const auto& sp : info.t->spans)
        if (is_compute(sp) && sp.step >= info.first_counted_step)
          busy_of_[sp.rank].emplace_back(sp.start_ns, sp.end_ns);
    for (auto& [r, v] : busy_of_) std::sort(v.begin(), v.end());
  }
  // Members of a collective inside a compute span at an instant (their progress threads compete
  // with their own compute).
  int computing_at(int64_t at, const std::vector<int32_t>& members) const {
    int k = 0;
    for (int32_t m : members) {
      const auto found = busy_of_.find(m);
      if (found == busy_of_.end()) continue;
      const auto& v = found->second;
      auto it = std::upper_bound(v.begin(), v.end(), std::make_pair(at, INT64_MAX));
      if (it != v.begin() && std::prev(it)->second > at) ++k;
    }
    return k;
  }

 private:
  std::map<int32_t, std::vector<std::pair<int64_t, int64_t>>> busy_of_;
};

// A point-to-point message of a run's counted steps and its transfer time.
struct Transfer {
  int64_t bytes = 0;
  int64_t time_ns = 0;
};

// The k-th send from A to B on a communicator is B's k-th receive from A, both by start time
// (traces::match_p2p over every step); its transfer time is the receive's end minus the later of
// the two posts. In (communicator, sender, receiver, k) order.
std::vector<Transfer> p2p_transfers(const TraceInfo& info) {
  const std::vector<traces::Span>& spans = info.t->spans;
  std::vector<Transfer> out;
  for (const traces::P2pMatch& m : traces::match_p2p(spans)) {
    const traces::Span& snd = spans[m.send];
    const traces::Span& rcv = spans[m.recv];
    if (snd.step < info.first_counted_step || snd.bytes != rcv.bytes) continue;
    const int64_t time = rcv.end_ns - std::max(snd.start_ns, rcv.start_ns);
    if (time <= 0) continue;
    out.push_back({snd.bytes, time});
  }
  return out;
}

CollectiveObs collect_collectives(const std::vector<TraceInfo>& infos) {
  CollectiveObs out;
  for (const auto& info : infos) {
    if (info.host_only) continue;
    const auto& t = *info.t;
    const ComputeIntervals busy(info);
    for (const CollGroup& g : collective_groups(info)) {
      const auto* c = t.comm(g.comm);
      const int n = c ? static_cast<int>(c->ranks.size()) : g.members;
      if (n < 2 || g.members != n || g.min_end <= g.max_start) continue;
      if (!info.bench && c)
        out.overlapped.push_back(
            {{g.op, n, info.ranks_on_node},
             g.bytes,
             double(g.max_end - g.max_start),
             busy.computing_at(g.max_start + (g.max_end - g.max_start) / 2, c->ranks)});
      auto& pts = out.points[{g.op, n, info.ranks_on_node}];
      pts.first.push_back(double(g.bytes) * traces::busbw_factor(g.op, n));
      pts.second.push_back(double(g.min_end - g.max_start));
      // A sweep's members issue each operation together (commbench lines them up), and the
      // simulator completes every member of a collective at once: its table holds the time from the
      // last arrival until the LAST member is done. (The first member done can be much earlier: in
      // an all-gather or broadcast the early members push their data before the last one arrives.)
      if (info.bench)
        out.bench_times[{g.op, n, info.ranks_on_node}][g.bytes].push_back(
            double(g.max_end - g.max_start));
    }
    for (const Transfer& x : p2p_transfers(info)) {
      auto& pts = out.points[{traces::CollOp::Send, 2, info.ranks_on_node}];
      pts.first.push_back(double(x.bytes));
      pts.second.push_back(double(x.time_ns));
      if (info.bench)
        out.bench_times[{traces::CollOp::Send, 2, info.ranks_on_node}][x.bytes].push_back(
            double(x.time_ns));
    }
  }
  return out;
}

using OpGroup = std::pair<traces::CollOp, int>;  // (op, group size)

struct AlphaBetaFits {
  std::map<CollKey, AffineFit> fits;  // per (op, n, ranks on node)
  // Per (op, n): the fit of most points with ranks·threads <= cores
  std::map<OpGroup, AffineFit> base;
  std::vector<CollFitRow> rows;
};

AlphaBetaFits fit_alpha_beta(const CollectiveObs& obs, int cores, int threads) {
  AlphaBetaFits out;
  for (const auto& [k, pts] : obs.points) {
    AffineFit f = fit_affine_nonneg(pts.first, pts.second);
    out.fits[k] = f;
    out.rows.push_back(
        {k.op, k.n, k.r, f.points, f.intercept, f.slope > 0 ? 1e9 / f.slope : 0, f.r2});
    const double u = double(k.r) * threads / cores;
    if (u <= 1.0 + 1e-9) {
      auto& bf = out.base[{k.op, k.n}];
      if (f.points > bf.points) bf = f;
    }
  }
  return out;
}

struct CommExponent {
  double exponent = 1.0;
  std::vector<std::string> notes;
};

// The comm exponent from oversubscribed runs of a measured (op, n): log-log least squares of the
// ratio of their fit to the uncrowded one, at the median message of the oversubscribed run.
CommExponent fit_comm_exponent(const CollectiveObs& obs, const AlphaBetaFits& ab, int cores,
                               int threads) {
  std::map<OpGroup, std::vector<std::pair<double, double>>> over;  // (u, t_R / t_base) pairs
  for (const auto& [k, f] : ab.fits) {
    const double u = double(k.r) * threads / cores;
    if (u <= 1.0 + 1e-9) continue;
    const auto b0 = ab.base.find({k.op, k.n});
    if (b0 == ab.base.end()) continue;
    const double xm = median(obs.points.at(k).first);
    const double t0 = b0->second.intercept + b0->second.slope * xm, t1 = f.intercept + f.slope * xm;
    if (t0 > 0 && t1 > 0) over[{k.op, k.n}].emplace_back(u, t1 / t0);
  }
  CommExponent out;
  double num = 0, den = 0;
  for (const auto& [k, v] : over)
    for (auto [u, ratio] : v)
      num += std::log(u) * std::log(ratio), den += std::log(u) * std::log(u);
  out.exponent = den > 0 ? std::max(0.0, num / den) : 1.0;
  if (den <= 0)
    out.notes.push_back(
        "no oversubscribed collective of a measured size: comm_exponent = 1 assumed");
  return out;
}

// The uncrowded fit per (op, n): base, plus the fits measured only on crowded nodes divided by
// comm_slowdown.
std::map<OpGroup, AffineFit> uncrowded_fits(const AlphaBetaFits& ab, const CoreSharing& sharing) {
  std::map<OpGroup, AffineFit> base = ab.base;
  for (const auto& [k, f] : ab.fits) {
    if (base.count({k.op, k.n})) continue;
    const double sc = comm_slowdown(sharing, k.r);
    AffineFit g = f;
    g.intercept /= sc;
    g.slope /= sc;
    base[{k.op, k.n}] = g;
  }
  return base;
}

struct GenericCollectives {
  std::vector<CollectiveOverride> overrides;  // every op and group size up to ranks_per_node
  double step_latency_ns = 0;                 // per latency step
  double busbw = 0;                           // bytes per ns (0: no collectives)
  std::vector<std::string> notes;
};

// The collective overrides for every op and group size: measured where the traces have that
// (op, n), else latency_steps(op, n) · a with the busbw of the reference fit.
GenericCollectives generic_overrides(const std::map<OpGroup, AffineFit>& base, int ranks_per_node) {
  GenericCollectives out;
  if (base.empty()) {
    out.notes.push_back(
        "no collective spans with all members: no collective overrides (the cluster's "
        "network model decides)");
    return out;
  }
  // The reference for unmeasured (op, n): the all-reduce fit with most points, else any.
  const AffineFit* best = nullptr;
  int best_n = 2;
  traces::CollOp best_op = traces::CollOp::AllReduce;
  for (const auto& [k, f] : base) {
    const bool better =
        !best || (k.first == traces::CollOp::AllReduce && best_op != traces::CollOp::AllReduce) ||
        ((k.first == traces::CollOp::AllReduce) == (best_op == traces::CollOp::AllReduce) &&
         f.points > best->points);
    if (better) best = &f, best_n = k.second, best_op = k.first;
  }
  out.step_latency_ns = best->intercept / std::max(1, latency_steps(best_op, best_n));
  out.busbw = best->slope > 0 ? 1.0 / best->slope : 0;  // bytes per ns
  if (out.busbw <= 0) {
    out.notes.push_back(
        "collective bandwidth could not be fitted (one message size?): 5 GB/s assumed");
    out.busbw = 5.0;
  }
  using traces::CollOp;
  for (CollOp op : {CollOp::AllReduce, CollOp::ReduceScatter, CollOp::AllGather, CollOp::Broadcast,
                    CollOp::Send}) {
    for (int n = 2; n <= ranks_per_node; ++n) {
      if (op == CollOp::Send && n != 2) continue;
      CollectiveOverride o;
      o.op = op;
      o.ranks = n;
      const auto it = base.find({op, n});
      if (it != base.end() && it->second.slope > 0) {
        o.latency_ns = static_cast<int64_t>(std::llround(it->second.intercept));
        o.bus_bandwidth_bytes_per_s = 1e9 / it->second.slope;
      } else {
        o.latency_ns =
            static_cast<int64_t>(std::llround(out.step_latency_ns * latency_steps(op, n)));
        o.bus_bandwidth_bytes_per_s = out.busbw * 1e9;
      }
      out.overrides.push_back(o);
    }
  }
  return out;
}

// Commbench sweeps: a measured table per (op, group size, ranks on the node), the median transfer
// time per size made non-decreasing in size (a larger message never costs less: the noise of the
// shared machine otherwise shows as dips), with that run's alpha-beta fit beside it.
std::vector<CollectiveOverride> bench_tables(const CollectiveObs& obs, const AlphaBetaFits& ab) {
  std::vector<CollectiveOverride> out;
  for (const auto& [k, sizes] : obs.bench_times) {
    CollectiveOverride o;
    o.op = k.op;
    o.ranks = k.n;
    o.ranks_on_node = k.r;
    for (const auto& [bytes, ts] : sizes)
      o.table.emplace_back(bytes, static_cast<int64_t>(std::llround(median(ts))));
    for (size_t i = o.table.size(); i-- > 1;)
      o.table[i - 1].second = std::min(o.table[i - 1].second, o.table[i].second);
    const auto f = ab.fits.find(k);
    o.latency_ns = f != ab.fits.end() ? static_cast<int64_t>(std::llround(f->second.intercept))
                                      : o.table.front().second;
    o.bus_bandwidth_bytes_per_s =
        f != ab.fits.end() && f->second.slope > 0 ? 1e9 / f->second.slope : 1e9;
    out.push_back(std::move(o));
  }
  return out;
}

// comm_compute_weight w: the training runs' collectives whose k members were computing took
// (1 + w k / cores) x the sweep's time for their (op, n, R, bytes); least squares through the
// origin of (ratio − 1) against k / cores over the instances with k > 0.
WeightFit fit_comm_compute_weight(const std::vector<Overlapped>& overlapped,
                                  const std::vector<CollectiveOverride>& collectives, int cores) {
  WeightFit out;
  std::map<CollKey, const CollectiveOverride*> table_of;
  for (const auto& o : collectives)
    if (!o.table.empty()) table_of[{o.op, o.ranks, o.ranks_on_node}] = &o;
  double num = 0, den = 0;
  int used = 0;
  for (const auto& ov : overlapped) {
    const auto it = table_of.find(ov.key);
    if (it == table_of.end() || ov.computing == 0) continue;
    const double sweep_ns = double(it->second->time_ns(ov.bytes, ov.key.n));
    if (sweep_ns <= 0) continue;
    const double share = double(ov.computing) / cores;
    num += share * (ov.time_ns / sweep_ns - 1.0), den += share * share;
    ++used;
  }
  if (den > 0) {
    out.weight = std::max(0.0, num / den);
    out.notes.push_back("comm_compute_weight " + std::to_string(*out.weight) + " from " +
                        std::to_string(used) + " collectives that overlapped compute");
  } else if (!table_of.empty()) {
    out.notes.push_back(
        "no collective of the training runs overlapped compute: comm_compute_weight = 0");
  }
  return out;
}

// ---- 4. the profile

// The measured lone-rank op times themselves: the simulator costs an op at a measured shape at
// exactly its measured time and scales other shapes from the nearest one by the fitted roofline
// (CostModel::named_op_ns), so the class fit only has to get ratios between shapes right.
std::vector<MeasuredOp> measured_ops(const PooledOps& ops) {
  std::vector<const Row*> all;
  for (const auto& r : ops.rows) all.push_back(&r);
  for (const auto& r : ops.measured_only) all.push_back(&r);
  std::vector<MeasuredOp> out;
  for (const Row* rp : all) {
    const Row& r = *rp;
    MeasuredOp m;
    m.name = r.key.name;
    m.piece = r.key.piece;
    m.pieces = r.key.pieces;
    if (m.name == names::kOptimizerStep || m.name == names::kZeroGrad) {
      m.params = r.params;
    } else {
      m.batch = r.dims.batch, m.seq = r.dims.seq, m.d_model = r.dims.d_model,
      m.heads = r.dims.heads;
      m.vocab = r.dims.vocab, m.tp = r.dims.tp;
    }
    m.time_ns = static_cast<int64_t>(std::llround(r.measured));
    out.push_back(m);
  }
  return out;
}

// Rank slots of the described machine: at least the most crowded run.
int described_ranks_per_node(const std::vector<TraceInfo>& infos, int ranks_per_node) {
  int m = 1;
  for (const auto& i : infos) m = std::max(m, i.ranks_on_node);
  return std::max(ranks_per_node, m);
}

// The `cluster:` section: the machine the traces came from.
MachineDescription machine_of(const HardwareProfile& p, int ranks_per_node,
                              const GenericCollectives& coll, const CalibrationOptions& opt) {
  MachineDescription m;
  m.device = "cpu";
  m.nodes = 1;
  m.ranks_per_node = ranks_per_node;
  m.peak_flops = p.peak_flops;
  m.memory_bandwidth_bytes_per_s = p.memory_bandwidth_bytes_per_s;
  m.memory_capacity_bytes = opt.memory_capacity_bytes > 0
                                ? opt.memory_capacity_bytes
                                : this_machine_memory_bytes() / ranks_per_node;
  m.link = "MPI between processes over shared memory";
  m.link_bytes_per_s = coll.busbw > 0 ? coll.busbw * 1e9 : 5e9;
  m.link_latency_ns = static_cast<int64_t>(std::llround(coll.step_latency_ns));
  return m;
}

// The `machine:` section: where the profile came from.
std::map<std::string, std::string> machine_notes(const std::vector<TraceInfo>& infos, int cores) {
  std::map<std::string, std::string> machine;
  machine["source"] = "orrery calibrate from " + std::to_string(infos.size()) + " trace(s)";
  std::string list;
  for (const auto& i : infos) list += (list.empty() ? "" : ", ") + i.label;
  machine["traces"] = list;
  machine["host"] = infos.front().t->meta.host;
  machine["cores"] = std::to_string(cores);
  return machine;
}

struct FitReport {
  std::vector<OpFitRow> ops;
  double rel_rms = 0;  // time-weighted relative RMS error
};

// The fit report with the real cost model on the profile (lone rank).
FitReport fit_report(const HardwareProfile& p, const std::vector<Row>& rows) {
  FitReport out;
  const CostModel cost(p, p.peak_flops, p.memory_bandwidth_bytes_per_s);
  double se = 0, sw = 0;
  for (const auto& r : rows) {
    OpFitRow f;
    f.name = r.key.pieces > 1 ? r.key.name + "[" + std::to_string(r.key.piece + 1) + "/" +
                                    std::to_string(r.key.pieces) + "]"
                              : r.key.name;
    f.shape = r.key.shape + (r.key.name == names::kOptimizerStep && r.key.stage
                                 ? " stage" + std::to_string(r.key.stage)
                                 : "");
    f.count = r.count;
    f.measured_ns = r.measured;
    f.fitted_ns = double(cost.op_ns(r.kernels));
    const double rel = f.measured_ns > 0 ? (f.fitted_ns - f.measured_ns) / f.measured_ns : 0;
    const double w = double(r.count) * r.measured;
    se += w * rel * rel, sw += w;
    out.ops.push_back(f);
  }
  out.rel_rms = sw > 0 ? std::sqrt(se / sw) : 0;
  return out;
}

}  // namespace

namespace {
// NVMe offload (zero.offload_optimizer nvme runs): the node's disk bandwidth from the runs'
// offload.read / offload.write spans, bytes over busy time per rank times the ranks that ran them
// at once (the run's ranks, on this one machine), byte-weighted over the runs.
struct OffloadFit {
  bool any = false;
  OffloadLinks links = offload_defaults("cpu", false);
  std::vector<std::string> notes;
};
OffloadFit fit_offload(const std::vector<traces::Trace>& traces) {
  OffloadFit f;
  double bytes[2] = {0, 0}, node_bytes_ns[2] = {0, 0};  // [read, write]
  for (const auto& t : traces) {
    double b[2] = {0, 0}, ns[2] = {0, 0};
    for (const auto& sp : t.spans) {
      const std::string& n = t.name_of(sp);
      const int k = n == names::kOffloadRead ? 0 : n == names::kOffloadWrite ? 1 : -1;
      if (k < 0 || sp.step < 1) continue;  // step 0 warms the page cache and the file
      b[k] += double(sp.bytes);
      ns[k] += double(sp.end_ns - sp.start_ns);
    }
    const int ranks = std::max(1, t.meta.world_size);
    for (int k = 0; k < 2; ++k) {
      if (b[k] <= 0 || ns[k] <= 0) continue;
      f.any = true;
      bytes[k] += b[k];
      node_bytes_ns[k] += b[k] * (b[k] / ns[k] * 1e9 * ranks);
    }
  }
  if (bytes[0] > 0) f.links.nvme_read_bytes_per_s = node_bytes_ns[0] / bytes[0];
  if (bytes[1] > 0) f.links.nvme_write_bytes_per_s = node_bytes_ns[1] / bytes[1];
  if (!f.any) f.notes.push_back("offload: no offload.read/write spans, disk bandwidth assumed");
  return f;
}

// This CPU's AdamW, the host step of ZeRO-Offload on a GPU machine with this CPU (the runtime's
// adamw_update either way): each run's adamw spans of the counted steps, kHostAdamWBytesPerParam
// per parameter the rank updates over their time, times the run's ranks on the node (the ranks
// step at once and share its memory). Offload runs' adamw spans are gone already
// (without_offload_adamw: they wait for the disk).
detail::PooledRate cpu_host_adamw(const std::vector<TraceInfo>& infos) {
  detail::PooledRate r;
  for (const auto& info : infos) {
    if (info.bench) continue;
    const auto& t = *info.t;
    std::map<int32_t, const traces::RankInfo*> coords;
    for (const auto& rk : t.ranks) coords[rk.rank] = &rk;
    double bytes = 0, ns = 0;
    int64_t spans = 0;
    for (const auto& sp : t.spans) {
      if (sp.step < info.first_counted_step || t.name_of(sp) != names::kOptimizerStep) continue;
      const auto it = coords.find(sp.rank);
      const double params = held_params(std::string(names::kOptimizerStep), info.s,
                                        it == coords.end() ? nullptr : it->second);
      bytes += kHostAdamWBytesPerParam * params, ns += double(sp.duration_ns()), ++spans;
    }
    r.add_run(bytes, ns, double(info.ranks_on_node), spans, info.label);
  }
  return r;
}
}  // namespace

namespace {
// ---- 2b. host compute beyond the model's kernels (HostComputeRates; hardware.hpp)

struct HostFit {
  HostComputeRates rates;
  std::vector<std::string> notes;
};

// The emulated 16-bit formats' rounding: each op of a 16-bit run (its lone-rank time: its median
// over the run's compute slowdown by the sharing law) against the same op of the fp32 runs (the
// pooled row), the difference per element rounded (rounded_elements of its fp32 kernels):
//   ns per element = Σ count · (t16 − t32) / Σ count · elements, per format.
// Exact when the 16-bit ops take their fp32 time plus a rate per element.
void fit_rounding(const std::vector<TraceInfo>& infos, const ComputeObs& obs, const PooledOps& ops,
                  const Slowdowns& sl, const CoreSharing& sharing, HostFit& out) {
  std::map<OpKey, const Row*> fp32;
  for (const auto& r : ops.rows) fp32[r.key] = &r;
  std::map<std::string, std::pair<double, double>> sums;  // format -> (Σ c·extra ns, Σ c·elements)
  const double ref_law = compute_slowdown(sharing, infos[sl.ref].ranks_on_node);
  for (size_t i = 0; i < infos.size(); ++i) {
    if (!infos[i].emulated_16bit) continue;
    const std::string format(to_string(model_dims(infos[i].s, 4).emulated_format));
    const double f = compute_slowdown(sharing, infos[i].ranks_on_node) / ref_law;
    auto& [extra, elements] = sums[format];
    for (const auto& [k, o] : obs.per_trace_16bit[i]) {
      const auto it = fp32.find(k);
      const double units = rounded_elements(o.kernels);
      if (it == fp32.end() || units <= 0 || o.durations.empty()) continue;
      const double c = double(o.durations.size());
      extra += c * (median(o.durations) / f - it->second->measured);
      elements += c * units;
    }
  }
  for (const auto& [format, sum] : sums) {
    if (sum.second <= 0) {
      out.notes.push_back("rounding: the " + format +
                          " runs have no GEMM op in common with the fp32 runs: not fitted");
      continue;
    }
    const double rate = std::max(0.0, sum.first / sum.second);
    out.rates.rounding_ns[format] = rate;
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "rounding: %s %.4f ns per element rounded (%.3g elements of the %s runs' GEMM "
                  "ops against the fp32 runs')",
                  format.c_str(), rate, sum.second, format.c_str());
    out.notes.push_back(buf);
  }
  for (const char* format : {"bf16", "fp16"})
    if (!sums.count(format))
      out.notes.push_back(std::string("rounding: no ") + format +
                          " run: its emulated rounding is priced by the roofline estimate "
                          "(elementwise passes)");
}

// The units of work (HostComputeRates) of a run's compression ops per (name, step), over its ranks:
// the simulator's own workload of the run's scenario built at 1 ns per unit.
std::map<std::pair<std::string, int>, double> compression_units(const Scenario& s) {
  HardwareProfile unit = default_hardware_profile("cpu", false);
  unit.host.compression[s.parallel.grad_compression] = CompressionRate{1.0, 1.0};
  const CostModel cost(unit, 1e10, 1e10);
  WorkloadOptions wo;
  wo.steps = s.training.steps;
  wo.precision = precision_config("fp32");
  const Workload w = build_workload(s, cost, wo);
  const double ranks_per_stage = double(s.world_size()) / double(std::max(1, s.parallel.pp));
  std::map<std::pair<std::string, int>, double> out;
  for (const auto& prog : w.stages)
    for (const auto& op : prog.ops) {
      const std::string& n = w.names[op.name];
      if (n == names::kDpCompress || n == names::kDpDecompress)
        out[{n, op.step}] += double(op.duration_ns) * ranks_per_stage;
    }
  return out;
}

// Gradient compression's compute, per scheme: the runs' ddp.compress / ddp.decompress spans of the
// counted steps (each normalised to a lone rank: its run's slowdown and the progress threads in
// flight, span_factor) over the units of the same ops of the run's workload:
//   ns per unit = Σ normalised span time / Σ units, per scheme and op.
void fit_compression(const std::vector<TraceInfo>& infos, const std::vector<double>& factor,
                     const CoreSharing& sharing, int threads, HostFit& out) {
  std::map<std::string, std::array<double, 4>> sums;  // scheme -> compress t, u, decompress t, u
  for (size_t i = 0; i < infos.size(); ++i) {
    const TraceInfo& info = infos[i];
    const std::string& scheme = info.s.parallel.grad_compression;
    if (info.bench || info.emulated_16bit || scheme == "none" || info.s.parallel.dp < 2) continue;
    std::map<std::pair<std::string, int>, double> units;
    try {
      units = compression_units(info.s);
    } catch (const InputError& e) {
      out.notes.push_back(info.label + ": compression not fitted (" + e.what() + ")");
      continue;
    }
    const CommInFlight in_flight(info);
    std::map<std::pair<std::string, int>, double> measured;
    for (const auto& sp : info.t->spans) {
      const std::string& n = info.t->name_of(sp);
      if (sp.step < info.first_counted_step ||
          (n != names::kDpCompress && n != names::kDpDecompress))
        continue;
      const double m = in_flight.at(sp.start_ns + sp.duration_ns() / 2);
      measured[{n, sp.step}] +=
          double(sp.duration_ns()) / span_factor(info, factor[i], sharing, threads, m);
    }
    auto& acc = sums[scheme];
    for (const auto& [key, t] : measured) {
      const auto u = units.find(key);
      if (u == units.end() || u->second <= 0) continue;
      const int k = key.first == names::kDpCompress ? 0 : 2;
      acc[k] += t, acc[k + 1] += u->second;
    }
  }
  for (const auto& [scheme, a] : sums) {
    CompressionRate r;
    r.compress_ns = a[1] > 0 ? a[0] / a[1] : 0.0;
    r.decompress_ns = a[3] > 0 ? a[2] / a[3] : 0.0;
    if (r.compress_ns <= 0 && r.decompress_ns <= 0) continue;
    out.rates.compression[scheme] = r;
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "compression: %s compress %.4f ns per unit (%.3g units), decompress %.4f ns per "
                  "unit (%.3g units), from its runs' ddp.compress / ddp.decompress spans",
                  scheme.c_str(), r.compress_ns, a[1], r.decompress_ns, a[3]);
    out.notes.push_back(buf);
  }
  for (const char* scheme : {"int8", "topk", "powersgd"})
    if (!out.rates.compression.count(scheme))
      out.notes.push_back(std::string("compression: no run with grad_compression ") + scheme +
                          ": its compute is priced by the roofline estimate");
}
}  // namespace

namespace detail {

std::vector<GpuItem> orrery_gpu_items(const traces::Trace& t, size_t trace_index, int skip_steps,
                                      std::vector<std::string>& notes) {
  const TraceInfo info = trace_info(t, skip_steps);
  const TraceOps ops = observe_compute(info);
  for (const auto& u : ops.unknown)
    if (u.rfind("fwd.", 0) == 0 || u.rfind("bwd.", 0) == 0)
      notes.push_back(info.label + ": op spans named '" + u + "' have no simulator op: left out");
  const auto prec = precision_from_string(info.s.runtime.precision);
  const int32_t elem = prec == Precision::BF16 || prec == Precision::FP16 ? 2 : 4;
  std::vector<GpuItem> out;
  for (const auto& [key, o] : ops.ops) {
    if (key.name == names::kZeroGrad || o.durations.empty()) continue;  // a memset: no class
    GpuItem it;
    it.name = key.name;
    it.shape = key.shape + (key.pieces > 1 ? " piece " + std::to_string(key.piece) : "");
    it.kernels = o.kernels;
    it.launched = double(o.kernels.size());
    it.measured_ns = median(o.durations);
    it.count = static_cast<int64_t>(o.durations.size());
    bool flop = false;
    for (const auto& k : o.kernels) flop = flop || flop_class(k.cls);
    it.elem_bytes = flop ? elem : 0;
    it.trace = trace_index;
    out.push_back(std::move(it));
  }
  return out;
}

}  // namespace detail

CalibrationResult calibrate(const std::vector<traces::Trace>& traces_all,
                            const CalibrationOptions& opt) {
  size_t gpu_traces = 0;
  for (const auto& t : traces_all) gpu_traces += is_gpu_trace(t) ? 1 : 0;
  if (gpu_traces > 0) {
    if (gpu_traces != traces_all.size())
      throw InputError(
          "orrery calibrate: GPU and CPU traces given together: a profile describes one device; "
          "calibrate them apart");
    check_options(traces_all, opt);
    return detail::calibrate_gpu(traces_all, opt);
  }
  if (opt.check)
    throw InputError("orrery calibrate: --check prices GPU traces' kernels; these are CPU traces");
  const OffloadFit offload = fit_offload(traces_all);
  detail::HostOffloadFit host_offload = detail::fit_host_offload(traces_all, opt.skip_steps);
  const std::vector<traces::Trace> traces_in = detail::without_offload_adamw(traces_all);
  check_options(traces_in, opt);
  CalibrationResult out;
  append(out.notes, offload.notes);
  const int cores = opt.cores > 0 ? opt.cores : std::max(1u, std::thread::hardware_concurrency());
  const std::vector<TraceInfo> infos = collect_runs(traces_in, opt.skip_steps);
  const int threads = opt.threads_per_rank > 0 ? opt.threads_per_rank
                                               : std::max(1, infos.front().s.runtime.threads);

  // 1. the compute observations and the core-sharing law
  const ComputeObs obs = collect_compute(infos);
  append(out.notes, obs.notes);
  const Slowdowns sl = measure_slowdowns(infos, obs.per_trace);
  append(out.notes, sl.notes);
  const SharingFit law = fit_sharing_law(infos, sl.factor, cores, threads);
  append(out.notes, law.notes);
  CoreSharing sharing = law.sharing;
  out.sharing = sharing_rows(infos, sl, sharing);
  const WeightFit thread_weight =
      fit_comm_thread_weight(infos, obs.per_trace, sl, sharing, threads);
  if (thread_weight.weight) sharing.comm_thread_weight = *thread_weight.weight;
  append(out.notes, thread_weight.notes);
  // 3b. the spread
  HardwareProfile& p = out.profile;
  const JitterFit jitter = fit_jitter(infos);
  if (jitter.op_jitter) p.op_jitter = *jitter.op_jitter;
  if (jitter.rank_jitter) p.rank_jitter = *jitter.rank_jitter;
  append(out.notes, jitter.notes);
  // The router's measured load (mixture of experts): the token histogram of the moe.tokens counters.
  p.moe_expert_shares = measured_expert_shares(traces_in);
  if (!p.moe_expert_shares.empty())
    out.notes.push_back("moe_expert_shares of " + std::to_string(p.moe_expert_shares.size()) +
                        " experts from the moe.tokens counters");

  // 2. compute
  const PooledOps ops = pool_ops(infos, obs.per_trace, sl.factor, sharing, threads, opt.skip_steps);
  const ClassFit class_fit = fit_class_costs(ops.rows);
  append(out.notes, class_fit.notes);
  const ClassRates rates = class_rates(class_fit.x, ops.rows);
  append(out.notes, rates.notes);
  p.name = opt.name;
  p.device = "cpu";
  p.precision = Precision::FP32;
  p.peak_flops = rates.peak_flops;
  p.memory_bandwidth_bytes_per_s = rates.memory_bandwidth_bytes_per_s;
  p.classes = rates.classes;
  const DataLoad data_load = fit_data_load(infos[sl.ref], sl.factor[sl.ref]);
  p.data_load_ns = data_load.ns;
  append(out.notes, data_load.notes);
  p.offload = offload.links;
  if (!host_offload.adamw.any()) host_offload.adamw = cpu_host_adamw(infos);
  detail::apply_host_offload(host_offload, p, nullptr, out.notes);
  // 2b. host compute: the 16-bit formats' rounding and the compression schemes' compute
  HostFit host;
  fit_rounding(infos, obs, ops, sl, sharing, host);
  fit_compression(infos, sl.factor, sharing, threads, host);
  p.host = host.rates;
  append(out.notes, host.notes);

  // 3. collectives
  const int ranks_per_node = described_ranks_per_node(infos, opt.ranks_per_node);
  const CollectiveObs coll = collect_collectives(infos);
  const AlphaBetaFits ab = fit_alpha_beta(coll, cores, threads);
  out.collectives = ab.rows;
  const CommExponent comm_exponent = fit_comm_exponent(coll, ab, cores, threads);
  sharing.comm_exponent = comm_exponent.exponent;
  append(out.notes, comm_exponent.notes);
  const GenericCollectives generic = generic_overrides(uncrowded_fits(ab, sharing), ranks_per_node);
  append(out.notes, generic.notes);
  p.collectives = generic.overrides;
  for (auto& o : bench_tables(coll, ab)) p.collectives.push_back(std::move(o));
  const WeightFit compute_weight = fit_comm_compute_weight(coll.overlapped, p.collectives, cores);
  if (compute_weight.weight) sharing.comm_compute_weight = *compute_weight.weight;
  append(out.notes, compute_weight.notes);

  // 4. the machine
  p.sharing = sharing;
  if (opt.measured_ops) p.ops = measured_ops(ops);
  p.cluster = machine_of(p, ranks_per_node, generic, opt);
  p.machine = machine_notes(infos, cores);

  FitReport report = fit_report(p, ops.rows);
  out.ops = std::move(report.ops);
  out.compute_rel_rms = report.rel_rms;
  return out;
}

namespace {

// A GPU fit's YAML: the profile, then per parameter where its number came from.
// The per-operator fit table of a written profile and its time-weighted error: the operator and
// shape columns `name_w` and `shape_w` wide, times with `decimals` decimals.
void write_op_fits(std::ostringstream& o, const CalibrationResult& r, int name_w, int shape_w,
                   int decimals) {
  char buf[320];
  for (const auto& f : r.ops) {
    std::snprintf(
        buf, sizeof buf, "#   %-*s %-*s n=%-5lld measured %10.*f us  fitted %10.*f us  %+6.*f %%\n",
        name_w, f.name.c_str(), shape_w, f.shape.c_str(), static_cast<long long>(f.count), decimals,
        f.measured_ns / 1e3, decimals, f.fitted_ns / 1e3, decimals, f.error_pct());
    o << buf;
  }
  std::snprintf(buf, sizeof buf, "#   time-weighted relative RMS error %.2f %%\n",
                100 * r.compute_rel_rms);
  o << buf;
}

std::string calibrated_gpu_yaml(const CalibrationResult& r) {
  std::ostringstream o;
  o << "# Calibrated GPU hardware profile, written by `orrery calibrate` from GPU traces\n"
       "# (sim/include/orrery/sim/calibrate.hpp, step 5; scenarios/hardware/README.md has the\n"
       "# defaults' sources). Peaks are the device preset's datasheet figures; each efficiency is\n"
       "# measured against them. Every parameter says below which traces and kernels fitted it.\n";
  o << to_yaml(r.profile);
  char buf[512];
  for (const auto& g : r.gpu) {
    std::string from;
    for (const auto& t : g.traces) from += (from.empty() ? "" : ", ") + t;
    // Offload's rates are fitted from spans (calibrate_offload.hpp), the rest from kernels.
    const char* unit = g.parameter.rfind("offload.", 0) == 0 ? "spans" : "kernels";
    if (g.fitted)
      std::snprintf(buf, sizeof buf, "# fit: %-34s %10.4f  from %lld %s of %s\n",
                    g.parameter.c_str(), g.value, static_cast<long long>(g.kernels), unit,
                    from.c_str());
    else
      std::snprintf(buf, sizeof buf, "# fit: %-34s %10.4f  NOT FITTED, the default kept: %s\n",
                    g.parameter.c_str(), g.value, g.why.c_str());
    o << buf;
  }
  o << "# Fit per operator and shape (median instance, measured and predicted by this profile):\n";
  write_op_fits(o, r, 44, 30, 2);
  for (const auto& n : r.notes) o << "# note: " << n << "\n";
  return o.str();
}

}  // namespace

std::string calibrated_yaml(const CalibrationResult& r) {
  if (!r.gpu.empty()) return calibrated_gpu_yaml(r);
  std::ostringstream o;
  // One source line per line of the written header.
  // clang-format off
  o << "# Calibrated hardware profile, written by `orrery calibrate` (sim/include/orrery/sim/calibrate.hpp\n"
       "# says how each number is fitted; scenarios/README.md documents the keys).\n"
       "#  - peak_flops / memory_bandwidth_gbps: the fastest FLOP and byte rates the fit found, for ONE rank\n"
       "#    alone on the machine; kernels.<class>: each class's efficiency relative to them and the fitted\n"
       "#    per-kernel overhead (host work, loop setup), so small kernels reach a lower FLOP/s.\n"
       "#  - data_load_us: host time per micro-batch not covered by ops (data, work between ops).\n"
       "#  - collectives: latency + bytes x busbw_factor / bus bandwidth per op and group size (ranks:), fitted\n"
       "#    from the collectives of the traces (time after the last member arrived) or derived from them.\n"
       "#  - cluster: the machine the traces came from; `orrery sim SCENARIO --hw THIS` without --cluster\n"
       "#    simulates on it.\n"
       "#  - sharing: ranks sharing the node's cores; a rank's compute slows by contention_at_full when\n"
       "#    ranks x threads = cores and by contention_at_full x (ranks x threads / cores)^exponent beyond.\n";
  // clang-format on
  o << to_yaml(r.profile);
  o << "# Fit (lone-rank times: measured median / slowdown of its run, and this profile's "
       "prediction):\n";
  char buf[256];
  write_op_fits(o, r, 16, 28, 1);
  for (const auto& s : r.sharing) {
    std::snprintf(buf, sizeof buf, "# sharing: %d ranks: measured slowdown %.3f, law %.3f (%s)\n",
                  s.ranks, s.factor, s.model, s.trace.c_str());
    o << buf;
  }
  for (const auto& c : r.collectives) {
    std::snprintf(buf, sizeof buf,
                  "# collective %s over %d ranks (run of %d): %d points, latency %.1f us, busbw "
                  "%.3f GB/s, r2 %.3f\n",
                  std::string(traces::to_string(c.op)).c_str(), c.ranks, c.ranks_on_node, c.points,
                  c.latency_ns / 1e3, c.busbw_bytes_per_s / 1e9, c.r2);
    o << buf;
  }
  for (const auto& n : r.notes) o << "# note: " << n << "\n";
  return o.str();
}

}  // namespace orrery::sim
