// Per-stage memory estimate: ZeRO model states plus activations in flight (see memory.hpp).
#include "orrery/sim/memory.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "orrery/common/pipeline_schedule.hpp"
#include "orrery/model/activations.hpp"
#include "orrery/model/moe.hpp"
#include "orrery/sim/moe_cost.hpp"

namespace orrery::sim {

ModelStateBytes model_state_bytes(double params, int zero_stage, int dp, const PrecisionConfig& p) {
  const double n = std::max(1, dp);
  ModelStateBytes m;
  m.parameters = p.param_bytes * params / (zero_stage >= 3 ? n : 1.0);
  m.gradients = p.grad_bytes * params / (zero_stage >= 2 ? n : 1.0);
  m.optimizer = p.optimizer_bytes * params / (zero_stage >= 1 ? n : 1.0);
  return m;
}

namespace {
// The block's saved activations on one rank in s·b·h 16-bit units, summed from the model's per-op
// table (model/activations.hpp: Korthikanti et al. 2022, section 4.1, generalised to GQA, the MLP
// width and SwiGLU): the attention core and the rest.
struct LayerTerms {
  double rest = 0, core = 0;
};
LayerTerms layer_terms(const Scenario& s) {
  const BlockArch arch = block_arch(s.model);
  const auto terms = model::block_activation_terms(arch, s.model.heads, s.model.d_model,
                                                   s.model.seq, s.parallel.tp);
  const bool sp = s.parallel.sequence_parallel && s.parallel.tp > 1;
  const model::BlockActivations b = model::block_activations(terms, s.parallel.tp, sp);
  return {b.rest, b.core};
}
double sbh_bytes(const Scenario& s, const PrecisionConfig& p) {
  return double(s.model.seq) * s.training.micro_batch * s.model.d_model * (p.act_bytes / 2.0);
}
}  // namespace

double activation_bytes_per_layer(const Scenario& s, const PrecisionConfig& p) {
  const LayerTerms x = layer_terms(s);
  const bool sp = s.parallel.sequence_parallel && s.parallel.tp > 1;
  switch (recompute_of(s.training)) {
    case Recompute::None:
      return sbh_bytes(s, p) * (x.rest + x.core);
    case Recompute::Selective:
      return sbh_bytes(s, p) * x.rest;
    case Recompute::Full:
      return sbh_bytes(s, p) * (sp ? 2.0 / s.parallel.tp : 2.0);
  }
  return 0;
}

double recompute_workspace_bytes(const Scenario& s, const PrecisionConfig& p) {
  const LayerTerms x = layer_terms(s);
  switch (recompute_of(s.training)) {
    case Recompute::None:
      return 0;
    case Recompute::Selective:
      return sbh_bytes(s, p) * x.core;
    case Recompute::Full:
      return sbh_bytes(s, p) * (x.rest + x.core);
  }
  return 0;
}

namespace {
// The elements whose optimizer state a rank of `stage` holds (Ψ/N under ZeRO >= 1, else Ψ).
double updated_elements(const Scenario& s, int stage, const MemoryEstimate& e) {
  const int dp = s.parallel.dp;
  const bool sharded = s.parallel.zero >= 1 && dp > 1;
  if (sharded && s.model.moe.enabled()) {  // MoE: the experts' state is sharded over edp instead
    const int edp = std::max(1, dp / std::max(1, s.parallel.ep));
    return double(stage_dense_params(s, stage)) / dp + double(stage_expert_params(s, stage)) / edp;
  }
  return sharded ? double(e.param_count) / dp : double(e.param_count);
}

// The runtime's chunk of `updated` elements: zero.offload_chunk_mb of floats, at most all of them.
double runtime_chunk(const Scenario& s, double updated) {
  return std::min(std::max(1.0, std::floor(s.zero.offload_chunk_mb * 1048576.0 / 4.0)), updated);
}

// Host offload's memory (memory.hpp): no optimizer state on the device, the runtime's pinned
// arrays in host memory.
void apply_host_offload(const Scenario& s, const PrecisionConfig& p, int stage, MemoryEstimate& e) {
  const double updated = updated_elements(s, stage, e);
  e.optimizer_bytes = 0;
  e.offload_host_bytes = 12.0 * updated + 2.0 * runtime_chunk(s, updated) * p.grad_bytes;
}

// The largest shard the runtime stages (its slots' size): the stage's segments' ceil(n / dp), an
// MoE block's experts' ceil(e / edp).
double largest_shard(const Scenario& s, int stage) {
  const int dp = s.parallel.dp;
  std::map<int, int64_t> segments;
  for (const auto& t : stage_parameters(s, stage)) segments[t.segment] += t.count;
  double largest = 0;
  for (const auto& [seg, n] : segments) largest = std::max(largest, std::ceil(double(n) / dp));
  const int moe_blocks = stage_moe_blocks(s, stage);
  if (moe_blocks > 0) {
    const int edp = std::max(1, dp / std::max(1, s.parallel.ep));
    const double per_block = double(stage_expert_params(s, stage) / moe_blocks);
    largest = std::max(largest, std::ceil(per_block / edp));
  }
  return largest;
}

// zero.offload_params on a device (memory.hpp): the file holds the shards too (12 bytes per updated
// element), no master weights are pinned, and the parameters are the runtime's staging slots (4, 6
// on a stage with experts) of the largest shard in fp32, on the device and pinned on the host alike.
void apply_device_params(const Scenario& s, const PrecisionConfig& p, int stage,
                         MemoryEstimate& e) {
  const double updated = updated_elements(s, stage, e);
  const double chunk = runtime_chunk(s, updated);
  const double slots = stage_moe_blocks(s, stage) > 0 ? 6.0 : 4.0;
  const double staging = slots * kDeviceShardBytesPerParam * largest_shard(s, stage);
  e.parameters_bytes = staging;
  e.offload_nvme_bytes = device_nvme_file_bytes(s) * updated;
  e.offload_host_bytes = 2.0 * chunk * p.grad_bytes + 3.0 * 3.0 * chunk * 4.0 + staging;
}

// NVMe offload on a device (memory.hpp): the moments in the file, the master weights and the
// buffers in pinned host memory, nothing on the device.
void apply_device_nvme(const Scenario& s, const PrecisionConfig& p, int stage, MemoryEstimate& e) {
  const double updated = updated_elements(s, stage, e);
  const double chunk = runtime_chunk(s, updated);
  e.optimizer_bytes = 0;
  e.offload_nvme_bytes = kDeviceNvmeBytesPerParam * updated;
  e.offload_host_bytes = 4.0 * updated + 2.0 * chunk * p.grad_bytes + 3.0 * 2.0 * chunk * 4.0;
  if (s.zero.offload_params == "nvme" && s.parallel.zero == 3) apply_device_params(s, p, stage, e);
}

// NVMe offload's memory (memory.hpp): the state moved to the file, the buffers kept.
void apply_offload(const Scenario& s, const PrecisionConfig& p, int stage, MemoryEstimate& e) {
  const int dp = s.parallel.dp;
  const double updated = updated_elements(s, stage, e);
  const bool params = s.zero.offload_params == "nvme";
  const std::vector<int64_t> chunks = offload_chunks(s, int64_t(std::llround(updated)));
  const double chunk = chunks.empty() ? 0.0 : double(chunks.front());
  e.offload_nvme_bytes = offload_bytes_per_param(s, p) * updated;
  e.optimizer_bytes = 3.0 * chunk * (p.optimizer_bytes + (params ? p.param_bytes : 0));
  if (!params) return;
  std::map<int, int64_t> segments;
  for (const auto& t : stage_parameters(s, stage)) segments[t.segment] += t.count;
  int64_t largest = 0;
  for (const auto& [seg, n] : segments) largest = std::max(largest, n);
  e.parameters_bytes = 4.0 * double(p.param_bytes) * std::ceil(double(largest) / dp);
}

// The stage's expert states (model/moe.hpp): the local experts' parameters (tp slice) and their
// gradients whole (summed over edp by all-reduce), their optimizer state sharded over the edp
// group under ZeRO 1/2, all three under ZeRO 3 (each block's experts a segment over edp); the
// stage's dense count corrected (router and shared experts in, the dense MLP of its MoE blocks out).
void add_moe_states(const Scenario& s, const PrecisionConfig& p, int st, MemoryEstimate& e) {
  const int64_t dense = stage_dense_params(s, st), expert = stage_expert_params(s, st);
  const int edp = std::max(1, s.parallel.dp / std::max(1, s.parallel.ep));
  const auto d = model_state_bytes(double(dense), s.parallel.zero, s.parallel.dp, p);
  const int expert_zero = s.parallel.zero == 3 ? 3 : std::min(1, s.parallel.zero);
  const auto x = model_state_bytes(double(expert), expert_zero, edp, p);
  e.param_count = dense + expert;
  e.parameters_bytes = d.parameters + x.parameters;
  e.gradients_bytes = d.gradients + x.gradients;
  e.optimizer_bytes = d.optimizer + x.optimizer;
}
}  // namespace

std::vector<MemoryEstimate> estimate_memory(const Scenario& s, const PrecisionConfig& p,
                                            int64_t capacity_bytes, bool device_nvme) {
  const int pp = s.parallel.pp;
  const int m = s.micro_batches_per_step();
  const double per_block = activation_bytes_per_layer(s, p);
  std::vector<MemoryEstimate> out;
  for (int st = 0; st < pp; ++st) {
    MemoryEstimate e;
    e.stage = st;
    // The stage's own blocks (parallel.pp_layers, or layers / pp: model::stage_contents).
    for (const auto& [first, last] : model::stage_contents(s, st).layers) e.layers += last - first;
    const int per_stage = e.layers;
    // MoE blocks (model/moe.hpp) keep their routed rows instead of the dense MLP's act and fc2
    // inputs: the stage's mean per block (all its blocks are held alike in flight).
    const int moe_blocks = stage_moe_blocks(s, st);
    const double per_layer = per_block + (per_stage > 0 ? double(moe_blocks) / per_stage : 0.0) *
                                             (moe_activation_bytes(s, p.act_bytes) -
                                              dense_mlp_activation_bytes(s, p.act_bytes));
    for (const auto& t : stage_parameters(s, st)) e.param_count += t.count;
    const auto ms = model_state_bytes(double(e.param_count), s.parallel.zero, s.parallel.dp, p);
    e.parameters_bytes = ms.parameters;
    e.gradients_bytes = ms.gradients;
    e.optimizer_bytes = ms.optimizer;
    if (s.model.moe.enabled()) add_moe_states(s, p, st, e);
    const bool on_device = device_nvme && s.zero.nvme();
    if (s.zero.nvme()) (on_device ? apply_device_nvme : apply_offload)(s, p, st, e);
    if (host_offload(s)) apply_host_offload(s, p, st, e);
    const double embed_act =
        st == 0 ? double(s.model.seq) * s.training.micro_batch * s.model.d_model * 2.0 : 0.0;
    if (schedule_of(s.parallel) == Schedule::Interleaved && pp > 1) {
      // Chunk passes hold per_stage / v layers' activations (chunk 0 of stage 0 also the embedding's)
      // from their forward to their backward: the peak over the stage's order, in chunk passes.
      const int v = std::max(1, s.parallel.virtual_stages);
      const double chunk_act = per_layer * per_stage / v;
      double held = 0, peak = 0;
      int passes = 0, peak_passes = 0;
      for (const PipelinePass& ps : pipeline_interleaved_order(pp, st, m, v)) {
        const double bytes = chunk_act + (ps.chunk == 0 ? embed_act : 0.0);
        if (ps.forward) {
          held += bytes;
          ++passes;
          if (held > peak) peak = held;
          peak_passes = std::max(peak_passes, passes);
        } else {
          held -= bytes;
          --passes;
        }
      }
      e.micro_batches_in_flight = (peak_passes + v - 1) / v;  // in whole stages' worth, rounded up
      e.activations_bytes = peak;
    } else {
      e.micro_batches_in_flight =
          schedule_of(s.parallel) == Schedule::GPipe ? m : std::min(pp - st, m);
      e.activations_bytes = (per_layer * per_stage + embed_act) * e.micro_batches_in_flight;
    }
    e.activations_bytes += recompute_workspace_bytes(s, p);
    // The all-to-all in flight: a send and a receive buffer of one dispatch (moe_cost.hpp).
    if (moe_blocks > 0)
      e.activations_bytes += 2.0 * double(moe_all_to_all_bytes(moe_load(s), s, p.act_bytes));
    if (st == pp - 1)
      e.activations_bytes += double(s.training.micro_batch) * s.model.seq * s.model.vocab * 4.0 *
                             2.0 / (s.parallel.vocab_parallel ? s.parallel.tp : 1);
    e.total_bytes =
        e.parameters_bytes + e.gradients_bytes + e.optimizer_bytes + e.activations_bytes;
    e.capacity_bytes = capacity_bytes;
    e.fits = capacity_bytes <= 0 || e.total_bytes <= double(capacity_bytes);
    out.push_back(e);
  }
  return out;
}

}  // namespace orrery::sim
