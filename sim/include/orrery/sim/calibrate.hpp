// Calibration: fits, from real traces of `orrery run`, the hardware profile the simulator uses
// (hardware.hpp), so that `orrery sim SCENARIO --hw PROFILE` predicts the machine the traces came
// from.
//
// What is fitted, and how (all least squares on medians over the counted steps, steps after the
// first `skip_steps`):
//
//  1. Core sharing. Ranks of one run share the node's cores. For every trace with R ranks on the
//     node, the slowdown f(R) = Σ_op n_op · median_R(op) / Σ_op n_op · median_1(op) over the
//     compute ops it shares with the lone-rank (R = 1) trace. The law the simulator applies
//     (core_sharing.hpp's compute_slowdown): with u = R · threads / cores,
//        u <= 1:  f(R) = 1 + (c − 1) · (R·threads − 1) / (cores − 1)   (memory, polling contention)
//        u >  1:  f(R) = c · u^e                                       (time slicing of the cores)
//     c = contention_at_full is f measured at u = 1 (or extrapolated linearly from the u < 1
//     traces; not clamped at 1: on a machine shared with other work the crowded run can be the
//     faster one, and the profile then predicts what the calibration runs showed), e =
//     oversubscription_exponent fitted from traces with u > 1 (log-log least squares), 1 (fair time
//     slicing) without any. Collectives slow down by u^comm_exponent beyond the cores
//     (comm_slowdown; exponent 1 unless fitted from a trace with u > 1).
//
//  2. Compute. Every compute or optimizer span is mapped to the simulator's kernel list of the
//     same op (cost_model.hpp: the same names, pieces and shapes), divided by its trace's f(R),
//     then non-negative least squares on the kernels' totals per op class fits
//        t(op) = Σ_k [ flops_k · s_class   (gemm, attention: seconds per FLOP)
//                    + bytes_k · s_class   (elementwise, layernorm, softmax_loss, optimizer: /byte)
//                    + overhead_class ]    (per-kernel overhead per class, ridge-penalised)
//     weighting each op by its share of the step (relative errors, weighted by time). The achieved
//     FLOP/s of a kernel, flops / (flops · s + overhead), thus falls with its size: GEMM FLOP/s as
//     a function of shape. The profile stores peak_flops = 1 / min s (compute classes) with each
//     class's efficiency relative to it, and memory_bandwidth likewise. The unexplained remainder
//     of a step (host work between ops, data loading) becomes data_load (per micro-batch). The
//     measured ops themselves (median lone-rank time per op and shape) go into the profile's `ops:`
//     list too: the simulator then costs an op at a measured shape at its measured time and other
//     shapes (tp shards, other micro-batches) at the nearest measured time scaled by the fitted
//     roofline's ratio (CostModel::named_op_ns), so the class fit only has to get ratios right.
//
//  2b. Host compute beyond the model's kernels (hardware.hpp's HostComputeRates). A run at a 16-bit
//     runtime.precision (bf16, fp16 on the CPU) fits only its format's rounding: each of its ops
//     (its median over the run's law slowdown) minus the same op of the fp32 runs (the pooled
//     lone-rank time), over the op's rounded elements (rounded_elements), count-weighted:
//        ns per element = Σ count · (t16 − t32) / Σ count · elements.
//     Its ops stay out of every other fit (slowdowns, class rates, ops:, spread). A run with
//     parallel.grad_compression (dp > 1) fits its scheme: the ddp.compress / ddp.decompress spans
//     of the counted steps, each divided by span_factor (its run's slowdown and the progress
//     threads in flight), summed per op, over the units of the same ops (the simulator's workload
//     of that run's scenario built at 1 ns per unit):  ns per unit = Σ time / Σ units.
//     Both kinds of run fit only these rates: they stay out of the sharing law, the class fit, the
//     measured ops, the spread and the collectives (a compression run's own measured slowdown
//     still normalises its spans), so the fp32 profile is the same with or without them.
//     Schemes and formats no run measures keep the roofline estimate, with a note.
//     Offload (calibrate_offload.hpp; hardware.hpp's OffloadLinks): the NVMe pair from
//     offload.read / offload.write spans, the host link from offload.d2h / offload.h2d spans
//     (bytes over busy time per run, byte-weighted over runs), the host AdamW bandwidth from
//     offload.adamw spans (kHostAdamWBytesPerParam per element over busy time, times the run's
//     ranks on a node) or, without any, from the runs' own adamw spans (the parameters each rank
//     updates): the CPU's adamw_update is the host step of ZeRO-Offload on a GPU machine with this
//     CPU. Offload runs' adamw spans (waits for the disk or the copies) leave the compute fit.
//
//  3. Collectives. Spans are grouped by (communicator, sequence number) across ranks; a
//     collective's transfer time is min(end) − max(start) over its members (the time after the
//     last member arrived). Per op and group size n, t = α + β · bytes · busbw_factor(op, n) is
//     fitted (α, β >= 0), divided by comm_slowdown(R). α is split into per-step latencies a = α /
//     steps(op, n) (ring all-reduce 2(n−1) steps, reduce-scatter / all-gather / broadcast n−1, send
//     1), so the profile gives collective overrides for every op and group size up to
//     ranks_per_node: measured where the traces have that (op, n), else steps(op, n) · a with the
//     busbw 1/β of the nearest measured op. Point-to-point transfers count too (the k-th send from
//     A to B matched with B's k-th receive from A: the receive's end minus the later post), as op
//     `send` over 2 ranks. Commbench traces (`orrery commbench`, runtime/commbench.hpp: meta
//     extra_json kind "commbench"; collectives only, every step counted) add a measured TABLE per
//     (op, n, R = ranks of that sweep on the node): the median per size of max(end) − max(start)
//     (its members issue together; the simulator completes all members at once), made
//     non-decreasing in size. profile_for_ranks keeps the tables of the simulated run's own R, so
//     what crowding costs the collectives is measured, not extrapolated; the generic fits above
//     serve the (op, n, R) no sweep measured.
//
//  3b. Spread: rank_jitter, the pooled relative spread of each rank's per-step compute total
//     against its step's mean over the ranks (multi-rank runs, R − 1 degrees of freedom per step);
//     op_jitter, the time-weighted relative standard deviation of each (rank, op, layer)'s repeated
//     times. The executor applies both deterministically (executor.hpp's
//     ExecutorOptions::rank_jitter/op_jitter). And the sharing weights: comm_thread_weight from
//     compute spans with collectives in flight against the same ops without; comm_compute_weight
//     from training collectives whose members were computing against the commbench table of the
//     same (op, n, R).
//
//  4. The machine: `cluster:` (device cpu with the fitted peak and bandwidth, ranks_per_node, the
//     rank-to-rank link with the fitted per-step latency and busbw) and `sharing:`.
//
//  5. GPU traces (issue 17): when the traces are GPU traces (imported Kineto traces with kernel
//     work, kernel_work.hpp; Orrery's own CUDA traces, runtime.device cuda), none of the above: the
//     device preset's default profile (hardware.hpp) is the start, and a GPU fit replaces what the
//     traces measure. Observations are operators at one shape each (an imported op instance's
//     kernels summed, the median over instances of that op and shape; Orrery's op spans with the
//     cost model's kernels). Each takes
//        t = n · o + g · l + Σ_k [ flops_k / shape_k · s_class   (gemm, attention: seconds per FLOP)
//                                | bytes_k · s_class ]            (elementwise, layernorm, softmax_loss,
//                                                                  optimizer: seconds per byte)
//     with n the kernels it launched, o the per-kernel overhead (launch, ramp and tail: the
//     intercept of time against work), g its GEMM kernels and l their kernel latency (the shape
//     model's kernel_latency_cycles: the prologue and epilogue every GEMM kernel pays once),
//     shape_k the gemm_shape efficiency of the GEMM's (M, N, K) (1 for attention, and for every
//     GEMM with `flat_gemm`). Non-negative least squares on relative errors (each observation
//     weighted by the square root of its instances). A GEMM on the memory side of its roofline
//     is priced by its bytes at the GEMMs' own bandwidth, a column of its own (gemm's
//     bandwidth_efficiency: skinny products reach a fraction of HBM bandwidth of their own). Which
//     GEMMs are there is one threshold on their bytes-to-FLOPs time ratio at the peaks (it is
//     bandwidth_efficiency / flops_efficiency); each candidate threshold is fitted and the one
//     with the least error kept. An attention kernel the current estimate puts on its memory side
//     is priced at the preset's bandwidth efficiency instead (its time subtracted), and the fit
//     repeats until that split stops changing. The profile's numbers: flops_efficiency =
//     1 / (s · peak) (for gemm the ceiling the shape model scales), bandwidth_efficiency =
//     1 / (s · bandwidth), every class's overhead_us = o, kernel_latency_cycles = l · clock, with
//     the datasheet peaks of the device preset at the precision of the GEMMs (16-bit operands:
//     bf16; 32-bit: fp32). o is fitted only when some class has observations of more than one
//     size per kernel (else an overhead cannot be told from a rate), l only when some
//     observation launches other kernels than its GEMMs (memory-bound classes, split-K
//     reductions; else l cannot be told from o). shape_k depends on the GEMM main loop's
//     iteration latency (GemmShapeModel::iteration_latency_cycles) and on the L2 operand rate
//     (l2_bytes_per_s, which the narrow loads of unaligned shapes divide: cost_model.hpp
//     gemm_load_bytes), which are not linear in t: each is searched (a log grid, of 1 to 8192
//     cycles and 0, or of 1 to 256 bytes per clock per SM and 0, then a golden-section search
//     between the best point's neighbours), the rates fitted as above at each point, and the
//     value whose fit has the least weighted squared relative error kept; the two searches
//     alternate until neither moves by 0.1 % (at most 8 rounds). A rate the GEMMs never feel (as
//     good off as at 256 bytes per clock) is not fitted. Whatever the traces do not measure keeps
//     the preset's default,
//     with a note naming it; the YAML says per parameter which traces and how many kernels fitted
//     it. With `check` nothing is fitted: the observations are priced with that profile. A run
//     with host offload (Orrery's CUDA traces) adds the rows offload.host_link_gbps and
//     offload.host_adamw_gbps (as in 2b; "kernels" then counts spans), its adamw spans left out.
//
// The simulator (sweep.hpp's simulate, i.e. `orrery sim`) applies the law dynamically: the node's
// cores are a processor-sharing server (ExecutorOptions::core_sharing), each computing rank running
// at 1 / compute_slowdown(n) while n ranks of the node compute at that instant, so ranks idle in a
// pipeline bubble or waiting for a collective free their share; collectives are scaled by
// comm_slowdown(R) (profile_for_ranks with scale_compute = false). profile_for_ranks with
// scale_compute = true is the static form (efficiencies ÷ f(R), overheads and data loading × f(R)),
// used by `orrery replay`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "orrery/sim/cluster.hpp"
#include "orrery/sim/core_sharing.hpp"  // the law the calibration fits and profile_for_ranks applies
#include "orrery/sim/cost_model.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery {
struct Scenario;
}

namespace orrery::sim {

// ---- the fitting maths (unit-tested on synthetic data with known parameters) ----

// Non-negative least squares: x >= 0 minimising |A x − b|² (Lawson–Hanson active set). A is
// row-major rows × cols. Exact for consistent systems with a unique non-negative solution.
std::vector<double> nnls(const std::vector<double>& a, int rows, int cols,
                         const std::vector<double>& b);

// y = intercept + slope · x, both >= 0, least squares (weights optional, same length as x).
struct AffineFit {
  double intercept = 0;
  double slope = 0;
  double r2 = 0;  // coefficient of determination (1 when exact)
  int points = 0;
};
AffineFit fit_affine_nonneg(const std::vector<double>& x, const std::vector<double>& y,
                            const std::vector<double>& w = {});

// Latency steps of an algorithm for op over n ranks (ring for all-reduce: 2(n−1); reduce-scatter,
// all-gather, broadcast, reduce: n−1; all-to-all, send, recv: 1).
int latency_steps(traces::CollOp op, int n);

// ---- a calibrated profile in the simulator (the core-sharing law itself: core_sharing.hpp) ----

// The profile as `ranks_on_node` ranks sharing a node see it (unchanged without a sharing model).
// With scale_compute false only the collectives are scaled: the executor then shares the cores
// among the ranks computing at each instant (ExecutorOptions::core_sharing), as `orrery sim` does.
HardwareProfile profile_for_ranks(const HardwareProfile& p, int ranks_on_node,
                                  bool scale_compute = true);

// Ranks of a scenario that share one node of the cluster (ranks fill nodes in order).
int ranks_on_node(const Scenario& s, const Cluster& c);

// The cluster a calibrated profile describes (its `cluster:` section), with at least `min_ranks`
// rank slots (nodes added when needed). InputError when the profile has no `cluster:` section.
Cluster cluster_from_profile(const HardwareProfile& p, int min_ranks = 0);

// ---- calibration ----

struct CalibrationOptions {
  std::string name = "calibrated";
  int cores = 0;  // cores per node; 0 = this machine's (std::thread::hardware_concurrency)
  int threads_per_rank = 0;  // 0 = the traces' runtime.threads (scenario), else 1
  int skip_steps = 1;        // warm-up steps left out
  int ranks_per_node = 8;    // rank slots of the described machine (at least the largest run)
  int64_t memory_capacity_bytes = 0;  // per rank slot; 0 = this machine's memory / ranks_per_node
  // Write the measured lone-rank op times (the profile's `ops:`), see step 2.
  bool measured_ops = true;
  // GPU traces (step 5): the device preset they ran on when the traces do not name it
  // (A100-SXM-80GB, H100-SXM, H200); "" = from the traces' GPU names.
  std::string device;
  // GPU traces: fit every GEMM at one flat rate (no shape model), for comparison.
  bool flat_gemm = false;
  // GPU traces: price the traces' kernels with this profile instead of fitting one (a held-out
  // check of a profile, calibrated or preset); the result's profile is this one, its ops rows that
  // profile's times, and no parameter row.
  std::optional<HardwareProfile> check;
};

// One fitted op: the median measured time (normalised to a lone rank) and the fitted profile's time
// (the real CostModel on the profile), over the calibration traces.
struct OpFitRow {
  std::string name;   // "fwd.block", "bwd.head[1/3]" (piece of a tp block), "adamw"
  std::string shape;  // "b8 t128 c256 v8192 tp1"
  int64_t count = 0;  // spans
  double measured_ns = 0;
  double fitted_ns = 0;
  double error_pct() const {
    return measured_ns > 0 ? 100.0 * (fitted_ns - measured_ns) / measured_ns : 0;
  }
};

struct CollFitRow {
  traces::CollOp op = traces::CollOp::AllReduce;
  int ranks = 0;                 // group size
  int ranks_on_node = 0;         // ranks of the run
  int points = 0;                // collectives
  double latency_ns = 0;         // α
  double busbw_bytes_per_s = 0;  // 1/β
  double r2 = 0;
};

struct SharingRow {
  std::string trace;
  int ranks = 0;
  double factor = 1;  // measured compute slowdown vs the lone rank
  double model = 1;   // compute_slowdown of the fitted law
};

// A parameter of a GPU fit (step 5): its value and where it came from.
struct GpuFitRow {
  std::string parameter;  // "gemm.flops_efficiency", "overhead_us", ...
  double value = 0;
  bool fitted = false;              // false: the preset's default kept
  int64_t kernels = 0;              // kernels that fitted it
  std::vector<std::string> traces;  // the traces they came from
  std::string why;                  // not fitted: why
};

struct CalibrationResult {
  HardwareProfile profile;
  std::vector<OpFitRow> ops;
  std::vector<CollFitRow> collectives;
  std::vector<SharingRow> sharing;
  double compute_rel_rms = 0;      // time-weighted relative RMS error of the compute fit
  std::vector<std::string> notes;  // what could not be fitted and what was assumed instead
  std::vector<GpuFitRow> gpu;      // GPU traces: the fitted (or kept) parameters
};

// A GPU trace (step 5): one with kernel work (traces/kernel_work.hpp) or from a CUDA run.
bool is_gpu_trace(const traces::Trace& t);
// The device preset of a GPU's name ("NVIDIA H100 80GB HBM3" -> "H100-SXM", "NVIDIA A100-SXM4-80GB"
// -> "A100-SXM-80GB", "NVIDIA H200" -> "H200"); "" when none matches.
std::string gpu_preset_of(const std::string& gpu_name);

// Fits a profile from real traces (each with its scenario in meta.scenario_text; GPU traces: step
// 5, imported ones need none). InputError when no trace has compute spans the simulator knows, a
// CPU trace has no scenario, CPU and GPU traces are mixed, or the GPU is not known.
CalibrationResult calibrate(const std::vector<traces::Trace>& traces,
                            const CalibrationOptions& opt = {});

// The profile as documented YAML (comments explaining every section, then hardware.hpp's keys).
std::string calibrated_yaml(const CalibrationResult& r);

}  // namespace orrery::sim
