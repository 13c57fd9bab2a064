// Builds the per-stage op programs of a training step (see workload.hpp for the op structure and the
// symmetry argument).
#include "orrery/sim/workload.hpp"

#include <algorithm>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "orrery/common/error.hpp"
#include "../../runtime/include/orrery/runtime/flops.hpp"

namespace orrery::sim {

std::string_view stream_name(int stream) {
  switch (stream) {
    case kStreamCompute: return "compute";
    case kStreamDp: return "comm.dp";
    case kStreamTp: return "comm.tp";
    case kStreamPpSend: return "comm.pp.send";
    case kStreamPpRecv: return "comm.pp.recv";
  }
  return "other";
}

int Layout::rank_of(int d, int t, int p) const {
  const int coord[3] = {d, t, p};
  const int size[3] = {dp, tp, pp};
  int r = 0;
  for (int i = 2; i >= 0; --i) r = r * size[order[i]] + coord[order[i]];
  return r;
}

Layout::Coord Layout::coord(int rank) const {
  const int size[3] = {dp, tp, pp};
  int c[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    c[order[i]] = rank % size[order[i]];
    rank /= size[order[i]];
  }
  return {c[0], c[1], c[2]};
}

Layout Layout::from(const Scenario& s) {
  Layout l;
  l.dp = s.parallel.dp;
  l.tp = s.parallel.tp;
  l.pp = s.parallel.pp;
  std::stringstream ss(s.parallel.placement);
  std::string axis;
  int i = 0;
  while (std::getline(ss, axis, ',') && i < 3) {
    axis.erase(std::remove(axis.begin(), axis.end(), ' '), axis.end());
    if (axis == "dp") l.order[i] = 0;
    else if (axis == "tp") l.order[i] = 1;
    else if (axis == "pp") l.order[i] = 2;
    else throw InputError(s.path + ": key 'parallel.placement': unknown axis '" + axis + "' (expected tp, dp, pp)");
    ++i;
  }
  if (i != 3) throw InputError(s.path + ": key 'parallel.placement': expected a permutation of tp,dp,pp");
  return l;
}

PrecisionConfig precision_config(const std::string& name) {
  PrecisionConfig p;
  p.name = name;
  if (name == "fp32") {
    p.param_bytes = 4, p.grad_bytes = 4, p.optimizer_bytes = 8, p.act_bytes = 4;
  } else if (name == "mixed" || name == "bf16") {
    p.name = "mixed";
    p.param_bytes = 2, p.grad_bytes = 2, p.optimizer_bytes = 12, p.act_bytes = 2;
  } else {
    throw InputError("precision '" + name + "': expected fp32 or mixed (bf16 with fp32 master weights)");
  }
  return p;
}

std::vector<ParamTensor> stage_parameters(const Scenario& s, int stage) {
  const int64_t c = s.model.d_model, v = s.model.vocab, t = s.model.seq, tp = s.parallel.tp;
  const int pp = s.parallel.pp;
  const int per_stage = s.model.layers / pp;
  std::vector<ParamTensor> out;
  if (stage == 0) {
    out.push_back({"wte", v * c, -1});
    out.push_back({"wpe", t * c, -1});
  }
  // Megatron slicing: qkv and fc1 column-parallel (weights and biases sliced), proj and fc2
  // row-parallel (weights sliced, biases replicated), LayerNorms replicated.
  for (int l = stage * per_stage; l < (stage + 1) * per_stage; ++l) {
    const std::string h = "h" + std::to_string(l) + ".";
    out.push_back({h + "ln1.w", c, l});
    out.push_back({h + "ln1.b", c, l});
    out.push_back({h + "qkv.w", 3 * c * c / tp, l});
    out.push_back({h + "qkv.b", 3 * c / tp, l});
    out.push_back({h + "proj.w", c * c / tp, l});
    out.push_back({h + "proj.b", c, l});
    out.push_back({h + "ln2.w", c, l});
    out.push_back({h + "ln2.b", c, l});
    out.push_back({h + "fc1.w", 4 * c * c / tp, l});
    out.push_back({h + "fc1.b", 4 * c / tp, l});
    out.push_back({h + "fc2.w", 4 * c * c / tp, l});
    out.push_back({h + "fc2.b", c, l});
  }
  if (stage == pp - 1) {
    out.push_back({"lnf.w", c, -1});
    out.push_back({"lnf.b", c, -1});
    if (pp > 1) out.push_back({"wte.head", v * c, -1});  // the last stage's copy of the tied embedding
  }
  return out;
}

std::vector<int> schedule_order(const std::string& schedule, int stages, int stage, int m) {
  std::vector<int> order;
  order.reserve(2 * static_cast<size_t>(m));
  if (schedule == "gpipe") {
    for (int i = 0; i < m; ++i) order.push_back(i);
    for (int i = 0; i < m; ++i) order.push_back(-i - 1);
  } else if (schedule == "1f1b") {
    // PipeDream-Flush (Narayanan et al. 2021): p-s-1 warm-up forwards, then alternate, then drain.
    const int warmup = std::min(stages - stage - 1, m);
    int f = 0, b = 0;
    for (; f < warmup; ++f) order.push_back(f);
    while (f < m) {
      order.push_back(f++);
      order.push_back(-(b++) - 1);
    }
    while (b < m) order.push_back(-(b++) - 1);
  } else {
    throw InputError("parallel.schedule '" + schedule + "': the simulator supports gpipe and 1f1b");
  }
  return order;
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

// Costs of the compute ops of one micro-batch, computed once.
struct ComputeCosts {
  std::vector<Kernel> embed_f, embed_b, attn_f, attn_b, mlp_f, mlp_b, head_f, head_b;
  int64_t embed_f_ns, embed_b_ns, attn_f_ns, attn_b_ns, mlp_f_ns, mlp_b_ns, head_f_ns, head_b_ns, data_ns;
  double attn_f_flops, attn_b_flops, mlp_f_flops, mlp_b_flops, head_f_flops, head_b_flops;
};

}  // namespace

Workload build_workload(const Scenario& s, const CostModel& cost, const WorkloadOptions& opt) {
  validate_layout(s);
  if (opt.steps < 1) throw InputError("simulated steps must be >= 1");
  Workload w;
  w.scenario = s;
  w.layout = Layout::from(s);
  w.precision = opt.precision;
  w.steps = opt.steps;
  w.micro_batches = s.micro_batches_per_step();
  w.model_flops_per_step = model_flops_per_step(s);
  w.tokens_per_step = int64_t(s.training.global_batch) * s.model.seq;
  // Reserve the phase names first so that their ids are stable.
  for (auto n : {names::kStep, names::kForward, names::kBackward, names::kOptimizer}) w.names.emplace_back(n);

  const auto& par = s.parallel;
  const int pp = par.pp, tp = par.tp, dp = par.dp, m = w.micro_batches;
  const int per_stage = s.model.layers / pp;
  const PrecisionConfig& prec = opt.precision;

  ComputeCosts cc;
  const ModelDims dims = model_dims(s, prec.act_bytes);
  cc.embed_f = embedding_forward_kernels(dims);
  cc.embed_b = embedding_backward_kernels(dims);
  cc.attn_f = attention_forward_kernels(dims);
  cc.attn_b = attention_backward_kernels(dims);
  cc.mlp_f = mlp_forward_kernels(dims);
  cc.mlp_b = mlp_backward_kernels(dims);
  cc.head_f = head_forward_kernels(dims);
  cc.head_b = head_backward_kernels(dims);
  cc.embed_f_ns = cost.op_ns(cc.embed_f);
  cc.embed_b_ns = cost.op_ns(cc.embed_b);
  cc.attn_f_ns = cost.op_ns(cc.attn_f);
  cc.attn_b_ns = cost.op_ns(cc.attn_b);
  cc.mlp_f_ns = cost.op_ns(cc.mlp_f);
  cc.mlp_b_ns = cost.op_ns(cc.mlp_b);
  cc.head_f_ns = cost.op_ns(cc.head_f);
  cc.head_b_ns = cost.op_ns(cc.head_b);
  cc.data_ns = cost.profile().data_load_ns;
  cc.attn_f_flops = total_flops(cc.attn_f);
  cc.attn_b_flops = total_flops(cc.attn_b);
  cc.mlp_f_flops = total_flops(cc.mlp_f);
  cc.mlp_b_flops = total_flops(cc.mlp_b);
  cc.head_f_flops = total_flops(cc.head_f);
  cc.head_b_flops = total_flops(cc.head_b);

  const int64_t act_msg_bytes = int64_t(s.training.micro_batch) * s.model.seq * s.model.d_model * prec.act_bytes;
  const int64_t bucket_cap_bytes = std::max<int64_t>(1, static_cast<int64_t>(par.bucket_mb * 1024.0 * 1024.0));

  w.stages.resize(pp);
  for (int st = 0; st < pp; ++st) {
    StageProgram& prog = w.stages[st];
    prog.stage = st;
    ProgramBuilder b(prog, w.names);
    const bool first = st == 0, last = st == pp - 1;
    const int l0 = st * per_stage, l1 = l0 + per_stage;

    // Parameters, and the gradient buckets in all-reduce order (reverse registration, DDP's rule:
    // a bucket closes once it holds at least bucket_mb of gradients). A bucket is ready when the
    // backward op producing its last gradient is done; positions count backward ops in order.
    const auto params = stage_parameters(s, st);
    for (const auto& p : params) prog.param_count += p.count;
    auto grad_position = [&](const ParamTensor& p) {
      if (p.layer >= 0) {
        const int k = l1 - 1 - p.layer;  // 0 for the stage's last block
        const bool attn_half = p.name.find(".ln1.") != std::string::npos || p.name.find(".qkv.") != std::string::npos ||
                               p.name.find(".proj.") != std::string::npos;
        return 1 + 2 * k + (attn_half ? 1 : 0);
      }
      if (p.name == "lnf.w" || p.name == "lnf.b" || p.name == "wte.head") return 0;  // head.backward
      return 1 + 2 * per_stage;  // wte, wpe: embed.backward (wte also gets the head's gradient first)
    };
    struct Bucket {
      int64_t params = 0;
      int ready = -1;  // backward position after which it can be reduced
    };
    std::vector<Bucket> buckets;
    {
      Bucket cur;
      for (auto it = params.rbegin(); it != params.rend(); ++it) {
        cur.params += it->count;
        cur.ready = std::max(cur.ready, grad_position(*it));
        if (cur.params * prec.grad_bytes >= bucket_cap_bytes) {
          buckets.push_back(cur);
          cur = Bucket{};
        }
      }
      if (cur.params > 0) buckets.push_back(cur);
    }
    for (const auto& bk : buckets) prog.bucket_params.push_back(bk.params);
    // Block parameters of one layer (ZeRO-3 gathers them per layer).
    int64_t block_params = 0;
    for (const auto& p : params)
      if (p.layer == l0) block_params += p.count;

    int32_t seq_tp = 0, seq_dp = 0, seq_act_next = 0, seq_act_prev = 0, seq_grad_next = 0, seq_grad_prev = 0;
    int32_t seq_embed = 0;
    uint32_t after_prev_step = kNone;  // the op the next step's first compute waits for (ZeRO all-gathers)

    auto compute = [&](std::string_view n, int64_t ns, double flops, double bytes, PhaseKind ph, int step, int mb,
                       int layer, traces::SpanKind kind = traces::SpanKind::Compute) {
      Op op;
      op.name = b.name(n);
      op.kind = kind;
      op.stream = kStreamCompute;
      op.phase = ph;
      op.step = step, op.micro_batch = mb, op.layer = layer;
      op.duration_ns = ns;
      op.flops = flops;
      op.bytes = static_cast<int64_t>(bytes);
      return op;
    };
    auto comm = [&](std::string_view n, traces::SpanKind kind, traces::CollOp coll, int stream, GroupRole g,
                    int64_t bytes, int32_t seq, PhaseKind ph, int step, int mb, int layer) {
      Op op;
      op.name = b.name(n);
      op.kind = kind;
      op.coll = coll;
      op.stream = static_cast<uint8_t>(stream);
      op.group = g;
      op.bytes = bytes;
      op.seq = seq;
      op.phase = ph;
      op.step = step, op.micro_batch = mb, op.layer = layer;
      return op;
    };

    for (int step = 0; step < opt.steps; ++step) {
      std::vector<uint32_t> grad_ops;  // DP gradient ops of this step (the optimizer waits for all)
      uint32_t last_backward_op = kNone;
      const auto order = schedule_order(par.schedule, pp, st, m);
      bool first_compute_of_step = true;
      // ZeRO-3: gathers one layer's parameters; `after` is the op it may not overtake (prefetch depth).
      auto zero3_gather = [&](PhaseKind ph, int mb, int layer, uint32_t after) {
        return b.add(comm(names::kZeroAllGather, traces::SpanKind::Collective, traces::CollOp::AllGather, kStreamDp,
                          GroupRole::DP, block_params * prec.param_bytes, seq_dp++, ph, step, mb, layer),
                     {after});
      };

      for (const int pass : order) {
        if (pass >= 0) {
          // ---- forward of micro-batch `mb`
          const int mb = pass;
          uint32_t wait = kNone;  // op the next compute op depends on
          if (first_compute_of_step) {
            wait = after_prev_step;
            first_compute_of_step = false;
          }
          uint32_t data = kNone;
          if (first || last) {
            data = b.add(compute(names::kDataLoad, cc.data_ns, 0, 0, PhaseKind::None, step, mb, -1,
                                 traces::SpanKind::Data),
                         {wait});
          }
          uint32_t recv = kNone;
          if (!first) {
            recv = b.add(comm(names::kRecvActivation, traces::SpanKind::P2P, traces::CollOp::Recv, kStreamPpRecv,
                              GroupRole::PPPrev, act_msg_bytes, 2 * seq_act_prev++, PhaseKind::Forward, step, mb, -1),
                         {});
          }
          uint32_t prev = kNone;
          if (first) {
            prev = b.add(compute(names::kEmbedForward, cc.embed_f_ns, 0, total_bytes(cc.embed_f), PhaseKind::Forward,
                                 step, mb, -1),
                         {data, wait});
          } else {
            prev = recv;
          }
          uint32_t prev_prev_compute = kNone, prev_compute = kNone;
          for (int l = l0; l < l1; ++l) {
            uint32_t gather = kNone;
            if (par.zero == 3)
              gather = zero3_gather(PhaseKind::Forward, mb, l, prev_prev_compute);
            uint32_t a = b.add(compute(names::kAttnForward, cc.attn_f_ns, cc.attn_f_flops, total_bytes(cc.attn_f),
                                       PhaseKind::Forward, step, mb, l),
                               {prev, gather, wait});
            wait = kNone;
            uint32_t x = a;
            if (tp > 1)
              x = b.add(comm(names::kTpAllReduce, traces::SpanKind::Collective, traces::CollOp::AllReduce, kStreamTp,
                             GroupRole::TP, act_msg_bytes, seq_tp++, PhaseKind::Forward, step, mb, l),
                        {a});
            uint32_t f = b.add(compute(names::kMlpForward, cc.mlp_f_ns, cc.mlp_f_flops, total_bytes(cc.mlp_f),
                                       PhaseKind::Forward, step, mb, l),
                               {x});
            prev = f;
            if (tp > 1)
              prev = b.add(comm(names::kTpAllReduce, traces::SpanKind::Collective, traces::CollOp::AllReduce,
                                kStreamTp, GroupRole::TP, act_msg_bytes, seq_tp++, PhaseKind::Forward, step, mb, l),
                           {f});
            prev_prev_compute = prev_compute;
            prev_compute = a;
          }
          if (last) {
            prev = b.add(compute(names::kHeadForward, cc.head_f_ns, cc.head_f_flops, total_bytes(cc.head_f),
                                 PhaseKind::Forward, step, mb, -1),
                         {prev, data});
          } else {
            b.add(comm(names::kSendActivation, traces::SpanKind::P2P, traces::CollOp::Send, kStreamPpSend,
                       GroupRole::PPNext, act_msg_bytes, 2 * seq_act_next++, PhaseKind::Forward, step, mb, -1),
                  {prev});
          }
        } else {
          // ---- backward of micro-batch `mb`
          const int mb = -pass - 1;
          const bool sync_grads = (mb == m - 1) || par.zero >= 2;  // gradient communication this pass
          const bool grad_rs = par.zero >= 1;
          std::vector<uint32_t> producers;  // backward position -> op
          uint32_t prev = kNone;
          if (!last) {
            prev = b.add(comm(names::kRecvGradient, traces::SpanKind::P2P, traces::CollOp::Recv, kStreamPpRecv,
                              GroupRole::PPNext, act_msg_bytes, 2 * seq_grad_next++ + 1, PhaseKind::Backward, step,
                              mb, -1),
                         {});
          }
          size_t next_bucket = 0;
          auto issue_ready_buckets = [&](int position, uint32_t producer) {
            if (!(dp > 1 && sync_grads && par.overlap)) return;
            while (next_bucket < buckets.size() && buckets[next_bucket].ready <= position) {
              const Bucket& bk = buckets[next_bucket++];
              grad_ops.push_back(b.add(
                  comm(grad_rs ? names::kDpReduceScatter : names::kDpAllReduce, traces::SpanKind::Collective,
                       grad_rs ? traces::CollOp::ReduceScatter : traces::CollOp::AllReduce, kStreamDp, GroupRole::DP,
                       bk.params * prec.grad_bytes, seq_dp++, PhaseKind::Backward, step, mb, -1),
                  {producer}));
            }
          };
          int position = 0;
          if (last) {
            prev = b.add(compute(names::kHeadBackward, cc.head_b_ns, cc.head_b_flops, total_bytes(cc.head_b),
                                 PhaseKind::Backward, step, mb, -1),
                         {prev});
          }
          if (last) issue_ready_buckets(position, prev);
          uint32_t prev_prev_compute = kNone, prev_compute = kNone;
          for (int l = l1 - 1; l >= l0; --l) {
            uint32_t gather = kNone;
            if (par.zero == 3) gather = zero3_gather(PhaseKind::Backward, mb, l, prev_prev_compute);
            const uint32_t f = b.add(compute(names::kMlpBackward, cc.mlp_b_ns, cc.mlp_b_flops, total_bytes(cc.mlp_b),
                                             PhaseKind::Backward, step, mb, l),
                                     {prev, gather});
            ++position;
            issue_ready_buckets(position, f);
            uint32_t x = f;
            if (tp > 1)
              x = b.add(comm(names::kTpAllReduce, traces::SpanKind::Collective, traces::CollOp::AllReduce, kStreamTp,
                             GroupRole::TP, act_msg_bytes, seq_tp++, PhaseKind::Backward, step, mb, l),
                        {f});
            const uint32_t a = b.add(compute(names::kAttnBackward, cc.attn_b_ns, cc.attn_b_flops,
                                             total_bytes(cc.attn_b), PhaseKind::Backward, step, mb, l),
                                     {x});
            ++position;
            issue_ready_buckets(position, a);
            prev = a;
            if (tp > 1)
              prev = b.add(comm(names::kTpAllReduce, traces::SpanKind::Collective, traces::CollOp::AllReduce,
                                kStreamTp, GroupRole::TP, act_msg_bytes, seq_tp++, PhaseKind::Backward, step, mb, l),
                           {a});
            prev_prev_compute = prev_compute;
            prev_compute = f;
          }
          if (first) {
            prev = b.add(compute(names::kEmbedBackward, cc.embed_b_ns, 0, total_bytes(cc.embed_b),
                                 PhaseKind::Backward, step, mb, -1),
                         {prev});
            ++position;
            issue_ready_buckets(position, prev);
          } else {
            b.add(comm(names::kSendGradient, traces::SpanKind::P2P, traces::CollOp::Send, kStreamPpSend,
                       GroupRole::PPPrev, act_msg_bytes, 2 * seq_grad_prev++ + 1, PhaseKind::Backward, step, mb, -1),
                  {prev});
          }
          last_backward_op = prev;
          // Without overlap (or buckets not yet issued): after the whole backward of this pass.
          if (dp > 1 && sync_grads) {
            while (next_bucket < buckets.size()) {
              const Bucket& bk = buckets[next_bucket++];
              grad_ops.push_back(b.add(
                  comm(grad_rs ? names::kDpReduceScatter : names::kDpAllReduce, traces::SpanKind::Collective,
                       grad_rs ? traces::CollOp::ReduceScatter : traces::CollOp::AllReduce, kStreamDp, GroupRole::DP,
                       bk.params * prec.grad_bytes, seq_dp++, PhaseKind::Backward, step, mb, -1),
                  {last_backward_op}));
            }
          }
        }
      }

      // ---- after the last micro-batch: tied embedding gradients, optimizer, ZeRO 1/2 all-gathers
      std::vector<uint32_t> opt_deps = grad_ops;
      opt_deps.push_back(last_backward_op);
      if (pp > 1 && (first || last)) {
        opt_deps.push_back(b.add(comm(names::kEmbedAllReduce, traces::SpanKind::Collective, traces::CollOp::AllReduce,
                                      kStreamDp, GroupRole::Embedding,
                                      int64_t(s.model.vocab) * s.model.d_model * prec.grad_bytes, seq_embed++,
                                      PhaseKind::Backward, step, -1, -1),
                                 {last_backward_op}));
      }
      const double opt_params = par.zero >= 1 ? double(prog.param_count) / dp : double(prog.param_count);
      const auto opt_kernels = optimizer_kernels(opt_params, 28.0);
      const uint32_t optim = b.add(compute(names::kOptimizerStep, cost.op_ns(opt_kernels), 0, total_bytes(opt_kernels),
                                           PhaseKind::Optimizer, step, -1, -1, traces::SpanKind::Optimizer),
                                   opt_deps);
      after_prev_step = kNone;
      if (par.zero == 1 || par.zero == 2) {
        for (const auto& bk : buckets) {
          after_prev_step =
              b.add(comm(names::kDpAllGather, traces::SpanKind::Collective, traces::CollOp::AllGather, kStreamDp,
                         GroupRole::DP, bk.params * prec.param_bytes, seq_dp++, PhaseKind::Optimizer, step, -1, -1),
                    {optim});
        }
      }
    }
  }
  return w;
}

}  // namespace orrery::sim
