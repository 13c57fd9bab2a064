// The reference GPT on CPUs: parameter layout and initialisation, activation buffers, and the
// forward/backward pieces (embedding, blocks, head) composed from the kernels. See model.hpp for
// the layout, the hooks and the span names.
#include "orrery/runtime/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"
#include "orrery/model/flops.hpp"
#include "orrery/runtime/buffers.hpp"
#include "orrery/runtime/kernels.hpp"
#include "random.hpp"

namespace orrery::runtime {
namespace {

using model::Init;
using model::Slice;
using TensorSpec = model::ParamSpec;

void fill_tensor(float* dst, const TensorSpec& t, uint64_t seed, const BlockDims& d, int tp_rank) {
  const std::size_t n = static_cast<std::size_t>(t.rows) * t.cols;
  if (t.init == Init::Zero) {
    std::fill(dst, dst + n, 0.0f);
    return;
  }
  if (t.init == Init::One) {
    std::fill(dst, dst + n, 1.0f);
    return;
  }
  // Draw the full tensor from its own stream, then cut this shard's slice.
  const std::size_t full_n = static_cast<std::size_t>(t.full_rows) * t.full_cols;
  detail::Rng rng(seed, t.name);
  if (t.slice == Slice::None) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(rng.normal() * t.stddev);
    return;
  }
  std::vector<float> full(full_n);
  for (auto& x : full) x = static_cast<float>(rng.normal() * t.stddev);
  const std::size_t fc = static_cast<std::size_t>(t.full_cols);
  switch (t.slice) {
    case Slice::QkvRows:
      for (int part = 0; part < 3; ++part) {
        for (int r = 0; r < d.Cl; ++r) {
          const std::size_t src_row =
              static_cast<std::size_t>(part) * d.C + static_cast<std::size_t>(tp_rank) * d.Cl + r;
          std::memcpy(dst + (static_cast<std::size_t>(part) * d.Cl + r) * fc,
                      full.data() + src_row * fc, fc * sizeof(float));
        }
      }
      break;
    case Slice::Rows:
      std::memcpy(dst, full.data() + static_cast<std::size_t>(tp_rank) * t.rows * fc,
                  n * sizeof(float));
      break;
    case Slice::Cols:
      for (int r = 0; r < t.rows; ++r) {
        std::memcpy(dst + static_cast<std::size_t>(r) * t.cols,
                    full.data() + static_cast<std::size_t>(r) * fc +
                        static_cast<std::size_t>(tp_rank) * t.cols,
                    static_cast<std::size_t>(t.cols) * sizeof(float));
      }
      break;
    case Slice::None:
      break;
  }
}

// The model's parameter table (model/parameters.hpp) for this shard.
std::vector<TensorSpec> tensor_specs(const GptConfig& cfg, const GptShard& sh) {
  const model::ModelShape shape{cfg.n_embd,  cfg.n_head,  cfg.vocab,
                                cfg.max_seq, cfg.n_layer, sh.tp_size};
  model::StageContents stage;
  stage.embed = sh.has_embed;
  stage.head = sh.has_head;
  stage.layers.emplace_back(sh.layer_begin, sh.layer_end);
  return model::parameter_tensors(shape, stage);
}

// Carves the 12 block pointers out of `base` in the order of tensor_specs.
BlockParams block_pointers(float* base, const std::vector<ParamTensor>& tensors,
                           std::size_t first) {
  float* ptr[12];
  for (int i = 0; i < 12; ++i) ptr[i] = base + tensors[first + static_cast<std::size_t>(i)].offset;
  return BlockParams{ptr[0], ptr[1], ptr[2], ptr[3], ptr[4],  ptr[5],
                     ptr[6], ptr[7], ptr[8], ptr[9], ptr[10], ptr[11]};
}

using Span = OpSpan;  // model.hpp

void tp_reduce(const Gpt& m, const GptHooks& hooks, TpPoint point, int layer, float* data,
               std::size_t n) {
  if (!hooks.tp_all_reduce) {
    throw std::logic_error("gpt: tp_size > 1 but GptHooks::tp_all_reduce is not set");
  }
  hooks.tp_all_reduce(point, layer, data, n);
}

void check_layer(const Gpt& m, int layer) {
  if (layer < m.shard.layer_begin || layer >= m.shard.layer_end) {
    throw std::out_of_range("gpt: layer " + std::to_string(layer) + " is not held by this shard [" +
                            std::to_string(m.shard.layer_begin) + ", " +
                            std::to_string(m.shard.layer_end) + ")");
  }
}

}  // namespace

GptConfig gpt_config(const orrery::ModelConfig& m) {
  return GptConfig{m.layers, m.d_model, m.heads, m.vocab, m.seq};
}

GptShard GptShard::pipeline_stage(const GptConfig& cfg, int stage, int stages) {
  if (stages < 1 || stage < 0 || stage >= stages || stages > cfg.n_layer) {
    throw InputError("pipeline: stage " + std::to_string(stage) + " of " + std::to_string(stages) +
                     " is impossible with " + std::to_string(cfg.n_layer) + " layers");
  }
  const int base = cfg.n_layer / stages, rem = cfg.n_layer % stages;
  GptShard s;
  s.layer_begin = stage * base + std::min(stage, rem);
  s.layer_end = s.layer_begin + base + (stage < rem ? 1 : 0);
  s.has_embed = stage == 0;
  s.has_head = stage == stages - 1;
  return s;
}

ParamRange Gpt::segment_range(int segment) const {
  std::size_t lo = params.size(), hi = 0;
  for (const auto& t : tensors) {
    if (t.segment != segment) continue;
    lo = std::min(lo, t.offset);
    hi = std::max(hi, t.offset + t.count);
  }
  if (hi == 0) return ParamRange{0, 0};
  return ParamRange{lo, hi - lo};
}

std::vector<ParamRange> Gpt::decay_ranges() const {
  std::vector<ParamRange> out;
  for (const auto& t : tensors) {
    if (!t.decay) continue;
    if (!out.empty() && out.back().end() == t.offset) {
      out.back().count += t.count;
    } else {
      out.push_back(ParamRange{t.offset, t.count});
    }
  }
  return out;
}

const ParamTensor& Gpt::tensor(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return t;
  }
  throw std::out_of_range("gpt: no tensor named " + name);
}

Gpt gpt_create(const GptConfig& config, const GptShard& shard_in, uint64_t seed) {
  const GptConfig& c = config;
  if (c.n_layer < 1 || c.n_embd < 1 || c.n_head < 1 || c.vocab < 1 || c.max_seq < 1) {
    throw InputError("model: layers, d_model, heads, vocab and seq must be positive");
  }
  if (c.n_embd % c.n_head != 0) {
    throw InputError("model: d_model " + std::to_string(c.n_embd) + " is not divisible by heads " +
                     std::to_string(c.n_head));
  }
  GptShard sh = shard_in;
  if (sh.layer_end < 0) sh.layer_end = c.n_layer;
  if (sh.layer_begin < 0 || sh.layer_begin > sh.layer_end || sh.layer_end > c.n_layer) {
    throw InputError("model: layer range [" + std::to_string(sh.layer_begin) + ", " +
                     std::to_string(sh.layer_end) + ") is outside the model's " +
                     std::to_string(c.n_layer) + " layers");
  }
  if (sh.tp_size < 1 || sh.tp_rank < 0 || sh.tp_rank >= sh.tp_size || c.n_head % sh.tp_size != 0) {
    throw InputError("model: tensor parallelism " + std::to_string(sh.tp_size) +
                     " must divide heads " + std::to_string(c.n_head));
  }
  Gpt m;
  m.config = c;
  m.shard = sh;
  m.dims.C = c.n_embd;
  m.dims.NH = c.n_head / sh.tp_size;
  m.dims.hs = c.n_embd / c.n_head;
  m.dims.Cl = m.dims.NH * m.dims.hs;
  m.dims.F = 4 * c.n_embd / sh.tp_size;

  const auto specs = tensor_specs(c, sh);
  std::size_t offset = 0;
  for (const auto& s : specs) {
    ParamTensor t;
    t.name = s.name;
    t.segment = s.segment;
    t.offset = offset;
    t.count = static_cast<std::size_t>(s.rows) * s.cols;
    t.rows = s.rows;
    t.cols = s.cols;
    t.decay = s.rows > 1;  // matrices (dim >= 2), as PyTorch's param groups in the baseline
    offset += t.count;
    m.tensors.push_back(t);
  }
  m.params.resize(offset);
  m.grads.resize(offset);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    fill_tensor(m.params.data() + m.tensors[i].offset, specs[i], seed, m.dims, sh.tp_rank);
  }

  std::size_t idx = 0;
  if (sh.has_embed || sh.has_head) {
    m.embed.wte = m.params.data() + m.tensors[idx].offset;
    m.dembed.wte = m.grads.data() + m.tensors[idx].offset;
    ++idx;
  }
  if (sh.has_embed) {
    m.embed.wpe = m.params.data() + m.tensors[idx].offset;
    m.dembed.wpe = m.grads.data() + m.tensors[idx].offset;
    ++idx;
  }
  for (int l = sh.layer_begin; l < sh.layer_end; ++l) {
    m.blocks.push_back(block_pointers(m.params.data(), m.tensors, idx));
    m.dblocks.push_back(block_pointers(m.grads.data(), m.tensors, idx));
    idx += 12;
  }
  if (sh.has_head) {
    m.head = HeadParams{m.params.data() + m.tensors[idx].offset,
                        m.params.data() + m.tensors[idx + 1].offset};
    m.dhead = HeadParams{m.grads.data() + m.tensors[idx].offset,
                         m.grads.data() + m.tensors[idx + 1].offset};
  }
  return m;
}

void gpt_zero_grad(Gpt& model) { model.grads.zero(); }

GptActivations gpt_activations(const Gpt& m, int B, int T) {
  if (B < 1 || T < 1 || T > m.config.max_seq) {
    throw InputError("model: batch (" + std::to_string(B) + ", " + std::to_string(T) +
                     ") needs B >= 1 and 1 <= T <= seq " + std::to_string(m.config.max_seq));
  }
  GptActivations a;
  // Each buffer is rounded up to 16 floats so every pointer stays 64-byte aligned.
  carve_activations(a, buffer_shape(m.dims, m.config, m.shard, std::size_t(m.num_blocks()), B, T),
                    16);
  a.inputs.assign(std::size_t(B) * T, 0);
  a.targets.assign(std::size_t(B) * T, 0);
  return a;
}

GptGradScratch gpt_grad_scratch(const Gpt& m, int B, int T) {
  GptGradScratch s;
  carve_grad_scratch(s, buffer_shape(m.dims, m.config, m.shard, std::size_t(m.num_blocks()), B, T),
                     16);
  return s;
}

// ---------------------------------------------------------------- block halves

void block_attention_part(const BlockDims& d, const BlockParams& p, BlockActivations& a,
                          const float* x, int B, int T) {
  layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1w, p.ln1b, B, T, d.C);
  matmul_forward(a.qkv, a.ln1, p.qkvw, p.qkvb, B, T, d.C, 3 * d.Cl);
  attention_forward(a.atty, a.att, a.qkv, B, T, d.Cl, d.NH);
  matmul_forward(a.attproj, a.atty, p.projw, nullptr, B, T, d.Cl, d.C);
}

void block_attention_epilogue(const BlockDims& d, const BlockParams& p, BlockActivations& a,
                              const float* x, int B, int T) {
  bias_residual_forward(a.res2, x, a.attproj, p.projb, B, T, d.C);
}

void block_mlp_part(const BlockDims& d, const BlockParams& p, BlockActivations& a, int B, int T) {
  layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b, B, T, d.C);
  matmul_forward(a.fch, a.ln2, p.fcw, p.fcb, B, T, d.C, d.F);
  gelu_forward(a.fch_gelu, a.fch, static_cast<std::size_t>(B) * T * d.F);
  matmul_forward(a.fcproj, a.fch_gelu, p.fcprojw, nullptr, B, T, d.F, d.C);
}

void block_mlp_epilogue(const BlockDims& d, const BlockParams& p, BlockActivations& a, float* y,
                        int B, int T) {
  bias_residual_forward(y, a.res2, a.fcproj, p.fcprojb, B, T, d.C);
}

// ---------------------------------------------------------------- pieces

void gpt_embed_forward(const Gpt& m, GptActivations& acts, const int32_t* inputs,
                       const GptHooks& hooks) {
  if (!m.shard.has_embed)
    throw std::logic_error("gpt: embedding forward on a shard without the embedding");
  Span span(hooks.observer, names::kEmbedForward.data(), kEmbedSegment,
            flops::embed_forward(flop_dims(m, acts.B, acts.T)));
  std::copy(inputs, inputs + acts.inputs.size(), acts.inputs.begin());
  encoder_forward(acts.stream, acts.inputs.data(), m.embed.wte, m.embed.wpe, acts.B, acts.T,
                  m.dims.C);
}

void gpt_block_forward(const Gpt& m, GptActivations& acts, int layer, const GptHooks& hooks) {
  check_layer(m, layer);
  const std::size_t idx = static_cast<std::size_t>(layer - m.shard.layer_begin);
  const BlockDims& d = m.dims;
  const BlockParams& p = m.blocks[idx];
  BlockActivations& a = acts.blocks[idx];
  const int B = acts.B, T = acts.T;
  const std::size_t n = acts.boundary_elems;
  const float* x = acts.stream + idx * n;
  float* y = acts.stream + (idx + 1) * n;
  const auto fd = flop_dims(m, B, T);
  const bool tp = m.shard.tp_size > 1;

  Span span(hooks.observer, names::kBlockForward.data(), layer,
            flops::block_piece(fd, true, 0, tp ? 3 : 1));
  block_attention_part(d, p, a, x, B, T);
  if (tp) {
    span.close();
    tp_reduce(m, hooks, TpPoint::kAttnProjForward, layer, a.attproj, n);
    span.reopen(hooks.observer, names::kBlockForward.data(), layer,
                flops::block_piece(fd, true, 1, 3));
  }
  block_attention_epilogue(d, p, a, x, B, T);
  block_mlp_part(d, p, a, B, T);
  if (tp) {
    span.close();
    tp_reduce(m, hooks, TpPoint::kMlpProjForward, layer, a.fcproj, n);
    span.reopen(hooks.observer, names::kBlockForward.data(), layer,
                flops::block_piece(fd, true, 2, 3));
  }
  block_mlp_epilogue(d, p, a, y, B, T);
}

float gpt_head_forward(const Gpt& m, GptActivations& acts, const int32_t* targets,
                       const GptHooks& hooks) {
  if (!m.shard.has_head) throw std::logic_error("gpt: head forward on a shard without the head");
  const int B = acts.B, T = acts.T, C = m.dims.C, V = m.config.vocab;
  Span span(hooks.observer, names::kHeadForward.data(), m.config.n_layer,
            flops::head_forward(flop_dims(m, B, T)));
  std::copy(targets, targets + acts.targets.size(), acts.targets.begin());
  layernorm_forward(acts.lnf, acts.lnf_mean, acts.lnf_rstd, acts.stage_output(), m.head.lnfw,
                    m.head.lnfb, B, T, C);
  matmul_forward(acts.logits, acts.lnf, m.embed.wte, nullptr, B, T, C, V);
  acts.loss = softmax_crossentropy_forward(acts.losses, acts.logits, acts.targets.data(), B, T, V);
  return acts.loss;
}

void gpt_head_backward(Gpt& m, GptActivations& acts, GptGradScratch& s, float loss_scale,
                       const GptHooks& hooks) {
  if (!m.shard.has_head) throw std::logic_error("gpt: head backward on a shard without the head");
  const int B = acts.B, T = acts.T, C = m.dims.C, V = m.config.vocab;
  const std::size_t n = acts.boundary_elems;
  {
    Span span(hooks.observer, names::kHeadBackward.data(), m.config.n_layer,
              flops::head_backward(flop_dims(m, B, T)));
    softmax_crossentropy_backward(acts.logits, acts.targets.data(),
                                  loss_scale / static_cast<float>(B * T), B, T, V);
    matmul_backward(s.dln, m.dembed.wte, nullptr, acts.logits, acts.lnf, m.embed.wte, B, T, C, V,
                    false);
    std::fill(s.dres, s.dres + n, 0.0f);
    layernorm_backward(s.dres, m.dhead.lnfw, m.dhead.lnfb, s.dln, acts.stage_output(), m.head.lnfw,
                       acts.lnf_mean, acts.lnf_rstd, B, T, C);
  }
  if (hooks.on_grads_ready) hooks.on_grads_ready(m.config.n_layer);
}

void gpt_block_backward(Gpt& m, GptActivations& acts, GptGradScratch& s, int layer,
                        const GptHooks& hooks) {
  check_layer(m, layer);
  const std::size_t idx = static_cast<std::size_t>(layer - m.shard.layer_begin);
  const BlockDims& d = m.dims;
  const BlockParams& p = m.blocks[idx];
  const BlockParams& g = m.dblocks[idx];
  const BlockActivations& a = acts.blocks[idx];
  const int B = acts.B, T = acts.T;
  const std::size_t BT = static_cast<std::size_t>(B) * T;
  const std::size_t n = acts.boundary_elems;
  const float* x = acts.stream + idx * n;
  const auto fd = flop_dims(m, B, T);
  const bool tp = m.shard.tp_size > 1;
  {
    Span span(hooks.observer, names::kBlockBackward.data(), layer,
              flops::block_piece(fd, false, 0, tp ? 3 : 1));
    // MLP: y = res2 + fc2(gelu(fc1(ln2(res2)))) + b; s.dres holds dy.
    bias_backward(g.fcprojb, s.dres, B, T, d.C);
    matmul_backward(s.dfch_gelu, g.fcprojw, nullptr, s.dres, a.fch_gelu, p.fcprojw, B, T, d.F, d.C,
                    false);
    std::fill(s.dfch, s.dfch + BT * d.F, 0.0f);
    gelu_backward(s.dfch, a.fch, s.dfch_gelu, BT * d.F);
    matmul_backward(s.dln, g.fcw, g.fcb, s.dfch, a.ln2, p.fcw, B, T, d.C, d.F, false);
    if (tp) {
      span.close();
      tp_reduce(m, hooks, TpPoint::kMlpInputBackward, layer, s.dln, n);
      span.reopen(hooks.observer, names::kBlockBackward.data(), layer,
                  flops::block_piece(fd, false, 1, 3));
    }
    layernorm_backward(s.dres, g.ln2w, g.ln2b, s.dln, a.res2, p.ln2w, a.ln2_mean, a.ln2_rstd, B, T,
                       d.C);
    // Attention: res2 = x + proj(attn(qkv(ln1(x)))) + b; s.dres now holds dres2.
    bias_backward(g.projb, s.dres, B, T, d.C);
    matmul_backward(s.datty, g.projw, nullptr, s.dres, a.atty, p.projw, B, T, d.Cl, d.C, false);
    std::fill(s.dqkv, s.dqkv + BT * 3 * d.Cl, 0.0f);
    attention_backward(s.dqkv, s.datt, s.datty, a.qkv, a.att, B, T, d.Cl, d.NH);
    matmul_backward(s.dln, g.qkvw, g.qkvb, s.dqkv, a.ln1, p.qkvw, B, T, d.C, 3 * d.Cl, false);
    if (tp) {
      span.close();
      tp_reduce(m, hooks, TpPoint::kAttnInputBackward, layer, s.dln, n);
      span.reopen(hooks.observer, names::kBlockBackward.data(), layer,
                  flops::block_piece(fd, false, 2, 3));
    }
    layernorm_backward(s.dres, g.ln1w, g.ln1b, s.dln, x, p.ln1w, a.ln1_mean, a.ln1_rstd, B, T, d.C);
  }
  if (hooks.on_grads_ready) hooks.on_grads_ready(layer);
}

void gpt_embed_backward(Gpt& m, GptActivations& acts, GptGradScratch& s, const GptHooks& hooks) {
  if (!m.shard.has_embed)
    throw std::logic_error("gpt: embedding backward on a shard without the embedding");
  {
    Span span(hooks.observer, names::kEmbedBackward.data(), kEmbedSegment,
              flops::embed_backward(flop_dims(m, acts.B, acts.T)));
    encoder_backward(m.dembed.wte, m.dembed.wpe, s.dres, acts.inputs.data(), acts.B, acts.T,
                     m.dims.C);
  }
  if (hooks.on_grads_ready) hooks.on_grads_ready(kEmbedSegment);
}

float gpt_forward(const Gpt& m, GptActivations& acts, const int32_t* inputs, const int32_t* targets,
                  const GptHooks& hooks) {
  if (m.shard.has_embed) gpt_embed_forward(m, acts, inputs, hooks);
  for (int l = m.shard.layer_begin; l < m.shard.layer_end; ++l)
    gpt_block_forward(m, acts, l, hooks);
  if (m.shard.has_head) return gpt_head_forward(m, acts, targets, hooks);
  return 0.0f;
}

void gpt_backward(Gpt& m, GptActivations& acts, GptGradScratch& s, float loss_scale,
                  const GptHooks& hooks) {
  if (s.B != acts.B || s.T != acts.T)
    throw std::logic_error("gpt: scratch and activations differ in (B, T)");
  if (m.shard.has_head) gpt_head_backward(m, acts, s, loss_scale, hooks);
  for (int l = m.shard.layer_end - 1; l >= m.shard.layer_begin; --l)
    gpt_block_backward(m, acts, s, l, hooks);
  if (m.shard.has_embed) {
    gpt_embed_backward(m, acts, s, hooks);
  } else if (m.shard.has_head && hooks.on_grads_ready) {
    hooks.on_grads_ready(kEmbedSegment);  // the head-only stage's copy of wte
  }
}

flops::Dims flop_dims(const Gpt& m, int B, int T) {
  return flops::Dims{B, T, m.config.n_embd, m.config.vocab, m.shard.tp_size};
}

}  // namespace orrery::runtime
