// The reference GPT on one CUDA device (see cuda/model.hpp): the CPU model's layout and pieces with
// device buffers and the CUDA kernels. The piece bodies follow runtime/src/model.cpp line by line,
// including the tensor-parallel split of each block into three spans around the tp sums.
#include "orrery/runtime/cuda/model.hpp"

#include <stdexcept>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/model/flops.hpp"
#include "orrery/runtime/buffers.hpp"

namespace orrery::runtime::cuda {
namespace {

float* rebase(const float* host_ptr, const float* host_base, float* dev_base) {
  if (host_ptr == nullptr) return nullptr;
  return dev_base + (host_ptr - host_base);
}

BlockParams rebase(const BlockParams& p, const float* hb, float* db) {
  return BlockParams{rebase(p.ln1w, hb, db), rebase(p.ln1b, hb, db),    rebase(p.qkvw, hb, db),
                     rebase(p.qkvb, hb, db), rebase(p.projw, hb, db),   rebase(p.projb, hb, db),
                     rebase(p.ln2w, hb, db), rebase(p.ln2b, hb, db),    rebase(p.fcw, hb, db),
                     rebase(p.fcb, hb, db),  rebase(p.fcprojw, hb, db), rebase(p.fcprojb, hb, db)};
}

flops::Dims flop_dims(const GpuGpt& m, int B, int T) { return runtime::flop_dims(m.host, B, T); }

using Span = OpSpan;  // model.hpp

// Megatron's sum over the tp group of a device tensor (GptHooks::tp_all_reduce, see model.hpp):
// the trainer queues it on the device communicator and orders the compute stream after it.
void tp_reduce(const GptHooks& hooks, TpPoint point, int layer, float* data, std::size_t n) {
  if (!hooks.tp_all_reduce) {
    throw std::logic_error("gpu gpt: tp_size > 1 but GptHooks::tp_all_reduce is not set");
  }
  hooks.tp_all_reduce(point, layer, data, n);
}

// The block's index in this shard (blocks are held from layer_begin on).
std::size_t check_layer(const GpuGpt& m, int layer) {
  const GptShard& sh = m.host.shard;
  if (layer < sh.layer_begin || layer >= sh.layer_end) {
    throw std::out_of_range("gpu gpt: layer " + std::to_string(layer) + " is not in this shard [" +
                            std::to_string(sh.layer_begin) + ", " + std::to_string(sh.layer_end) +
                            ")");
  }
  return static_cast<std::size_t>(layer - sh.layer_begin);
}

void zero_async(const Context& ctx, float* p, std::size_t n) {
  if (n == 0) return;
  ORRERY_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), ctx.stream()));
}

}  // namespace

const FloatArray& GpuGpt::download_params() {
  params.copy_to_host(host.params.data(), host.params.size());
  return host.params;
}

GpuGpt gpu_gpt_create(Gpt host, bool device_storage) {
  // Any shard gpt_create made (it validated the layer range): a pipeline stage keeps its blocks at
  // index layer - layer_begin, and a head-only stage its own wte copy (wpe null), as on the CPU.
  GpuGpt m;
  m.host = std::move(host);
  if (!device_storage) {  // ZeRO 3 (cuda/zero3.hpp) binds every pointer to its working buffers
    m.blocks.resize(m.host.blocks.size());
    m.dblocks.resize(m.host.dblocks.size());
    return m;
  }
  const std::size_t n = m.host.params.size();
  m.params.resize(n);
  m.grads.resize(n);
  m.params.copy_from_host(m.host.params.data(), n);
  const float* hp = m.host.params.data();
  const float* hg = m.host.grads.data();
  float* dp = m.params.data();
  float* dg = m.grads.data();
  m.embed = EmbedParams{rebase(m.host.embed.wte, hp, dp), rebase(m.host.embed.wpe, hp, dp)};
  m.dembed = EmbedParams{rebase(m.host.dembed.wte, hg, dg), rebase(m.host.dembed.wpe, hg, dg)};
  for (const auto& b : m.host.blocks) m.blocks.push_back(rebase(b, hp, dp));
  for (const auto& b : m.host.dblocks) m.dblocks.push_back(rebase(b, hg, dg));
  m.head = HeadParams{rebase(m.host.head.lnfw, hp, dp), rebase(m.host.head.lnfb, hp, dp)};
  m.dhead = HeadParams{rebase(m.host.dhead.lnfw, hg, dg), rebase(m.host.dhead.lnfb, hg, dg)};
  return m;
}

void gpu_zero_grad(const Context& ctx, GpuGpt& model) {
  zero_async(ctx, model.grads.data(), model.grads.size());
}

GpuActivations gpu_activations(const GpuGpt& m, int B, int T) {
  if (B < 1 || T < 1 || T > m.config().max_seq) {
    throw InputError("model: batch (" + std::to_string(B) + ", " + std::to_string(T) +
                     ") needs B >= 1 and 1 <= T <= seq " + std::to_string(m.config().max_seq));
  }
  GpuActivations a;
  // Rounded to 64 floats (256 bytes) per buffer: every pointer keeps cudaMalloc's alignment.
  carve_activations(
      a, buffer_shape(m.dims(), m.config(), m.host.shard, std::size_t(m.host.num_blocks()), B, T),
      64);
  a.inputs.resize(std::size_t(B) * T);
  a.targets.resize(std::size_t(B) * T);
  return a;
}

GpuGradScratch gpu_grad_scratch(const GpuGpt& m, int B, int T) {
  GpuGradScratch s;
  carve_grad_scratch(
      s, buffer_shape(m.dims(), m.config(), m.host.shard, std::size_t(m.host.num_blocks()), B, T),
      64);
  return s;
}

// ---------------------------------------------------------------- pieces

void gpu_embed_forward(const Context& ctx, const GpuGpt& m, GpuActivations& acts,
                       const int32_t* inputs, const GptHooks& hooks) {
  if (!m.host.shard.has_embed)
    throw std::logic_error("gpu gpt: embedding forward on a shard without the embedding");
  Span span(hooks.observer, names::kEmbedForward.data(), kEmbedSegment,
            flops::embed_forward(flop_dims(m, acts.B, acts.T)));
  ORRERY_CUDA_CHECK(cudaMemcpyAsync(acts.inputs.data(), inputs, acts.inputs.size_bytes(),
                                    cudaMemcpyHostToDevice, ctx.stream()));
  encoder_forward(ctx, acts.stream, acts.inputs.data(), m.embed.wte, m.embed.wpe, acts.B, acts.T,
                  m.dims().C);
}

void gpu_block_forward(const Context& ctx, const GpuGpt& m, GpuActivations& acts, int layer,
                       const GptHooks& hooks) {
  const std::size_t idx = check_layer(m, layer);
  const BlockDims& d = m.dims();
  const BlockParams& p = m.blocks[idx];
  BlockActivations& a = acts.blocks[idx];
  const int B = acts.B, T = acts.T;
  const std::size_t n = acts.boundary_elems;
  const float* x = acts.stream + idx * n;
  float* y = acts.stream + (idx + 1) * n;
  const auto fd = flop_dims(m, B, T);
  const bool tp = m.host.shard.tp_size > 1;
  Span span(hooks.observer, names::kBlockForward.data(), layer,
            flops::block_piece(fd, true, 0, tp ? 3 : 1));
  // Attention half (block_attention_part).
  layernorm_forward(ctx, a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1w, p.ln1b, B, T, d.C);
  matmul_forward(ctx, a.qkv, a.ln1, p.qkvw, p.qkvb, B, T, d.C, 3 * d.Cl);
  attention_forward(ctx, a.atty, a.att, a.qkv, B, T, d.Cl, d.NH);
  matmul_forward(ctx, a.attproj, a.atty, p.projw, nullptr, B, T, d.Cl, d.C);
  if (tp) {
    span.close();
    tp_reduce(hooks, TpPoint::kAttnProjForward, layer, a.attproj, n);
    span.reopen(hooks.observer, names::kBlockForward.data(), layer,
                flops::block_piece(fd, true, 1, 3));
  }
  bias_residual_forward(ctx, a.res2, x, a.attproj, p.projb, B, T, d.C);
  // MLP half (block_mlp_part).
  layernorm_forward(ctx, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b, B, T, d.C);
  matmul_forward(ctx, a.fch, a.ln2, p.fcw, p.fcb, B, T, d.C, d.F);
  gelu_forward(ctx, a.fch_gelu, a.fch, static_cast<std::size_t>(B) * T * d.F);
  matmul_forward(ctx, a.fcproj, a.fch_gelu, p.fcprojw, nullptr, B, T, d.F, d.C);
  if (tp) {
    span.close();
    tp_reduce(hooks, TpPoint::kMlpProjForward, layer, a.fcproj, n);
    span.reopen(hooks.observer, names::kBlockForward.data(), layer,
                flops::block_piece(fd, true, 2, 3));
  }
  bias_residual_forward(ctx, y, a.res2, a.fcproj, p.fcprojb, B, T, d.C);
}

float gpu_head_forward(const Context& ctx, const GpuGpt& m, GpuActivations& acts,
                       const int32_t* targets, const GptHooks& hooks) {
  if (!m.host.shard.has_head)
    throw std::logic_error("gpu gpt: head forward on a shard without the head");
  const int B = acts.B, T = acts.T, C = m.dims().C, V = m.config().vocab;
  Span span(hooks.observer, names::kHeadForward.data(), m.config().n_layer,
            flops::head_forward(flop_dims(m, B, T)));
  ORRERY_CUDA_CHECK(cudaMemcpyAsync(acts.targets.data(), targets, acts.targets.size_bytes(),
                                    cudaMemcpyHostToDevice, ctx.stream()));
  layernorm_forward(ctx, acts.lnf, acts.lnf_mean, acts.lnf_rstd, acts.stage_output(), m.head.lnfw,
                    m.head.lnfb, B, T, C);
  matmul_forward(ctx, acts.logits, acts.lnf, m.embed.wte, nullptr, B, T, C, V);
  acts.loss =
      softmax_crossentropy_forward(ctx, acts.losses, acts.logits, acts.targets.data(), B, T, V);
  return acts.loss;
}

void gpu_head_backward(const Context& ctx, GpuGpt& m, GpuActivations& acts, GpuGradScratch& s,
                       float loss_scale, const GptHooks& hooks) {
  if (!m.host.shard.has_head)
    throw std::logic_error("gpu gpt: head backward on a shard without the head");
  const int B = acts.B, T = acts.T, C = m.dims().C, V = m.config().vocab;
  {
    Span span(hooks.observer, names::kHeadBackward.data(), m.config().n_layer,
              flops::head_backward(flop_dims(m, B, T)));
    softmax_crossentropy_backward(ctx, acts.logits, acts.targets.data(),
                                  loss_scale / static_cast<float>(B * T), B, T, V);
    matmul_backward(ctx, s.dln, m.dembed.wte, nullptr, acts.logits, acts.lnf, m.embed.wte, B, T, C,
                    V, false);
    zero_async(ctx, s.dres, acts.boundary_elems);
    layernorm_backward(ctx, s.dres, m.dhead.lnfw, m.dhead.lnfb, s.dln, acts.stage_output(),
                       m.head.lnfw, acts.lnf_mean, acts.lnf_rstd, B, T, C);
  }
  if (hooks.on_grads_ready) hooks.on_grads_ready(m.config().n_layer);
}

void gpu_block_backward(const Context& ctx, GpuGpt& m, GpuActivations& acts, GpuGradScratch& s,
                        int layer, const GptHooks& hooks) {
  const std::size_t idx = check_layer(m, layer);
  const BlockDims& d = m.dims();
  const BlockParams& p = m.blocks[idx];
  const BlockParams& g = m.dblocks[idx];
  const BlockActivations& a = acts.blocks[idx];
  const int B = acts.B, T = acts.T;
  const std::size_t BT = static_cast<std::size_t>(B) * T;
  const float* x = acts.stream + idx * acts.boundary_elems;
  const std::size_t n = acts.boundary_elems;
  const auto fd = flop_dims(m, B, T);
  const bool tp = m.host.shard.tp_size > 1;
  {
    Span span(hooks.observer, names::kBlockBackward.data(), layer,
              flops::block_piece(fd, false, 0, tp ? 3 : 1));
    // MLP: y = res2 + fc2(gelu(fc1(ln2(res2)))) + b; s.dres holds dy.
    bias_backward(ctx, g.fcprojb, s.dres, B, T, d.C);
    matmul_backward(ctx, s.dfch_gelu, g.fcprojw, nullptr, s.dres, a.fch_gelu, p.fcprojw, B, T, d.F,
                    d.C, false);
    zero_async(ctx, s.dfch, BT * d.F);
    gelu_backward(ctx, s.dfch, a.fch, s.dfch_gelu, BT * d.F);
    matmul_backward(ctx, s.dln, g.fcw, g.fcb, s.dfch, a.ln2, p.fcw, B, T, d.C, d.F, false);
    if (tp) {
      span.close();
      tp_reduce(hooks, TpPoint::kMlpInputBackward, layer, s.dln, n);
      span.reopen(hooks.observer, names::kBlockBackward.data(), layer,
                  flops::block_piece(fd, false, 1, 3));
    }
    layernorm_backward(ctx, s.dres, g.ln2w, g.ln2b, s.dln, a.res2, p.ln2w, a.ln2_mean, a.ln2_rstd,
                       B, T, d.C);
    // Attention: res2 = x + proj(attn(qkv(ln1(x)))) + b; s.dres now holds dres2.
    bias_backward(ctx, g.projb, s.dres, B, T, d.C);
    matmul_backward(ctx, s.datty, g.projw, nullptr, s.dres, a.atty, p.projw, B, T, d.Cl, d.C,
                    false);
    zero_async(ctx, s.dqkv, BT * 3 * d.Cl);
    attention_backward(ctx, s.dqkv, s.datt, s.datty, a.qkv, a.att, B, T, d.Cl, d.NH);
    matmul_backward(ctx, s.dln, g.qkvw, g.qkvb, s.dqkv, a.ln1, p.qkvw, B, T, d.C, 3 * d.Cl, false);
    if (tp) {
      span.close();
      tp_reduce(hooks, TpPoint::kAttnInputBackward, layer, s.dln, n);
      span.reopen(hooks.observer, names::kBlockBackward.data(), layer,
                  flops::block_piece(fd, false, 2, 3));
    }
    layernorm_backward(ctx, s.dres, g.ln1w, g.ln1b, s.dln, x, p.ln1w, a.ln1_mean, a.ln1_rstd, B, T,
                       d.C);
  }
  if (hooks.on_grads_ready) hooks.on_grads_ready(layer);
}

void gpu_embed_backward(const Context& ctx, GpuGpt& m, GpuActivations& acts, GpuGradScratch& s,
                        const GptHooks& hooks) {
  if (!m.host.shard.has_embed)
    throw std::logic_error("gpu gpt: embedding backward on a shard without the embedding");
  {
    Span span(hooks.observer, names::kEmbedBackward.data(), kEmbedSegment,
              flops::embed_backward(flop_dims(m, acts.B, acts.T)));
    encoder_backward(ctx, m.dembed.wte, m.dembed.wpe, s.dres, acts.inputs.data(), acts.B, acts.T,
                     m.dims().C);
  }
  if (hooks.on_grads_ready) hooks.on_grads_ready(kEmbedSegment);
}

float gpu_forward(const Context& ctx, const GpuGpt& m, GpuActivations& acts, const int32_t* inputs,
                  const int32_t* targets, const GptHooks& hooks) {
  const GptShard& sh = m.host.shard;
  if (sh.has_embed) gpu_embed_forward(ctx, m, acts, inputs, hooks);
  for (int l = sh.layer_begin; l < sh.layer_end; ++l) gpu_block_forward(ctx, m, acts, l, hooks);
  if (sh.has_head) return gpu_head_forward(ctx, m, acts, targets, hooks);
  return 0.0f;
}

void gpu_backward(const Context& ctx, GpuGpt& m, GpuActivations& acts, GpuGradScratch& s,
                  float loss_scale, const GptHooks& hooks) {
  if (s.B != acts.B || s.T != acts.T)
    throw std::logic_error("gpu gpt: scratch and activations differ in (B, T)");
  const GptShard& sh = m.host.shard;
  if (sh.has_head) gpu_head_backward(ctx, m, acts, s, loss_scale, hooks);
  for (int l = sh.layer_end - 1; l >= sh.layer_begin; --l)
    gpu_block_backward(ctx, m, acts, s, l, hooks);
  if (sh.has_embed) {
    gpu_embed_backward(ctx, m, acts, s, hooks);
  } else if (sh.has_head && hooks.on_grads_ready) {
    hooks.on_grads_ready(kEmbedSegment);  // the head-only stage's copy of wte (as gpt_backward)
  }
}

}  // namespace orrery::runtime::cuda
