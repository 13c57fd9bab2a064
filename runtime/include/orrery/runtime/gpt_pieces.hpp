// The reference GPT's forward and backward pieces, written once over a backend's kernels: the CPU
// model (model.hpp: gpt_embed_forward ... gpt_backward) and the CUDA model (cuda/model.hpp:
// gpu_embed_forward ... gpu_backward) are these templates with their own `Kernels`.
//
// `Kernels` (CpuKernels below, cuda::CudaKernels in cuda/backend.hpp) has every kernel of
// kernels.hpp under the same name and argument list, plus
//   zero(float* p, size_t n)                         p[0, n) = 0
//   copy(float* dst, const float* src, size_t n)     dst[0, n) = src[0, n)
//   upload_tokens(int32_t* dst, const int32_t* src, size_t n)
//                                                    host token ids into the activations' storage
// and for the mixture-of-experts blocks the MoE kernels and buffers moe_pieces.hpp lists.
// Each call is issued in program order on the backend's one compute stream; the CPU runs it there
// and then, the CUDA kernels queue it (softmax_crossentropy_forward waits: it returns the loss).
//
// `Model` is runtime::Gpt or cuda::GpuGpt: layout_of(m) (found by argument-dependent lookup) is the
// host layout (config, shard, dims, tensors); m.embed, m.blocks, m.head and their gradients
// m.dembed, m.dblocks, m.dhead are pointers in the backend's memory.
//
// Layout, hooks, spans and FLOPs: model.hpp. With tp > 1 a block's span is three pieces around the
// tensor-parallel sums (model/block.hpp's cut points), so no collective sits inside a compute span.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "orrery/model/block.hpp"
#include "orrery/model/flops.hpp"
#include "orrery/model/names.hpp"
#include "orrery/runtime/kernels.hpp"
#include "orrery/runtime/model.hpp"
#include "orrery/runtime/moe_block.hpp"
#include "orrery/runtime/moe_pieces.hpp"

namespace orrery::runtime {

inline const Gpt& layout_of(const Gpt& m) { return m; }

// The CPU kernels (kernels.hpp) as a `Kernels`.
struct CpuKernels {
#define ORRERY_CPU_KERNEL(name)                            \
  template <class... A>                                    \
  auto name(A&&... a) const {                              \
    return ::orrery::runtime::name(std::forward<A>(a)...); \
  }
  ORRERY_MODEL_KERNELS(ORRERY_CPU_KERNEL)
  ORRERY_MOE_KERNELS(ORRERY_CPU_KERNEL)
#undef ORRERY_CPU_KERNEL
  void zero(float* p, std::size_t n) const;
  void copy(float* dst, const float* src, std::size_t n) const;
  void upload_tokens(int32_t* dst, const int32_t* src, std::size_t n) const;
  // moe_pieces.hpp's buffers: host vectors, resized to what they hold; nothing is staged.
  template <class T>
  using Buffer = std::vector<T>;
  template <class T>
  T* fit(std::vector<T>& b, std::size_t n) const {
    b.resize(n);
    return b.data();
  }
  const float* to_host(const float* p, std::size_t, std::vector<float>&) const { return p; }
  template <class T>
  const T* to_device(const T* h, std::size_t, std::vector<T>&) const {
    return h;
  }
};

namespace pieces {

template <class Model>
std::size_t block_index(const Model& m, int layer) {
  const GptShard& sh = layout_of(m).shard;
  if (layer < sh.layer_begin || layer >= sh.layer_end) {
    throw std::out_of_range("gpt: layer " + std::to_string(layer) + " is not held by this shard [" +
                            std::to_string(sh.layer_begin) + ", " + std::to_string(sh.layer_end) +
                            ")");
  }
  return static_cast<std::size_t>(layer - sh.layer_begin);
}

inline void tp_reduce(const GptHooks& hooks, TpPoint point, int layer, float* data, std::size_t n) {
  if (!hooks.tp_all_reduce) {
    throw std::logic_error("gpt: tp_size > 1 but GptHooks::tp_all_reduce is not set");
  }
  hooks.tp_all_reduce(point, layer, data, n);
}

// Sequence parallelism (GptShard::sp(), model/block.hpp): the tp collectives that replace the
// all-reduces, each between two pieces of a span.
inline void tp_gather(const GptHooks& hooks, TpPoint point, int layer, const float* send,
                      float* recv, std::size_t send_count) {
  if (!hooks.tp_all_gather) {
    throw std::logic_error("gpt: sequence parallelism but GptHooks::tp_all_gather is not set");
  }
  hooks.tp_all_gather(point, layer, send, recv, send_count);
}
inline void tp_scatter(const GptHooks& hooks, TpPoint point, int layer, const float* send,
                       float* recv, std::size_t recv_count) {
  if (!hooks.tp_reduce_scatter) {
    throw std::logic_error("gpt: sequence parallelism but GptHooks::tp_reduce_scatter is not set");
  }
  hooks.tp_reduce_scatter(point, layer, send, recv, recv_count);
}

// The tokens of this rank's residual stream: all B·T, or its contiguous 1/tp under sequence
// parallelism; and the FLOPs of sequence-parallel piece k (model/block.hpp's tables).
inline int local_tokens(const Gpt& g, int B, int T) {
  return g.shard.sp() ? B * T / g.shard.tp_size : B * T;
}
inline double sp_piece_flops(const flops::Dims& fd, const model::OpRange& r, bool forward) {
  return flops::block_ops_flops(fd, forward, r.begin, r.end);
}

// The block's variable parts (model.norm, activation, position, bias; GptConfig::arch), each in
// one place for the forward, the recomputation and the backward.
// A norm: LayerNorm (its shift `b` may be null) or RMSNorm (no mean, no shift).
template <class Kernels>
void norm_forward(const Kernels& k, const Gpt& g, float* out, float* mean, float* rstd,
                  const float* inp, const float* w, const float* b, int B, int T) {
  if (g.config.arch.rmsnorm()) {
    k.rmsnorm_forward(out, rstd, inp, w, B, T, g.dims.C);
  } else {
    k.layernorm_forward(out, mean, rstd, inp, w, b, B, T, g.dims.C);
  }
}
template <class Kernels>
void norm_backward(const Kernels& k, const Gpt& g, float* dinp, float* dw, float* db,
                   const float* dout, const float* inp, const float* w, const float* mean,
                   const float* rstd, int B, int T) {
  if (g.config.arch.rmsnorm()) {
    k.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, B, T, g.dims.C);
  } else {
    k.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, B, T, g.dims.C);
  }
}
// qkv = ln1 · qkvw^T (+ qkvb), then RoPE on its q and k heads under rotary positions.
template <class Kernels>
void qkv_forward(const Kernels& k, const Gpt& g, const BlockParams& p, BlockActivations& a, int B,
                 int T) {
  const BlockDims& d = g.dims;
  k.matmul_forward(a.qkv, a.ln1, p.qkvw, p.qkvb, B, T, d.C, d.qkv());
  if (g.config.arch.rope()) {
    k.rope_forward(a.qkv, B, T, d.NH, d.NKV, d.hs, static_cast<float>(g.config.arch.rope_theta));
  }
}
// The attention core's and qkv's backward: s.dqkv from s.datty, rotated back under RoPE, then
// the qkv matmul's gradients; s.dln gets the (partial, under tp) gradient of ln1's output.
template <class Kernels, class Scratch>
void qkv_attention_backward(const Kernels& k, const Gpt& gl, const BlockParams& p,
                            const BlockParams& g, const BlockActivations& a, Scratch& s, int B,
                            int T) {
  const BlockDims& d = gl.dims;
  k.zero(s.dqkv, static_cast<std::size_t>(B) * T * d.qkv());
  k.attention_backward(s.dqkv, s.datt, s.datty, a.qkv, a.att, B, T, d.Cl, d.NH, d.NKV);
  if (gl.config.arch.rope()) {
    k.rope_backward(s.dqkv, B, T, d.NH, d.NKV, d.hs, static_cast<float>(gl.config.arch.rope_theta));
  }
  k.matmul_backward(s.dln, g.qkvw, g.qkvb, s.dqkv, a.ln1, p.qkvw, B, T, d.C, d.qkv(), false);
}
// fch_gelu = act(fch): GELU, or SwiGLU of fch's [gate | up] halves.
template <class Kernels>
void act_forward(const Kernels& k, const Gpt& g, BlockActivations& a, int B, int T) {
  const std::size_t BT = static_cast<std::size_t>(B) * T;
  if (g.config.arch.swiglu()) {
    k.swiglu_forward(a.fch_gelu, a.fch, BT, g.dims.F);
  } else {
    k.gelu_forward(a.fch_gelu, a.fch, BT * g.dims.F);
  }
}
// dfch = act'(fch) · dfch_gelu (dfch zeroed first).
template <class Kernels>
void act_backward(const Kernels& k, const Gpt& g, float* dfch, const float* fch,
                  const float* dfch_gelu, int B, int T) {
  const std::size_t BT = static_cast<std::size_t>(B) * T;
  k.zero(dfch, BT * g.dims.fc1());
  if (g.config.arch.swiglu()) {
    k.swiglu_backward(dfch, fch, dfch_gelu, BT, g.dims.F);
  } else {
    k.gelu_backward(dfch, fch, dfch_gelu, BT * g.dims.F);
  }
}
// db += column sums of dout, when the block has that bias.
template <class Kernels>
void bias_grad(const Kernels& k, float* db, const float* dout, int B, int T, int C) {
  if (db != nullptr) k.bias_backward(db, dout, B, T, C);
}
// The LM head's weight and its gradient: wte when tied, else lmw.
template <class Model>
const float* lm_weight(const Model& m) {
  return m.head.lmw != nullptr ? m.head.lmw : m.embed.wte;
}
template <class Model>
float* lm_grad(Model& m) {
  return m.dhead.lmw != nullptr ? m.dhead.lmw : m.dembed.wte;
}

// Sequence-parallel [Ln1 .. Gelu] of block `layer` into `a` (forward pieces 0-3 less Fc2, or the
// full recomputation's four pieces): the span `span` is cut at each collective and reopened with the
// next piece's FLOPs from `pieces`.
template <class Kernels, class Acts, std::size_t P>
void sp_block_front(const Kernels& k, const Gpt& g, const BlockParams& p, BlockActivations& a,
                    Acts& acts, const float* x, int layer, const GptHooks& hooks, OpSpan& span,
                    const char* name, const std::array<model::OpRange, P>& pieces) {
  const BlockDims& d = g.dims;
  const int B = acts.B, T = acts.T, n = local_tokens(g, B, T);
  const std::size_t nC = acts.boundary_elems;
  const auto fd = flop_dims(g, B, T);
  auto next = [&](int piece) {
    span.reopen(hooks.observer, name, layer, sp_piece_flops(fd, pieces[std::size_t(piece)], true));
  };
  norm_forward(k, g, acts.tp_local, a.ln1_mean, a.ln1_rstd, x, p.ln1w, p.ln1b, 1, n);
  span.close();
  tp_gather(hooks, TpPoint::kLn1Gather, layer, acts.tp_local, a.ln1, nC);
  next(1);
  qkv_forward(k, g, p, a, B, T);
  k.attention_forward(a.atty, a.att, a.qkv, B, T, d.Cl, d.NH, d.NKV);
  k.matmul_forward(acts.tp_partial, a.atty, p.projw, nullptr, B, T, d.Cl, d.C);
  span.close();
  tp_scatter(hooks, TpPoint::kAttnProjForward, layer, acts.tp_partial, a.attproj, nC);
  next(2);
  k.bias_residual_forward(a.res2, x, a.attproj, p.projb, 1, n, d.C);
  norm_forward(k, g, acts.tp_local, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b, 1, n);
  span.close();
  tp_gather(hooks, TpPoint::kLn2Gather, layer, acts.tp_local, a.ln2, nC);
  next(3);
  k.matmul_forward(a.fch, a.ln2, p.fcw, p.fcb, B, T, d.C, d.fc1());
  act_forward(k, g, a, B, T);
}

// stream[0] = wte[inputs] + wpe.
template <class Kernels, class Model, class Acts>
void embed_forward(const Kernels& k, const Model& m, Acts& acts, const int32_t* inputs,
                   const GptHooks& hooks) {
  const Gpt& g = layout_of(m);
  if (!g.shard.has_embed)
    throw std::logic_error("gpt: embedding forward on a shard without the embedding");
  OpSpan span(hooks.observer, names::kEmbedForward.data(), kEmbedSegment,
              flops::embed_forward(flop_dims(g, acts.B, acts.T)));
  k.upload_tokens(acts.inputs.data(), inputs, acts.inputs.size());
  if (!g.shard.sp()) {
    k.encoder_forward(acts.stream, acts.inputs.data(), m.embed.wte, m.embed.wpe, acts.B, acts.T,
                      g.dims.C);
    return;
  }
  // Sequence parallelism: every tp rank embeds all tokens (the embedding is replicated) and keeps
  // its shard, Megatron's scatter to the sequence-parallel region.
  k.encoder_forward(acts.tp_partial, acts.inputs.data(), m.embed.wte, m.embed.wpe, acts.B, acts.T,
                    g.dims.C);
  k.copy(acts.stream, acts.tp_partial + std::size_t(g.shard.tp_rank) * acts.boundary_elems,
         acts.boundary_elems);
}

// The block's forward ops, in model/block.hpp's pieces, shared by its forward and its
// recomputation (so that a recomputed buffer is the forward's to the bit).
// [Ln1, Qkv, Attention, Proj]: attproj = proj(attn(qkv(ln1(x)))), before the tp sum and the bias.
template <class Kernels>
void attention_half(const Kernels& k, const Gpt& g, const BlockParams& p, BlockActivations& a,
                    const float* x, int B, int T) {
  const BlockDims& d = g.dims;
  norm_forward(k, g, a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1w, p.ln1b, B, T);
  qkv_forward(k, g, p, a, B, T);
  k.attention_forward(a.atty, a.att, a.qkv, B, T, d.Cl, d.NH, d.NKV);
  k.matmul_forward(a.attproj, a.atty, p.projw, nullptr, B, T, d.Cl, d.C);
}
// [AttnResidual, Ln2, Fc1, Gelu]: res2 = x + attproj + projb, fch_gelu = act(fc1(ln2(res2))).
template <class Kernels>
void mlp_front(const Kernels& k, const Gpt& g, const BlockParams& p, BlockActivations& a,
               const float* x, int B, int T) {
  const BlockDims& d = g.dims;
  k.bias_residual_forward(a.res2, x, a.attproj, p.projb, B, T, d.C);
  norm_forward(k, g, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b, B, T);
  k.matmul_forward(a.fch, a.ln2, p.fcw, p.fcb, B, T, d.C, d.fc1());
  act_forward(k, g, a, B, T);
}

inline void check_bound(const BlockActivations& a) {
  if (a.att == nullptr || a.ln1 == nullptr) {
    throw std::logic_error(
        "gpt: activations made for recomputation are not bound to a scratch workspace "
        "(bind_workspace)");
  }
}

// stream[l-lb+1] = block_l(stream[l-lb]).
template <class Kernels, class Model, class Acts>
void block_forward(const Kernels& k, const Model& m, Acts& acts, int layer, const GptHooks& hooks) {
  const Gpt& g = layout_of(m);
  const std::size_t idx = block_index(m, layer);
  const BlockDims& d = g.dims;
  const BlockParams& p = m.blocks[idx];
  BlockActivations& a = acts.blocks[idx];
  check_bound(a);
  const int B = acts.B, T = acts.T;
  const std::size_t n = acts.boundary_elems;
  const float* x = acts.stream + idx * n;
  float* y = acts.stream + (idx + 1) * n;
  const auto fd = flop_dims(g, B, T);
  const bool tp = g.shard.tp_size > 1;
  const char* name = names::kBlockForward.data();
  if (g.shard.sp()) {
    OpSpan span(hooks.observer, name, layer, sp_piece_flops(fd, model::kSpForwardPieces[0], true));
    sp_block_front(k, g, p, a, acts, x, layer, hooks, span, name, model::kSpForwardPieces);
    k.matmul_forward(acts.tp_partial, a.fch_gelu, p.fcprojw, nullptr, B, T, d.F, d.C);
    span.close();
    tp_scatter(hooks, TpPoint::kMlpProjForward, layer, acts.tp_partial, a.fcproj, n);
    span.reopen(hooks.observer, name, layer, sp_piece_flops(fd, model::kSpForwardPieces[4], true));
    k.bias_residual_forward(y, a.res2, a.fcproj, p.fcprojb, 1, local_tokens(g, B, T), d.C);
    return;
  }

  // An MoE block: its FFN is moe_pieces.hpp's, between the block's [Ln1 .. Ln2] and [MlpResidual]
  // pieces (model/moe.hpp's span order).
  const bool moe = g.is_moe_block(layer);
  OpSpan span(
      hooks.observer, name, layer,
      moe ? flops::block_attention_forward(fd) : flops::block_piece(fd, true, 0, tp ? 3 : 1));
  attention_half(k, g, p, a, x, B, T);
  if (tp) {
    span.close();
    tp_reduce(hooks, TpPoint::kAttnProjForward, layer, a.attproj, n);
    span.reopen(hooks.observer, name, layer, moe ? 0.0 : flops::block_piece(fd, true, 1, 3));
  }
  if (moe) {
    k.bias_residual_forward(a.res2, x, a.attproj, p.projb, B, T, d.C);
    norm_forward(k, g, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b, B, T);
    span.close();
    moe_pieces::forward(k, m, acts, layer, hooks);  // a.fcproj: this tp rank's partial
    if (tp) tp_reduce(hooks, TpPoint::kMlpProjForward, layer, a.fcproj, n);
    span.reopen(hooks.observer, name, layer, 0.0);
    k.bias_residual_forward(y, a.res2, a.fcproj, nullptr, B, T, d.C);
    return;
  }
  mlp_front(k, g, p, a, x, B, T);
  // y = res2 + fc2(fch_gelu) + fcprojb.
  k.matmul_forward(a.fcproj, a.fch_gelu, p.fcprojw, nullptr, B, T, d.F, d.C);
  if (tp) {
    span.close();
    tp_reduce(hooks, TpPoint::kMlpProjForward, layer, a.fcproj, n);
    span.reopen(hooks.observer, name, layer, flops::block_piece(fd, true, 2, 3));
  }
  k.bias_residual_forward(y, a.res2, a.fcproj, p.fcprojb, B, T, d.C);
}

// Recomputation before block l's backward (training.recompute; model/block.hpp): full reruns its
// forward from its kept input up to the GELU output into the workspace (with tp > 1 around the
// attention projection's tp all-reduce, again); selective reruns the attention core into the
// workspace's probabilities (atty is rewritten with the values it holds). The same kernels on the
// same inputs: the backward then reads exactly what it would have without recomputation.
template <class Kernels, class Model, class Acts>
void recompute(const Kernels& k, const Model& m, Acts& acts, int layer, const GptHooks& hooks) {
  const Gpt& g = layout_of(m);
  const std::size_t idx = block_index(m, layer);
  const BlockDims& d = g.dims;
  const BlockParams& p = m.blocks[idx];
  BlockActivations& a = acts.blocks[idx];
  check_bound(a);
  const int B = acts.B, T = acts.T;
  const auto fd = flop_dims(g, B, T);
  if (acts.recompute == Recompute::Selective) {
    OpSpan span(hooks.observer, names::kAttentionRecompute.data(), layer,
                flops::recompute_attention(fd));
    k.attention_forward(a.atty, a.att, a.qkv, B, T, d.Cl, d.NH, d.NKV);
    return;
  }
  const std::size_t n = acts.boundary_elems;
  const float* x = acts.stream + idx * n;
  const bool tp = g.shard.tp_size > 1;
  const char* name = names::kBlockRecompute.data();
  if (g.shard.sp()) {
    OpSpan span(hooks.observer, name, layer,
                sp_piece_flops(fd, model::kSpRecomputePieces[0], true));
    sp_block_front(k, g, p, a, acts, x, layer, hooks, span, name, model::kSpRecomputePieces);
    return;
  }
  OpSpan span(hooks.observer, name, layer, flops::recompute_block_piece(fd, 0, tp ? 2 : 1));
  attention_half(k, g, p, a, x, B, T);
  if (tp) {
    span.close();
    tp_reduce(hooks, TpPoint::kAttnProjForward, layer, a.attproj, n);
    span.reopen(hooks.observer, name, layer, flops::recompute_block_piece(fd, 1, 2));
  }
  mlp_front(k, g, p, a, x, B, T);
}

// Final LayerNorm, tied LM head, softmax cross-entropy; returns and stores the mean loss.
template <class Kernels, class Model, class Acts>
float head_forward(const Kernels& k, const Model& m, Acts& acts, const int32_t* targets,
                   const GptHooks& hooks) {
  const Gpt& g = layout_of(m);
  if (!g.shard.has_head) throw std::logic_error("gpt: head forward on a shard without the head");
  const int B = acts.B, T = acts.T, C = g.dims.C, V = g.config.vocab;
  const auto fd = flop_dims(g, B, T);
  const bool sp = g.shard.sp();
  const char* name = names::kHeadForward.data();
  OpSpan span(hooks.observer, name, g.config.n_layer,
              sp ? flops::head_norm_forward(fd, true) : flops::head_forward(fd));
  k.upload_tokens(acts.targets.data(), targets, acts.targets.size());
  if (!sp) {
    norm_forward(k, g, acts.lnf, acts.lnf_mean, acts.lnf_rstd, acts.stage_output(), m.head.lnfw,
                 m.head.lnfb, B, T);
  } else {
    // Sequence parallelism: the final LayerNorm on this rank's tokens, gathered for the LM head
    // (replicated over tp, as the loss).
    norm_forward(k, g, acts.tp_local, acts.lnf_mean, acts.lnf_rstd, acts.stage_output(),
                 m.head.lnfw, m.head.lnfb, 1, local_tokens(g, B, T));
    span.close();
    tp_gather(hooks, TpPoint::kHeadGather, g.config.n_layer, acts.tp_local, acts.lnf,
              acts.boundary_elems);
    span.reopen(hooks.observer, name, g.config.n_layer, flops::head_lm_forward(fd));
  }
  k.matmul_forward(acts.logits, acts.lnf, lm_weight(m), nullptr, B, T, C, V);
  acts.loss =
      k.softmax_crossentropy_forward(acts.losses, acts.logits, acts.targets.data(), B, T, V);
  return acts.loss;
}

template <class Kernels, class Model, class Acts, class Scratch>
void head_backward(const Kernels& k, Model& m, Acts& acts, Scratch& s, float loss_scale,
                   const GptHooks& hooks) {
  const Gpt& g = layout_of(m);
  if (!g.shard.has_head) throw std::logic_error("gpt: head backward on a shard without the head");
  const int B = acts.B, T = acts.T, C = g.dims.C, V = g.config.vocab;
  {
    const auto fd = flop_dims(g, B, T);
    OpSpan span(hooks.observer, names::kHeadBackward.data(), g.config.n_layer,
                g.shard.sp()
                    ? 2.0 * (flops::head_lm_forward(fd) + flops::head_norm_forward(fd, true))
                    : flops::head_backward(fd));
    k.softmax_crossentropy_backward(acts.logits, acts.targets.data(),
                                    loss_scale / static_cast<float>(B * T), B, T, V);
    k.matmul_backward(s.dln, lm_grad(m), nullptr, acts.logits, acts.lnf, lm_weight(m), B, T, C, V,
                      false);
    k.zero(s.dres, acts.boundary_elems);
    if (!g.shard.sp()) {
      norm_backward(k, g, s.dres, m.dhead.lnfw, m.dhead.lnfb, s.dln, acts.stage_output(),
                    m.head.lnfw, acts.lnf_mean, acts.lnf_rstd, B, T);
    } else {
      // This rank's rows of the (replicated) gradient of the norm's output; its gain (and shift)
      // gradients over these tokens only, summed over tp below.
      k.zero(s.tp_grads, 2 * std::size_t(C));
      norm_backward(k, g, s.dres, s.tp_grads, m.dhead.lnfb ? s.tp_grads + C : nullptr,
                    s.dln + std::size_t(g.shard.tp_rank) * acts.boundary_elems, acts.stage_output(),
                    m.head.lnfw, acts.lnf_mean, acts.lnf_rstd, 1, local_tokens(g, B, T));
    }
  }
  if (g.shard.sp()) {
    const std::size_t n = (m.dhead.lnfb ? 2 : 1) * std::size_t(C);
    tp_reduce(hooks, TpPoint::kReplicatedGrads, g.config.n_layer, s.tp_grads, n);
    k.residual_forward(m.dhead.lnfw, m.dhead.lnfw, s.tp_grads, std::size_t(C));
    if (m.dhead.lnfb)
      k.residual_forward(m.dhead.lnfb, m.dhead.lnfb, s.tp_grads + C, std::size_t(C));
  }
  if (hooks.on_grads_ready) hooks.on_grads_ready(g.config.n_layer);
}

// Sequence-parallel backward of one block (model/block.hpp's five backward pieces): s.dres holds
// this rank's tokens of dy and ends with those of dx. The replicated norm gains and shifts and the
// row-parallel biases the block has get this rank's tokens' share in s.tp_grads (packed in the
// order ln1w ln1b projb ln2w ln2b fcprojb, absent ones skipped), summed over tp once and then added
// to the block's gradients (so accumulation over micro-batches is not summed twice).
template <class Kernels, class Acts, class Scratch>
void sp_block_backward(const Kernels& k, const Gpt& gl, const BlockParams& p, const BlockParams& g,
                       const BlockActivations& a, Acts& acts, Scratch& s, const float* x, int layer,
                       const GptHooks& hooks) {
  const BlockDims& d = gl.dims;
  const int B = acts.B, T = acts.T, n = local_tokens(gl, B, T);
  const std::size_t nC = acts.boundary_elems;
  const std::size_t C = std::size_t(d.C);
  const auto fd = flop_dims(gl, B, T);
  const char* name = names::kBlockBackward.data();
  BlockParams r = g;  // the replicated gradients of this micro-batch, in s.tp_grads
  std::size_t packed = 0;
  std::array<std::pair<float**, float*>, 6> replicated{{{&r.ln1w, g.ln1w},
                                                        {&r.ln1b, g.ln1b},
                                                        {&r.projb, g.projb},
                                                        {&r.ln2w, g.ln2w},
                                                        {&r.ln2b, g.ln2b},
                                                        {&r.fcprojb, g.fcprojb}}};
  for (auto& [field, grad] : replicated) {
    *field = grad != nullptr ? s.tp_grads + (packed++) * C : nullptr;
  }
  auto piece = [&](int i) {
    return sp_piece_flops(fd, model::kSpBackwardPieces[std::size_t(i)], false);
  };
  {
    OpSpan span(hooks.observer, name, layer, piece(0));
    k.zero(s.tp_grads, packed * C);
    bias_grad(k, r.fcprojb, s.dres, 1, n, d.C);
    span.close();
    tp_gather(hooks, TpPoint::kOutputGradGather, layer, s.dres, s.tp_full, nC);
    span.reopen(hooks.observer, name, layer, piece(1));
    k.matmul_backward(s.dfch_gelu, g.fcprojw, nullptr, s.tp_full, a.fch_gelu, p.fcprojw, B, T, d.F,
                      d.C, false);
    act_backward(k, gl, s.dfch, a.fch, s.dfch_gelu, B, T);
    k.matmul_backward(s.dln, g.fcw, g.fcb, s.dfch, a.ln2, p.fcw, B, T, d.C, d.fc1(), false);
    span.close();
    tp_scatter(hooks, TpPoint::kMlpInputBackward, layer, s.dln, s.tp_local, nC);
    span.reopen(hooks.observer, name, layer, piece(2));
    norm_backward(k, gl, s.dres, r.ln2w, r.ln2b, s.tp_local, a.res2, p.ln2w, a.ln2_mean, a.ln2_rstd,
                  1, n);
    bias_grad(k, r.projb, s.dres, 1, n, d.C);
    span.close();
    tp_gather(hooks, TpPoint::kOutputGradGather, layer, s.dres, s.tp_full, nC);
    span.reopen(hooks.observer, name, layer, piece(3));
    k.matmul_backward(s.datty, g.projw, nullptr, s.tp_full, a.atty, p.projw, B, T, d.Cl, d.C,
                      false);
    qkv_attention_backward(k, gl, p, g, a, s, B, T);
    span.close();
    tp_scatter(hooks, TpPoint::kAttnInputBackward, layer, s.dln, s.tp_local, nC);
    span.reopen(hooks.observer, name, layer, piece(4));
    norm_backward(k, gl, s.dres, r.ln1w, r.ln1b, s.tp_local, x, p.ln1w, a.ln1_mean, a.ln1_rstd, 1,
                  n);
  }
  tp_reduce(hooks, TpPoint::kReplicatedGrads, layer, s.tp_grads, packed * C);
  for (auto& [field, grad] : replicated) {
    if (grad != nullptr) k.residual_forward(grad, grad, *field, C);
  }
}

// A block's backward from the gradient of its ln2 output s.dln (summed over tp) on: ln2, then the
// attention half, then ln1; s.dres holds dy on entry and dx on exit. With tp (`split_flops` >= 0)
// `span` is cut around the tp all-reduce of ln1's output gradient, reopened with `split_flops`.
template <class Kernels, class Scratch>
void attention_half_backward(const Kernels& k, const Gpt& gl, const BlockParams& p,
                             const BlockParams& g, const BlockActivations& a, Scratch& s,
                             const float* x, int layer, const GptHooks& hooks, OpSpan& span,
                             double split_flops) {
  const BlockDims& d = gl.dims;
  const int B = s.B, T = s.T;
  norm_backward(k, gl, s.dres, g.ln2w, g.ln2b, s.dln, a.res2, p.ln2w, a.ln2_mean, a.ln2_rstd, B, T);
  // Attention: res2 = x + proj(attn(qkv(ln1(x)))) + b; s.dres now holds dres2.
  bias_grad(k, g.projb, s.dres, B, T, d.C);
  k.matmul_backward(s.datty, g.projw, nullptr, s.dres, a.atty, p.projw, B, T, d.Cl, d.C, false);
  qkv_attention_backward(k, gl, p, g, a, s, B, T);
  if (split_flops >= 0) {
    span.close();
    tp_reduce(hooks, TpPoint::kAttnInputBackward, layer, s.dln, std::size_t(B) * T * d.C);
    span.reopen(hooks.observer, names::kBlockBackward.data(), layer, split_flops);
  }
  norm_backward(k, gl, s.dres, g.ln1w, g.ln1b, s.dln, x, p.ln1w, a.ln1_mean, a.ln1_rstd, B, T);
}

template <class Kernels, class Model, class Acts, class Scratch>
void block_backward(const Kernels& k, Model& m, Acts& acts, Scratch& s, int layer,
                    const GptHooks& hooks) {
  const Gpt& gl = layout_of(m);
  const std::size_t idx = block_index(m, layer);
  const BlockDims& d = gl.dims;
  const BlockParams& p = m.blocks[idx];
  const BlockParams& g = m.dblocks[idx];
  const BlockActivations& a = acts.blocks[idx];
  check_bound(a);
  const int B = acts.B, T = acts.T;
  const std::size_t n = acts.boundary_elems;
  const float* x = acts.stream + idx * n;
  const auto fd = flop_dims(gl, B, T);
  const bool tp = gl.shard.tp_size > 1;
  const char* name = names::kBlockBackward.data();
  if (acts.recompute != Recompute::None) recompute(k, m, acts, layer, hooks);
  if (gl.shard.sp()) {
    sp_block_backward(k, gl, p, g, a, acts, s, x, layer, hooks);
    if (hooks.on_grads_ready) hooks.on_grads_ready(layer);
    return;
  }
  if (gl.is_moe_block(layer)) {
    { OpSpan residual(hooks.observer, name, layer, 0.0); }  // [MlpResidual]: no bias to reduce
    moe_pieces::backward(k, m, acts, s, layer, hooks);      // s.dln: this tp rank's partial
    if (tp) tp_reduce(hooks, TpPoint::kMlpInputBackward, layer, s.dln, n);
    const double attn = 2.0 * flops::block_attention_forward(fd);
    OpSpan span(hooks.observer, name, layer, attn);
    attention_half_backward(k, gl, p, g, a, s, x, layer, hooks, span, tp ? 0.0 : -1.0);
    span.close();
    if (hooks.on_grads_ready) hooks.on_grads_ready(layer);
    return;
  }
  {
    OpSpan span(hooks.observer, name, layer, flops::block_piece(fd, false, 0, tp ? 3 : 1));
    // MLP: y = res2 + fc2(act(fc1(ln2(res2)))) + b; s.dres holds dy.
    bias_grad(k, g.fcprojb, s.dres, B, T, d.C);
    k.matmul_backward(s.dfch_gelu, g.fcprojw, nullptr, s.dres, a.fch_gelu, p.fcprojw, B, T, d.F,
                      d.C, false);
    act_backward(k, gl, s.dfch, a.fch, s.dfch_gelu, B, T);
    k.matmul_backward(s.dln, g.fcw, g.fcb, s.dfch, a.ln2, p.fcw, B, T, d.C, d.fc1(), false);
    if (tp) {
      span.close();
      tp_reduce(hooks, TpPoint::kMlpInputBackward, layer, s.dln, n);
      span.reopen(hooks.observer, name, layer, flops::block_piece(fd, false, 1, 3));
    }
    attention_half_backward(k, gl, p, g, a, s, x, layer, hooks, span,
                            tp ? flops::block_piece(fd, false, 2, 3) : -1.0);
  }
  if (hooks.on_grads_ready) hooks.on_grads_ready(layer);
}

template <class Kernels, class Model, class Acts, class Scratch>
void embed_backward(const Kernels& k, Model& m, Acts& acts, Scratch& s, const GptHooks& hooks) {
  const Gpt& g = layout_of(m);
  if (!g.shard.has_embed)
    throw std::logic_error("gpt: embedding backward on a shard without the embedding");
  {
    const float* dout = s.dres;
    if (g.shard.sp()) {  // every token's gradient, for the replicated embedding's
      tp_gather(hooks, TpPoint::kEmbedGather, kEmbedSegment, s.dres, s.tp_full,
                acts.boundary_elems);
      dout = s.tp_full;
    }
    OpSpan span(hooks.observer, names::kEmbedBackward.data(), kEmbedSegment,
                flops::embed_backward(flop_dims(g, acts.B, acts.T)));
    k.encoder_backward(m.dembed.wte, m.dembed.wpe, dout, acts.inputs.data(), acts.B, acts.T,
                       g.dims.C);
  }
  if (hooks.on_grads_ready) hooks.on_grads_ready(kEmbedSegment);
}

// Whole stage: embedding (if held), blocks, head (if held); the mean loss, or 0 without the head.
template <class Kernels, class Model, class Acts>
float forward(const Kernels& k, const Model& m, Acts& acts, const int32_t* inputs,
              const int32_t* targets, const GptHooks& hooks) {
  const GptShard& sh = layout_of(m).shard;
  auto before = [&](int segment) {
    if (hooks.before_forward) hooks.before_forward(segment);
  };
  if (sh.has_embed) {
    before(kEmbedSegment);
    embed_forward(k, m, acts, inputs, hooks);
  }
  for (int l = sh.layer_begin; l < sh.layer_end; ++l) {
    before(l);
    block_forward(k, m, acts, l, hooks);
  }
  if (!sh.has_head) return 0.0f;
  before(layout_of(m).config.n_layer);
  return head_forward(k, m, acts, targets, hooks);
}

// Head (if held; otherwise scratch.dres holds the output gradient), blocks in reverse, embedding (if
// held). A head-only stage that holds wte fires on_grads_ready(kEmbedSegment) last.
template <class Kernels, class Model, class Acts, class Scratch>
void backward(const Kernels& k, Model& m, Acts& acts, Scratch& s, float loss_scale,
              const GptHooks& hooks) {
  if (s.B != acts.B || s.T != acts.T)
    throw std::logic_error("gpt: scratch and activations differ in (B, T)");
  const GptShard& sh = layout_of(m).shard;
  acts.objective_scale = loss_scale;  // the MoE blocks' aux-loss gradients (moe_block.hpp)
  if (sh.has_head) head_backward(k, m, acts, s, loss_scale, hooks);
  for (int l = sh.layer_end - 1; l >= sh.layer_begin; --l) block_backward(k, m, acts, s, l, hooks);
  if (sh.has_embed) {
    embed_backward(k, m, acts, s, hooks);
  } else if (sh.has_head && holds_embedding_segment(layout_of(m)) && hooks.on_grads_ready) {
    hooks.on_grads_ready(kEmbedSegment);  // the head-only stage's copy of the tied wte
  }
}

}  // namespace pieces
}  // namespace orrery::runtime
