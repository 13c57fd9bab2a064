// One simulated training step of a scenario on a cluster (what `orrery sim` prints), and scaling
// sweeps over cluster sizes with an optional layout search (what `orrery sweep` prints).
//
// Breakdown of a step, per simulated rank over the step's window [earliest op start, latest op end
// over all simulated ranks], then averaged over the simulated ranks (one per stage by default: every
// stage has the same number of ranks, so this is the mean over all ranks) and the counted steps.
// The definition is compute_metrics' (profiler::account_step), applied to the ops from start to end
// as the simulated trace's spans, so `orrery report` of that trace gives the same figures:
//   compute      = |C|, C = compute and optimizer ops (merged intervals)
//   exposed tp   = |TP \ C|
//   exposed dp   = |DP \ (C ∪ TP)|            gradient all-reduce / reduce-scatter / all-gather,
//                                             ZeRO-3 gathers, tied-embedding all-reduce
//   bubble       = window - |C ∪ TP ∪ DP| when pp > 1 (waiting for other stages), else 0
//   idle         = the same when pp = 1 (data loading, waiting for peers), else 0
//   exposed pp   = |PP \ (C ∪ TP ∪ DP)|, point-to-point transfers and the waits they cover: part
//                  of the bubble, not added to it
//   exposed ep   = |EP \ (C ∪ TP)|, the expert-parallel all-to-alls (moe.dispatch, moe.combine and
//                  their backward, model/moe.hpp): part of exposed dp (a collective outside tp,
//                  as the report counts it), not added to it
// so compute + exposed tp + exposed dp + bubble + idle = the step window. A collective counts from
// its start, as a blocking call's span does: waiting for a late member is exposed communication.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/sim/cluster.hpp"
#include "orrery/sim/executor.hpp"
#include "orrery/sim/hardware.hpp"
#include "orrery/sim/memory.hpp"
#include "orrery/sim/network.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::sim {

struct SimOptions {
  NetworkModel network = NetworkModel::Flow;
  bool all_ranks = false;
  int steps = 1;
  std::string precision;  // fp32 | mixed; "" = from the profile (bf16/fp16 -> mixed)
  std::optional<HardwareProfile> profile;  // none: default_hardware_profile(cluster device)
  bool keep_trace = false;                 // build the simulated trace (SimResult::trace)
  // all_ranks: tp rank 0 of each group stands for its peers where that is exact (the executor's
  // rail symmetry, executor.hpp); false simulates every rank literally (a check).
  bool rail_symmetry = true;
};

struct StepBreakdown {
  double window_ns = 0;
  double compute_ns = 0;
  double exposed_tp_ns = 0;
  double exposed_dp_ns = 0;
  double exposed_pp_ns = 0;
  double exposed_ep_ns = 0;
  double bubble_ns = 0;
  double idle_ns = 0;
};

struct SimResult {
  int dp = 1, tp = 1, pp = 1, zero = 0, micro_batch = 1, micro_batches = 1;
  // zero.offload_optimizer / offload_params ("none", "nvme", "nvme+params") and
  // parallel.grad_compression of the simulated layout (a --search may pick them).
  std::string offload = "none";
  std::string grad_compression = "none";
  int ep = 1;        // parallel.ep
  bool moe = false;  // model.moe.experts > 0 (the report then shows ep and the all-to-alls)
  std::string schedule;
  std::string precision;
  std::string profile_name;
  int64_t step_time_ns = 0;  // mean over the simulated steps (the first skipped when steps > 1)
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;           // model FLOP/s per GPU / 1e12
  double mfu = 0;                      // model FLOP/s per GPU / peak
  double peak_flops = 0;               // per GPU, the precision's
  StepBreakdown breakdown;             // per step, mean over simulated ranks
  std::vector<MemoryEstimate> memory;  // per stage
  std::vector<StageCompute> stages;    // per stage: layers, compute time and FLOPs of one rank
  double peak_memory_bytes = 0;        // max over stages
  bool fits = true;
  int64_t capacity_bytes = 0;
  size_t simulated_ranks = 0;
  size_t copied_ranks =
      0;           // ranks whose timelines are exact copies of a simulated one's (rail symmetry)
  size_t ops = 0;  // ops executed (over the simulated ranks)
  uint64_t events = 0;  // engine events
  double wall_s = 0;    // host time of build + execution
  std::optional<traces::Trace> trace;
};

// Adapts the scenario's layout to the cluster: unchanged when dp·tp·pp equals its GPU count,
// otherwise dp = GPUs / (tp·pp) when that divides. InputError when tp·pp does not divide the
// cluster, or the layout does not fit the model (heads, layers, batch: validate_layout).
Scenario fit_layout(Scenario s, const Cluster& c);

// The most transformer blocks (model.layers) the simulator takes: 100 times the deepest published
// transformer (DeepNet, 1,000 layers; GPT-3 has 96). Documented in scenarios/README.md.
inline constexpr int kMaxSimulatedLayers = 100'000;

// What a simulation would hold in host memory, estimated in closed form before anything is built:
// the stage programs (workload_ops_bound ops each, with their deps and stream lists, vectors up to
// twice their size while growing), the executor's state per simulated rank and op, the step
// breakdown's intervals, the simulated trace's spans (keep_trace), and the cluster (its topology,
// network and per-GPU tables: ~300 bytes a GPU measured, counted at 512).
struct SimulationSize {
  int64_t world = 0;            // dp x tp x pp, in int64
  int64_t simulated_ranks = 0;  // one per stage, or the world (every_rank)
  double ops_per_stage = 0;     // workload_ops_bound
  double bytes = 0;
};
// rail_copies: the ranks one simulated rank stands for when every rank is asked for (tp with the
// executor's rail symmetry, rail_copies below; 1 without): the executor then simulates world /
// rail_copies ranks, while the trace (keep_trace) still holds every rank's spans.
SimulationSize estimate_simulation_size(const Scenario& s, int steps, bool every_rank,
                                        bool keep_trace, int rail_copies = 1);

// Refuses, with an InputError naming the scenario keys (and --steps, --all-ranks, --out) and their
// values, a simulation that cannot run before it allocates anything: model.layers above
// kMaxSimulatedLayers, a world above 2^31 - 1 ranks, stage programs above kMaxStageOps, or an
// estimated size above `memory_bytes` (0: this machine's physical memory, sysconf). every_rank:
// --all-ranks, or a profile with core sharing (the executor then simulates every rank).
void check_simulation_size(const Scenario& s, int steps, bool every_rank, bool keep_trace,
                           int64_t memory_bytes = 0, int rail_copies = 1);

// tp when simulate(s, cluster, opt) with `profile` (its core sharing and jitters) would simulate
// tp rank 0 of each group for its peers (executor.hpp: rail_copies_apply), else 1.
int rail_copies(const Scenario& s, const Cluster& cluster, const SimOptions& opt,
                const HardwareProfile& profile);

// Simulates `opt.steps` steps of the scenario (whose layout must use every GPU of the cluster: see
// fit_layout). Throws InputError for bad layouts and for a simulation too large for this machine
// (check_simulation_size, first).
SimResult simulate(const Scenario& s, const Cluster& cluster, const SimOptions& opt);

// The profile `simulate` uses when none is given: scenarios/hardware/<device>.yaml when `search_dir`
// holds it, else the built-in defaults.
HardwareProfile profile_for(const Cluster& c, const std::string& search_dir = "");

struct SweepRow {
  int gpus = 0;
  bool ok = false;        // a layout was simulated
  std::string note;       // why not, or remarks ("does not fit")
  SimResult result;       // valid when ok
  double efficiency = 0;  // per-GPU throughput relative to the smallest simulated size
  int candidates = 0;     // --search: layouts considered (fitting memory) / simulated
  int simulated = 0;
  std::vector<SimResult> others;  // --search: the other simulated layouts, fastest first
};
// --search: why the row's layout was picked, one line: its step's bubble and exposed
// communication and its memory, then the runner-up and what it loses on (step time, bubble,
// exposed communication); "" for a row without a search or a result.
std::string explain_choice(const SweepRow& row);

// One simulation of a sweep: a layout of row `row` on that row's cluster.
struct SweepJob {
  int row = 0;
  Scenario scenario;
  std::shared_ptr<const Cluster> cluster;
  SimOptions options;
  std::string label;  // the progress line ("[1024 GPUs] 2/6 (of 40 fitting) dp=... ")
};
// Runs a sweep's simulations and returns their results in job order. The default
// (run_sweep_jobs) runs them one after another; `orrery sweep` under mpirun spreads them over the
// ranks (cli/cmd_sweep.cpp). Whatever runs them, the rows are assembled from the results in job
// order, so the table does not depend on who simulated what.
using SweepRunner = std::function<std::vector<SimResult>(const std::vector<SweepJob>&)>;
std::vector<SimResult> run_sweep_jobs(const std::vector<SweepJob>& jobs,
                                      const std::function<void(const std::string&)>& progress);

struct SweepOptions {
  std::vector<int> gpus;
  bool search = false;
  // --search: also consider gradient compression (int8, on ZeRO 0/1 layouts with dp > 1) when the
  // scenario has none; NVMe offload is considered for layouts that do not fit memory without it.
  bool search_compression = false;
  int search_top = 6;  // --search: layouts simulated per size (the best by a closed-form estimate)
  SimOptions sim;
  std::function<void(const std::string&)> progress;  // one line per step of work (stderr)
  SweepRunner runner;                                // empty: run_sweep_jobs
};

// Simulation results as bytes and back, exactly (every field but the trace; doubles round-trip):
// what the ranks of a distributed sweep send each other. from_wire throws InputError on bytes it
// did not write.
std::string results_to_wire(const std::vector<SimResult>& results);
std::vector<SimResult> results_from_wire(const std::string& bytes);

// The scaling table: the scenario at each size (same node type and topology, more nodes: see
// resize_cluster), global batch fixed. Without search: the scenario's tp, pp, zero and micro-batch
// with dp filling the size; with search: the best (tokens/s) dp/tp/pp/zero/micro-batch that fits
// device memory (tp within a node and dividing the heads, pp dividing the layers; the scenario's
// parallel.pp_layers kept for its own pp, an even split for the others).
std::vector<SweepRow> sweep(const Scenario& s, const Cluster& cluster, const SweepOptions& opt);

// Output of `orrery sim` and `orrery sweep`: one JSON object per result (keys in snake_case with
// units), the human-readable report, and the sweep table (text and CSV).
nlohmann::json to_json(const SimResult& r);
std::string format_report(const SimResult& r, const Scenario& s, const Cluster& c,
                          NetworkModel model);
nlohmann::json to_json(const std::vector<SweepRow>& rows);
std::string format_sweep_table(const std::vector<SweepRow>& rows);
std::string format_sweep_csv(const std::vector<SweepRow>& rows);

// Where the default hardware profiles of a cluster file live: <cluster dir>/../hardware when it
// exists, else scenarios/hardware under the working directory, else "" (built-in defaults).
std::string hardware_dir_for(const std::string& cluster_path);

}  // namespace orrery::sim
