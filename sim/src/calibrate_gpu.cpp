// Calibration from GPU traces (calibrate.hpp, step 5): the observations (imported kernels with
// their operators' work, traces/kernel_work.hpp; Orrery's op spans, calibrate.cpp), the fit of the
// per-kernel overhead and the class rates under the GEMM shape model, and the profile it gives.
#include "calibrate_gpu.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "calibrate_offload.hpp"
#include "orrery/common/error.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/traces/kernel_work.hpp"

namespace orrery::sim {

bool is_gpu_trace(const traces::Trace& t) {
  if (!traces::read_kernel_work(t).empty()) return true;
  if (t.meta.layout.device == "cuda") return true;
  for (const auto& r : t.ranks)
    if (r.device.rfind("cuda", 0) == 0) return true;
  return false;
}

std::string gpu_preset_of(const std::string& gpu_name) {
  std::string n = gpu_name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::toupper(c); });
  if (n.find("H200") != std::string::npos) return "H200";
  if (n.find("H100") != std::string::npos) return "H100-SXM";
  if (n.find("A100") != std::string::npos) return "A100-SXM-80GB";
  return {};
}

namespace detail {
namespace {

// The overhead, one rate per class, then the GEMMs' bandwidth (their kernels on the bytes side of
// the roofline) and their kernel latency (one per GEMM kernel, the shape model's floor).
constexpr int kGemmBandwidthCol = 1 + kOpClassCount;
constexpr int kGemmLatencyCol = kGemmBandwidthCol + 1;
constexpr int kGpuCols = kGemmLatencyCol + 1;
int col_of(OpClass c) { return 1 + static_cast<int>(c); }
bool flop_cls(OpClass c) { return c == OpClass::Gemm || c == OpClass::Attention; }

std::optional<OpClass> class_of(const std::string& s) {
  for (int c = 0; c < kOpClassCount; ++c)
    if (to_string(static_cast<OpClass>(c)) == s) return static_cast<OpClass>(c);
  return std::nullopt;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

// The simulator's kernel for an imported op's work (a batched GEMM's products stacked as rows:
// the same tiles, as cost_model's unfused attention prices them).
Kernel kernel_of(const traces::OpWork& w, OpClass cls) {
  Kernel k;
  k.cls = cls;
  k.flops = w.flops;
  k.bytes = w.bytes;
  if (cls == OpClass::Gemm) {
    k.gm = w.m * w.batch, k.gn = w.n, k.gk = w.k, k.elem_bytes = w.elem_bytes;
    k.load_bytes = gemm_load_bytes(w.m, w.n, w.k, w.elem_bytes);  // each product's, not the stack's
  }
  if (cls == OpClass::Attention) {
    k.gm = w.m, k.gn = w.n, k.gk = w.k, k.gbatch = w.batch, k.gemm_backward = w.backward;
    k.elem_bytes = w.elem_bytes;
  }
  return k;
}

std::string shape_text(const traces::OpWork& w) {
  const std::string e = w.elem_bytes > 0 ? " e" + std::to_string(w.elem_bytes) : "";
  if (w.cls == "gemm")
    return (w.batch > 1 ? fmt(w.batch) + "x " : "") + fmt(w.m) + "x" + fmt(w.n) + "x" + fmt(w.k) +
           e;
  if (w.cls == "attention")
    return fmt(w.batch) + "x T" + fmt(w.m) + " S" + fmt(w.n) + " D" + fmt(w.k) +
           (w.backward ? " bwd" : " fwd") + e;
  return fmt(w.bytes) + " B";
}

// Imported kernels: per op instance (rank, group) the kernels' summed duration; per (op, work,
// kernels launched) the median instance.
std::vector<GpuItem> imported_items(const traces::Trace& t, size_t trace_index,
                                    std::set<std::string>& unknown_classes) {
  const std::vector<traces::KernelWork> rows = traces::read_kernel_work(t);
  struct Instance {
    size_t row = 0;
    double ns = 0;
    int kernels = 0;
    bool tf32 = false;
  };
  // The kernel spans' names, by the (rank, stream, start, end) a row names its span with.
  std::map<std::tuple<int32_t, int32_t, int64_t, int64_t>, traces::NameId> names;
  for (const auto& s : t.spans)
    if (s.kind == traces::SpanKind::Compute)
      names.emplace(std::make_tuple(s.rank, s.stream, s.start_ns, s.end_ns), s.name);
  std::map<std::pair<int32_t, int64_t>, Instance> inst;
  for (size_t r = 0; r < rows.size(); ++r) {
    auto [it, fresh] = inst.try_emplace({rows[r].rank, rows[r].group});
    if (fresh) it->second.row = r;
    it->second.ns += double(rows[r].end_ns - rows[r].start_ns);
    it->second.kernels += 1;
    const auto n = names.find({rows[r].rank, rows[r].stream, rows[r].start_ns, rows[r].end_ns});
    if (n != names.end() && traces::tf32_tensor_core_kernel(t.strings.str(n->second)))
      it->second.tf32 = true;
  }
  // op, shape, kernels launched, FLOPs (a causal and a full attention of one shape differ)
  using Key = std::tuple<std::string, std::string, int, double>;
  std::map<Key, std::pair<GpuItem, std::vector<double>>> groups;
  for (const auto& [key, i] : inst) {
    const traces::KernelWork& w = rows[i.row];
    const auto cls = class_of(w.work.cls);
    if (!cls) {
      unknown_classes.insert(w.work.cls);
      continue;
    }
    auto& g = groups[{w.op, shape_text(w.work), i.kernels, w.work.flops}];
    if (g.second.empty()) {
      g.first.name = w.op;
      g.first.shape = shape_text(w.work);
      g.first.kernels = {kernel_of(w.work, *cls)};
      g.first.launched = i.kernels;
      g.first.elem_bytes = flop_cls(*cls) ? w.work.elem_bytes : 0;
      g.first.trace = trace_index;
    }
    g.first.tf32 = g.first.tf32 || (g.first.elem_bytes == 4 && i.tf32);
    g.second.push_back(i.ns);
  }
  std::vector<GpuItem> out;
  for (auto& [k, g] : groups) {
    g.first.measured_ns = median_of(g.second);
    g.first.count = static_cast<int64_t>(g.second.size());
    out.push_back(std::move(g.first));
  }
  return out;
}

// ---- the fit

struct Estimates {
  std::array<double, kOpClassCount> flops_eff{};
  std::array<double, kOpClassCount> bw_eff{};
  double overhead_s = 0;
  double gemm_latency_s = 0;  // the shape model's kernel_latency_cycles, in seconds
};

struct Design {
  std::vector<double> a, b;        // rows x kGpuCols, weighted
  std::vector<char> memory_bound;  // per (item, kernel): priced on its bytes side
  std::array<bool, kGpuCols> used{};
};

struct Machine {
  double peak = 0, bw = 0;
  GemmShapeModel shape;
  // Whether GEMM kernels pay the shape model's kernel latency (CostModel::kernel_ns).
  bool gemm_latency() const { return shape.enabled() && shape.clock_hz > 0; }
};
bool shaped_gemm(const Kernel& k) { return k.cls == OpClass::Gemm && k.gm > 0; }

// The shape efficiency of every (item, kernel), in order: it depends on the shape model and the
// device, not on the rates being fitted, so one pass serves every iteration of a fit.
std::vector<double> shape_effs(const std::vector<GpuItem>& items, const Machine& m) {
  std::vector<double> out;
  for (const auto& it : items)
    for (const auto& k : it.kernels)
      out.push_back(k.cls == OpClass::Gemm ? gemm_shape_efficiency(m.shape, k, {m.peak, m.bw})
                                           : 1.0);
  return out;
}

// A GEMM kernel's time on its bytes side over its time on its FLOP side, both at the peaks: it is
// on its bytes side where this exceeds bandwidth_efficiency / flops_efficiency, one threshold for
// every GEMM (infinite without FLOPs).
double bytes_to_flops(const Kernel& k, const Machine& m, double shape) {
  if (!(k.flops > 0)) return std::numeric_limits<double>::infinity();
  return k.bytes * m.peak * shape / (m.bw * k.flops);
}

// Which of the fixed costs the rows fit (those not fitted are the estimates', subtracted).
struct FixedCosts {
  bool overhead = false;      // per kernel launched
  bool gemm_latency = false;  // per GEMM kernel
};

// The observation rows: which GEMM and attention kernels are memory-bound (their time on the
// bandwidth side: a GEMM's bytes at the GEMMs' fitted bandwidth, attention's at the estimate's,
// subtracted), the rest per class. GEMMs are on their bytes side where bytes_to_flops >=
// gemm_tau (fit_gpu tries each threshold); attention by the current estimates' roofline, or with
// roofline false on its FLOP side (the first pass: the preset's efficiencies may be far from the
// traces', and a kernel put on its bytes side never moves its class's estimate).
Design design(const std::vector<GpuItem>& items, const Machine& m, const std::vector<double>& effs,
              const Estimates& e, FixedCosts fit, bool roofline, double gemm_tau) {
  Design d;
  size_t at = 0;  // (item, kernel) index into effs
  for (const auto& it : items) {
    std::vector<double> row(kGpuCols, 0.0);
    double target = it.measured_ns * 1e-9;
    // Without a fitted overhead, the preset's stands and the rates explain the rest.
    if (fit.overhead)
      row[0] = it.launched;
    else
      target -= it.launched * e.overhead_s;
    for (const auto& k : it.kernels) {
      const int c = static_cast<int>(k.cls);
      const double shape = effs[at++];
      bool mem = false;
      if (m.gemm_latency() && shaped_gemm(k)) {
        if (fit.gemm_latency)
          row[kGemmLatencyCol] += 1;
        else
          target -= e.gemm_latency_s;
      }
      if (flop_cls(k.cls)) {
        const double tc = k.flops / (m.peak * e.flops_eff[c] * shape);
        const double tm = k.bytes / (m.bw * e.bw_eff[c]);
        mem =
            k.cls == OpClass::Gemm ? bytes_to_flops(k, m, shape) >= gemm_tau : roofline && tm > tc;
        // A GEMM on its bytes side measures the GEMMs' fraction of the bandwidth; attention's
        // is not fitted (its time there stays the estimate's).
        if (mem && k.cls == OpClass::Gemm)
          row[kGemmBandwidthCol] += k.bytes;
        else if (mem)
          target -= tm;
        else
          row[col_of(k.cls)] += k.flops / shape;
      } else {
        row[col_of(k.cls)] += k.bytes;
      }
      d.memory_bound.push_back(mem);
    }
    const double w =
        std::sqrt(double(std::max<int64_t>(1, it.count))) / std::max(1e-12, it.measured_ns * 1e-9);
    for (int j = 0; j < kGpuCols; ++j) {
      if (row[j] > 0) d.used[j] = true;
      d.a.push_back(row[j] * w);
    }
    d.b.push_back(target * w);
  }
  return d;
}

// NNLS on the design with unit-norm columns (unused columns stay 0).
std::vector<double> solve(Design d, size_t rows) {
  std::array<double, kGpuCols> scale{};
  for (int j = 0; j < kGpuCols; ++j) {
    double s = 0;
    for (size_t i = 0; i < rows; ++i) s += d.a[i * kGpuCols + j] * d.a[i * kGpuCols + j];
    scale[j] = s > 0 ? std::sqrt(s) : 0.0;
    for (size_t i = 0; i < rows; ++i)
      d.a[i * kGpuCols + j] = scale[j] > 0 ? d.a[i * kGpuCols + j] / scale[j] : 0.0;
  }
  std::vector<double> x = nnls(d.a, static_cast<int>(rows), kGpuCols, d.b);
  for (int j = 0; j < kGpuCols; ++j) x[j] = scale[j] > 0 ? x[j] / scale[j] : 0.0;
  return x;
}

// An overhead can be told from a rate only when some class has observations of different work
// per launched kernel.
bool overhead_identifiable(const std::vector<GpuItem>& items) {
  std::map<int, std::vector<double>> per_class;
  for (const auto& it : items) {
    if (it.kernels.size() != 1) continue;
    const Kernel& k = it.kernels.front();
    per_class[static_cast<int>(k.cls)].push_back((flop_cls(k.cls) ? k.flops : k.bytes) /
                                                 it.launched);
  }
  for (auto& [c, v] : per_class) {
    if (v.size() < 2) continue;
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    if (*hi > 1.05 * *lo) return true;
  }
  // Multi-kernel observations (Orrery's ops) of more than one shape do too.
  std::set<std::string> shapes;
  for (const auto& it : items)
    if (it.kernels.size() > 1) shapes.insert(it.name + " " + it.shape);
  return shapes.size() > 1;
}

bool has_shaped_gemm(const std::vector<GpuItem>& items) {
  for (const auto& it : items)
    for (const auto& k : it.kernels)
      if (shaped_gemm(k)) return true;
  return false;
}

// The GEMM kernel latency can be told from the per-kernel overhead only where some observation
// launches other kernels than its shaped GEMMs (memory-bound classes, split-K reductions).
bool gemm_latency_identifiable(const std::vector<GpuItem>& items) {
  for (const auto& it : items) {
    double gemms = 0;
    for (const auto& k : it.kernels) gemms += shaped_gemm(k) ? 1.0 : 0.0;
    if (gemms != it.launched) return true;
  }
  return false;
}

struct GpuFit {
  Estimates e;
  std::array<bool, kGpuCols> fitted{};
  std::array<std::string, kGpuCols> why{};
  std::vector<char> memory_bound;  // per (item, kernel) of the last design: priced on its bytes
  int iterations = 0;
};

// The fit's weighted error, Σ count · ((modelled − measured) / measured)², each item priced as
// the design prices it: the overhead per kernel launched, each kernel on its roofline.
double fit_error(const std::vector<GpuItem>& items, const Machine& m, const Estimates& e,
                 const std::vector<double>& effs) {
  double err = 0;
  size_t at = 0;
  for (const auto& it : items) {
    double s = it.launched * e.overhead_s;
    for (const auto& k : it.kernels) {
      const int c = static_cast<int>(k.cls);
      if (m.gemm_latency() && shaped_gemm(k)) s += e.gemm_latency_s;
      const double tm = k.bytes / (m.bw * e.bw_eff[c]);
      const double shape = effs[at++];
      s += flop_cls(k.cls) ? std::max(k.flops / (m.peak * e.flops_eff[c] * shape), tm) : tm;
    }
    const double measured = it.measured_ns * 1e-9;
    err += double(it.count) * std::pow((s - measured) / measured, 2);
  }
  return err;
}

double fit_error(const std::vector<GpuItem>& items, const Machine& m, const Estimates& e) {
  return fit_error(items, m, e, shape_effs(items, m));
}

// The rates under one partition of the GEMM kernels (those with bytes_to_flops >= gemm_tau on
// their bytes side), attention's by the roofline of the current estimates, iterated until its
// partition holds.
void fit_partition(GpuFit& f, const std::vector<GpuItem>& items, const Machine& m,
                   const std::vector<double>& effs, FixedCosts fit, double gemm_tau) {
  std::vector<char> last;
  for (f.iterations = 1; f.iterations <= 10; ++f.iterations) {
    const Design d = design(items, m, effs, f.e, fit, f.iterations > 1, gemm_tau);
    const std::vector<double> x = solve(d, items.size());
    for (int j = 0; j < kGpuCols; ++j) {
      // A latency of 0 is a fit (none); a rate of 0 is not (an infinite efficiency).
      f.fitted[j] = j == 0                 ? fit.overhead
                    : j == kGemmLatencyCol ? fit.gemm_latency && d.used[j]
                                           : d.used[j] && x[j] > 0;
      if (!f.fitted[j]) continue;
      const int c = j == kGemmBandwidthCol ? static_cast<int>(OpClass::Gemm) : j - 1;
      if (j == 0)
        f.e.overhead_s = x[0];
      else if (j == kGemmLatencyCol)
        f.e.gemm_latency_s = x[j];
      else if (j != kGemmBandwidthCol && flop_cls(static_cast<OpClass>(c)))
        f.e.flops_eff[c] = 1.0 / (x[j] * m.peak);
      else
        f.e.bw_eff[c] = 1.0 / (x[j] * m.bw);
    }
    for (int j = 1; j < kGemmLatencyCol; ++j)
      if (d.used[j] && x[j] <= 0)
        f.why[j] = "the fit gives it no time (its kernels are explained by the overhead alone)";
    f.memory_bound = d.memory_bound;
    if (f.iterations > 1 && d.memory_bound == last) break;
    last = d.memory_bound;
  }
}

// The candidate thresholds of the GEMM partition: the GEMM kernels' bytes_to_flops (it and those
// above on their bytes side; at most kMaxThresholds of them, evenly spaced in rank, the largest
// always), and infinity (none).
constexpr size_t kMaxThresholds = 32;
std::vector<double> gemm_thresholds(const std::vector<GpuItem>& items, const Machine& m,
                                    const std::vector<double>& effs) {
  std::vector<double> taus = {std::numeric_limits<double>::infinity()};
  size_t at = 0;
  for (const auto& it : items)
    for (const auto& k : it.kernels) {
      const double shape = effs[at++];
      if (k.cls == OpClass::Gemm) taus.push_back(bytes_to_flops(k, m, shape));
    }
  std::sort(taus.begin(), taus.end());
  taus.erase(std::unique(taus.begin(), taus.end()), taus.end());
  if (taus.size() <= kMaxThresholds) return taus;
  std::vector<double> some;
  for (size_t i = 0; i < kMaxThresholds; ++i)
    some.push_back(taus[taus.size() - 1 - i * (taus.size() - 1) / (kMaxThresholds - 1)]);
  std::reverse(some.begin(), some.end());
  return some;
}

// The fit: per-kernel overhead, GEMM kernel latency and class rates by NNLS. Which GEMMs are on
// their bytes side is not known before their rates are: each candidate threshold's partition is
// fitted, and the one whose rates explain the items best is kept.
GpuFit fit_gpu(const std::vector<GpuItem>& items, const Machine& m, const HardwareProfile& base) {
  GpuFit f;
  for (int c = 0; c < kOpClassCount; ++c) {
    f.e.flops_eff[c] = base.classes[c].flops_efficiency;
    f.e.bw_eff[c] = base.classes[c].bandwidth_efficiency;
  }
  f.e.overhead_s = double(base.classes[0].overhead_ns) * 1e-9;
  if (m.gemm_latency()) f.e.gemm_latency_s = m.shape.kernel_latency_cycles / m.shape.clock_hz;
  if (items.empty()) {
    f.why[0] = "no kernels with shapes";
    return f;
  }
  const bool with_overhead = overhead_identifiable(items);
  const FixedCosts fit{with_overhead, m.gemm_latency() && has_shaped_gemm(items) && with_overhead &&
                                          gemm_latency_identifiable(items)};
  if (m.gemm_latency() && has_shaped_gemm(items) && !fit.gemm_latency)
    f.why[kGemmLatencyCol] =
        "every observation launches its GEMM kernels only: their latency cannot be told from "
        "the per-kernel overhead";
  if (!with_overhead)
    f.why[0] =
        "every observation of a class has the same work per kernel: an overhead cannot be "
        "told from a rate";
  const std::vector<double> effs = shape_effs(items, m);
  GpuFit best;
  double best_err = std::numeric_limits<double>::infinity();
  for (const double tau : gemm_thresholds(items, m, effs)) {
    GpuFit g = f;
    fit_partition(g, items, m, effs, fit, tau);
    const double err = fit_error(items, m, g.e, effs);
    if (err < best_err) best = std::move(g), best_err = err;
  }
  return best;
}

// A fit of one of the shape model's parameters that the times are not linear in.
struct LatencyFit {
  double cycles = 0;  // the parameter's value (cycles, or bytes/s for the L2 rate)
  bool fitted = false;
  std::string why;
};

// The value of a shape model parameter (`field`: the main loop's iteration_latency_cycles, or
// the L2 operand rate l2_bytes_per_s) under which the rates fitted explain the items best. The
// rates are linear given it, it is not: a grid (`grid`, ascending, 0 first: the term off), then a
// golden-section search between the best grid point's neighbours, each point a whole fit of the
// rates. Not fitted where every grid point explains the GEMMs equally well (the term never binds).
LatencyFit fit_shape_parameter(const std::vector<GpuItem>& items, Machine m,
                               const HardwareProfile& base, double GemmShapeModel::*field,
                               const std::vector<double>& grid) {
  LatencyFit out{m.shape.*field, false, {}};
  if (!m.shape.enabled())
    out.why = "no gemm_shape model";
  else if (!(m.shape.clock_hz > 0))
    out.why = "the gemm_shape model has no clock_mhz";
  else if (!has_shaped_gemm(items))
    out.why = "no GEMM kernels with shapes";
  if (!out.why.empty()) return out;
  auto error_at = [&](double v) {
    m.shape.*field = v;
    return fit_error(items, m, fit_gpu(items, m, base).e);
  };
  std::vector<double> errs;
  for (double c : grid) errs.push_back(error_at(c));
  const auto [lo_it, hi_it] = std::minmax_element(errs.begin(), errs.end());
  const size_t b = static_cast<size_t>(lo_it - errs.begin());
  const auto same = [&](double a) { return a - *lo_it <= 1e-9 * std::max(1.0, *lo_it); };
  if (same(*hi_it)) {
    out.why = "every value explains the GEMMs equally well";
    return out;
  }
  // Best with the term off and as good with the grid's largest value: it binds none of the GEMMs
  // there, and any value above where it starts to explains them as well.
  if (b == 0 && same(errs.back())) {
    out.why = "the term binds none of the GEMMs at the grid's largest value";
    return out;
  }
  double lo = grid[b > 0 ? b - 1 : 0], hi = grid[std::min(b + 1, grid.size() - 1)];
  const double phi = (std::sqrt(5.0) - 1) / 2;
  double x1 = hi - phi * (hi - lo), x2 = lo + phi * (hi - lo);
  double f1 = error_at(x1), f2 = error_at(x2);
  for (int i = 0; i < 40; ++i) {  // the bracket shrinks to 0.618^40, 4e-9 of itself
    if (f1 <= f2)
      hi = x2, x2 = x1, f2 = f1, x1 = hi - phi * (hi - lo), f1 = error_at(x1);
    else
      lo = x1, x1 = x2, f1 = f2, x2 = lo + phi * (hi - lo), f2 = error_at(x2);
  }
  const double golden = f1 <= f2 ? x1 : x2;
  out.cycles = std::min(f1, f2) <= *lo_it ? golden : grid[b];
  out.fitted = true;
  return out;
}

// The iteration latency: a log grid of 1 to 8192 cycles (and 0).
LatencyFit fit_latency(const std::vector<GpuItem>& items, const Machine& m,
                       const HardwareProfile& base) {
  std::vector<double> grid = {0};
  for (int i = 0; i <= 26; ++i) grid.push_back(std::pow(2.0, i / 2.0));
  return fit_shape_parameter(items, m, base, &GemmShapeModel::iteration_latency_cycles, grid);
}

// The L2 operand rate (the fill term that narrow loads of unaligned shapes slow down): a log grid
// of 1 to 256 bytes per clock per SM (and 0, off).
LatencyFit fit_fill_rate(const std::vector<GpuItem>& items, const Machine& m,
                         const HardwareProfile& base) {
  std::vector<double> grid = {0};
  for (int i = 0; i <= 16; ++i)
    grid.push_back(std::pow(2.0, i / 2.0) * m.shape.sms * m.shape.clock_hz);
  return fit_shape_parameter(items, m, base, &GemmShapeModel::l2_bytes_per_s, grid);
}

// ---- the traces, the device, the profile

std::string label_of(const traces::Trace& t, size_t i) {
  return t.path.empty() ? "trace " + std::to_string(i + 1) : t.path;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The device preset the traces ran on: --device, else the one their GPU names say.
std::string traces_device(const std::vector<traces::Trace>& ts, const CalibrationOptions& opt) {
  if (!opt.device.empty()) {
    const auto d = device_preset(opt.device);
    if (!d || d->name == "cpu")
      throw InputError("orrery calibrate: --device '" + opt.device +
                       "' is not a GPU preset (A100-SXM-80GB, H100-SXM, H200)");
    return d->name;
  }
  std::set<std::string> presets;
  std::vector<std::string> names;
  for (const auto& t : ts)
    for (const auto& n : traces::recorded_gpu_names(t)) {
      names.push_back(n);
      if (const std::string p = gpu_preset_of(n); !p.empty()) presets.insert(p);
    }
  if (presets.size() == 1) return *presets.begin();
  if (presets.size() > 1)
    throw InputError("orrery calibrate: the traces ran on different GPUs (" + join(names) +
                     "): calibrate one device at a time, or name it with --device");
  throw InputError("orrery calibrate: the traces do not say which GPU they ran on" +
                   (names.empty() ? std::string() : " (" + join(names) + ": no device preset)") +
                   "; give --device A100-SXM-80GB, H100-SXM or H200");
}

// The FLOPs of the items with a known operand size (GEMM and attention), by that size, and of the
// 4-byte ones those that ran on TF32 tensor-core kernels.
struct FlopsBySize {
  std::map<int32_t, double> by_size;
  double tf32 = 0;
};
FlopsBySize flops_by_size(const std::vector<GpuItem>& items) {
  FlopsBySize f;
  for (const auto& it : items)
    if (it.elem_bytes > 0)
      for (const auto& k : it.kernels) {
        f.by_size[it.elem_bytes] += k.flops * double(it.count);
        if (it.tf32) f.tf32 += k.flops * double(it.count);
      }
  return f;
}

// The precision of the GEMMs (FLOP-weighted operand size: 2 bytes bf16, 4 fp32, or tf32 when most
// of the 4-byte FLOPs ran on TF32 tensor-core kernels); a CUDA run's runtime.precision when no
// observation says; bf16 otherwise.
Precision items_precision(const std::vector<GpuItem>& items, const std::vector<traces::Trace>& ts) {
  const FlopsBySize f = flops_by_size(items);
  if (!f.by_size.empty()) {
    const auto best = std::max_element(f.by_size.begin(), f.by_size.end(),
                                       [](auto& a, auto& b) { return a.second < b.second; });
    if (best->first <= 2) return Precision::BF16;
    return f.tf32 > 0.5 * best->second ? Precision::TF32 : Precision::FP32;
  }
  for (const auto& t : ts)
    if (const auto p = precision_from_string(t.meta.layout.precision)) return *p;
  return Precision::BF16;
}

struct Observations {
  std::vector<GpuItem> items;
  std::vector<std::string> notes;
};

Observations observe(const std::vector<traces::Trace>& ts, const CalibrationOptions& opt) {
  Observations o;
  std::set<std::string> unknown;
  for (size_t i = 0; i < ts.size(); ++i) {
    std::vector<GpuItem> got;
    if (!traces::read_kernel_work(ts[i]).empty())
      got = imported_items(ts[i], i, unknown);
    else if (!ts[i].meta.scenario_text.empty())
      got = orrery_gpu_items(ts[i], i, opt.skip_steps, o.notes);
    if (got.empty())
      o.notes.push_back(label_of(ts[i], i) +
                        ": no kernel with its operator's shapes (import a PyTorch profile recorded "
                        "with record_shapes=True, or give a trace of `orrery run` on cuda)");
    for (auto& g : got) o.items.push_back(std::move(g));
  }
  for (const auto& u : unknown)
    o.notes.push_back("kernel work of class '" + u + "' is not a simulator op class: left out");
  return o;
}

// Drops the GEMM and attention observations of another operand size than `p`'s.
void keep_precision(Observations& o, Precision p) {
  const int32_t want = p == Precision::FP32 || p == Precision::TF32 ? 4 : 2;
  int64_t dropped = 0;
  std::vector<GpuItem> kept;
  for (auto& it : o.items) {
    if (it.elem_bytes > 0 && it.elem_bytes != want)
      dropped += it.count;
    else
      kept.push_back(std::move(it));
  }
  o.items = std::move(kept);
  if (dropped > 0)
    o.notes.push_back(std::to_string(dropped) + " GEMM / attention op(s) with " +
                      (want == 2 ? "other than 16-bit" : "other than 32-bit") +
                      " operands left out (the profile describes one precision, " +
                      std::string(to_string(p)) + ")");
}

// TF32: the share of the 4-byte GEMM FLOPs that ran on CUDA-core kernels, fitted against the
// TF32 peak all the same (the simulator prices a TF32 run's GEMMs so).
void note_tf32(Observations& o) {
  const FlopsBySize f = flops_by_size(o.items);
  const auto four = f.by_size.find(4);
  const double all = four == f.by_size.end() ? 0.0 : four->second, cuda_cores = all - f.tf32;
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.1f", all > 0 ? 100.0 * cuda_cores / all : 0.0);
  o.notes.push_back(
      "the 32-bit GEMMs ran on TF32 tensor-core kernels (their names say so): fitted against the "
      "TF32 peak; " +
      std::string(pct) + " % of their FLOPs ran on CUDA-core kernels (sgemm), priced so too");
}

const char* kParamNames[kGpuCols] = {
    "overhead_us",
    "gemm.flops_efficiency",
    "attention.flops_efficiency",
    "elementwise.bandwidth_efficiency",
    "layernorm.bandwidth_efficiency",
    "softmax_loss.bandwidth_efficiency",
    "optimizer.bandwidth_efficiency",
    "gemm.bandwidth_efficiency",
    "gemm_shape.kernel_latency_cycles",
};

const char* kNoKernels[kGpuCols] = {
    "no kernels",
    "no GEMM kernels (aten::mm, addmm, bmm, linear, matmul) with shapes",
    "no fused attention kernels (scaled_dot_product flash / efficient / cudnn) with shapes",
    "no elementwise kernels (add, mul, gelu, ...) with shapes",
    "no norm kernels (layer_norm, rms_norm) with shapes",
    "no softmax or loss kernels with shapes",
    "no optimizer kernels (_fused_adam(w)_, _foreach_*) with shapes",
    "no GEMM kernel on the bytes side of its roofline",
    "no GEMM kernels with shapes under a gemm_shape model with a clock",
};

// The profile's numbers from the fit (the preset's where not fitted), and the rows saying so.
std::vector<GpuFitRow> apply_fit(const GpuFit& f, const std::vector<GpuItem>& items,
                                 const std::vector<traces::Trace>& ts, HardwareProfile& p,
                                 std::vector<std::string>& notes) {
  std::vector<GpuFitRow> rows(kGpuCols);
  std::array<std::set<std::string>, kGpuCols> from;
  size_t at = 0;  // (item, kernel) index into f.memory_bound
  for (const auto& it : items) {
    rows[0].kernels += int64_t(it.launched) * it.count;
    from[0].insert(label_of(ts[it.trace], it.trace));
    for (const auto& k : it.kernels) {
      const int64_t n = int64_t(it.launched) * it.count / int64_t(it.kernels.size());
      if (shaped_gemm(k)) {
        rows[kGemmLatencyCol].kernels += n;
        from[kGemmLatencyCol].insert(label_of(ts[it.trace], it.trace));
      }
      // A GEMM or attention kernel on the bytes side of its roofline says nothing of its rate;
      // a GEMM's measures the GEMMs' bandwidth.
      const bool mem = at < f.memory_bound.size() && f.memory_bound[at++];
      const int col = !mem ? col_of(k.cls) : k.cls == OpClass::Gemm ? kGemmBandwidthCol : -1;
      if (col < 0) continue;
      rows[col].kernels += n;
      from[col].insert(label_of(ts[it.trace], it.trace));
    }
  }
  for (int j = 0; j < kGpuCols; ++j) {
    GpuFitRow& r = rows[j];
    r.parameter = kParamNames[j];
    r.fitted = f.fitted[j];
    r.traces.assign(from[j].begin(), from[j].end());
    const int c = j == kGemmBandwidthCol ? static_cast<int>(OpClass::Gemm) : j - 1;
    // The FLOP rate of a GEMM or attention column, else a bandwidth.
    const bool flop_rate = j != kGemmBandwidthCol && flop_cls(static_cast<OpClass>(c));
    if (r.fitted && j == 0) {
      const int64_t ns = std::llround(f.e.overhead_s * 1e9);
      for (auto& cc : p.classes) cc.overhead_ns = ns;
    } else if (r.fitted && j == kGemmLatencyCol) {
      p.gemm_shape.kernel_latency_cycles = f.e.gemm_latency_s * p.gemm_shape.clock_hz;
    } else if (r.fitted) {
      double& v = flop_rate ? p.classes[c].flops_efficiency : p.classes[c].bandwidth_efficiency;
      const double fitted = flop_rate ? f.e.flops_eff[c] : f.e.bw_eff[c];
      if (fitted > 1.0)
        notes.push_back(std::string(kParamNames[j]) + " fitted " + std::to_string(fitted) +
                        " > 1 (faster than the datasheet peak: is --device right?): 1 written");
      v = std::min(1.0, fitted);
    } else {
      r.why = !f.why[j].empty() ? f.why[j] : kNoKernels[j];
      r.kernels = 0;
      notes.push_back(std::string(kParamNames[j]) + " not fitted (" + r.why + "): kept the " +
                      p.device + " default");
    }
    r.value = j == 0                 ? double(p.classes[0].overhead_ns) / 1e3
              : j == kGemmLatencyCol ? p.gemm_shape.kernel_latency_cycles
              : flop_rate            ? p.classes[c].flops_efficiency
                                     : p.classes[c].bandwidth_efficiency;
  }
  return rows;
}

// The latency's row: fitted from the GEMM kernels the ceiling was (`gemm`, apply_fit's row), or
// why it was not.
GpuFitRow latency_row(const LatencyFit& l, const GpuFitRow& gemm, const HardwareProfile& p,
                      std::vector<std::string>& notes, bool fill = false) {
  GpuFitRow r;
  r.parameter = fill ? "gemm_shape.l2_bandwidth_gbps" : "gemm_shape.iteration_latency_cycles";
  r.value = fill ? p.gemm_shape.l2_bytes_per_s / 1e9 : p.gemm_shape.iteration_latency_cycles;
  r.fitted = l.fitted;
  r.why = l.why;
  if (l.fitted) r.kernels = gemm.kernels, r.traces = gemm.traces;
  if (!l.fitted)
    notes.push_back(r.parameter + " not fitted (" + r.why + "): kept the " + p.device + " default");
  return r;
}

// Measured against fitted, per observation (the real cost model on the profile).
void report_items(const std::vector<GpuItem>& items, const HardwareProfile& p, const Machine& m,
                  CalibrationResult& out) {
  const CostModel cm(p, m.peak, m.bw);
  double num = 0, den = 0;
  for (const auto& it : items) {
    double ns = 0;
    for (const auto& k : it.kernels) ns += double(cm.kernel_ns(k));
    ns += (it.launched - double(it.kernels.size())) * double(p.classes[0].overhead_ns);
    OpFitRow r{it.name, it.shape, it.count, it.measured_ns, ns};
    const double w = double(it.count) * it.measured_ns;
    num += w * std::pow(r.error_pct() / 100.0, 2);
    den += w;
    out.ops.push_back(std::move(r));
  }
  out.compute_rel_rms = den > 0 ? std::sqrt(num / den) : 0.0;
}

// --check: the traces' kernels priced with `given` at the traces' precision (its efficiencies are
// fractions of that precision's peak, as when the simulator runs a job of that precision).
CalibrationResult check_profile(const HardwareProfile& given, const Observations& obs,
                                const std::vector<traces::Trace>& ts, const Device& dev,
                                const std::string& preset, Precision prec) {
  CalibrationResult out;
  out.profile = given;
  out.profile.precision = prec;
  out.notes = obs.notes;
  out.notes.push_back("--check: the " + std::to_string(ts.size()) +
                      " trace(s) priced with profile '" + given.name + "' at " +
                      std::string(to_string(prec)) + ", nothing fitted");
  if (given.device != preset)
    out.notes.push_back("the profile is for " + given.device + ", the traces ran on " + preset +
                        " (its peaks are the traces' device's)");
  const Machine m{dev.peak_flops(prec), dev.mem_bandwidth_bytes_per_s, given.gemm_shape};
  report_items(obs.items, out.profile, m, out);
  return out;
}

}  // namespace

CalibrationResult calibrate_gpu(const std::vector<traces::Trace>& all,
                                const CalibrationOptions& opt) {
  // Host offload's adamw spans hold the copies and the host's steps: fitted apart, not as kernels.
  const HostOffloadFit host = fit_host_offload(all, opt.skip_steps);
  const std::vector<traces::Trace> ts = without_offload_adamw(all);
  CalibrationResult out;
  const std::string preset = traces_device(ts, opt);
  const Device dev = *device_preset(preset);
  Observations obs = observe(ts, opt);
  const Precision prec = items_precision(obs.items, ts);
  keep_precision(obs, prec);
  if (prec == Precision::TF32) note_tf32(obs);
  HardwareProfile& p = out.profile;
  if (opt.check) return check_profile(*opt.check, obs, ts, dev, preset, prec);
  p = default_hardware_profile(preset, true);
  p.name = opt.name;
  p.precision = prec;
  if (opt.flat_gemm) p.gemm_shape = {};
  Machine m{dev.peak_flops(prec), dev.mem_bandwidth_bytes_per_s, p.gemm_shape};
  // Coordinate descent over the two (they trade off: both slow the small tiles most): the
  // latency, the L2 rate at it, and again, until neither moves by 0.1 % (at most 8 rounds).
  LatencyFit lat, fill{m.shape.l2_bytes_per_s, false, {}};
  for (int round = 0; round < 8; ++round) {
    const double was_lat = m.shape.iteration_latency_cycles, was_fill = m.shape.l2_bytes_per_s;
    lat = fit_latency(obs.items, m, p);
    m.shape.iteration_latency_cycles = lat.cycles;
    fill = fit_fill_rate(obs.items, m, p);
    m.shape.l2_bytes_per_s = fill.cycles;
    const auto still = [](double a, double b) { return std::fabs(a - b) <= 1e-3 * std::fabs(b); };
    if (round > 0 && still(lat.cycles, was_lat) && still(fill.cycles, was_fill)) break;
  }
  p.gemm_shape.iteration_latency_cycles = m.shape.iteration_latency_cycles;
  p.gemm_shape.l2_bytes_per_s = m.shape.l2_bytes_per_s;
  const GpuFit f = fit_gpu(obs.items, m, p);
  out.notes = obs.notes;
  out.gpu = apply_fit(f, obs.items, ts, p, out.notes);
  out.gpu.push_back(latency_row(lat, out.gpu[col_of(OpClass::Gemm)], p, out.notes));
  out.gpu.push_back(latency_row(fill, out.gpu[col_of(OpClass::Gemm)], p, out.notes, true));
  std::vector<std::string> labels;
  for (size_t i = 0; i < ts.size(); ++i) labels.push_back(label_of(ts[i], i));
  p.machine = {{"source", "orrery calibrate from GPU traces: " + join(labels)}, {"gpus", preset}};
  if (opt.flat_gemm)
    out.notes.push_back("--flat-gemm: every GEMM fitted at one rate (no gemm_shape model)");
  apply_host_offload(host, p, &out.gpu, out.notes);
  report_items(obs.items, p, m, out);
  return out;
}

}  // namespace detail
}  // namespace orrery::sim
