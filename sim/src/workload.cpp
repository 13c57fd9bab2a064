// Builds the per-stage op programs of a training step (see workload.hpp for the op structure and the
// symmetry argument).
#include "orrery/common/pipeline_schedule.hpp"
#include "orrery/sim/workload.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "orrery/common/error.hpp"

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

int chunks_per_stage(const Scenario& s) {
  return s.parallel.schedule == "interleaved" ? std::max(1, s.parallel.virtual_stages) : 1;
}

std::vector<ParamTensor> stage_parameters(const Scenario& s, int stage) {
  const int64_t c = s.model.d_model, v = s.model.vocab, t = s.model.seq, tp = s.parallel.tp;
  const int pp = s.parallel.pp, L = s.model.layers;
  const int chunks = chunks_per_stage(s), per_chunk = L / (pp * chunks);
  std::vector<ParamTensor> out;
  if (stage == 0) {
    out.push_back({"wte", v * c, -1});
    out.push_back({"wpe", t * c, -1});
  } else if (stage == pp - 1) {
    out.push_back({"wte", v * c, -1});  // the last stage's own copy of the tied embedding (model.hpp)
  }
  // Megatron slicing (model.hpp): qkv and fc1 column-parallel (weights and biases sliced), proj and
  // fc2 row-parallel (weights sliced, biases replicated), LayerNorms replicated.
  // The stage's chunks in order (one chunk, its contiguous layers, unless interleaved): chunk k holds
  // the layers of virtual stage k·pp + stage.
  for (int k = 0; k < chunks; ++k) {
    for (int l = (k * pp + stage) * per_chunk; l < (k * pp + stage + 1) * per_chunk; ++l) {
      const std::string h = "h." + std::to_string(l) + ".";
      out.push_back({h + "ln1w", c, l});
      out.push_back({h + "ln1b", c, l});
      out.push_back({h + "qkvw", 3 * c * c / tp, l});
      out.push_back({h + "qkvb", 3 * c / tp, l});
      out.push_back({h + "projw", c * c / tp, l});
      out.push_back({h + "projb", c, l});
      out.push_back({h + "ln2w", c, l});
      out.push_back({h + "ln2b", c, l});
      out.push_back({h + "fcw", 4 * c * c / tp, l});
      out.push_back({h + "fcb", 4 * c / tp, l});
      out.push_back({h + "fcprojw", 4 * c * c / tp, l});
      out.push_back({h + "fcprojb", c, l});
    }
  }
  if (stage == pp - 1) {
    out.push_back({"lnfw", c, L});
    out.push_back({"lnfb", c, L});
  }
  return out;
}

std::vector<int> schedule_order(const std::string& schedule, int stages, int stage, int m) {
  return pipeline_schedule_order(schedule, stages, stage, m, "the simulator");
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
  int64_t data_ns = 0;
};

ComputeCosts make_costs(const ModelDims& d, const CostModel& cost) {
  // Each piece's FLOPs and bytes from its kernels, its time from the cost model by name (a measured
  // op of the profile, scaled to this shape, or the roofline of its kernels: cost_model.hpp).
  auto piece = [&](const char* name, int index, int pieces) {
    const auto ks = op_kernels(name, index, pieces, d);
    return Piece{total_flops(*ks), total_bytes(*ks), cost.named_op_ns(name, index, pieces, d)};
  };
  ComputeCosts c;
  c.embed_f = piece("fwd.embed", 0, 1);
  c.embed_b = piece("bwd.embed", 0, 1);
  c.head_f = piece("fwd.head", 0, 1);
  c.head_b = piece("bwd.head", 0, 1);
  // One piece per block (tp = 1) or the runtime's three, split where Megatron sums over the tp group
  // (model.hpp; op_kernels lists their kernels).
  const int pieces = d.tp == 1 ? 1 : 3;
  for (int i = 0; i < pieces; ++i) {
    c.block_f.push_back(piece("fwd.block", i, pieces));
    c.block_b.push_back(piece("bwd.block", i, pieces));
  }
  return c;
}

}  // namespace

double workload_ops_bound(const Scenario& s, int steps) {
  const auto& par = s.parallel;
  const double pp = std::max(1, par.pp), per_stage = double(s.model.layers) / pp;
  const double m = double(s.training.global_batch) /
                   (double(std::max(1, par.dp)) * double(std::max(1, s.training.micro_batch)));
  const double pieces = par.tp > 1 ? 3 : 1;
  // Per micro-batch and layer: the forward's and the backward's pieces with the tp all-reduces
  // between them; ZeRO 3 adds a gather before each and the backward's reduce-scatter.
  const double per_layer = 2 * (2 * pieces - 1) + (par.zero == 3 ? 3 : 0);
  // Per micro-batch at most 10 more (data, embedding or receive, head or send, ZeRO's blocking
  // collectives, the extra prefetch); per step at most one DDP bucket per segment and 10 more
  // (zero_grad, ZeRO 3's start gathers, tied-embedding all-reduce, optimizer, all-gather, loss).
  // Interleaved: per micro-batch and chunk at most the 10 (a chunk's pass has the same extras).
  const double per_step = m * (per_stage * per_layer + 10 * chunks_per_stage(s)) + (per_stage + 2) + 10;
  return double(std::max(1, steps)) * per_step;
}

Workload build_workload(const Scenario& s, const CostModel& cost, const WorkloadOptions& opt) {
  validate_layout(s);
  if (opt.steps < 1) throw InputError("simulated steps must be >= 1");
  const bool interleaved = s.parallel.schedule == "interleaved";
  if (interleaved) {
    // Megatron's interleaved 1F1B: v model chunks per stage, chunk c of stage s the layers of
    // virtual stage c·pp + s (validate_layout checks that pp·v divides the layers).
    const int pp = s.parallel.pp, v = chunks_per_stage(s);
    if (pp < 2)
      throw InputError(s.path + ": key 'parallel.schedule': the interleaved schedule needs parallel.pp >= 2 (got " +
                       std::to_string(pp) + ")");
    if (s.model.layers % (pp * v) != 0)
      throw InputError(s.path + ": key 'parallel.virtual_stages': model.layers (" + std::to_string(s.model.layers) +
                       ") must be divisible by pp x virtual_stages (" + std::to_string(pp * v) + ")");
    // ZeRO 2 sums the tied embedding between the first and the last stage after every micro-batch's
    // backward, blocking (reduce_gradients_zero): under this order the last stage would wait there
    // after chunk 0's backward of micro-batch i for stage 0, whose backward of it needs a forward the
    // last stage runs only later (p = 4, v = 2: stage 3 runs B0.0 before F0.6, whose output stage 0's
    // F1.6 needs before its B0.0): a deadlock, so refused. ZeRO 3 is not built for chunks.
    if (s.parallel.zero == 2)
      throw InputError(s.path + ": key 'parallel.zero': ZeRO 2 cannot run the interleaved schedule (its blocking " +
                       "per-micro-batch sum of the tied embedding between the first and last stage would deadlock " +
                       "it); use zero 0 or 1, or schedule 1f1b");
    if (s.parallel.zero == 3)
      throw InputError(s.path + ": key 'parallel.zero': ZeRO 3 with the interleaved schedule is not simulated " +
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
  const int pp = par.pp, dp = par.dp, m = w.micro_batches, L = s.model.layers;
  const int chunks = chunks_per_stage(s);       // model chunks per stage (1 unless interleaved)
  const int per_stage = L / pp;                  // layers per stage
  const int per_chunk = per_stage / chunks;      // layers per chunk
  const PrecisionConfig& prec = opt.precision;
  ComputeCosts cc = make_costs(model_dims(s, prec.act_bytes), cost);
  cc.data_ns = cost.profile().data_load_ns;

  const int64_t act_msg_bytes = int64_t(s.training.micro_batch) * s.model.seq * s.model.d_model * prec.act_bytes;
  const double bucket_cap_bytes = par.bucket_mb * 1024.0 * 1024.0;

  w.stages.resize(pp);
  for (int st = 0; st < pp; ++st) {
    StageProgram& prog = w.stages[st];
    prog.stage = st;
    ProgramBuilder b(prog, w.names);
    const bool first = st == 0, last = st == pp - 1;
    // Chunk k of the stage: layers [chunk_l0(k), chunk_l0(k) + per_chunk); one chunk = the stage.
    const auto chunk_l0 = [&](int k) { return (k * pp + st) * per_chunk; };

    // Segments in gradient-ready order with their parameter counts, and the backward position after
    // which each is ready: 0 = after bwd.head, 1 + k = after block l1-1-k, per_stage + 1 = after
    // bwd.embed (a head-only stage's wte copy is ready with the last block, as the runtime fires it).
    // Interleaved: a chunk's gradients are ready after its last backward (micro-batch m-1); those run
    // chunk v-1 first, chunk 0 last, so chunk k's positions are offset by (v-1-k)·(per_chunk + 2).
    // Parameters per segment of the stage (slot 0 the embedding -1, 1 the final LayerNorm L, then
    // the blocks by chunk), summed once: a scan of the stage's tensors per segment was quadratic in
    // the layers (minutes at 100,000).
    std::vector<int64_t> seg_params(size_t(per_stage) + 2, 0);
    const auto slot = [&](int seg) {
      if (seg < 0) return size_t(0);
      if (seg >= L) return size_t(1);
      return size_t(2 + (seg / per_chunk / pp) * per_chunk + seg % per_chunk);  // chunk, then layer
    };
    const auto chunk_base = [&](int k) { return (chunks - 1 - k) * (per_chunk + 2); };
    for (const auto& p : stage_parameters(s, st)) {
      prog.param_count += p.count;
      seg_params[slot(p.segment)] += p.count;
    }
    auto segment_params = [&](int seg) { return seg_params[slot(seg)]; };
    struct Segment {
      int id;
      int64_t params;
      int position;
    };
    std::vector<Segment> ready_order;
    for (int k = chunks - 1; k >= 0; --k) {
      const int l0 = chunk_l0(k), l1 = l0 + per_chunk, base = chunk_base(k);
      if (last && k == chunks - 1) ready_order.push_back({L, segment_params(L), base});
      for (int l = l1 - 1; l >= l0; --l) ready_order.push_back({l, segment_params(l), base + 1 + (l1 - 1 - l)});
      if (first && k == 0) ready_order.push_back({-1, segment_params(-1), base + per_chunk + 1});
    }
    if (!first && last) ready_order.push_back({-1, segment_params(-1), chunk_base(0) + per_chunk});

    // DDP buckets (ddp.hpp): whole segments; a bucket closes before the segment that would take it
    // past the cap, so a segment larger than the cap is a bucket of its own.
    struct Bucket {
      int64_t params = 0;
      int ready = -1;       // backward position after which it can be reduced
      int lowest = INT32_MAX;  // lowest segment (the span's layer)
    };
    std::vector<Bucket> buckets;
    {
      Bucket cur;
      for (const auto& sg : ready_order) {
        if (cur.params > 0 && double(cur.params + sg.params) * prec.grad_bytes > bucket_cap_bytes) {
          buckets.push_back(cur);
          cur = Bucket{};
        }
        cur.params += sg.params;
        cur.ready = std::max(cur.ready, sg.position);
        cur.lowest = std::min(cur.lowest, sg.id);
      }
      if (cur.params > 0) buckets.push_back(cur);
    }
    for (const auto& bk : buckets) prog.bucket_params.push_back(bk.params);

    int32_t seq_tp = 0, seq_dp = 0, seq_act_next = 0, seq_act_prev = 0, seq_grad_next = 0, seq_grad_prev = 0;
    int32_t seq_embed = 0;
    uint32_t after_prev_step = kNone;  // the op the next step's first pass waits for (optimizer, all-gather, loss)

    auto compute = [&](std::string_view n, const Piece& pc, PhaseKind ph, int step, int mb, int layer,
                       traces::SpanKind kind = traces::SpanKind::Compute) {
      Op op;
      op.name = b.name(n);
      op.kind = kind;
      op.stream = kStreamCompute;
      op.phase = ph;
      op.step = step, op.micro_batch = mb, op.layer = layer;
      op.duration_ns = pc.ns;
      op.flops = pc.flops;
      op.bytes = static_cast<int64_t>(pc.bytes);
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
    auto tp_all_reduce = [&](PhaseKind ph, int step, int mb, int layer, uint32_t after) {
      return b.add(comm(names::kTpAllReduce, traces::SpanKind::Collective, traces::CollOp::AllReduce, kStreamTp,
                        GroupRole::TP, act_msg_bytes, seq_tp++, ph, step, mb, layer),
                   {after});
    };
    // A block's forward or backward: its pieces, with a tp all-reduce between consecutive pieces.
    auto block = [&](std::string_view n, const std::vector<Piece>& pieces, PhaseKind ph, int step, int mb, int layer,
                     std::initializer_list<uint32_t> first_deps) {
      uint32_t prev = kNone;
      for (size_t k = 0; k < pieces.size(); ++k) {
        const uint32_t op = k == 0 ? b.add(compute(n, pieces[k], ph, step, mb, layer), first_deps)
                                   : b.add(compute(n, pieces[k], ph, step, mb, layer), {prev});
        prev = k + 1 < pieces.size() ? tp_all_reduce(ph, step, mb, layer, op) : op;
      }
      return prev;
    };

    // ZeRO sizes: the runtime pads an array of n elements to dp · ceil(n / dp) (zero.hpp); the
    // collectives move the padded total.
    auto padded = [&](int64_t n) { return (n + dp - 1) / dp * dp; };
    const bool has_embed_segment = first || last;  // wte (and wpe on stage 0) on this stage
    int32_t seq_pp = 0;                           // collectives on the pp group (pp.loss)
    // Each step first zeroes the gradients the stage holds (and ZeRO's shard accumulators).
    const ModelDims dims = model_dims(s, prec.act_bytes);
    const double zeroed = double(prog.param_count) + (par.zero >= 1 ? double(padded(prog.param_count)) / dp : 0.0);
    const Piece zero_grad_piece{0.0, total_bytes(*op_kernels("zero_grad", 0, 1, dims, zeroed)),
                                cost.named_op_ns("zero_grad", 0, 1, dims, zeroed)};

    for (int step = 0; step < opt.steps; ++step) {
      std::vector<uint32_t> grad_ops;  // DP gradient ops of this step (the optimizer waits for all)
      uint32_t last_backward_op = kNone;
      std::vector<PipelinePass> order;
      if (interleaved) {
        order = pipeline_interleaved_order(pp, st, m, chunks);
      } else {
        for (const int pass : schedule_order(par.schedule, pp, st, m))
          order.push_back(pass >= 0 ? PipelinePass{0, pass, true} : PipelinePass{0, -pass - 1, false});
      }
      size_t next_bucket = 0;  // DDP buckets issued so far this step
      const uint32_t zero_grad =
          b.add(compute(names::kZeroGrad, zero_grad_piece, PhaseKind::None, step, -1, -1), {after_prev_step});
      // The op the next pass's first op waits for: the runtime's blocking collectives between passes
      // (the previous step's ZeRO all-gather and pp.loss, ZeRO 1/2 reductions, ZeRO 3's end of backward).
      std::vector<uint32_t> blocker{zero_grad};
      auto dp_coll = [&](std::string_view n, traces::CollOp c, int64_t bytes, PhaseKind ph, int mb, int layer,
                         std::vector<uint32_t> deps) {
        return b.add(comm(n, traces::SpanKind::Collective, c, kStreamDp, GroupRole::DP, bytes, seq_dp++, ph, step, mb,
                          layer),
                     deps);
      };
      auto embed_all_reduce = [&](int mb, std::vector<uint32_t> deps) {
        return b.add(comm(names::kEmbedAllReduce, traces::SpanKind::Collective, traces::CollOp::AllReduce, kStreamDp,
                          GroupRole::Embedding, int64_t(s.model.vocab) * s.model.d_model * prec.grad_bytes,
                          seq_embed++, PhaseKind::Backward, step, mb, -1),
                     deps);
      };
      // ZeRO 3 (the runtime's Zero3Storage): one all-gather per segment, issued on the comm thread in
      // the order the trainer binds them (a block's gather when the block before it is bound, so one
      // block ahead), and one reduce-scatter per segment as its backward completes.
      auto z3_gather = [&](PhaseKind ph, int mb, int segment, uint32_t after) {
        return dp_coll(names::kZeroAllGather, traces::CollOp::AllGather,
                       padded(segment_params(segment)) * prec.param_bytes, ph, mb, segment, {after});
      };
      auto z3_scatter = [&](int mb, int segment, uint32_t after) {
        const uint32_t op = dp_coll(names::kDpReduceScatter, traces::CollOp::ReduceScatter,
                                    padded(segment_params(segment)) * prec.grad_bytes, PhaseKind::Backward, mb, segment,
                                    {after});
        grad_ops.push_back(op);
        return op;
      };
      if (par.zero == 3) {
        // The embedding and the final LayerNorm: gathered once a step, before any pass (blocking).
        uint32_t after = zero_grad;
        if (has_embed_segment) after = z3_gather(PhaseKind::None, -1, -1, after);
        if (last) after = z3_gather(PhaseKind::None, -1, L, after);
        blocker = {after};
      }

      for (const PipelinePass& pass : order) {
        // The pass's chunk: its layers, and whether it holds the embedding (stage 0's chunk 0) or the
        // head (the last stage's last chunk); without interleaving the stage's first and last flags.
        const int l0 = chunk_l0(pass.chunk), l1 = l0 + per_chunk;
        const bool embed_chunk = first && pass.chunk == 0, head_chunk = last && pass.chunk == chunks - 1;
        const int base = chunk_base(pass.chunk);
        if (pass.forward) {
          // ---- forward of micro-batch `mb`
          const int mb = pass.micro_batch;
          const std::vector<uint32_t> wait = std::move(blocker);
          blocker.clear();
          uint32_t data = kNone;
          if (embed_chunk || head_chunk)
            data = b.add(compute(names::kDataLoad, Piece{0, 0, cc.data_ns}, PhaseKind::None, step, mb, -1,
                                 traces::SpanKind::Data),
                         wait);
          uint32_t prev = kNone;
          if (embed_chunk) {
            std::vector<uint32_t> deps = wait;
            deps.push_back(data);
            prev = b.add(compute(names::kEmbedForward, cc.embed_f, PhaseKind::Forward, step, mb, -1), deps);
          } else {
            prev = b.add(comm(names::kRecvActivation, traces::SpanKind::P2P, traces::CollOp::Recv, kStreamPpRecv,
                              GroupRole::PPPrev, act_msg_bytes, 2 * seq_act_prev++, PhaseKind::Forward, step, mb, -1),
                         wait);
          }
          uint32_t gathered = kNone;  // ZeRO 3: this block's gather
          for (int l = l0; l < l1; ++l) {
            if (par.zero == 3) {
              if (l == l0) gathered = z3_gather(PhaseKind::Forward, mb, l, prev);
              const uint32_t this_gather = gathered;
              // Prefetch of the next block, issued once this one's gather is waited for.
              gathered = l + 1 < l1 ? z3_gather(PhaseKind::Forward, mb, l + 1, prev) : kNone;
              prev = block(names::kBlockForward, cc.block_f, PhaseKind::Forward, step, mb, l, {prev, this_gather});
            } else {
              prev = block(names::kBlockForward, cc.block_f, PhaseKind::Forward, step, mb, l, {prev});
            }
          }
          if (head_chunk) {
            prev = b.add(compute(names::kHeadForward, cc.head_f, PhaseKind::Forward, step, mb, L), {prev, data});
          } else {
            b.add(comm(names::kSendActivation, traces::SpanKind::P2P, traces::CollOp::Send, kStreamPpSend,
                       GroupRole::PPNext, act_msg_bytes, 2 * seq_act_next++, PhaseKind::Forward, step, mb, -1),
                  {prev});
          }
        } else {
          // ---- backward of micro-batch `mb`
          const int mb = pass.micro_batch;
          const std::vector<uint32_t> wait = std::move(blocker);
          blocker.clear();
          // DDP (zero 0): per bucket on the last micro-batch (each chunk's last backward), overlapped
          // with the backward; the step's last backward (chunk 0's) issues what is left.
          const bool ddp_sync = dp > 1 && par.zero == 0 && mb == m - 1;
          const bool step_last_backward = mb == m - 1 && pass.chunk == 0;
          auto issue_bucket = [&](uint32_t after) {
            const Bucket& bk = buckets[next_bucket++];
            grad_ops.push_back(dp_coll(names::kDpAllReduce, traces::CollOp::AllReduce, bk.params * prec.grad_bytes,
                                       PhaseKind::Backward, mb, bk.lowest, {after}));
          };
          // With overlap, a bucket goes out as soon as its last segment's gradient is ready.
          auto issue_ready = [&](int position, uint32_t producer) {
            if (!(ddp_sync && par.overlap)) return;
            while (next_bucket < buckets.size() && buckets[next_bucket].ready <= base + position)
              issue_bucket(producer);
          };
          uint32_t prev = kNone;
          std::vector<uint32_t> z3_rs;  // ZeRO 3 reduce-scatters of this pass, by position
          if (head_chunk) {
            prev = b.add(compute(names::kHeadBackward, cc.head_b, PhaseKind::Backward, step, mb, L), wait);
            if (par.zero == 3) z3_scatter(mb, L, prev);
          } else {
            prev = b.add(comm(names::kRecvGradient, traces::SpanKind::P2P, traces::CollOp::Recv, kStreamPpRecv,
                              GroupRole::PPNext, act_msg_bytes, 2 * seq_grad_next++ + 1, PhaseKind::Backward, step,
                              mb, -1),
                         wait);
          }
          if (head_chunk) issue_ready(0, prev);
          uint32_t gathered = kNone;
          std::vector<uint32_t> rs_of_layer(std::max(1, per_stage), kNone);
          for (int l = l1 - 1; l >= l0; --l) {
            if (par.zero == 3) {
              if (l == l1 - 1) gathered = z3_gather(PhaseKind::Backward, mb, l, prev);
              const uint32_t this_gather = gathered;
              gathered = l - 1 >= l0 ? z3_gather(PhaseKind::Backward, mb, l - 1, prev) : kNone;
              // The block's gradient buffer is the one of the block two layers up: its scatter first.
              const uint32_t buffer_free = l + 2 < l1 ? rs_of_layer[l + 2 - l0] : kNone;
              prev = block(names::kBlockBackward, cc.block_b, PhaseKind::Backward, step, mb, l,
                           {prev, this_gather, buffer_free});
              rs_of_layer[l - l0] = z3_scatter(mb, l, prev);
            } else {
              prev = block(names::kBlockBackward, cc.block_b, PhaseKind::Backward, step, mb, l, {prev});
            }
            issue_ready(1 + (l1 - 1 - l), prev);
          }
          if (embed_chunk) {
            prev = b.add(compute(names::kEmbedBackward, cc.embed_b, PhaseKind::Backward, step, mb, -1), {prev});
            issue_ready(per_chunk + 1, prev);
          } else {
            b.add(comm(names::kSendGradient, traces::SpanKind::P2P, traces::CollOp::Send, kStreamPpSend,
                       GroupRole::PPPrev, act_msg_bytes, 2 * seq_grad_prev++ + 1, PhaseKind::Backward, step, mb, -1),
                  {prev});
          }
          last_backward_op = prev;
          // Without overlap: every bucket after the whole backward of this pass (interleaved: of the
          // step's last pass, chunk 0's backward of micro-batch m-1).
          if (ddp_sync && step_last_backward)
            while (next_bucket < buckets.size()) issue_bucket(last_backward_op);
          if (dp > 1 && par.zero == 3) {
            // z3_finish_backward: the tied wte's sum, the embedding's scatter, then wait for all.
            uint32_t after = prev;
            if (pp > 1 && has_embed_segment) after = embed_all_reduce(mb, {after});
            if (has_embed_segment) z3_scatter(mb, -1, after);
            blocker = grad_ops;
          } else if (dp > 1 && pass.chunk == 0 && (par.zero == 2 || (par.zero == 1 && mb == m - 1))) {
            // (Interleaved, ZeRO 1 only: after the step's last backward, chunk 0's of micro-batch m-1.)
            // reduce_gradients_zero: the tied wte's sum, then one reduce-scatter of the whole array;
            // both blocking.
            uint32_t after = prev;
            if (pp > 1 && has_embed_segment) after = embed_all_reduce(mb, {after});
            const uint32_t rs = dp_coll(names::kDpReduceScatter, traces::CollOp::ReduceScatter,
                                        padded(prog.param_count) * prec.grad_bytes, PhaseKind::Backward, mb,
                                        has_embed_segment ? -1 : l0, {after});
            grad_ops.push_back(rs);
            blocker = {rs};
          }
        }
      }

      // ---- after the last pass: tied embedding gradients (without ZeRO), optimizer, ZeRO 1/2
      // all-gather, the pipeline's loss broadcast
      std::vector<uint32_t> opt_deps = grad_ops;
      opt_deps.push_back(last_backward_op);
      opt_deps.insert(opt_deps.end(), blocker.begin(), blocker.end());
      if (pp > 1 && has_embed_segment && (par.zero == 0 || dp == 1))
        opt_deps.push_back(embed_all_reduce(-1, opt_deps));
      const double opt_params = par.zero >= 1 ? double(prog.param_count) / dp : double(prog.param_count);
      const auto opt_kernels = optimizer_kernels(opt_params, 28.0);
      // Optimizer ops carry no model FLOPs (MFU counts the model's forward and backward only).
      const Piece opt_piece{0.0, total_bytes(opt_kernels),
                            cost.named_op_ns("adamw", 0, 1, model_dims(s, prec.act_bytes), opt_params)};
      const uint32_t optim = b.add(
          compute(names::kOptimizerStep, opt_piece, PhaseKind::Optimizer, step, -1, -1, traces::SpanKind::Optimizer),
          opt_deps);
      after_prev_step = optim;
      if (dp > 1 && (par.zero == 1 || par.zero == 2))
        after_prev_step = dp_coll(names::kDpAllGather, traces::CollOp::AllGather,
                                  padded(prog.param_count) * prec.param_bytes, PhaseKind::Optimizer, -1, -1, {optim});
      if (pp > 1)
        after_prev_step = b.add(comm(names::kPipelineLoss, traces::SpanKind::Collective, traces::CollOp::Broadcast,
                                     kStreamPpSend, GroupRole::PPNext, 4, seq_pp++, PhaseKind::None, step, -1, -1),
                                {after_prev_step});
    }
  }
  return w;
}

}  // namespace orrery::sim
