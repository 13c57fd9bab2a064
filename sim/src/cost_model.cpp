// Kernel lists of the training step's compute ops and their roofline timing (see cost_model.hpp).
#include "orrery/sim/cost_model.hpp"

#include <algorithm>
#include <cmath>

#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"
// The runtime's FLOP counting, header-only and self-contained by design: the simulator includes it
// so that simulated and real spans carry the same FLOPs (checked in test_cost_model.cpp).
#include "orrery/model/block.hpp"
#include "orrery/model/flops.hpp"
#include "orrery/model/moe.hpp"
#include "orrery/model/names.hpp"

namespace orrery::sim {

namespace names = ::orrery::model::names;

ModelDims model_dims(const Scenario& s, int64_t act_bytes) {
  ModelDims d;
  d.batch = s.training.micro_batch;
  d.seq = s.model.seq;
  d.d_model = s.model.d_model;
  d.heads = s.model.heads;
  d.vocab = s.model.vocab;
  d.layers = s.model.layers;
  d.tp = s.parallel.tp;
  d.act_bytes = act_bytes;
  d.sequence_parallel = s.parallel.sequence_parallel && s.parallel.tp > 1;
  d.vocab_parallel = s.parallel.vocab_parallel && s.parallel.tp > 1;
  d.arch = block_arch(s.model);
  const auto p = precision_from_string(s.runtime.precision);
  d.emulated_16bit = parse_device(s.runtime.device) == orrery::Device::Cpu && p &&
                     (*p == Precision::BF16 || *p == Precision::FP16);
  if (d.emulated_16bit) d.emulated_format = *p;
  return d;
}

model::flops::Dims flop_dims(const ModelDims& d) {
  return model::flops::dims_of(d.arch, d.batch, d.seq, d.d_model, d.heads, d.vocab, d.tp);
}

namespace {

struct Shape {
  double n, c, t, v, tp, e;  // tokens, channels, sequence, vocabulary, tp slices, element bytes
  double kv, f;              // key/value channels (all ranks' heads), MLP width (whole model)
  double up, b, np;          // fc1 bands (2 for SwiGLU), 1 with biases else 0, norm params/channel
  bool rope, swiglu;
};
Shape shape(const ModelDims& d) {
  const BlockArch a = d.arch.resolve(int(d.heads), int(d.d_model));
  return {double(d.batch) * double(d.seq), double(d.d_model), double(d.seq), double(d.vocab),
          double(d.tp), double(d.act_bytes),
          // every rank's kv_heads_per_rank heads (one, replicated, when kv_heads < tp)
          double(std::max<int64_t>(a.kv_heads, d.tp)) * double(d.d_model / d.heads),
          double(a.ffn_hidden), a.swiglu() ? 2.0 : 1.0, a.bias ? 1.0 : 0.0,
          double(a.norm_params_per_channel()), a.rope(), a.swiglu()};
}

// Scales a forward kernel list into its backward: 2x FLOPs (gpt.md) and 2x bytes (gradients of
// inputs and weights are written, forward activations re-read).
std::vector<Kernel> backward_of(std::vector<Kernel> ks) {
  for (auto& k : ks) {
    k.flops *= 2;
    k.bytes *= 2;
    k.gemm_backward = k.gm > 0;
  }
  return ks;
}

// A norm over n tokens of c channels: 2 FLOPs per gain (and shift, for a LayerNorm with bias) per
// token (the runtime's counting, divided by tp like the rest of the block), reads and writes the
// activations.
Kernel layernorm(const Shape& x, bool sliced_flops) {
  return {OpClass::LayerNorm, x.n * 2.0 * x.np * x.c / (sliced_flops ? x.tp : 1.0),
          x.e * (2.0 * x.n * x.c + x.np * x.c)};
}
// out (n, oc) = in (n, ic) @ W^T + bias: 2 FLOPs per weight and per counted bias element per token.
// A row-parallel layer's bias is replicated but counted as sliced (bias_count = oc/tp), as the runtime.
Kernel linear(const Shape& x, double ic, double oc, double bias_count) {
  Kernel k{OpClass::Gemm, x.n * 2.0 * (ic * oc + bias_count),
           x.e * (x.n * ic + ic * oc + x.n * oc)};
  k.elem_bytes = x.e;
  k.gm = x.n;
  k.gn = oc;
  k.gk = ic;
  return k;
}
// Row-parallel epilogue: out = residual + partial (summed over tp) + bias.
Kernel bias_residual(const Shape& x) { return {OpClass::Elementwise, 0.0, x.e * 3.0 * x.n * x.c}; }
// Fused causal attention (scores, softmax, weighted sum): 2·T·C/tp FLOPs per token (the model
// count, whatever the key/value heads); reads q, k, v and writes the heads' output. Its shape
// (T queries x T keys over the head size, B x H/tp of them) prices unfused attention.
Kernel attention_kernel(const ModelDims& d, const Shape& x, double cs, double kvs) {
  Kernel k{OpClass::Attention, x.n * 2.0 * x.t * cs, x.e * x.n * (2.0 * cs + 2.0 * kvs),
           int(model::BlockOp::Attention)};
  k.gm = x.t;
  k.gn = x.t;
  k.gk = double(d.d_model / d.heads);
  k.gbatch = double(d.batch) * double(d.heads / d.tp);
  k.elem_bytes = x.e;
  return k;
}
Kernel tagged(Kernel k, model::BlockOp op) {
  k.op = static_cast<int>(op);
  return k;
}
// The kernels of `ks` whose op is in [begin, end), in order.
std::vector<Kernel> ops_in(const std::vector<Kernel>& ks, int begin, int end) {
  std::vector<Kernel> out;
  for (const auto& k : ks) {
    if (k.op >= begin && k.op < end) out.push_back(k);
  }
  return out;
}

}  // namespace

std::vector<Kernel> embedding_forward_kernels(const ModelDims& d) {
  const Shape x = shape(d);
  // Gather wte rows (and wpe rows with learned positions), write the sum.
  return {{OpClass::Elementwise, 0.0, x.e * (x.rope ? 2.0 : 3.0) * x.n * x.c}};
}
std::vector<Kernel> embedding_backward_kernels(const ModelDims& d) {
  const Shape x = shape(d);
  // Read dout, read-modify-write the touched rows of dwte (and dwpe).
  return {{OpClass::Elementwise, 0.0, x.e * (x.rope ? 3.0 : 5.0) * x.n * x.c}};
}

std::vector<Kernel> block_forward_kernels(const ModelDims& d) {
  using model::BlockOp;
  const Shape x = shape(d);
  const double cs = x.c / x.tp;    // channels of this rank's query heads
  const double kvs = x.kv / x.tp;  // channels of its key/value heads
  const double fs = x.f / x.tp;    // its slice of the MLP width
  const double qkv = cs + 2.0 * kvs;
  std::vector<Kernel> ks{
      tagged(layernorm(x, true), BlockOp::Ln1),
      tagged(linear(x, x.c, qkv, x.b * qkv), BlockOp::Qkv),
  };
  // RoPE rotates q and k in place: reads and writes their n·(cs + kvs) values.
  if (x.rope)
    ks.push_back({OpClass::Elementwise, 0.0, x.e * 2.0 * x.n * (cs + kvs), int(BlockOp::Qkv)});
  const std::vector<Kernel> rest{
      // Fused causal attention (scores, softmax, weighted sum): 2·T·C/tp FLOPs per token (the
      // model count, whatever the key/value heads); reads q, k, v and writes the heads' output.
      attention_kernel(d, x, cs, kvs),
      tagged(linear(x, cs, x.c, x.b * x.c / x.tp), BlockOp::Proj),
      tagged(bias_residual(x), BlockOp::AttnResidual),
      tagged(layernorm(x, true), BlockOp::Ln2),
      tagged(linear(x, x.c, x.up * fs, x.b * x.up * fs), BlockOp::Fc1),
      // GELU reads and writes (n, F/tp); SwiGLU reads gate and up (n, 2F/tp) and writes (n, F/tp).
      {OpClass::Elementwise, 0.0, x.e * (x.swiglu ? 3.0 : 2.0) * x.n * fs, int(BlockOp::Gelu)},
      tagged(linear(x, fs, x.c, x.b * x.c / x.tp), BlockOp::Fc2),
      tagged(bias_residual(x), BlockOp::MlpResidual),
  };
  ks.insert(ks.end(), rest.begin(), rest.end());
  return ks;
}

std::vector<Kernel> attention_forward_kernels(const ModelDims& d) {
  return ops_in(block_forward_kernels(d), 0, 5);
}

std::vector<Kernel> mlp_forward_kernels(const ModelDims& d) {
  return ops_in(block_forward_kernels(d), 5, model::kBlockOps);
}

std::vector<Kernel> attention_backward_kernels(const ModelDims& d) {
  return backward_of(attention_forward_kernels(d));
}
std::vector<Kernel> mlp_backward_kernels(const ModelDims& d) {
  return backward_of(mlp_forward_kernels(d));
}

std::vector<Kernel> head_forward_kernels(const ModelDims& d) {
  const Shape x = shape(d);
  // wte or lmw: whole on every tp rank (as the runtime), or this rank's V/tp rows of it
  // (parallel.vocab_parallel, Megatron's column-parallel output layer).
  const double v = d.vocab_parallel ? x.v / x.tp : x.v;
  Kernel lm = linear(x, x.c, v, 0.0);
  Kernel ln = layernorm(x, false);
  if (d.sequence_parallel) ln = {ln.cls, ln.flops / x.tp, ln.bytes / x.tp};  // this rank's tokens
  return {
      ln,
      lm,
      // Softmax and cross-entropy in place over the logits: read and write (n, V or V/tp).
      {OpClass::SoftmaxLoss, 0.0, x.e * 2.0 * x.n * v},
  };
}
std::vector<Kernel> head_backward_kernels(const ModelDims& d) {
  return backward_of(head_forward_kernels(d));
}

std::vector<Kernel> optimizer_kernels(double params, double bytes_per_param) {
  return {{OpClass::Optimizer, 12.0 * params, bytes_per_param * params}};
}

namespace {
// Sequence parallelism (model/block.hpp): the block's ten forward kernels in BlockOp order, the
// token-wise ones (LayerNorms, residual adds) over this rank's 1/tp of the tokens; forward pieces,
// backward pieces (the forward kernels' backward, in reverse) or the full recomputation's pieces.
std::optional<std::vector<Kernel>> sp_block_kernels(std::string_view name, int piece, int pieces,
                                                    const ModelDims& d) {
  std::vector<Kernel> ops = block_forward_kernels(d);
  for (auto& k : ops) {  // token-wise ops
    if (k.op == 0 || k.op == 4 || k.op == 5 || k.op == 9) k.bytes /= double(d.tp);
  }
  if (piece < 0 || piece >= pieces) return std::nullopt;
  if (pieces == 1) {  // the whole block at once (the sweep's closed-form estimate asks so)
    if (name == names::kBlockForward) return ops;
    if (name == names::kBlockRecompute)
      return ops_in(ops, model::kRecomputeBlock.begin, model::kRecomputeBlock.end);
    std::vector<Kernel> out = backward_of(ops);
    std::reverse(out.begin(), out.end());
    return out;
  }
  if (name == names::kBlockRecompute) {
    if (pieces != int(model::kSpRecomputePieces.size())) return std::nullopt;
    const auto r = model::kSpRecomputePieces[size_t(piece)];
    return ops_in(ops, r.begin, r.end);
  }
  if (pieces != model::kSpBlockPieces) return std::nullopt;
  if (name == names::kBlockForward) {
    const auto r = model::kSpForwardPieces[size_t(piece)];
    return ops_in(ops, r.begin, r.end);
  }
  const auto r = model::kSpBackwardPieces[size_t(piece)];
  std::vector<Kernel> out = backward_of(ops_in(ops, r.begin, r.end));
  std::reverse(out.begin(), out.end());
  return out;
}
}  // namespace

namespace {
std::optional<std::vector<Kernel>> op_kernels_fp32(std::string_view name, int piece, int pieces,
                                                   const ModelDims& d, double opt_params);

// One elementwise pass per GEMM kernel of `ks` over the elements it rounds (8 bytes each: read and
// write): a, w and out forward; dout, inp, W and dinp backward.
std::vector<Kernel> rounding_kernels(const std::vector<Kernel>& ks) {
  std::vector<Kernel> rounding;
  for (const Kernel& k : ks) {
    if (k.cls != OpClass::Gemm || k.gm <= 0) continue;
    const double a = k.gm * k.gk, w = k.gk * k.gn, out = k.gm * k.gn;
    Kernel r;
    r.op = k.op;
    r.bytes = 8.0 * (k.gemm_backward ? out + a + w + a : a + w + out);
    rounding.push_back(r);
  }
  return rounding;
}
}  // namespace

std::optional<std::vector<Kernel>> op_kernels(std::string_view name, int piece, int pieces,
                                              const ModelDims& d, double opt_params) {
  auto ks = op_kernels_fp32(name, piece, pieces, d, opt_params);
  if (!ks || !d.emulated_16bit) return ks;
  // The rounding passes of the emulated 16-bit products (ModelDims::emulated_16bit).
  const std::vector<Kernel> rounding = rounding_kernels(*ks);
  ks->insert(ks->end(), rounding.begin(), rounding.end());
  return ks;
}

double rounded_elements(const std::vector<Kernel>& ks) {
  return total_bytes(rounding_kernels(ks)) / 8.0;
}

namespace {
std::optional<std::vector<Kernel>> op_kernels_fp32(std::string_view name, int piece, int pieces,
                                                   const ModelDims& d, double opt_params) {
  auto cat = [](std::vector<Kernel> a, const std::vector<Kernel>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  if (d.sequence_parallel && name == names::kHeadForward && pieces == 2) {
    const auto h = head_forward_kernels(d);
    if (piece == 0) return std::vector<Kernel>{h[0]};
    if (piece == 1) return std::vector<Kernel>(h.begin() + 1, h.end());
    return std::nullopt;
  }
  if (name == names::kEmbedForward) return embedding_forward_kernels(d);
  if (name == names::kEmbedBackward) return embedding_backward_kernels(d);
  if (name == names::kHeadForward) return head_forward_kernels(d);
  if (name == names::kHeadBackward) return head_backward_kernels(d);
  if (d.sequence_parallel && (name == names::kBlockForward || name == names::kBlockBackward ||
                              name == names::kBlockRecompute)) {
    return sp_block_kernels(name, piece, pieces, d);
  }
  if (name == names::kBlockForward || name == names::kBlockBackward) {
    const auto af = attention_forward_kernels(d), mf = mlp_forward_kernels(d);
    const auto ab = attention_backward_kernels(d), mb = mlp_backward_kernels(d);
    const bool fwd = name == names::kBlockForward;
    if (pieces == 1) return fwd ? cat(af, mf) : cat(mb, ab);
    if (pieces != model::kTpBlockPieces || piece < 0 || piece >= pieces) return std::nullopt;
    // The runtime's three pieces of a tensor-parallel block, cut where model/block.hpp says
    // (the kernels carry their BlockOp).
    const std::vector<Kernel> ops = block_forward_kernels(d);
    if (fwd) {
      const auto r = model::kForwardPieces[size_t(piece)];
      return ops_in(ops, r.begin, r.end);
    }
    const auto r = model::kBackwardPieces[size_t(piece)];
    std::vector<Kernel> out = backward_of(ops_in(ops, r.begin, r.end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  if (name == names::kBlockRecompute || name == names::kAttentionRecompute) {
    // Activation recomputation (model/block.hpp): forward kernels of the block, in BlockOp order.
    const std::vector<Kernel> ops = block_forward_kernels(d);
    model::OpRange r{};
    if (name == names::kAttentionRecompute) {
      if (pieces != 1 || piece != 0) return std::nullopt;
      r = model::kRecomputeAttention;
    } else if (pieces == 1 && piece == 0) {
      r = model::kRecomputeBlock;
    } else if (pieces == int(model::kRecomputePieces.size()) && piece >= 0 && piece < pieces) {
      r = model::kRecomputePieces[size_t(piece)];
    } else {
      return std::nullopt;
    }
    return ops_in(ops, r.begin, r.end);
  }
  if (name == names::kOptimizerStep) return optimizer_kernels(opt_params, 28.0);
  // Zeroing `opt_params` fp32 gradient elements: a write of 4 bytes each.
  if (name == names::kZeroGrad)
    return std::vector<Kernel>{Kernel{OpClass::Elementwise, 0.0, 4.0 * opt_params}};
  return std::nullopt;
}
}  // namespace

double total_flops(const std::vector<Kernel>& ks) {
  double f = 0;
  for (const auto& k : ks) f += k.flops;
  return f;
}
double total_bytes(const std::vector<Kernel>& ks) {
  double b = 0;
  for (const auto& k : ks) b += k.bytes;
  return b;
}

CostModel::CostModel(HardwareProfile profile, double peak_flops,
                     double memory_bandwidth_bytes_per_s)
    : profile_(std::move(profile)),
      peak_flops_(profile_.peak_flops > 0 ? profile_.peak_flops : peak_flops),
      bandwidth_(profile_.memory_bandwidth_bytes_per_s > 0 ? profile_.memory_bandwidth_bytes_per_s
                                                           : memory_bandwidth_bytes_per_s) {
  if (!(peak_flops_ > 0) || !(bandwidth_ > 0))
    throw InputError("hardware profile '" + profile_.name +
                     "': the device has no peak FLOP/s or memory bandwidth (set peak_flops and "
                     "memory_bandwidth_gbps in the profile or the cluster's device)");
}

namespace {
// The model's time of one candidate (tile, split) in units of one SM's MMA step at the best
// tile's rate (one tile element over one K element), so that without a device (peak 0) it is the
// pure tile and wave count. `unit_s` is that step in seconds (0 without a device).
double candidate_steps(const GemmShapeModel& g, const GemmTile& t, int split, double m, double n,
                       double k, const GemmDevice& dev, double unit_s) {
  const double tiles = std::ceil(m / t.m) * std::ceil(n / t.n);
  const double waves = std::ceil(tiles * split / g.sms);
  const double mma = double(t.m) * double(t.n) / t.relative;  // per K element
  const double chunk = k / split;                             // each split's K
  if (!(unit_s > 0)) return waves * (chunk + g.k_fixed) * mma;
  const double e = dev.elem_bytes > 0 ? dev.elem_bytes : 2.0;
  const double tile_k = std::max(1.0, g.tile_k_bytes / e);
  double per_k = mma;
  // Narrower loads than 16 bytes bring the operands in at that fraction of the rate.
  const double fill = g.l2_bytes_per_s * std::min(16.0, dev.load_bytes) / 16.0;
  if (fill > 0) per_k = std::max(mma, double(t.m + t.n) * e * g.sms / fill / unit_s);
  // The latency of every iteration, at least one even for a chunk shallower than tile_k.
  const double latency =
      g.clock_hz > 0 ? g.iteration_latency_cycles / g.clock_hz / unit_s / tile_k : 0.0;
  // The fp32 partial outputs stay in L2: with tiles x split <= sms they are at most 4 bytes x sms
  // tiles (14 MB on an A100, 17 on an H100, against 40 and 50 MB of L2). Without an L2 figure,
  // memory's bandwidth stands in.
  const double partials_bw =
      g.l2_bytes_per_s > 0 ? g.l2_bytes_per_s : dev.memory_bandwidth_bytes_per_s;
  const double reduction =
      split > 1 && partials_bw > 0 ? 8.0 * split * m * n / partials_bw / unit_s : 0.0;
  return waves * (chunk * per_k + std::max(chunk, tile_k) * latency + g.k_fixed * mma) + reduction;
}
}  // namespace

double gemm_load_bytes(double m, double n, double k, double elem_bytes) {
  double width = 16;
  for (const double d : {m, n, k}) {
    const double bytes = d * (elem_bytes > 0 ? elem_bytes : 2.0);
    if (!(bytes >= 1 && bytes < 9e15 && bytes == std::floor(bytes))) continue;
    const auto b = static_cast<int64_t>(bytes);
    width = std::min(width, double(b & -b));  // the lowest set bit: the largest power of two
  }
  return width;
}

double gemm_shape_efficiency(const GemmShapeModel& g, double m, double n, double k,
                             const GemmDevice& device) {
  if (!g.enabled() || !(m > 0 && n > 0 && k > 0)) return 1.0;
  GemmDevice dev = device;
  if (!(dev.load_bytes > 0)) dev.load_bytes = gemm_load_bytes(m, n, k, dev.elem_bytes);
  const double sms = g.sms;
  const double unit_s = dev.peak_flops > 0 ? 2.0 * sms / dev.peak_flops : 0.0;
  double best = 0;
  for (const GemmTile& t : g.tiles) {
    const double tiles = std::ceil(m / t.m) * std::ceil(n / t.n);
    for (int split = 1; split <= g.max_split_k; ++split) {
      // cuBLAS splits K only to occupy SMs a too-small grid leaves idle.
      if (split > 1 && (tiles * split > sms || k / split < 1)) break;
      const double steps = candidate_steps(g, t, split, m, n, k, dev, unit_s);
      best = std::max(best, m * n * k / sms / steps);
    }
  }
  return std::min(1.0, best);
}

double gemm_shape_efficiency(const GemmShapeModel& g, const Kernel& k, const GemmDevice& dev) {
  if (!g.enabled() || k.cls != OpClass::Gemm || !(k.gm > 0)) return 1.0;
  GemmDevice d = dev;
  if (k.elem_bytes > 0) d.elem_bytes = k.elem_bytes;
  if (k.load_bytes > 0) d.load_bytes = k.load_bytes;
  if (!k.gemm_backward) return gemm_shape_efficiency(g, k.gm, k.gn, k.gk, d);
  // Input gradient (m x k over n) and weight gradient (k x n over m): equal FLOPs each.
  const double a = gemm_shape_efficiency(g, k.gm, k.gk, k.gn, d);
  const double b = gemm_shape_efficiency(g, k.gk, k.gn, k.gm, d);
  return 2.0 / (1.0 / a + 1.0 / b);
}

int64_t CostModel::unfused_attention_ns(const Kernel& k) const {
  // The standard implementation (Dao et al. 2022, "FlashAttention", section 2.2): S = Q·K^T and
  // O = P·V as batched GEMMs over the full T x T scores (the causal mask applied after, so twice
  // the causal FLOPs), S written to HBM, read by the softmax, P written, read by the second GEMM:
  // 4 T² elements per head moved. Backward: twice the forward.
  const ClassCost& g = profile_.cost(OpClass::Gemm);
  const ClassCost& el = profile_.cost(OpClass::Elementwise);
  const double rows = k.gm * k.gbatch;  // the batch stacked as rows: the same tiles
  const double gemm_flops = 2.0 * rows * k.gn * k.gk;
  const GemmDevice dev{peak_flops_, bandwidth_, k.elem_bytes > 0 ? k.elem_bytes : 2.0};
  const double qk =
      gemm_flops / (peak_flops_ * g.flops_efficiency *
                    gemm_shape_efficiency(profile_.gemm_shape, rows, k.gn, k.gk, dev));
  const double pv =
      gemm_flops / (peak_flops_ * g.flops_efficiency *
                    gemm_shape_efficiency(profile_.gemm_shape, rows, k.gk, k.gn, dev));
  const double scores = 4.0 * k.elem_bytes * rows * k.gn / (bandwidth_ * el.bandwidth_efficiency);
  const double io = k.bytes / (bandwidth_ * g.bandwidth_efficiency);
  const double s = (k.gemm_backward ? 2.0 : 1.0) * (qk + pv + scores);
  return static_cast<int64_t>(std::ceil(std::max(s, io) * 1e9)) + 2 * g.overhead_ns +
         el.overhead_ns;
}

int64_t CostModel::kernel_ns(const Kernel& k) const {
  if (k.cls == OpClass::Attention && !profile_.attention_fused && k.gm > 0)
    return unfused_attention_ns(k);
  const ClassCost& c = profile_.cost(k.cls);
  const double compute_s =
      k.flops / (peak_flops_ * c.flops_efficiency *
                 gemm_shape_efficiency(profile_.gemm_shape, k, {peak_flops_, bandwidth_}));
  const double memory_s = k.bytes / (bandwidth_ * c.bandwidth_efficiency);
  const GemmShapeModel& g = profile_.gemm_shape;
  const double floor_s = k.cls == OpClass::Gemm && k.gm > 0 && g.enabled() && g.clock_hz > 0
                             ? g.kernel_latency_cycles / g.clock_hz
                             : 0.0;
  // Rounded up to whole nanoseconds so that a non-empty kernel never takes zero time.
  return static_cast<int64_t>(std::ceil((std::max(compute_s, memory_s) + floor_s) * 1e9)) +
         c.overhead_ns;
}

int64_t CostModel::op_ns(const std::vector<Kernel>& ks) const {
  int64_t t = 0;
  for (const auto& k : ks) t += kernel_ns(k);
  return t;
}

int64_t CostModel::named_op_ns(std::string_view name, int piece, int pieces, const ModelDims& d,
                               double opt_params) const {
  const auto ks = op_kernels(name, piece, pieces, d, opt_params);
  if (!ks)
    throw InputError("cost model: no op named '" + std::string(name) + "' (piece " +
                     std::to_string(piece) + " of " + std::to_string(pieces) + ")");
  if (d.emulated_16bit) {
    const auto r = profile_.host.rounding_ns.find(std::string(to_string(d.emulated_format)));
    if (r != profile_.host.rounding_ns.end() && r->second > 0) {
      ModelDims f = d;
      f.emulated_16bit = false;
      const double elements = rounded_elements(*op_kernels(name, piece, pieces, f, opt_params));
      return named_op_ns(name, piece, pieces, f, opt_params) +
             static_cast<int64_t>(std::llround(elements * r->second));
    }
  }
  const int64_t modelled = op_ns(*ks);
  const MeasuredOp* best = nullptr;
  double best_dist = 0;
  auto ld = [](double a, double b) { return a > 0 && b > 0 ? std::fabs(std::log(a / b)) : 50.0; };
  for (const auto& m : profile_.ops) {
    if (m.name != name) continue;
    double dist = 0;
    if (name == names::kOptimizerStep || name == names::kZeroGrad) {
      dist = ld(opt_params, m.params);
    } else {
      dist = ld(double(d.batch) * double(d.seq), double(m.batch) * double(m.seq)) +
             ld(double(d.seq), double(m.seq)) + ld(double(d.d_model), double(m.d_model)) +
             ld(double(d.heads), double(m.heads)) + ld(double(d.vocab), double(m.vocab)) +
             ld(double(d.tp), double(m.tp));
      if (m.pieces != pieces)
        dist += 100.0;
      else if (m.piece != piece)
        dist += 1000.0;
    }
    if (!best || dist < best_dist) best = &m, best_dist = dist;
  }
  if (!best || best->time_ns <= 0) return modelled;
  ModelDims md = d;
  md.batch = best->batch, md.seq = best->seq, md.d_model = best->d_model, md.heads = best->heads;
  md.vocab = best->vocab, md.tp = best->tp;
  // Measured entries are fp32 runs' (MeasuredOp records no precision): an emulated 16-bit op
  // costs the entry's time scaled by its rounding passes too.
  md.emulated_16bit = false;
  const auto mks = op_kernels(name, best->piece, best->pieces, md, best->params);
  const int64_t ref = mks ? op_ns(*mks) : 0;
  if (ref <= 0) return modelled;
  return static_cast<int64_t>(std::llround(double(best->time_ns) * double(modelled) / double(ref)));
}

double CostModel::compression_rate(std::string_view scheme, bool decompress) const {
  const auto it = profile_.host.compression.find(std::string(scheme));
  if (it == profile_.host.compression.end()) return 0;
  return decompress ? it->second.decompress_ns : it->second.compress_ns;
}

int64_t CostModel::compression_ns(std::string_view scheme, bool decompress, double units,
                                  const std::vector<Kernel>& kernels) const {
  const double rate = compression_rate(scheme, decompress);
  if (rate > 0) return static_cast<int64_t>(std::llround(units * rate));
  return op_ns(kernels);
}

double model_flops_per_step(const Scenario& s) {
  const model::flops::Dims d = model::flops::dims_of(s.model, s.training.micro_batch);
  double per_micro_batch = model::flops::model_step(d, s.model.layers);
  if (s.model.moe.enabled()) {
    // An MoE block (model/moe.hpp) counts its router GEMM and top_k expert FFNs plus the shared
    // experts per token, 2 FLOPs per weight (and bias), instead of the dense fc1 and fc2; forward
    // and backward 3x, as the dense ops.
    const MoeConfig& m = s.model.moe;
    const BlockArch a = block_arch(s.model).resolve(s.model.heads, s.model.d_model);
    const double tokens = double(s.training.micro_batch) * s.model.seq, c = s.model.d_model;
    const double w = m.expert_ffn_hidden > 0 ? m.expert_ffn_hidden : a.ffn_hidden;
    const double up = a.swiglu() ? 2.0 : 1.0, b = a.bias ? 1.0 : 0.0;
    const double expert = 2.0 * (up * (w * c + b * w) + (w * c + b * c));
    const double moe_block = tokens * (2.0 * c * m.experts + (m.top_k + m.shared_experts) * expert);
    const double dense_mlp = model::flops::block_op_forward(d, int(model::BlockOp::Fc1)) +
                             model::flops::block_op_forward(d, int(model::BlockOp::Fc2));
    const int blocks = model::moe::moe_blocks(m, 0, s.model.layers);
    per_micro_batch += 3.0 * blocks * (moe_block - dense_mlp);
  }
  return per_micro_batch * double(s.micro_batches_per_step()) * double(s.parallel.dp);
}

}  // namespace orrery::sim
