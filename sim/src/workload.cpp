// Builds the per-stage op programs of a training step (see workload.hpp for the op structure and the
// symmetry argument).
#include "orrery/sim/workload.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "orrery/common/error.hpp"
#include "orrery/common/pipeline_schedule.hpp"
#include "orrery/model/block.hpp"
#include "orrery/model/buckets.hpp"
#include "orrery/model/compression.hpp"
#include "orrery/model/flops.hpp"
#include "orrery/model/moe.hpp"
#include "orrery/model/zero_partition.hpp"
#include "orrery/sim/moe_cost.hpp"

namespace orrery::sim {

PrecisionConfig precision_config(const std::string& name) {
  PrecisionConfig p;
  p.name = name;
  if (name == "fp32") {
    p.param_bytes = 4, p.grad_bytes = 4, p.optimizer_bytes = 8, p.act_bytes = 4;
  } else if (name == "mixed" || name == "bf16") {
    p.name = "mixed";
    p.param_bytes = 2, p.grad_bytes = 2, p.optimizer_bytes = 12, p.act_bytes = 2;
  } else {
    throw InputError("precision '" + name +
                     "': expected fp32 or mixed (bf16 with fp32 master weights)");
  }
  return p;
}

double offload_bytes_per_param(const Scenario& s, const PrecisionConfig& p) {
  if (!s.zero.nvme()) return 0;
  return double(p.optimizer_bytes) + (s.zero.offload_params == "nvme" ? p.param_bytes : 0);
}

std::vector<int64_t> offload_chunks(const Scenario& s, int64_t params) {
  std::vector<int64_t> out;
  if (params <= 0) return out;
  int64_t chunk = std::max<int64_t>(1, int64_t(s.zero.offload_chunk_mb * 1048576.0 / 4.0));
  chunk = std::max(chunk, (params + kMaxOffloadChunks - 1) / kMaxOffloadChunks);
  for (int64_t first = 0; first < params; first += chunk)
    out.push_back(std::min(chunk, params - first));
  return out;
}

int64_t offload_io_ns(double bytes, double bytes_per_s) {
  if (bytes <= 0 || bytes_per_s <= 0) return 0;
  return int64_t(std::ceil(bytes / bytes_per_s * 1e9));
}

bool host_offload(const Scenario& s) { return s.zero.offload_optimizer == "host"; }

int host_link_sharers(const OffloadLinks& links, int ranks_per_node) {
  return std::max(1, std::min(links.host_link_shared_by, ranks_per_node));
}

int64_t host_adamw_ns(double params, const OffloadLinks& links, int ranks_per_node) {
  return offload_io_ns(kHostAdamWBytesPerParam * params,
                       links.host_adamw_bytes_per_s / std::max(1, ranks_per_node));
}

bool device_nvme_offload(const Scenario& s, const OffloadLinks& links) {
  return s.zero.nvme() && links.host_link_bytes_per_s > 0;
}

bool device_offload_params(const Scenario& s, const OffloadLinks& links) {
  return device_nvme_offload(s, links) && s.zero.offload_params == "nvme" && s.parallel.zero == 3;
}

double device_nvme_file_bytes(const Scenario& s) {
  const bool params = s.zero.offload_params == "nvme" && s.parallel.zero == 3;
  return kDeviceNvmeBytesPerParam + (params ? kDeviceShardBytesPerParam : 0.0);
}

void check_host_offload(const Scenario& s, const HardwareProfile& p) {
  const OffloadLinks& o = p.offload;
  if (device_nvme_offload(s, o) && !(o.host_adamw_bytes_per_s > 0)) {
    throw InputError(s.path + ": key 'zero.offload_optimizer': nvme offload on a device steps " +
                     "AdamW on the host, but the hardware profile '" + p.name + "' (device " +
                     p.device + ") has a host link and offload.host_adamw_gbps " +
                     std::to_string(o.host_adamw_bytes_per_s / 1e9) +
                     " (set it, or offload.host_link_gbps 0 for a device whose memory is the "
                     "host's)");
  }
  if (!host_offload(s)) return;
  if (o.host_link_bytes_per_s > 0 && o.host_adamw_bytes_per_s > 0) return;
  throw InputError(s.path + ": key 'zero.offload_optimizer': host offload needs a GPU's host " +
                   "link and the host's AdamW rate, but the hardware profile '" + p.name +
                   "' (device " + p.device + ") has offload.host_link_gbps " +
                   std::to_string(o.host_link_bytes_per_s / 1e9) + " and offload.host_adamw_gbps " +
                   std::to_string(o.host_adamw_bytes_per_s / 1e9) +
                   " (a CPU device keeps its state in host memory already; simulate on a GPU "
                   "cluster or set both keys)");
}

std::vector<ParamTensor> stage_parameters(const Scenario& s, int stage) {
  const auto specs =
      model::parameter_tensors(model::model_shape(s), model::stage_contents(s, stage));
  std::vector<ParamTensor> out;
  out.reserve(specs.size());
  // parallel.vocab_parallel: each tp rank holds V/tp rows of the embedding table and LM head.
  const bool vocab_split = s.parallel.vocab_parallel && s.parallel.tp > 1;
  for (const auto& p : specs) {
    if (p.expert) continue;  // dense parameters only: the experts are counted by moe_cost.hpp
    const bool vocab_rows = p.name == "wte" || p.name == "lmw";
    out.push_back(
        {p.name, vocab_split && vocab_rows ? p.count() / s.parallel.tp : p.count(), p.segment});
  }
  return out;
}

std::vector<int> schedule_order(Schedule schedule, int stages, int stage, int m) {
  return pipeline_schedule_order(schedule, stages, stage, m, "the simulator");
}

std::vector<StageCompute> stage_compute(const Workload& w) {
  std::vector<StageCompute> out;
  const double steps = std::max(1, w.steps);
  for (const auto& p : w.stages) {
    StageCompute c;
    c.stage = p.stage;
    c.layers = p.layers;
    for (const auto& op : p.ops) {
      if (op.kind != traces::SpanKind::Compute && op.kind != traces::SpanKind::Optimizer) continue;
      c.compute_ns += double(op.duration_ns);
      c.flops += op.flops;
      const std::string_view n = w.names[op.name];
      if (n == names::kBlockForward || n == names::kBlockBackward || n == names::kBlockRecompute ||
          n == names::kAttentionRecompute)
        c.block_flops += op.flops;
    }
    c.compute_ns /= steps;
    c.flops /= steps;
    c.block_flops /= steps;
    out.push_back(c);
  }
  return out;
}

size_t Workload::op_count() const {
  size_t n = 0;
  for (const auto& st : stages) n += st.ops.size();
  return n;
}

uint32_t Workload::name_id(std::string_view n) const {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == n) return static_cast<uint32_t>(i);
  return std::numeric_limits<uint32_t>::max();
}

namespace {

constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

// Appends ops and their deps to one stage program.
class ProgramBuilder {
 public:
  ProgramBuilder(StageProgram& p, std::vector<std::string>& names) : p_(p), names_(names) {}

  uint32_t name(std::string_view n) {
    auto it = ids_.find(std::string(n));
    if (it != ids_.end()) return it->second;
    uint32_t id = kNone;
    for (size_t i = 0; i < names_.size(); ++i)
      if (names_[i] == n) id = static_cast<uint32_t>(i);
    if (id == kNone) {
      id = static_cast<uint32_t>(names_.size());
      names_.emplace_back(n);
    }
    ids_.emplace(std::string(n), id);
    return id;
  }

  uint32_t add(Op op, std::initializer_list<uint32_t> deps) {
    op.dep_begin = static_cast<uint32_t>(p_.deps.size());
    for (uint32_t d : deps)
      if (d != kNone) p_.deps.push_back(d);
    op.dep_count = static_cast<uint32_t>(p_.deps.size()) - op.dep_begin;
    const auto id = static_cast<uint32_t>(p_.ops.size());
    p_.stream_ops[op.stream].push_back(id);
    p_.ops.push_back(op);
    return id;
  }
  uint32_t add(Op op, const std::vector<uint32_t>& deps) {
    op.dep_begin = static_cast<uint32_t>(p_.deps.size());
    for (uint32_t d : deps)
      if (d != kNone) p_.deps.push_back(d);
    op.dep_count = static_cast<uint32_t>(p_.deps.size()) - op.dep_begin;
    const auto id = static_cast<uint32_t>(p_.ops.size());
    p_.stream_ops[op.stream].push_back(id);
    p_.ops.push_back(op);
    return id;
  }

 private:
  StageProgram& p_;
  std::vector<std::string>& names_;
  std::unordered_map<std::string, uint32_t> ids_;
};

// One compute op: its kernels, memory traffic and time. Its model FLOPs are its kernels' FLOPs,
// which reproduce the runtime's attribution per piece (test_cost_model.cpp checks the sums).
struct Piece {
  double flops = 0;
  double bytes = 0;
  int64_t ns = 0;
};

struct ComputeCosts {
  Piece embed_f, embed_b, head_f, head_b;
  std::vector<Piece> block_f, block_b;  // one piece (tp = 1) or three (tp > 1, model.hpp)
  std::vector<Piece> recompute_block;   // full recomputation: one piece (tp = 1), two, or four (sp)
  std::vector<Piece> head_f_sp;         // sequence parallelism: the head forward's two pieces
  Piece recompute_attention;            // selective recomputation
  int64_t data_ns = 0;
  // An MoE block (model/moe.hpp): its dense pieces around the moe.* ops, forward [Ln1 .. Ln2]
  // (tp > 1: [Ln1 .. Proj], [AttnResidual, Ln2]) and [MlpResidual], backward [MlpResidual] and
  // [Ln2 .. Ln1] (tp > 1: [Ln2 .. Qkv], [Ln1]); the moe.* ops; the all-to-all and gate sizes.
  std::vector<Piece> moe_head_f, moe_tail_f, moe_tail_b, moe_head_b;
  Piece router_f, router_b, experts_f, experts_b, gated_f, gated_b;
  int64_t a2a_bytes = 0, gate_bytes = 0;
};

// The dense block ops [begin, end) as one piece: forward, or backward (the reverse order).
Piece block_range_piece(const ModelDims& d, const CostModel& cost, bool forward, int begin,
                        int end) {
  std::vector<Kernel> ks;
  for (const auto& k : block_forward_kernels(d))
    if (k.op >= begin && k.op < end) ks.push_back(k);
  if (!forward) ks = backward_kernels(std::move(ks));
  return Piece{model::flops::block_ops_flops(flop_dims(d), forward, begin, end), total_bytes(ks),
               cost.op_ns(ks)};
}

Piece kernels_piece(const std::vector<Kernel>& ks, const CostModel& cost) {
  return Piece{total_flops(ks), total_bytes(ks), cost.op_ns(ks)};
}

void make_moe_costs(const Scenario& s, const ModelDims& d, const CostModel& cost, ComputeCosts& c) {
  if (!s.model.moe.enabled()) return;
  using model::BlockOp;
  const int ln2_end = int(BlockOp::Ln2) + 1, mlp_res = int(BlockOp::MlpResidual);
  if (d.tp == 1) {
    c.moe_head_f = {block_range_piece(d, cost, true, 0, ln2_end)};
    c.moe_head_b = {block_range_piece(d, cost, false, 0, ln2_end)};
  } else {
    const int attn_res = int(BlockOp::AttnResidual), qkv = int(BlockOp::Qkv);
    c.moe_head_f = {block_range_piece(d, cost, true, 0, attn_res),
                    block_range_piece(d, cost, true, attn_res, ln2_end)};
    c.moe_head_b = {block_range_piece(d, cost, false, qkv, ln2_end),
                    block_range_piece(d, cost, false, 0, qkv)};
  }
  c.moe_tail_f = {block_range_piece(d, cost, true, mlp_res, mlp_res + 1)};
  c.moe_tail_b = {block_range_piece(d, cost, false, mlp_res, mlp_res + 1)};
  const MoeLoad m = moe_load(s, cost.profile().moe_expert_shares);
  const auto router = moe_router_kernels(d, s, m), experts = moe_expert_kernels(d, s, m),
             gated = moe_gated_sum_kernels(d, s, m);
  c.router_f = kernels_piece(router, cost);
  c.router_b = kernels_piece(backward_kernels(router), cost);
  c.experts_f = kernels_piece(experts, cost);
  c.experts_b = kernels_piece(backward_kernels(experts), cost);
  c.gated_f = kernels_piece(gated, cost);
  c.gated_b = kernels_piece(backward_kernels(gated), cost);
  // The FLOPs the runtime's MoE spans carry (model/moe.hpp): the gated sum 2·S·C forward and
  // 4·S·C backward (S the rows this rank dispatches); the block's own pieces the attention half's
  // model FLOPs (flops::block_attention_forward; twice backward) on the piece before the attention's
  // tp all-reduce, 0 on the others. Their times stay those of their kernels.
  c.gated_f.flops = 2.0 * m.send_rows * double(d.d_model);
  c.gated_b.flops = 2.0 * c.gated_f.flops;
  const double attn = model::flops::block_attention_forward(flop_dims(d));
  for (auto* v : {&c.moe_head_f, &c.moe_head_b, &c.moe_tail_f, &c.moe_tail_b})
    for (Piece& pc : *v) pc.flops = 0.0;
  c.moe_head_f.front().flops = attn;
  c.moe_head_b.front().flops = 2.0 * attn;
  c.a2a_bytes = moe_all_to_all_bytes(m, s, int(d.act_bytes));
  c.gate_bytes = moe_gate_all_reduce_bytes(s, int(d.act_bytes));
}

ComputeCosts make_costs(const ModelDims& d, const CostModel& cost) {
  // Each piece's bytes from its kernels, its time from the cost model by name (a measured op of
  // the profile, scaled to this shape, or the roofline of its kernels: cost_model.hpp); its model
  // FLOPs as the runtime's span carries them (model/flops.hpp; a block piece's kernels count the
  // same FLOPs over the block, cut elsewhere: the LayerNorms fall in the neighbouring piece).
  const model::flops::Dims fd = flop_dims(d);
  auto piece = [&](std::string_view name, int index, int pieces) {
    const auto ks = op_kernels(name, index, pieces, d);
    const bool block = name == names::kBlockForward || name == names::kBlockBackward;
    double f = block ? model::flops::block_piece(fd, name == names::kBlockForward, index, pieces)
                     : total_flops(*ks);
    if (name == names::kBlockRecompute) f = model::flops::recompute_block_piece(fd, index, pieces);
    if (name == names::kAttentionRecompute) f = model::flops::recompute_attention(fd);
    if (d.sequence_parallel && (block || name == names::kBlockRecompute)) {
      // model/block.hpp's sequence-parallel pieces, the FLOPs of their BlockOps.
      const model::OpRange r =
          name == names::kBlockRecompute
              ? model::kSpRecomputePieces[size_t(index)]
              : (name == names::kBlockForward ? model::kSpForwardPieces[size_t(index)]
                                              : model::kSpBackwardPieces[size_t(index)]);
      f = model::flops::block_ops_flops(fd, name != names::kBlockBackward, r.begin, r.end);
    }
    return Piece{f, total_bytes(*ks), cost.named_op_ns(name, index, pieces, d)};
  };
  ComputeCosts c;
  c.embed_f = piece(names::kEmbedForward, 0, 1);
  c.embed_b = piece(names::kEmbedBackward, 0, 1);
  c.head_f = piece(names::kHeadForward, 0, 1);
  c.head_b = piece(names::kHeadBackward, 0, 1);
  if (d.sequence_parallel) {  // the final LayerNorm, all-gather, then the LM head
    c.head_f_sp = {piece(names::kHeadForward, 0, 2), piece(names::kHeadForward, 1, 2)};
  }
  // One piece per block (tp = 1) or the runtime's three, split where Megatron sums over the tp group,
  // or five under sequence parallelism (model/block.hpp; op_kernels lists their kernels).
  const int pieces =
      d.tp == 1 ? 1 : (d.sequence_parallel ? model::kSpBlockPieces : model::kTpBlockPieces);
  for (int i = 0; i < pieces; ++i) {
    c.block_f.push_back(piece(names::kBlockForward, i, pieces));
    c.block_b.push_back(piece(names::kBlockBackward, i, pieces));
  }
  const int rpieces = d.tp == 1 ? 1
                                : int(d.sequence_parallel ? model::kSpRecomputePieces.size()
                                                          : model::kRecomputePieces.size());
  for (int i = 0; i < rpieces; ++i)
    c.recompute_block.push_back(piece(names::kBlockRecompute, i, rpieces));
  c.recompute_attention = piece(names::kAttentionRecompute, 0, 1);
  return c;
}

}  // namespace

// Replicated kv heads (fewer kv heads than tp ranks; the runtime's kv_grad_all_reduce): each
// block's all-reduce over tp carries a slot per kv head of its k and v rows of qkvw (2 x head size
// x d_model) and, with biases, of qkvb; 0 when no head is replicated.
int64_t kv_grad_values(const Scenario& s) {
  const BlockArch a = block_arch(s.model).resolve(s.model.heads, s.model.d_model);
  if (s.parallel.tp <= 1 || a.kv_replicas(s.parallel.tp) == 1) return 0;
  const int64_t rows = 2 * int64_t(s.model.d_model / s.model.heads);
  return int64_t(a.kv_heads) * rows * (int64_t(s.model.d_model) + (a.bias ? 1 : 0));
}

double workload_ops_bound(const Scenario& s, int steps) {
  const auto& par = s.parallel;
  // Layers of the largest stage (parallel.pp_layers may make them uneven).
  double per_stage = double(s.model.layers) / std::max(1, par.pp);
  if (!par.pp_layers.empty())
    per_stage = double(*std::max_element(par.pp_layers.begin(), par.pp_layers.end()));
  const double m = double(s.training.global_batch) /
                   (double(std::max(1, par.dp)) * double(std::max(1, s.training.micro_batch)));
  const bool sp = par.sequence_parallel && par.tp > 1;
  const double pieces = par.tp > 1 ? (sp ? 5 : 3) : 1;
  // Per micro-batch and layer: the forward's and the backward's pieces with the tp all-reduces
  // between them; ZeRO 3 adds a gather before each and the backward's reduce-scatter.
  // Recomputation adds, in the backward, one op (selective) or the full recomputation's pieces with
  // the tp all-reduce between them (3 ops under tp, else 1).
  const Recompute rc = recompute_of(s.training);
  const double recompute_ops =
      rc == Recompute::None ? 0 : (rc == Recompute::Full && par.tp > 1 ? (sp ? 7 : 3) : 1);
  // Sequence parallelism: one all-reduce of the replicated gradients per block backward.
  // Replicated kv heads: at most one more per block and micro-batch (ZeRO 2 and 3; else per step).
  // An MoE block (model/moe.hpp) adds at most 8 ops to its forward (one more dense piece, three
  // moe.* compute ops, two all-to-alls, the tp all-reduce) and 9 to its backward (the gate's too).
  const double moe_ops = s.model.moe.enabled() ? 17 : 0;
  // ZeRO 3 with MoE: the experts' gathers (forward and backward) and reduce-scatter, 3 more.
  const double z3_ops = par.zero == 3 ? (s.model.moe.enabled() ? 6 : 3) : 0;
  // zero.offload_params: a read and an upload before each gather (and the read ahead), 4 more per
  // block (8 with experts) and 4 a step (the embedding's and the final norm's).
  const bool shards = par.zero == 3 && s.zero.offload_params == "nvme";
  const double shard_ops = shards ? (s.model.moe.enabled() ? 8 : 4) : 0;
  const double per_layer = 2 * (2 * pieces - 1) + z3_ops + shard_ops + recompute_ops +
                           (sp ? 1 : 0) + (kv_grad_values(s) > 0 ? 1 : 0) + moe_ops;
  // Per micro-batch at most 10 more (data, embedding or receive, head or send, ZeRO's blocking
  // collectives, the extra prefetch); per step at most one DDP bucket per segment and 10 more
  // (zero_grad, ZeRO 3's start gathers, tied-embedding all-reduce, optimizer, all-gather, loss).
  // Interleaved: per micro-batch and chunk at most the 10 (a chunk's pass has the same extras).
  // zero.overlap_grad_reduce: at most one reduce-scatter per segment and micro-batch (ZeRO 2) and
  // one all-gather per segment a step.
  const double zero_buckets = s.zero.overlap_grad_reduce ? (per_stage + 2) * (m + 1) : 0;
  // Offload: per chunk at most a read, a download, an AdamW piece (host step), an upload and a
  // write; per range at most kMaxOffloadChunks chunks; ZeRO 3 a range per segment (the blocks,
  // their experts, the embedding and the head), else at most 2 (the dense and the experts' shard).
  const double ranges = par.zero == 3 ? 2 * per_stage + 2 : 2;
  const double offload = s.zero.offload_optimizer != "none" ? 5.0 * kMaxOffloadChunks * ranges : 0;
  const double per_step = m * (per_stage * per_layer + (10 + (sp ? 4 : 0)) * chunks_per_stage(s)) +
                          (per_stage + 2) * (s.model.moe.enabled() ? 2 : 1) + 10 + zero_buckets +
                          offload + (shards ? 4 : 0);
  return double(std::max(1, steps)) * per_step;
}

namespace {

// The refusals of build_workload (workload.hpp) before anything is built.
void check_buildable(const Scenario& s, const WorkloadOptions& opt) {
  validate_layout(s);
  if (opt.steps < 1) throw InputError("simulated steps must be >= 1");
  if (schedule_of(s.parallel) == Schedule::Interleaved) {
    // Megatron's interleaved 1F1B: v model chunks per stage, chunk c of stage s the layers of
    // virtual stage c·pp + s (validate_layout checks that pp·v divides the layers).
    const int pp = s.parallel.pp, v = chunks_per_stage(s);
    if (pp < 2)
      throw InputError(
          s.path +
          ": key 'parallel.schedule': the interleaved schedule needs parallel.pp >= 2 (got " +
          std::to_string(pp) + ")");
    if (s.model.layers % (pp * v) != 0)
      throw InputError(s.path + ": key 'parallel.virtual_stages': model.layers (" +
                       std::to_string(s.model.layers) +
                       ") must be divisible by pp x virtual_stages (" + std::to_string(pp * v) +
                       ")");
    // ZeRO 2 sums the tied embedding between the first and the last stage after every micro-batch's
    // backward, blocking (reduce_gradients_zero): under this order the last stage would wait there
    // after chunk 0's backward of micro-batch i for stage 0, whose backward of it needs a forward the
    // last stage runs only later (p = 4, v = 2: stage 3 runs B0.0 before F0.6, whose output stage 0's
    // F1.6 needs before its B0.0): a deadlock, so refused. ZeRO 3 is not built for chunks.
    if (s.parallel.zero == 2)
      throw InputError(
          s.path +
          ": key 'parallel.zero': ZeRO 2 cannot run the interleaved schedule (its blocking " +
          "per-micro-batch sum of the tied embedding between the first and last stage would "
          "deadlock " +
          "it); use zero 0 or 1, or schedule 1f1b");
    if (s.parallel.zero == 3)
      throw InputError(
          s.path + ": key 'parallel.zero': ZeRO 3 with the interleaved schedule is not simulated " +
          "(use zero 0 or 1, or schedule 1f1b)");
  }
  // Op ids, dependency offsets and sequence numbers are 32-bit (Op): refuse before building.
  if (const double ops = workload_ops_bound(s, opt.steps); ops > double(kMaxStageOps)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", ops);
    throw InputError(s.path + ": key 'model.layers' (" + std::to_string(s.model.layers) + ") x " +
                     std::to_string(s.micro_batches_per_step()) + " micro-batches per step x " +
                     std::to_string(opt.steps) + " steps: up to " + buf +
                     " ops per pipeline stage, more than the simulator's 32-bit op ids allow (" +
                     std::to_string(kMaxStageOps) + ")");
  }
}

// Blocks held by one stage (model::stage_contents: parallel.pp_layers, or layers / pp).
int stage_blocks(const Scenario& s, int stage) {
  int n = 0;
  for (const auto& [first, last] : model::stage_contents(s, stage).layers) n += last - first;
  return n;
}

// A DDP bucket of a stage, as the workload issues it.
struct Bucket {
  int64_t params = 0;
  int ready = -1;          // backward position after which it can be reduced
  int lowest = INT32_MAX;  // lowest segment (the span's layer)
  // PowerSGD (parallel.grad_compression): the (rows, cols) of the matrices it compresses, in the
  // runtime's order (memory order: the bucket's segments last-ready first); the other entries.
  std::vector<std::pair<int64_t, int64_t>> matrices;
  int64_t plain = 0;
};

// Gradient compression on the dp group (runtime ddp_compression.hpp), from the scenario.
enum class Compression { None, Int8, TopK, PowerSgd };
Compression compression_of(const Scenario& s) {
  const std::string& c = s.parallel.grad_compression;
  if (c == "int8") return Compression::Int8;
  if (c == "topk") return Compression::TopK;
  if (c == "powersgd") return Compression::PowerSgd;
  return Compression::None;
}

// Builds the program of one pipeline stage, step by step and pass by pass: the state of the
// original single function (sequence numbers per communicator, the ops a pass waits for) is this
// object's, each piece of the op structure of workload.hpp one member.
class StageBuilder {
 public:
  StageBuilder(const Scenario& s, const CostModel& cost, const WorkloadOptions& opt,
               const ComputeCosts& cc, int micro_batches, int stage, StageProgram& prog,
               std::vector<std::string>& names)
      : s_(s),
        par_(s.parallel),
        cost_(cost),
        prec_(opt.precision),
        cc_(cc),
        steps_(opt.steps),
        pp_(par_.pp),
        dp_(par_.dp),
        m_(micro_batches),
        L_(s.model.layers),
        chunks_(chunks_per_stage(s)),
        per_stage_(stage_blocks(s, stage)),
        per_chunk_(per_stage_ / chunks_),
        st_(stage),
        first_layer_(model::stage_contents(s, stage).layers.front().first),
        first_(stage == 0),
        last_(stage == pp_ - 1),
        interleaved_(schedule_of(par_) == Schedule::Interleaved),
        // The head's stage holds a copy of wte only when the LM head is tied to it; only then is
        // there a tied-embedding sum between the first and the last stage.
        has_embed_segment_(first_ || (last_ && s.model.tied_embeddings)),
        embed_sum_(pp_ > 1 && s.model.tied_embeddings && (first_ || last_)),
        // Sequence parallelism's tp all-reduce of the replicated gradients: the two norms' gains
        // (and shifts) and, with biases, the two row-parallel biases per block; the final norm's.
        block_replicated_(
            int64_t(s.model.d_model) *
            (2 * block_arch(s.model).norm_params_per_channel() + (s.model.bias ? 2 : 0))),
        head_replicated_(int64_t(s.model.d_model) * block_arch(s.model).norm_params_per_channel()),
        kv_values_(kv_grad_values(s)),
        recompute_(recompute_of(s.training)),
        act_msg_bytes_(int64_t(s.training.micro_batch) * s.model.seq * s.model.d_model *
                       prec_.act_bytes /
                       (s.parallel.sequence_parallel && s.parallel.tp > 1 ? s.parallel.tp : 1)),
        sp_(s.parallel.sequence_parallel && s.parallel.tp > 1),
        sp_coll_bytes_(int64_t(s.training.micro_batch) * s.model.seq * s.model.d_model *
                       prec_.act_bytes),
        compression_(compression_of(s)),
        ep_(std::max(1, s.parallel.ep)),
        edp_(std::max(1, s.parallel.dp / std::max(1, s.parallel.ep))),
        zero_rs_(s.parallel.dp > 1 && (s.parallel.zero == 1 || s.parallel.zero == 2) &&
                 s.zero.overlap_grad_reduce),
        prog_(prog),
        b_(prog, names),
        offload_params_(device_offload_params(s, cost.profile().offload)) {
    ranks_per_node_ = std::max(1, opt.ranks_per_node);
    prog_.stage = stage;
    prog_.layers = per_stage_;
  }

  void build() {
    plan_segments_and_buckets();
    zero_grad_piece_ = make_zero_grad_piece();
    for (int step = 0; step < steps_; ++step) build_step(step);
  }

 private:
  struct Segment {
    int id;
    int64_t params;
    int position;
  };

  // Chunk k of the stage: layers [chunk_l0(k), chunk_l0(k) + per_chunk); one chunk = the stage
  // (its own layer count under parallel.pp_layers).
  int chunk_l0(int k) const { return chunks_ == 1 ? first_layer_ : (k * pp_ + st_) * per_chunk_; }
  int chunk_base(int k) const { return (chunks_ - 1 - k) * (per_chunk_ + 2); }
  // Parameters per segment of the stage (slot 0 the embedding -1, 1 the final LayerNorm L, then the
  // blocks by chunk), summed once: a scan of the stage's tensors per segment was quadratic in the
  // layers (minutes at 100,000).
  size_t slot(int seg) const {
    if (seg < 0) return size_t(0);
    if (seg >= L_) return size_t(1);
    if (chunks_ == 1) return size_t(2 + seg - first_layer_);
    return size_t(2 + (seg / per_chunk_ / pp_) * per_chunk_ +
                  seg % per_chunk_);  // chunk, then layer
  }
  int64_t segment_params(int seg) const { return seg_params_[slot(seg)]; }
  // ZeRO sizes: the model's partition pads an array of n elements to dp · ceil(n / dp)
  // (model/zero_partition.hpp); the collectives move the padded total.
  int64_t padded(int64_t n) const {
    return int64_t(model::zero_partition(size_t(n), 0, dp_).padded());
  }

  // Segments in gradient-ready order with their parameter counts, and the backward position after
  // which each is ready: 0 = after bwd.head, 1 + k = after block l1-1-k, per_stage + 1 = after
  // bwd.embed (a head-only stage's wte copy is ready with the last block, as the runtime fires it).
  // Interleaved: a chunk's gradients are ready after its last backward (micro-batch m-1); those run
  // chunk v-1 first, chunk 0 last, so chunk k's positions are offset by (v-1-k)·(per_chunk + 2).
  // Then the DDP buckets: the model's rule (model/buckets.hpp) on this ready order.
  void plan_segments_and_buckets() {
    seg_params_.assign(size_t(per_stage_) + 2, 0);
    seg_mats_.assign(size_t(per_stage_) + 2, {});
    for (const auto& p :
         model::parameter_tensors(model::model_shape(s_), model::stage_contents(s_, st_))) {
      if (p.expert) continue;  // the local experts' tensors: edp buckets (plan_moe_segments)
      prog_.param_count += p.count();
      seg_params_[slot(p.segment)] += p.count();
      if (compression_ == Compression::PowerSgd &&
          model::powersgd_compresses(size_t(p.rows), size_t(p.cols), s_.compression.powersgd_rank))
        seg_mats_[slot(p.segment)].emplace_back(p.rows, p.cols);
    }
    plan_moe_segments();
    std::vector<Segment> ready_order;
    for (int k = chunks_ - 1; k >= 0; --k) {
      const int l0 = chunk_l0(k), l1 = l0 + per_chunk_, base = chunk_base(k);
      if (last_ && k == chunks_ - 1) ready_order.push_back({L_, segment_params(L_), base});
      for (int l = l1 - 1; l >= l0; --l)
        ready_order.push_back({l, segment_params(l), base + 1 + (l1 - 1 - l)});
      if (first_ && k == 0) ready_order.push_back({-1, segment_params(-1), base + per_chunk_ + 1});
    }
    if (!first_ && last_)
      ready_order.push_back({-1, segment_params(-1), chunk_base(0) + per_chunk_});

    std::vector<model::BucketSegment> order;
    order.reserve(ready_order.size());
    for (const auto& sg : ready_order) order.push_back({sg.id, sg.params});
    const double cap_bytes = par_.bucket_mb * 1024.0 * 1024.0;
    if (zero_rs_) return plan_zero_buckets(ready_order, order, cap_bytes);
    for (const auto& plan : model::ddp_buckets(order, cap_bytes, prec_.grad_bytes)) {
      Bucket bk;
      bk.params = plan.elements;
      bk.lowest = plan.lowest_segment;
      for (size_t i = plan.begin; i < plan.end; ++i)
        bk.ready = std::max(bk.ready, ready_order[i].position);
      int64_t covered = 0;
      for (size_t i = plan.end; i-- > plan.begin;) {
        for (const auto& m : seg_mats_[slot(ready_order[i].id)]) {
          bk.matrices.push_back(m);
          covered += m.first * m.second;
        }
      }
      bk.plain = bk.params - covered;
      buckets_.push_back(bk);
    }
    for (const auto& bk : buckets_) prog_.bucket_params.push_back(bk.params);
  }

  // ZeRO's buckets (model/buckets.hpp zero_buckets: boundaries moved up to multiples of dp), the
  // ready position of each, and which of them every segment's parameters lie in: the segments sit
  // in memory in the reverse of the ready order (the runtime's flat array), the first at the top.
  void plan_zero_buckets(const std::vector<Segment>& ready_order,
                         const std::vector<model::BucketSegment>& order, double cap_bytes) {
    const auto plans = model::zero_buckets(order, cap_bytes, prec_.grad_bytes, dp_);
    for (const auto& z : plans) {
      Bucket bk;
      bk.params = z.elements;
      bk.lowest = z.lowest_segment;
      for (size_t i = z.begin; i < z.end; ++i) {
        bk.ready = std::max(bk.ready, ready_order[i].position);
        if (ready_order[i].id == -1 && embed_sum_) held_bucket_ = buckets_.size();
      }
      buckets_.push_back(bk);
      prog_.bucket_params.push_back(bk.params);
    }
    zero_reads_.assign(size_t(per_stage_) + 2, {-1, -1});
    int64_t top = 0;
    for (const auto& sg : ready_order) top += sg.params;
    for (const auto& sg : ready_order) {
      top -= sg.params;
      const auto over = model::zero_buckets_overlapping(plans, top, sg.params);
      if (over.size() > 2) throw InternalError("zero buckets: a segment over more than 2 buckets");
      for (size_t i = 0; i < over.size(); ++i) zero_reads_[slot(sg.id)][i] = over[i];
    }
    pending_ag_.assign(buckets_.size(), kNone);
  }
  // zero.overlap_param_gather: the previous step's all-gathers of the buckets segment `seg` reads,
  // waited for once (the runtime's before_forward hook); kNone where none is pending.
  std::array<uint32_t, 2> gathers_for(int seg) {
    std::array<uint32_t, 2> out{kNone, kNone};
    if (!first_forward_ || zero_reads_.empty()) return out;
    for (size_t i = 0; i < 2; ++i) {
      const int b = zero_reads_[slot(seg)][i];
      if (b < 0) continue;
      out[i] = pending_ag_[size_t(b)];
      pending_ag_[size_t(b)] = kNone;
    }
    return out;
  }

  // MoE blocks (model/moe.hpp): their dense parameters corrected (router and shared experts in, the
  // dense MLP out), their local experts' parameters apart, bucketed by the DDP rule over the edp
  // group in gradient-ready order (the chunks' blocks last first, as the dense segments).
  void plan_moe_segments() {
    if (!s_.model.moe.enabled()) return;
    const MoeBlockParams mp = moe_block_params(s_);
    std::vector<model::BucketSegment> order;
    for (int k = chunks_ - 1; k >= 0; --k) {
      const int l0 = chunk_l0(k), l1 = l0 + per_chunk_;
      for (int l = l1 - 1; l >= l0; --l) {
        if (!is_moe(l)) continue;
        prog_.expert_param_count += mp.expert;
        order.push_back({l, mp.expert});
      }
    }
    expert_block_params_ = mp.expert;
    if (par_.zero == 3) return;  // ZeRO 3: per block over edp (z3_experts), no edp buckets
    const double cap_bytes = par_.bucket_mb * 1024.0 * 1024.0;
    for (const auto& plan : model::ddp_buckets(order, cap_bytes, prec_.grad_bytes)) {
      expert_buckets_.push_back({plan.elements, order[plan.end - 1].segment, plan.lowest_segment});
      prog_.expert_bucket_params.push_back(plan.elements);
    }
  }

  // Each step first zeroes the gradients the stage holds (and ZeRO's shard accumulators).
  Piece make_zero_grad_piece() const {
    const ModelDims dims = model_dims(s_, prec_.act_bytes);
    const double zeroed = double(prog_.param_count) + double(prog_.expert_param_count) +
                          (par_.zero >= 1 ? double(padded(prog_.param_count)) / dp_ : 0.0);
    return Piece{0.0, total_bytes(*op_kernels(names::kZeroGrad, 0, 1, dims, zeroed)),
                 cost_.named_op_ns(names::kZeroGrad, 0, 1, dims, zeroed)};
  }

  Op compute(std::string_view n, const Piece& pc, PhaseKind ph, int mb, int layer,
             traces::SpanKind kind = traces::SpanKind::Compute) {
    Op op;
    op.name = b_.name(n);
    op.kind = kind;
    op.stream = kStreamCompute;
    op.phase = ph;
    op.step = step_, op.micro_batch = mb, op.layer = layer;
    op.duration_ns = pc.ns;
    op.flops = pc.flops;
    op.bytes = static_cast<int64_t>(pc.bytes);
    return op;
  }
  Op comm(std::string_view n, traces::SpanKind kind, traces::CollOp coll, int stream, GroupRole g,
          int64_t bytes, int32_t seq, PhaseKind ph, int mb, int layer) {
    Op op;
    op.name = b_.name(n);
    op.kind = kind;
    op.coll = coll;
    op.stream = static_cast<uint8_t>(stream);
    op.group = g;
    op.bytes = bytes;
    op.seq = seq;
    op.phase = ph;
    op.step = step_, op.micro_batch = mb, op.layer = layer;
    return op;
  }
  uint32_t tp_all_reduce(PhaseKind ph, int mb, int layer, uint32_t after) {
    return b_.add(comm(names::kTpAllReduce, traces::SpanKind::Collective, traces::CollOp::AllReduce,
                       kStreamTp, GroupRole::TP, act_msg_bytes_, seq_tp_++, ph, mb, layer),
                  {after});
  }
  // Sequence parallelism's collectives (model/block.hpp): the all-gather of a LayerNorm output or
  // a residual gradient and the reduce-scatter of a partial product, both of the whole (B,T,C)
  // tensor's bytes, and the all-reduce of `values` replicated gradients.
  uint32_t tp_sp_coll(bool gather, PhaseKind ph, int mb, int layer, uint32_t after) {
    return b_.add(
        comm(gather ? names::kTpAllGather : names::kTpReduceScatter, traces::SpanKind::Collective,
             gather ? traces::CollOp::AllGather : traces::CollOp::ReduceScatter, kStreamTp,
             GroupRole::TP, sp_coll_bytes_, seq_tp_++, ph, mb, layer),
        {after});
  }
  uint32_t tp_grad_all_reduce(int mb, int layer, int64_t values, uint32_t after) {
    return b_.add(comm(names::kTpGradAllReduce, traces::SpanKind::Collective,
                       traces::CollOp::AllReduce, kStreamTp, GroupRole::TP,
                       values * prec_.grad_bytes, seq_tp_++, PhaseKind::Backward, mb, layer),
                  {after});
  }
  // Replicated kv heads (fewer than tp ranks): the sum of a block's shared k and v gradients
  // over the tp group (kv_grad_values); kv_blocks chains one per block of the stage, first to last.
  uint32_t kv_grad_all_reduce(int mb, int layer, const std::vector<uint32_t>& deps) {
    return b_.add(comm(names::kTpKvGradAllReduce, traces::SpanKind::Collective,
                       traces::CollOp::AllReduce, kStreamTp, GroupRole::TP,
                       kv_values_ * prec_.grad_bytes, seq_tp_++, PhaseKind::Backward, mb, layer),
                  deps);
  }
  uint32_t kv_blocks(int mb, const std::vector<uint32_t>& deps) {
    uint32_t prev = kNone;
    for (const auto& [first, last] : model::stage_contents(s_, st_).layers) {
      for (int l = first; l < last; ++l)
        prev = kv_grad_all_reduce(mb, l, prev == kNone ? deps : std::vector<uint32_t>{prev});
    }
    return prev;
  }
  // A block's forward or backward: its pieces, with a tp all-reduce between consecutive pieces
  // (sequence parallelism: an all-gather after even pieces, a reduce-scatter after odd ones).
  uint32_t block(std::string_view n, const std::vector<Piece>& pieces, PhaseKind ph, int mb,
                 int layer, std::initializer_list<uint32_t> first_deps) {
    uint32_t prev = kNone;
    for (size_t k = 0; k < pieces.size(); ++k) {
      const uint32_t op = k == 0 ? b_.add(compute(n, pieces[k], ph, mb, layer), first_deps)
                                 : b_.add(compute(n, pieces[k], ph, mb, layer), {prev});
      if (k + 1 == pieces.size()) {
        prev = op;
      } else if (sp_) {
        prev = tp_sp_coll(model::sp_gather_after(int(k)), ph, mb, layer, op);
      } else {
        prev = tp_all_reduce(ph, mb, layer, op);
      }
    }
    return prev;
  }
  // Activation recomputation before block `layer`'s backward (model/block.hpp): the full
  // recomputation's pieces with the attention projection's tp all-reduce between them, or the
  // attention core; kNone without recomputation.
  uint32_t recompute_ops(int mb, int layer, std::initializer_list<uint32_t> deps) {
    if (recompute_ == Recompute::None) return kNone;
    if (recompute_ == Recompute::Selective)
      return b_.add(compute(names::kAttentionRecompute, cc_.recompute_attention,
                            PhaseKind::Backward, mb, layer),
                    deps);
    return block(names::kBlockRecompute, cc_.recompute_block, PhaseKind::Backward, mb, layer, deps);
  }
  uint32_t dp_coll(std::string_view n, traces::CollOp c, int64_t bytes, PhaseKind ph, int mb,
                   int layer, const std::vector<uint32_t>& deps) {
    return b_.add(comm(n, traces::SpanKind::Collective, c, kStreamDp, GroupRole::DP, bytes,
                       seq_dp_++, ph, mb, layer),
                  deps);
  }
  // Labelled micro-batch -1 on every call, as the runtime's (training_loop_impl.hpp), which issues
  // it once a step (ZeRO 0/1) or after every backward (ZeRO 2/3).
  uint32_t embed_all_reduce(const std::vector<uint32_t>& deps) {
    return b_.add(comm(names::kEmbedAllReduce, traces::SpanKind::Collective,
                       traces::CollOp::AllReduce, kStreamDp, GroupRole::Embedding,
                       int64_t(s_.model.vocab) * s_.model.d_model * prec_.grad_bytes /
                           (s_.parallel.vocab_parallel ? s_.parallel.tp : 1),
                       seq_embed_++, PhaseKind::Backward, -1, -1),
                  deps);
  }
  // ZeRO 3 (the runtime's Zero3Storage): one all-gather per segment, issued on the comm thread in
  // the order the trainer binds them (a block's gather when the block before it is bound, so one
  // block ahead), and one reduce-scatter per segment as its backward completes. An MoE block's
  // experts are a segment of their own over the edp group, gathered and scattered right after the
  // block's (none when edp is one rank: the runtime copies). Returns the later of the two.
  // With offload_params on a device each gather waits for its shard's upload (stage_shard).
  uint32_t z3_gather(PhaseKind ph, int mb, int segment, uint32_t after) {
    const size_t k = staging_slot(segment);
    const uint32_t up = offload_params_ ? stage_shard(ph, mb, segment, k, after) : kNone;
    const uint32_t op =
        dp_coll(names::kZeroAllGather, traces::CollOp::AllGather,
                padded(segment_params(segment)) * prec_.param_bytes, ph, mb, segment, {after, up});
    if (offload_params_) staging_[k].gather = op;
    const bool experts = offload_params_ && k < 2 && has_expert_gather(segment);
    const uint32_t eup = experts ? stage_shard(ph, mb, segment, 4 + k, after) : kNone;
    const uint32_t e = z3_experts(names::kZeroAllGather, traces::CollOp::AllGather,
                                  prec_.param_bytes, ph, mb, segment, op, eup);
    if (experts) staging_[4 + k].gather = e;
    return e;
  }
  uint32_t z3_scatter(int mb, int segment, uint32_t after) {
    uint32_t op = dp_coll(names::kDpReduceScatter, traces::CollOp::ReduceScatter,
                          padded(segment_params(segment)) * prec_.grad_bytes, PhaseKind::Backward,
                          mb, segment, {after});
    grad_ops_.push_back(op);
    const uint32_t experts = z3_experts(names::kDpReduceScatter, traces::CollOp::ReduceScatter,
                                        prec_.grad_bytes, PhaseKind::Backward, mb, segment, op);
    if (experts != op) grad_ops_.push_back(experts);
    return experts;
  }
  bool has_expert_gather(int segment) const {
    return edp_ > 1 && segment >= 0 && segment < L_ && is_moe(segment);
  }
  uint32_t z3_experts(std::string_view n, traces::CollOp c, int64_t elem_bytes, PhaseKind ph,
                      int mb, int segment, uint32_t after, uint32_t upload = kNone) {
    if (!has_expert_gather(segment)) return after;
    const int64_t n_edp =
        int64_t(model::zero_partition(size_t(expert_block_params_), 0, edp_).padded());
    return b_.add(comm(n, traces::SpanKind::Collective, c, kStreamDp, GroupRole::EDP,
                       n_edp * elem_bytes, seq_edp_++, ph, mb, segment),
                  {after, upload});
  }

  // zero.offload_params on a device (workload.hpp device_offload_params): the runtime's staging
  // slot of a segment's gather (zero3_slot; 4 + it for an MoE block's experts).
  size_t staging_slot(int segment) const {
    if (segment < 0) return 2;
    if (segment >= L_) return 3;
    return size_t((segment - first_layer_) & 1);
  }
  // The shard's elements of staging slot k holding `segment`: ceil(n / dp), the experts' over edp.
  int64_t staged_elems(int segment, size_t k) const {
    if (k >= 4) return int64_t(model::zero_partition(size_t(expert_block_params_), 0, edp_).shard);
    return padded(segment_params(segment)) / dp_;
  }
  // A Memcpy of a staged shard: 4 bytes per element at `bytes_per_s`, on `queue`.
  uint32_t shard_copy(std::string_view n, int queue, int64_t elems, double bytes_per_s,
                      PhaseKind ph, int mb, int segment, const std::vector<uint32_t>& after) {
    const double bytes = kDeviceShardBytesPerParam * double(elems);
    Op op = comm(n, traces::SpanKind::Memcpy, traces::CollOp::None, queue, GroupRole::None,
                 int64_t(bytes), -1, ph, mb, segment);
    op.duration_ns = offload_io_ns(bytes, bytes_per_s);
    return b_.add(op, after);
  }
  // The file's read of `segment`'s shard into slot k's host staging, issued at `after`: after the
  // slot's last upload (the host waits for it before refilling the pinned buffer).
  void read_shard(PhaseKind ph, int mb, int segment, size_t k, uint32_t after) {
    Staging& st = staging_[k];
    const double rd = cost_.profile().offload.nvme_read_bytes_per_s / ranks_per_node_;
    st.read = shard_copy(names::kOffloadRead, kStreamOffloadIo, staged_elems(segment, k), rd, ph,
                         mb, segment, {after, st.upload});
    st.segment = segment;
  }
  // The upload before the gather of `segment` from slot k: its read (now, unless the slot's host
  // staging holds the shard already; the experts' always), after the slot's last gather.
  uint32_t stage_shard(PhaseKind ph, int mb, int segment, size_t k, uint32_t after) {
    Staging& st = staging_[k];
    if (st.segment != segment || k >= 4) read_shard(ph, mb, segment, k, after);
    st.upload = shard_copy(names::kOffloadH2D, names::kStreamOffload, staged_elems(segment, k),
                           host_link_share(), ph, mb, segment, {st.read, st.gather});
    return st.upload;
  }
  // The read-ahead of the runtime's z3_bind_block: block `ahead`'s shard (one after next) into the
  // slot of the block `bound` just bound, issued at `after`.
  void prefetch_shard(PhaseKind ph, int mb, int bound, int ahead, uint32_t after) {
    if (offload_params_) read_shard(ph, mb, ahead, staging_slot(bound), after);
  }

  std::vector<PipelinePass> pass_order() const {
    std::vector<PipelinePass> order;
    if (interleaved_) return pipeline_interleaved_order(pp_, st_, m_, chunks_);
    for (const int pass : schedule_order(schedule_of(par_), pp_, st_, m_))
      order.push_back(pass >= 0 ? PipelinePass{0, pass, true} : PipelinePass{0, -pass - 1, false});
    return order;
  }

  void build_step(int step) {
    step_ = step;
    grad_ops_.clear();
    last_backward_op_ = kNone;
    next_bucket_ = 0;
    next_expert_bucket_ = 0;
    experts_ready_.clear();
    first_forward_ = true;
    const uint32_t zero_grad = b_.add(
        compute(names::kZeroGrad, zero_grad_piece_, PhaseKind::None, -1, -1), after_prev_step_);
    // The op the next pass's first op waits for: the runtime's blocking collectives between passes
    // (the previous step's ZeRO all-gather and pp.loss, ZeRO 1/2 reductions, ZeRO 3's end of backward).
    blocker_ = {zero_grad};
    if (par_.zero == 3) {
      // offload_params: the optimizer wrote new shards; no staging holds a current one.
      for (Staging& st : staging_) st.segment = -99;
      // The embedding and the final LayerNorm: gathered once a step, before any pass (blocking).
      uint32_t after = zero_grad;
      if (has_embed_segment_) after = z3_gather(PhaseKind::None, -1, -1, after);
      if (last_) after = z3_gather(PhaseKind::None, -1, L_, after);
      blocker_ = {after};
    }
    for (const PipelinePass& pass : pass_order()) {
      if (pass.forward)
        forward_pass(pass);
      else
        backward_pass(pass);
    }
    finish_step();
  }

  // The pass's chunk: whether it holds the embedding (stage 0's chunk 0) or the head (the last
  // stage's last chunk); without interleaving the stage's first and last flags.
  bool embed_chunk(const PipelinePass& p) const { return first_ && p.chunk == 0; }
  bool head_chunk(const PipelinePass& p) const { return last_ && p.chunk == chunks_ - 1; }

  void forward_pass(const PipelinePass& pass) {
    const int mb = pass.micro_batch, l0 = chunk_l0(pass.chunk), l1 = l0 + per_chunk_;
    const bool embed = embed_chunk(pass), head = head_chunk(pass);
    const std::vector<uint32_t> wait = std::move(blocker_);
    blocker_.clear();
    uint32_t data = kNone;
    if (embed || head)
      data = b_.add(compute(names::kDataLoad, Piece{0, 0, cc_.data_ns}, PhaseKind::None, mb, -1,
                            traces::SpanKind::Data),
                    wait);
    uint32_t prev = kNone;
    if (embed) {
      std::vector<uint32_t> deps = wait;
      deps.push_back(data);
      for (uint32_t g : gathers_for(-1)) deps.push_back(g);
      prev = b_.add(compute(names::kEmbedForward, cc_.embed_f, PhaseKind::Forward, mb, -1), deps);
    } else {
      prev = b_.add(
          comm(names::kRecvActivation, traces::SpanKind::P2P, traces::CollOp::Recv, kStreamPpRecv,
               GroupRole::PPPrev, act_msg_bytes_, 2 * seq_act_prev_++, PhaseKind::Forward, mb, -1),
          wait);
    }
    uint32_t gathered = kNone;  // ZeRO 3: this block's gather
    for (int l = l0; l < l1; ++l) {
      if (par_.zero == 3) {
        if (l == l0) gathered = z3_gather(PhaseKind::Forward, mb, l, prev);
        const uint32_t this_gather = gathered;
        // Prefetch of the next block, issued once this one's gather is waited for.
        gathered = l + 1 < l1 ? z3_gather(PhaseKind::Forward, mb, l + 1, prev) : kNone;
        if (l + 2 < l1) prefetch_shard(PhaseKind::Forward, mb, l, l + 2, prev);
        prev = forward_block(mb, l, {prev, this_gather});
      } else {
        const auto g = gathers_for(l);
        prev = forward_block(mb, l, {prev, g[0], g[1]});
      }
    }
    if (head) {
      // The head reads the final LayerNorm and, on a last stage with the tied wte, its copy.
      const auto gl = gathers_for(L_), ge = gathers_for(-1);
      const std::vector<uint32_t> deps{prev, data, gl[0], gl[1], ge[0], ge[1]};
      if (sp_) {  // the final LayerNorm on this rank's tokens, all-gathered for the LM head
        const uint32_t ln = b_.add(
            compute(names::kHeadForward, cc_.head_f_sp[0], PhaseKind::Forward, mb, L_), deps);
        const uint32_t ag = tp_sp_coll(true, PhaseKind::Forward, mb, L_, ln);
        b_.add(compute(names::kHeadForward, cc_.head_f_sp[1], PhaseKind::Forward, mb, L_), {ag});
      } else {
        b_.add(compute(names::kHeadForward, cc_.head_f, PhaseKind::Forward, mb, L_), deps);
      }
    } else {
      b_.add(
          comm(names::kSendActivation, traces::SpanKind::P2P, traces::CollOp::Send, kStreamPpSend,
               GroupRole::PPNext, act_msg_bytes_, 2 * seq_act_next_++, PhaseKind::Forward, mb, -1),
          {prev});
    }
    first_forward_ = false;
  }

  // DDP (zero 0): per bucket on the last micro-batch (each chunk's last backward), overlapped with
  // the backward; the step's last backward (chunk 0's) issues what is left.
  void issue_bucket(int mb, uint32_t after) {
    const Bucket& bk = buckets_[next_bucket_++];
    if (zero_rs_) {  // ZeRO's bucket: its reduce-scatter (the runtime's DataParallel issues it)
      const uint32_t rs =
          dp_coll(names::kDpReduceScatter, traces::CollOp::ReduceScatter,
                  bk.params * prec_.grad_bytes, PhaseKind::Backward, mb, bk.lowest, {after});
      grad_ops_.push_back(rs);
      pass_rs_.push_back(rs);
      return;
    }
    if (compressing()) {
      if (compression_ == Compression::PowerSgd)
        grad_ops_.push_back(powersgd_bucket(bk, mb, after));
      else
        gather_bucket(bk, mb, after);
      return;
    }
    // parallel.grad_dtype bf16 / fp16: the runtime sends the bucket as 16-bit patterns (ddp.hpp),
    // 2 bytes per gradient whatever the precision config's gradient bytes.
    const int64_t elem_bytes = grad_dtype_of(s_.parallel) == Precision::FP32 ? prec_.grad_bytes : 2;
    grad_ops_.push_back(dp_coll(names::kDpAllReduce, traces::CollOp::AllReduce,
                                bk.params * elem_bytes, PhaseKind::Backward, mb, bk.lowest,
                                {after}));
  }
  // --- Gradient compression (runtime ddp_compression.hpp): the same collectives, names and bytes
  // (model/compression.hpp's closed forms) as the runtime's hooks. Their host compute: the
  // profile's measured rate per unit of work for the scheme (HostComputeRates, fitted by `orrery
  // calibrate` from a run with that scheme), or without one the roofline of its passes over the
  // bucket (elementwise, or GEMM for PowerSGD's products). The first "ddp.compress" of a bucket
  // carries its fp32 bytes, as the runtime's.
  bool compressing() const {
    return compression_ != Compression::None && dp_ > 1 && step_ >= s_.compression.start_step;
  }
  Piece compression_piece(bool decompress, double units, const std::vector<Kernel>& ks,
                          int64_t span_bytes) const {
    return Piece{0.0, double(span_bytes),
                 cost_.compression_ns(s_.parallel.grad_compression, decompress, units, ks)};
  }
  // int8 / top-k: compress, then the all-gather of every rank's payload; decompressed after the
  // backward (decompress_gathered), as the runtime's finish_backward.
  void gather_bucket(const Bucket& bk, int mb, uint32_t after) {
    const int64_t n = bk.params;
    const bool int8 = compression_ == Compression::Int8;
    // int8: read g and the residual, write the residual, codes and dequantised values; top-k: the
    // same reads plus a selection pass over the magnitudes.
    const double bytes = int8 ? 17.0 * double(n) : 24.0 * double(n);
    const uint32_t c = b_.add(
        compute(names::kDpCompress,
                compression_piece(false, double(n),
                                  {Kernel{OpClass::Elementwise, 4.0 * double(n), bytes}}, 4 * n),
                PhaseKind::Backward, mb, bk.lowest),
        {after});
    const int64_t payload =
        int64_t(int8 ? model::int8_payload_bytes(size_t(n))
                     : model::topk_payload_bytes(size_t(n), s_.compression.topk_ratio));
    const uint32_t g =
        dp_coll(int8 ? names::kDpInt8AllGather : names::kDpTopkAllGather, traces::CollOp::AllGather,
                payload * dp_, PhaseKind::Backward, mb, bk.lowest, {c});
    gathers_.push_back({g, n, bk.lowest});
  }
  // Units (HostComputeRates): int8 the n x dp elements gathered, top-k the bucket's n.
  void decompress_gathered(int mb) {
    for (const auto& [g, n, layer] : gathers_) {
      const bool int8 = compression_ == Compression::Int8;
      const double gathered = double(n) * (int8 ? 1.0 : 0.0) * dp_;
      const std::vector<Kernel> ks{
          Kernel{OpClass::Elementwise, 2.0 * double(n) * dp_, gathered + 8.0 * double(n)}};
      const double units = int8 ? double(n) * dp_ : double(n);
      grad_ops_.push_back(
          b_.add(compute(names::kDpDecompress, compression_piece(true, units, ks, 0),
                         PhaseKind::Backward, mb, layer),
                 {g}));
    }
    gathers_.clear();
  }
  // PowerSGD: per matrix compress (P = M Q), all-reduce P, compress (orthonormalise, Q = Mᵀ P),
  // all-reduce Q; then the last approximation and the plain entries, their all-reduce, and the copy
  // back; every collective waited for (the runtime's hook blocks). Returns the bucket's last op.
  uint32_t powersgd_bucket(const Bucket& bk, int mb, uint32_t after) {
    const int rank = s_.compression.powersgd_rank;
    uint32_t prev = after;
    int64_t span_bytes = 4 * bk.params;
    double approx_flops = 0, approx_bytes = 0;  // the previous matrix's P Qᵀ and residual
    // Units (HostComputeRates): the FLOPs of the stretch's products.
    auto compress = [&](double flops, double bytes) {
      const std::vector<Kernel> ks{Kernel{OpClass::Gemm, flops, bytes}};
      prev = b_.add(compute(names::kDpCompress, compression_piece(false, flops, ks, span_bytes),
                            PhaseKind::Backward, mb, bk.lowest),
                    {prev});
      span_bytes = 0;
    };
    auto all_reduce = [&](std::string_view name, int64_t bytes) {
      prev = dp_coll(name, traces::CollOp::AllReduce, bytes, PhaseKind::Backward, mb, bk.lowest,
                     {prev});
    };
    for (const auto& [rows, cols] : bk.matrices) {
      const double r = double(model::powersgd_effective_rank(size_t(rows), size_t(cols), rank));
      const double mn = double(rows) * double(cols);
      compress(approx_flops + 2.0 * mn * r, approx_bytes + 12.0 * mn);
      all_reduce(names::kDpPowerSgdP, int64_t(4.0 * double(rows) * r));
      compress(2.0 * mn * r + 2.0 * double(rows) * r * r, 4.0 * mn);
      all_reduce(names::kDpPowerSgdQ, int64_t(4.0 * double(cols) * r));
      approx_flops = 2.0 * mn * r;
      approx_bytes = 12.0 * mn;
    }
    compress(approx_flops, approx_bytes + 16.0 * double(bk.plain));
    if (bk.plain == 0) return prev;
    all_reduce(names::kDpPowerSgdVectors, 4 * bk.plain);
    const std::vector<Kernel> ks{Kernel{OpClass::Elementwise, 0.0, 8.0 * double(bk.plain)}};
    return prev = b_.add(
               compute(names::kDpDecompress, compression_piece(true, double(bk.plain), ks, 0),
                       PhaseKind::Backward, mb, bk.lowest),
               {prev});
  }

  // --- Mixture-of-experts blocks (model/moe.hpp's span order; workload.hpp).
  uint32_t ep_all_to_all(std::string_view n, PhaseKind ph, int mb, int layer, uint32_t after) {
    if (ep_ <= 1) return after;  // one ep rank: its experts are local, nothing to exchange
    return b_.add(comm(n, traces::SpanKind::Collective, traces::CollOp::AllToAll, kStreamEp,
                       GroupRole::EP, cc_.a2a_bytes, seq_ep_++, ph, mb, layer),
                  {after});
  }
  uint32_t forward_block(int mb, int l, std::initializer_list<uint32_t> deps) {
    const PhaseKind ph = PhaseKind::Forward;
    if (!is_moe(l)) return block(names::kBlockForward, cc_.block_f, ph, mb, l, deps);
    uint32_t prev = block(names::kBlockForward, cc_.moe_head_f, ph, mb, l, deps);
    prev = b_.add(compute(names::kMoeRouter, cc_.router_f, ph, mb, l), {prev});
    prev = ep_all_to_all(names::kMoeDispatch, ph, mb, l, prev);
    prev = b_.add(compute(names::kMoeExperts, cc_.experts_f, ph, mb, l), {prev});
    prev = ep_all_to_all(names::kMoeCombine, ph, mb, l, prev);
    prev = b_.add(compute(names::kMoeGatedSum, cc_.gated_f, ph, mb, l), {prev});
    if (par_.tp > 1) prev = tp_all_reduce(ph, mb, l, prev);
    return block(names::kBlockForward, cc_.moe_tail_f, ph, mb, l, {prev});
  }
  uint32_t backward_block(int mb, int l, std::initializer_list<uint32_t> deps) {
    const PhaseKind ph = PhaseKind::Backward;
    if (!is_moe(l)) return block(names::kBlockBackward, cc_.block_b, ph, mb, l, deps);
    uint32_t prev = block(names::kBlockBackward, cc_.moe_tail_b, ph, mb, l, deps);
    prev = b_.add(compute(names::kMoeGatedSumBackward, cc_.gated_b, ph, mb, l), {prev});
    if (par_.tp > 1)
      prev = b_.add(
          comm(names::kTpMoeGateAllReduce, traces::SpanKind::Collective, traces::CollOp::AllReduce,
               kStreamTp, GroupRole::TP, cc_.gate_bytes, seq_tp_++, ph, mb, l),
          {prev});
    prev = ep_all_to_all(names::kMoeCombineBackward, ph, mb, l, prev);
    const uint32_t experts =
        b_.add(compute(names::kMoeExpertsBackward, cc_.experts_b, ph, mb, l), {prev});
    prev = ep_all_to_all(names::kMoeDispatchBackward, ph, mb, l, experts);
    prev = b_.add(compute(names::kMoeRouterBackward, cc_.router_b, ph, mb, l), {prev});
    if (par_.tp > 1) prev = tp_all_reduce(ph, mb, l, prev);
    prev = block(names::kBlockBackward, cc_.moe_head_b, ph, mb, l, {prev});
    expert_grads_ready(mb, l, experts);
    return prev;
  }
  // On the gradient-sync micro-batch (the last), with overlap: the expert buckets whose last block
  // is now complete go out over the edp group.
  void expert_grads_ready(int mb, int l, uint32_t producer) {
    if (mb != m_ - 1 || !par_.overlap) return;
    experts_ready_.push_back(l);
    while (next_expert_bucket_ < expert_buckets_.size() &&
           std::find(experts_ready_.begin(), experts_ready_.end(),
                     expert_buckets_[next_expert_bucket_].ready_layer) != experts_ready_.end())
      issue_expert_bucket(mb, producer);
  }
  void issue_expert_bucket(int mb, uint32_t after) {
    const ExpertBucket& bk = expert_buckets_[next_expert_bucket_++];
    if (edp_ <= 1) return;  // one replica of these experts: nothing to sum
    const int64_t elem_bytes = grad_dtype_of(s_.parallel) == Precision::FP32 ? prec_.grad_bytes : 2;
    grad_ops_.push_back(
        b_.add(comm(names::kEdpAllReduce, traces::SpanKind::Collective, traces::CollOp::AllReduce,
                    kStreamDp, GroupRole::EDP, bk.params * elem_bytes, seq_edp_++,
                    PhaseKind::Backward, mb, bk.lowest),
               {after}));
  }

  // With overlap, a bucket goes out as soon as its last segment's gradient is ready.
  void issue_ready(bool ddp_sync, int mb, int position, uint32_t producer) {
    if (!(ddp_sync && (par_.overlap || zero_rs_))) return;
    while (next_bucket_ < buckets_.size() && next_bucket_ != held_bucket_ &&
           buckets_[next_bucket_].ready <= position)
      issue_bucket(mb, producer);
  }

  // The blocks of a backward pass, last first; returns the last block's op.
  uint32_t backward_blocks(const PipelinePass& pass, bool ddp_sync, uint32_t prev) {
    const int mb = pass.micro_batch, l0 = chunk_l0(pass.chunk), l1 = l0 + per_chunk_,
              base = chunk_base(pass.chunk);
    uint32_t gathered = kNone;
    std::vector<uint32_t> rs_of_layer(std::max(1, per_stage_), kNone);
    for (int l = l1 - 1; l >= l0; --l) {
      if (par_.zero == 3) {
        if (l == l1 - 1) gathered = z3_gather(PhaseKind::Backward, mb, l, prev);
        const uint32_t this_gather = gathered;
        gathered = l - 1 >= l0 ? z3_gather(PhaseKind::Backward, mb, l - 1, prev) : kNone;
        if (l - 2 >= l0) prefetch_shard(PhaseKind::Backward, mb, l, l - 2, prev);
        // The block's gradient buffer is the one of the block two layers up: its scatter first.
        const uint32_t buffer_free = l + 2 < l1 ? rs_of_layer[l + 2 - l0] : kNone;
        const uint32_t rc = recompute_ops(mb, l, {prev, this_gather});
        prev = rc == kNone ? backward_block(mb, l, {prev, this_gather, buffer_free})
                           : backward_block(mb, l, {rc, buffer_free});
        if (sp_) prev = tp_grad_all_reduce(mb, l, block_replicated_, prev);
        if (kv_values_ > 0) prev = kv_grad_all_reduce(mb, l, {prev});
        rs_of_layer[l - l0] = z3_scatter(mb, l, prev);
      } else {
        const uint32_t rc = recompute_ops(mb, l, {prev});
        prev = backward_block(mb, l, {rc == kNone ? prev : rc});
        if (sp_) prev = tp_grad_all_reduce(mb, l, block_replicated_, prev);
      }
      issue_ready(ddp_sync, mb, base + 1 + (l1 - 1 - l), prev);
    }
    return prev;
  }

  void backward_pass(const PipelinePass& pass) {
    const int mb = pass.micro_batch, l0 = chunk_l0(pass.chunk), base = chunk_base(pass.chunk);
    const bool embed = embed_chunk(pass), head = head_chunk(pass);
    const std::vector<uint32_t> wait = std::move(blocker_);
    blocker_.clear();
    // ZeRO 1 with a compressed step: DDP's compressed reduction, then each rank's shard of it.
    // zero.overlap_grad_reduce: ZeRO's buckets the same way, every micro-batch under ZeRO 2.
    const bool ddp_sync =
        (dp_ > 1 && (par_.zero == 0 || (par_.zero == 1 && compressing())) && mb == m_ - 1) ||
        (zero_rs_ && (par_.zero == 2 || mb == m_ - 1));
    if (zero_rs_) next_bucket_ = 0;
    const bool step_last_backward = mb == m_ - 1 && pass.chunk == 0;
    uint32_t prev = kNone;
    if (head) {
      prev = b_.add(compute(names::kHeadBackward, cc_.head_b, PhaseKind::Backward, mb, L_), wait);
      if (sp_) prev = tp_grad_all_reduce(mb, L_, head_replicated_, prev);
      if (par_.zero == 3) z3_scatter(mb, L_, prev);
    } else {
      prev = b_.add(comm(names::kRecvGradient, traces::SpanKind::P2P, traces::CollOp::Recv,
                         kStreamPpRecv, GroupRole::PPNext, act_msg_bytes_, 2 * seq_grad_next_++ + 1,
                         PhaseKind::Backward, mb, -1),
                    wait);
    }
    if (head) issue_ready(ddp_sync, mb, base + 0, prev);
    prev = backward_blocks(pass, ddp_sync, prev);
    if (embed) {
      if (sp_)
        prev = tp_sp_coll(true, PhaseKind::Backward, mb, -1, prev);  // every token's gradient
      prev =
          b_.add(compute(names::kEmbedBackward, cc_.embed_b, PhaseKind::Backward, mb, -1), {prev});
      issue_ready(ddp_sync, mb, base + per_chunk_ + 1, prev);
    } else {
      b_.add(comm(names::kSendGradient, traces::SpanKind::P2P, traces::CollOp::Send, kStreamPpSend,
                  GroupRole::PPPrev, act_msg_bytes_, 2 * seq_grad_prev_++ + 1, PhaseKind::Backward,
                  mb, -1),
             {prev});
    }
    last_backward_op_ = prev;
    // The expert gradients not yet sent (no overlap, or a bucket the order left): after the
    // step's last backward.
    if (mb == m_ - 1 && pass.chunk == 0)
      while (next_expert_bucket_ < expert_buckets_.size()) issue_expert_bucket(mb, prev);
    // Without overlap: every bucket after the whole backward of this pass (interleaved: of the
    // step's last pass, chunk 0's backward of micro-batch m-1).
    if (ddp_sync && step_last_backward && !zero_rs_) {
      while (next_bucket_ < buckets_.size()) issue_bucket(mb, last_backward_op_);
      decompress_gathered(mb);
    }
    reduce_after_backward(pass, prev, l0);
  }

  // ZeRO's reductions at the end of a backward pass.
  void reduce_after_backward(const PipelinePass& pass, uint32_t prev, int l0) {
    const int mb = pass.micro_batch;
    if (dp_ > 1 && par_.zero == 3) {
      // z3_finish_backward: the tied wte's sum, the embedding's scatter, then wait for all.
      uint32_t after = prev;
      if (embed_sum_) after = embed_all_reduce({after});
      if (has_embed_segment_) z3_scatter(mb, -1, after);
      blocker_ = grad_ops_;
    } else if (dp_ > 1 && pass.chunk == 0 && (par_.zero == 2 || (par_.zero == 1 && mb == m_ - 1))) {
      // (Interleaved, ZeRO 1 only: after the step's last backward, chunk 0's of micro-batch m-1.)
      // reduce_gradients_zero: the replicated kv heads' sums, the tied wte's, then one
      // reduce-scatter of the whole array; all blocking.
      uint32_t after = prev;
      if (zero_rs_) {
        // The tied wte's sum, then the buckets held for it; the pass ends with every scatter.
        if (embed_sum_) after = embed_all_reduce({after});
        while (next_bucket_ < buckets_.size()) issue_bucket(mb, after);
        blocker_ = std::move(pass_rs_);
        pass_rs_.clear();
        return;
      }
      if (par_.zero == 1 && compressing()) {
        // The compressed average is complete: the sums after it, then the shard is a copy.
        std::vector<uint32_t> deps = grad_ops_;
        deps.push_back(prev);
        if (kv_values_ > 0) deps = {kv_blocks(mb, deps)};
        if (embed_sum_) deps = {embed_all_reduce(deps)};
        grad_ops_.insert(grad_ops_.end(), deps.begin(), deps.end());
        blocker_ = deps;
        return;
      }
      if (kv_values_ > 0) after = kv_blocks(mb, {after});
      if (embed_sum_) after = embed_all_reduce({after});
      const uint32_t rs = dp_coll(names::kDpReduceScatter, traces::CollOp::ReduceScatter,
                                  padded(prog_.param_count) * prec_.grad_bytes, PhaseKind::Backward,
                                  mb, has_embed_segment_ ? -1 : l0, {after});
      grad_ops_.push_back(rs);
      blocker_ = {rs};
    }
  }

  // After the last pass: replicated kv heads' and tied embedding gradients (without ZeRO),
  // optimizer, ZeRO 1/2 all-gather,
  // the pipeline's loss broadcast.
  void finish_step() {
    std::vector<uint32_t> opt_deps = grad_ops_;
    opt_deps.push_back(last_backward_op_);
    opt_deps.insert(opt_deps.end(), blocker_.begin(), blocker_.end());
    if (kv_values_ > 0 && (par_.zero == 0 || dp_ == 1)) opt_deps.push_back(kv_blocks(-1, opt_deps));
    if (embed_sum_ && (par_.zero == 0 || dp_ == 1)) opt_deps.push_back(embed_all_reduce(opt_deps));
    // ZeRO 1/2: the dense optimizer state sharded over dp, the experts' over edp.
    const double opt_params =
        par_.zero >= 1 ? double(prog_.param_count) / dp_ + double(prog_.expert_param_count) / edp_
                       : double(prog_.param_count) + double(prog_.expert_param_count);
    const auto opt_kernels = optimizer_kernels(opt_params, 28.0);
    // Optimizer ops carry no model FLOPs (MFU counts the model's forward and backward only).
    const Piece opt_piece{0.0, total_bytes(opt_kernels),
                          cost_.named_op_ns(names::kOptimizerStep, 0, 1,
                                            model_dims(s_, prec_.act_bytes), opt_params)};
    const std::vector<uint32_t> optim =
        s_.zero.offload_optimizer != "none"
            ? offloaded_optimizer(opt_deps)
            : std::vector<uint32_t>{
                  b_.add(compute(names::kOptimizerStep, opt_piece, PhaseKind::Optimizer, -1, -1,
                                 traces::SpanKind::Optimizer),
                         opt_deps)};
    after_prev_step_ = optim;
    if (zero_rs_) {
      gather_buckets(optim);
    } else if (dp_ > 1 && (par_.zero == 1 || par_.zero == 2)) {
      after_prev_step_ = {dp_coll(names::kDpAllGather, traces::CollOp::AllGather,
                                  padded(prog_.param_count) * prec_.param_bytes,
                                  PhaseKind::Optimizer, -1, -1, optim)};
    }
    if (pp_ > 1)
      after_prev_step_ = {
          b_.add(comm(names::kPipelineLoss, traces::SpanKind::Collective, traces::CollOp::Broadcast,
                      kStreamPpSend, GroupRole::PPNext, 4, seq_pp_++, PhaseKind::None, -1, -1),
                 after_prev_step_)};
  }

  // zero.overlap_grad_reduce: each bucket's all-gather after the optimizer, in forward order (the
  // runtime's gather_zero_buckets). With zero.overlap_param_gather the next step's first forward
  // of each segment waits for its buckets (gathers_for), the scenario's last step for all of them;
  // without, the step does.
  void gather_buckets(const std::vector<uint32_t>& optim) {
    std::vector<uint32_t> all;
    for (size_t i = buckets_.size(); i-- > 0;) {
      pending_ag_[i] = dp_coll(names::kDpAllGather, traces::CollOp::AllGather,
                               buckets_[i].params * prec_.param_bytes, PhaseKind::Optimizer, -1,
                               buckets_[i].lowest, optim);
      all.push_back(pending_ag_[i]);
    }
    if (!s_.zero.overlap_param_gather || step_ + 1 == steps_) {
      after_prev_step_ = all;
      std::fill(pending_ag_.begin(), pending_ag_.end(), kNone);
    }
  }

  // The ranges the runtime's optimizer steps one after another (workload.hpp, "Ranges"), in
  // elements of this rank.
  std::vector<double> optimizer_ranges() const {
    auto shard = [](int64_t n, int ranks) { return double((n + ranks - 1) / ranks); };
    const double experts = double(prog_.expert_param_count);
    if (par_.zero == 3 && dp_ > 1) {
      std::vector<double> out;
      if (has_embed_segment_) out.push_back(shard(segment_params(-1), dp_));
      for (int k = 0; k < chunks_; ++k)
        for (int l = chunk_l0(k); l < chunk_l0(k) + per_chunk_; ++l)
          out.push_back(shard(segment_params(l), dp_));
      if (last_) out.push_back(shard(segment_params(L_), dp_));
      for (int k = 0; k < chunks_; ++k)
        for (int l = chunk_l0(k); l < chunk_l0(k) + per_chunk_; ++l)
          if (is_moe(l)) out.push_back(shard(expert_block_params_, edp_));
      return out;
    }
    if (par_.zero == 0) return {double(prog_.param_count) + experts};
    const double dense = double(prog_.param_count) / dp_;
    if (experts > 0 && dp_ > 1 && ep_ > 1) return {dense, experts / edp_};
    return {dense + experts / edp_};
  }

  // zero.offload_optimizer host or nvme (workload.hpp): each range's pipeline in turn; the last
  // range's final ops, which the optimizer's end waits for (each stream runs the ranges in order).
  std::vector<uint32_t> offloaded_optimizer(const std::vector<uint32_t>& deps) {
    const OffloadLinks& links = cost_.profile().offload;
    std::vector<uint32_t> ends;
    for (const double n : optimizer_ranges()) {
      const std::vector<int64_t> chunks = offload_chunks(s_, int64_t(std::llround(n)));
      if (chunks.empty()) continue;
      ends = host_offload(s_)                 ? host_range(chunks, deps)
             : device_nvme_offload(s_, links) ? device_nvme_range(chunks, deps)
                                              : nvme_range(chunks, deps);
    }
    return ends.empty() ? deps : ends;
  }

  // A Memcpy of offload: `elem_bytes` x chunk i's elements at `bytes_per_s`, on `queue`.
  uint32_t offload_copy(std::string_view n, int queue, const std::vector<int64_t>& chunks, size_t i,
                        double elem_bytes, double bytes_per_s, const std::vector<uint32_t>& after) {
    const double bytes = elem_bytes * double(chunks[i]);
    Op op = comm(n, traces::SpanKind::Memcpy, traces::CollOp::None, queue, GroupRole::None,
                 int64_t(bytes), -1, PhaseKind::Optimizer, -1, -1);
    op.duration_ns = offload_io_ns(bytes, bytes_per_s);
    return b_.add(op, after);
  }

  // The host's AdamW of chunk i (host and device nvme offload).
  uint32_t host_step(const std::vector<int64_t>& chunks, size_t i,
                     const std::vector<uint32_t>& after) {
    const double n = double(chunks[i]);
    const Piece pc{0.0, 4.0 * n, host_adamw_ns(n, cost_.profile().offload, ranks_per_node_)};
    return b_.add(compute(names::kOffloadAdamW, pc, PhaseKind::Optimizer, -1, -1,
                          traces::SpanKind::Optimizer),
                  after);
  }

  // The rank's share of its host link.
  double host_link_share() const {
    const OffloadLinks& links = cost_.profile().offload;
    return links.host_link_bytes_per_s / host_link_sharers(links, ranks_per_node_);
  }

  // zero.offload_optimizer nvme on the CPU runtime's path (workload.hpp): one range's chunked
  // reads, AdamW pieces and writes; its last write.
  std::vector<uint32_t> nvme_range(const std::vector<int64_t>& chunks,
                                   const std::vector<uint32_t>& deps) {
    const double per = offload_bytes_per_param(s_, prec_);
    const OffloadLinks& links = cost_.profile().offload;
    const double rd = links.nvme_read_bytes_per_s / ranks_per_node_;
    const double wr = links.nvme_write_bytes_per_s / ranks_per_node_;
    const ModelDims d = model_dims(s_, prec_.act_bytes);
    const int q = names::kStreamOffload;
    std::vector<uint32_t> reads{offload_copy(names::kOffloadRead, q, chunks, 0, per, rd, deps)};
    uint32_t last = reads[0];
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (i + 1 < chunks.size())
        reads.push_back(offload_copy(names::kOffloadRead, q, chunks, i + 1, per, rd, deps));
      const double n = double(chunks[i]);
      const Piece pc{0.0, total_bytes(optimizer_kernels(n, 28.0)),
                     cost_.named_op_ns(names::kOptimizerStep, 0, 1, d, n)};
      std::vector<uint32_t> after = deps;
      after.push_back(reads[i]);
      const uint32_t a = b_.add(compute(names::kOptimizerStep, pc, PhaseKind::Optimizer, -1, -1,
                                        traces::SpanKind::Optimizer),
                                after);
      last = offload_copy(names::kOffloadWrite, q, chunks, i, per, wr, {a});
    }
    return {last};
  }

  // zero.offload_optimizer host (workload.hpp): one range's download, host step and upload per
  // chunk in the host's issue order D0 D1 S0 U0 D2 S1 U1 ...; its last upload.
  std::vector<uint32_t> host_range(const std::vector<int64_t>& chunks,
                                   const std::vector<uint32_t>& deps) {
    const double link = host_link_share();
    const int q = names::kStreamOffload;
    std::vector<uint32_t> downs{
        offload_copy(names::kOffloadD2H, q, chunks, 0, prec_.grad_bytes, link, deps)};
    uint32_t last = downs[0];
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (i + 1 < chunks.size())
        downs.push_back(
            offload_copy(names::kOffloadD2H, q, chunks, i + 1, prec_.grad_bytes, link, deps));
      const uint32_t step = host_step(chunks, i, {downs[i]});
      last = offload_copy(names::kOffloadH2D, q, chunks, i, prec_.param_bytes, link, {step});
    }
    return {last};
  }

  // zero.offload_optimizer nvme on a device (workload.hpp): one range's reads and writes on the I/O
  // queue, its downloads and uploads on the copy stream and its host steps, with the dependencies
  // of the runtime's host thread; its last upload and last write.
  std::vector<uint32_t> device_nvme_range(const std::vector<int64_t>& chunks,
                                          const std::vector<uint32_t>& deps) {
    const OffloadLinks& links = cost_.profile().offload;
    const double rd = links.nvme_read_bytes_per_s / ranks_per_node_;
    const double wr = links.nvme_write_bytes_per_s / ranks_per_node_;
    const double link = host_link_share(), file = device_nvme_file_bytes(s_);
    const int io = kStreamOffloadIo, cp = names::kStreamOffload;
    std::vector<uint32_t> reads{offload_copy(names::kOffloadRead, io, chunks, 0, file, rd, deps)};
    std::vector<uint32_t> downs;
    std::vector<uint32_t> ends;
    for (size_t i = 0; i < chunks.size(); ++i) {
      // The host has waited for read i: it submits read i+1, then queues the next download(s).
      if (i + 1 < chunks.size())
        reads.push_back(offload_copy(names::kOffloadRead, io, chunks, i + 1, file, rd, {reads[i]}));
      std::vector<uint32_t> issued = deps;
      issued.push_back(reads[i]);
      for (size_t j = downs.size(); j <= std::min(i + 1, chunks.size() - 1); ++j)
        downs.push_back(
            offload_copy(names::kOffloadD2H, cp, chunks, j, prec_.grad_bytes, link, issued));
      const uint32_t step = host_step(chunks, i, {downs[i], reads[i]});
      // offload_params: the file holds the updated shard, nothing goes up.
      const uint32_t up = offload_params_ ? kNone
                                          : offload_copy(names::kOffloadH2D, cp, chunks, i,
                                                         prec_.param_bytes, link, {step});
      const uint32_t write = offload_copy(names::kOffloadWrite, io, chunks, i, file, wr, {step});
      ends = up == kNone ? std::vector<uint32_t>{write} : std::vector<uint32_t>{up, write};
    }
    return ends;
  }

  const Scenario& s_;
  const ParallelConfig& par_;
  const CostModel& cost_;
  const PrecisionConfig& prec_;
  const ComputeCosts& cc_;
  const int steps_, pp_, dp_, m_, L_, chunks_, per_stage_, per_chunk_, st_;
  const int first_layer_;  // the stage's first block (its layers by model::stage_contents)
  const bool first_, last_, interleaved_, has_embed_segment_;
  const bool embed_sum_;  // the tied wte's gradient is summed over the first and last stage
  const int64_t block_replicated_, head_replicated_;
  const int64_t kv_values_;  // replicated kv heads: values of each block's tp.kv_grad_all_reduce
  const Recompute recompute_;
  const int64_t act_msg_bytes_;
  const bool sp_;                // sequence parallelism (tp > 1)
  const int64_t sp_coll_bytes_;  // its all-gathers and reduce-scatters: the whole (B,T,C)
  const Compression compression_;
  int ranks_per_node_ = 1;  // sharing the node's NVMe bandwidth and host memory
  const int ep_, edp_;      // expert parallelism: the ep and edp group sizes (model/moe.hpp)
  // zero.overlap_grad_reduce (model/buckets.hpp zero_buckets): buckets_ are ZeRO's, each
  // reduce-scattered when ready and all-gathered after the optimizer; the buckets each segment's
  // forward reads (by slot), the bucket held for the tied wte's sum (npos: none), this backward
  // pass's scatters, and the previous step's gathers not yet waited for (by bucket; kNone: done).
  const bool zero_rs_;
  std::vector<std::array<int, 2>> zero_reads_;
  size_t held_bucket_ = std::numeric_limits<size_t>::max();
  std::vector<uint32_t> pass_rs_, pending_ag_;
  bool first_forward_ = false;  // the step's first forward pass is being built
  StageProgram& prog_;
  ProgramBuilder b_;
  std::vector<int64_t> seg_params_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> seg_mats_;  // PowerSGD's, by slot
  std::vector<Bucket> buckets_;
  struct Gather {
    uint32_t op;
    int64_t params;
    int layer;
  };
  std::vector<Gather> gathers_;  // int8 / top-k: this step's all-gathers, to decompress
  // Expert gradient buckets over the edp group: parameters, the segment (MoE block) whose
  // moe.experts.bwd completes the bucket, the lowest block (the span's layer).
  struct ExpertBucket {
    int64_t params = 0;
    int ready_layer = -1;
    int lowest = -1;
  };
  std::vector<ExpertBucket> expert_buckets_;
  size_t next_expert_bucket_ = 0;   // issued so far this step
  std::vector<int> experts_ready_;  // MoE blocks whose expert gradients are complete this step
  int32_t seq_ep_ = 0, seq_edp_ = 0;
  int64_t expert_block_params_ = 0;  // an MoE block's local experts' parameters (tp slice)
  Piece zero_grad_piece_;
  // Sequence numbers per communicator role, over the whole run.
  int32_t seq_tp_ = 0, seq_dp_ = 0, seq_act_next_ = 0, seq_act_prev_ = 0, seq_grad_next_ = 0,
          seq_grad_prev_ = 0;
  int32_t seq_embed_ = 0, seq_pp_ = 0;
  // The ops the next step's first pass waits for (optimizer, all-gathers, loss).
  std::vector<uint32_t> after_prev_step_;
  // The step being built.
  int step_ = 0;
  std::vector<uint32_t> grad_ops_;  // DP gradient ops of this step (the optimizer waits for all)
  uint32_t last_backward_op_ = kNone;
  size_t next_bucket_ = 0;  // DDP buckets issued so far this step
  bool is_moe(int layer) const { return model::moe::is_moe_block(s_.model.moe, layer); }
  std::vector<uint32_t> blocker_;
  // zero.offload_params on a device: per staging slot the segment its host buffer holds (-99:
  // none) and the slot's last read, upload and gather.
  struct Staging {
    int segment = -99;
    uint32_t read = kNone, upload = kNone, gather = kNone;
  };
  const bool offload_params_;
  std::array<Staging, 6> staging_{};
};

}  // namespace

Workload build_workload(const Scenario& s, const CostModel& cost, const WorkloadOptions& opt) {
  check_buildable(s, opt);
  check_host_offload(s, cost.profile());
  Workload w;
  w.scenario = s;
  w.layout = Layout::from(s);
  w.precision = opt.precision;
  w.steps = opt.steps;
  w.micro_batches = s.micro_batches_per_step();
  w.model_flops_per_step = model_flops_per_step(s);
  w.tokens_per_step = int64_t(s.training.global_batch) * s.model.seq;
  // Reserve the phase names first so that their ids are stable.
  for (auto n : {names::kStep, names::kForward, names::kBackward, names::kOptimizer})
    w.names.emplace_back(n);

  ComputeCosts cc = make_costs(model_dims(s, opt.precision.act_bytes), cost);
  make_moe_costs(s, model_dims(s, opt.precision.act_bytes), cost, cc);
  cc.data_ns = cost.profile().data_load_ns;
  w.stages.resize(s.parallel.pp);
  for (int st = 0; st < s.parallel.pp; ++st) {
    StageBuilder(s, cost, opt, cc, w.micro_batches, st, w.stages[st], w.names).build();
  }
  return w;
}

}  // namespace orrery::sim
