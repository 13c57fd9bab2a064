// The reference GPT on CPUs: parameter layout and initialisation, activation buffers, and the
// forward/backward pieces (embedding, blocks, head) composed from the kernels. See model.hpp for
// the layout, the hooks and the span names; the pieces are gpt_pieces.hpp's, over the CPU kernels.
#include "orrery/runtime/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"
#include "orrery/model/flops.hpp"
#include "orrery/runtime/buffers.hpp"
#include "orrery/runtime/gpt_pieces.hpp"
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
    case Slice::Bands: {
      // Weights only (biases start at zero): band k's local rows from its rank's slice.
      std::size_t src_band = 0, dst_row = 0;
      for (std::size_t k = 0; k < t.bands.size(); ++k) {
        const model::BandCut cut = model::band_cut(t.bands, t.band_shards, k, d.tp, tp_rank);
        const std::size_t local = static_cast<std::size_t>(cut.rows);
        std::memcpy(dst + dst_row * fc,
                    full.data() + (src_band + static_cast<std::size_t>(cut.first)) * fc,
                    local * fc * sizeof(float));
        src_band += static_cast<std::size_t>(t.bands[k]);
        dst_row += local;
      }
      break;
    }
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
  model::ModelShape shape{cfg.n_embd,  cfg.n_head, cfg.vocab, cfg.max_seq,
                          cfg.n_layer, sh.tp_size, cfg.arch};
  model::StageContents stage;
  stage.embed = sh.has_embed;
  stage.head = sh.has_head;
  stage.layers.emplace_back(sh.layer_begin, sh.layer_end);
  shape.moe = cfg.moe;
  shape.ep = sh.ep_size;
  shape.ep_rank = sh.ep_rank;
  auto specs = model::parameter_tensors(shape, stage);
  // The routed experts' tensors after every dense one (model.hpp): the dense segments stay
  // contiguous for DDP's buckets, the experts' are reduced over their own group.
  std::stable_partition(specs.begin(), specs.end(), [](const TensorSpec& t) { return !t.expert; });
  return specs;
}

// The pointer of tensor `name` in `base`, or null when the table has no such tensor.
float* tensor_ptr(float* base, const std::vector<ParamTensor>& tensors, const std::string& name) {
  for (const auto& t : tensors) {
    if (t.name == name) return base + t.offset;
  }
  return nullptr;
}

// Block `layer`'s pointers into `base`, by the table's names (absent biases stay null).
BlockParams block_pointers(float* base, const std::vector<ParamTensor>& tensors, int layer) {
  const std::string p = "h." + std::to_string(layer) + ".";
  auto at = [&](const char* n) { return tensor_ptr(base, tensors, p + n); };
  BlockParams b;
  b.ln1w = at("ln1w");
  b.ln1b = at("ln1b");
  b.qkvw = at("qkvw");
  b.qkvb = at("qkvb");
  b.projw = at("projw");
  b.projb = at("projb");
  b.ln2w = at("ln2w");
  b.ln2b = at("ln2b");
  b.fcw = at("fcw");
  b.fcb = at("fcb");
  b.fcprojw = at("fcprojw");
  b.fcprojb = at("fcprojb");
  return b;
}

// An FFN's pointers under prefix `p` ("h.3.expert.5.").
FfnParams ffn_pointers(float* base, const std::vector<ParamTensor>& tensors, const std::string& p) {
  return FfnParams{tensor_ptr(base, tensors, p + "fcw"), tensor_ptr(base, tensors, p + "fcb"),
                   tensor_ptr(base, tensors, p + "fcprojw"),
                   tensor_ptr(base, tensors, p + "fcprojb")};
}

// MoE block `layer`'s pointers into `base` (empty for a dense block).
MoeParams moe_pointers(float* base, const Gpt& m, int layer) {
  MoeParams out;
  if (!m.is_moe_block(layer)) return out;
  const std::string p = "h." + std::to_string(layer) + ".";
  out.router = tensor_ptr(base, m.tensors, p + "router");
  for (int j = 0; j < m.moe_dims.S; ++j) {
    out.shared.push_back(ffn_pointers(base, m.tensors, p + "shared." + std::to_string(j) + "."));
  }
  for (int j = 0; j < m.moe_dims.El; ++j) {
    out.experts.push_back(
        ffn_pointers(base, m.tensors, p + "expert." + std::to_string(m.moe_dims.first + j) + "."));
  }
  return out;
}

// MoE sizes of a shard, checked (the scenario's validation names the keys first).
MoeDims moe_dims_of(const GptConfig& c, const BlockArch& arch, const GptShard& sh) {
  MoeDims d;
  if (!c.moe.enabled()) return d;
  const int W = c.moe.expert_ffn_hidden > 0 ? c.moe.expert_ffn_hidden : arch.ffn_hidden;
  if (sh.ep_size < 1 || c.moe.experts % sh.ep_size != 0 || sh.ep_rank < 0 ||
      sh.ep_rank >= sh.ep_size || c.moe.top_k < 1 || c.moe.top_k > c.moe.experts ||
      W % sh.tp_size != 0 || c.moe.every < 1) {
    throw InputError("model: MoE with " + std::to_string(c.moe.experts) + " experts, top_k " +
                     std::to_string(c.moe.top_k) + ", expert width " + std::to_string(W) +
                     " needs parallel.ep " + std::to_string(sh.ep_size) +
                     " dividing model.moe.experts, 1 <= top_k <= experts, model.moe.every >= 1 "
                     "and parallel.tp " +
                     std::to_string(sh.tp_size) + " dividing the expert width");
  }
  d.E = c.moe.experts;
  d.K = c.moe.top_k;
  d.ep = sh.ep_size;
  const model::moe::ExpertRange r = model::moe::local_experts(d.E, d.ep, sh.ep_rank);
  d.El = r.count;
  d.first = r.first;
  d.We = W / sh.tp_size;
  d.S = c.moe.shared_experts;
  return d;
}

}  // namespace

GptConfig gpt_config(const orrery::ModelConfig& m) {
  GptConfig c{m.layers, m.d_model, m.heads, m.vocab, m.seq, block_arch(m)};
  c.moe = m.moe;
  return c;
}

namespace {
// The ep = 1 table of `m`'s (tp, pp) shard: its tensors' offsets by name, and its end.
std::pair<std::unordered_map<std::string, std::size_t>, std::size_t> ep1_offsets(const Gpt& m) {
  GptShard one = m.shard;
  one.ep_size = 1;
  one.ep_rank = 0;
  std::unordered_map<std::string, std::size_t> at;
  std::size_t offset = 0;
  for (const auto& t : tensor_specs(m.config, one)) {
    at.emplace(t.name, offset);
    offset += static_cast<std::size_t>(t.rows) * t.cols;
  }
  return {std::move(at), offset};
}
}  // namespace

std::vector<FlatRun> global_flat_runs(const Gpt& m) {
  const auto [at, total] = ep1_offsets(m);
  std::vector<FlatRun> runs;
  for (const auto& t : m.tensors) {  // memory order
    const auto it = at.find(t.name);
    if (it == at.end()) throw std::logic_error("global_flat_runs: no ep 1 tensor " + t.name);
    FlatRun* last = runs.empty() ? nullptr : &runs.back();
    if (last != nullptr && last->local + last->count == t.offset &&
        last->global + last->count == it->second) {
      last->count += t.count;
    } else {
      runs.push_back({t.offset, it->second, t.count});
    }
  }
  return runs;
}

std::size_t global_flat_elems(const Gpt& m) { return ep1_offsets(m).second; }

GptShard GptShard::pipeline_stage(const GptConfig& cfg, int stage, int stages,
                                  const std::vector<int>& stage_layers) {
  if (stages < 1 || stage < 0 || stage >= stages || stages > cfg.n_layer) {
    throw InputError("pipeline: stage " + std::to_string(stage) + " of " + std::to_string(stages) +
                     " is impossible with " + std::to_string(cfg.n_layer) + " layers");
  }
  const auto [first, last] = model::stage_layer_range(cfg.n_layer, stages, stage_layers, stage);
  GptShard s;
  s.layer_begin = first;
  s.layer_end = last;
  s.has_embed = stage == 0;
  s.has_head = stage == stages - 1;
  return s;
}

ParamRange Gpt::segment_range(int segment) const {
  std::size_t lo = params.size(), hi = 0;
  for (const auto& t : tensors) {
    if (t.segment != segment || t.expert) continue;
    lo = std::min(lo, t.offset);
    hi = std::max(hi, t.offset + t.count);
  }
  if (hi == 0) return ParamRange{0, 0};
  return ParamRange{lo, hi - lo};
}

ParamRange Gpt::expert_range(int layer) const {
  std::size_t lo = params.size(), hi = 0;
  for (const auto& t : tensors) {
    if (t.segment != layer || !t.expert) continue;
    lo = std::min(lo, t.offset);
    hi = std::max(hi, t.offset + t.count);
  }
  if (hi == 0) return ParamRange{0, 0};
  return ParamRange{lo, hi - lo};
}

bool Gpt::is_moe_block(int layer) const { return model::moe::is_moe_block(config.moe, layer); }

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
  const BlockArch arch = c.arch.resolve(c.n_head, c.n_embd);
  if (c.n_head % arch.kv_heads != 0 ||
      (arch.kv_heads % sh.tp_size != 0 && sh.tp_size % arch.kv_heads != 0) ||
      arch.ffn_hidden % sh.tp_size != 0) {
    throw InputError("model: " + std::to_string(arch.kv_heads) + " key/value heads and MLP width " +
                     std::to_string(arch.ffn_hidden) + " need kv heads dividing heads " +
                     std::to_string(c.n_head) + ", tensor parallelism " +
                     std::to_string(sh.tp_size) +
                     " dividing the MLP width, and dividing the kv heads or a multiple of them");
  }
  if (arch.rope() && (c.n_embd / c.n_head) % 2 != 0) {
    throw InputError("model: rope needs an even head size, got " +
                     std::to_string(c.n_embd / c.n_head));
  }
  Gpt m;
  m.config = c;
  m.config.arch = arch;
  m.shard = sh;
  m.dims.C = c.n_embd;
  m.dims.NH = c.n_head / sh.tp_size;
  m.dims.hs = c.n_embd / c.n_head;
  m.dims.Cl = m.dims.NH * m.dims.hs;
  m.dims.F = arch.ffn_hidden / sh.tp_size;
  m.dims.tp = sh.tp_size;
  m.dims.NKV = arch.kv_heads_per_rank(sh.tp_size);
  m.dims.Ckvl = m.dims.NKV * m.dims.hs;
  m.dims.up = arch.swiglu() ? 2 : 1;
  m.moe_dims = moe_dims_of(c, arch, sh);

  const auto specs = tensor_specs(m.config, sh);
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
    t.slice = s.slice;
    t.bands = s.bands;
    t.band_shards = s.band_shards;
    t.expert = s.expert;
    offset += t.count;
    m.tensors.push_back(t);
  }
  m.params.resize(offset);
  m.grads.resize(offset);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    fill_tensor(m.params.data() + m.tensors[i].offset, specs[i], seed, m.dims, sh.tp_rank);
  }

  float* P = m.params.data();
  float* G = m.grads.data();
  m.embed = EmbedParams{tensor_ptr(P, m.tensors, "wte"), tensor_ptr(P, m.tensors, "wpe")};
  m.dembed = EmbedParams{tensor_ptr(G, m.tensors, "wte"), tensor_ptr(G, m.tensors, "wpe")};
  for (int l = sh.layer_begin; l < sh.layer_end; ++l) {
    m.blocks.push_back(block_pointers(P, m.tensors, l));
    m.dblocks.push_back(block_pointers(G, m.tensors, l));
    m.moe.push_back(moe_pointers(P, m, l));
    m.dmoe.push_back(moe_pointers(G, m, l));
  }
  if (sh.has_head) {
    m.head = HeadParams{tensor_ptr(P, m.tensors, "lnfw"), tensor_ptr(P, m.tensors, "lnfb"),
                        tensor_ptr(P, m.tensors, "lmw")};
    m.dhead = HeadParams{tensor_ptr(G, m.tensors, "lnfw"), tensor_ptr(G, m.tensors, "lnfb"),
                         tensor_ptr(G, m.tensors, "lmw")};
  }
  return m;
}

bool holds_embedding_segment(const Gpt& g) {
  return g.shard.has_embed || (g.shard.has_head && g.config.arch.tied_embeddings);
}

void gpt_zero_grad(Gpt& model) { model.grads.zero(); }

GptActivations gpt_activations(const Gpt& m, int B, int T, Recompute recompute) {
  if (B < 1 || T < 1 || T > m.config.max_seq) {
    throw InputError("model: batch (" + std::to_string(B) + ", " + std::to_string(T) +
                     ") needs B >= 1 and 1 <= T <= seq " + std::to_string(m.config.max_seq));
  }
  GptActivations a;
  // Each buffer is rounded up to 16 floats so every pointer stays 64-byte aligned.
  carve_activations(
      a, buffer_shape(m.dims, m.config, m.shard, std::size_t(m.num_blocks()), B, T, recompute), 16);
  a.inputs.assign(std::size_t(B) * T, 0);
  a.targets.assign(std::size_t(B) * T, 0);
  if (m.config.moe.enabled()) a.moe.resize(std::size_t(m.num_blocks()));
  return a;
}

GptGradScratch gpt_grad_scratch(const Gpt& m, int B, int T, Recompute recompute) {
  GptGradScratch s;
  carve_grad_scratch(
      s, buffer_shape(m.dims, m.config, m.shard, std::size_t(m.num_blocks()), B, T, recompute), 16);
  return s;
}

// ---------------------------------------------------------------- pieces (gpt_pieces.hpp)

void CpuKernels::zero(float* p, std::size_t n) const { std::fill(p, p + n, 0.0f); }

void CpuKernels::copy(float* dst, const float* src, std::size_t n) const {
  std::copy(src, src + n, dst);
}

void CpuKernels::upload_tokens(int32_t* dst, const int32_t* src, std::size_t n) const {
  std::copy(src, src + n, dst);
}

void gpt_embed_forward(const Gpt& m, GptActivations& acts, const int32_t* inputs,
                       const GptHooks& hooks) {
  pieces::embed_forward(CpuKernels{}, m, acts, inputs, hooks);
}

void gpt_block_forward(const Gpt& m, GptActivations& acts, int layer, const GptHooks& hooks) {
  pieces::block_forward(CpuKernels{}, m, acts, layer, hooks);
}

float gpt_head_forward(const Gpt& m, GptActivations& acts, const int32_t* targets,
                       const GptHooks& hooks) {
  return pieces::head_forward(CpuKernels{}, m, acts, targets, hooks);
}

void gpt_head_backward(Gpt& m, GptActivations& acts, GptGradScratch& s, float loss_scale,
                       const GptHooks& hooks) {
  pieces::head_backward(CpuKernels{}, m, acts, s, loss_scale, hooks);
}

void gpt_block_backward(Gpt& m, GptActivations& acts, GptGradScratch& s, int layer,
                        const GptHooks& hooks) {
  pieces::block_backward(CpuKernels{}, m, acts, s, layer, hooks);
}

void gpt_embed_backward(Gpt& m, GptActivations& acts, GptGradScratch& s, const GptHooks& hooks) {
  pieces::embed_backward(CpuKernels{}, m, acts, s, hooks);
}

float gpt_forward(const Gpt& m, GptActivations& acts, const int32_t* inputs, const int32_t* targets,
                  const GptHooks& hooks) {
  return pieces::forward(CpuKernels{}, m, acts, inputs, targets, hooks);
}

void gpt_backward(Gpt& m, GptActivations& acts, GptGradScratch& s, float loss_scale,
                  const GptHooks& hooks) {
  pieces::backward(CpuKernels{}, m, acts, s, loss_scale, hooks);
}

flops::Dims flop_dims(const Gpt& m, int B, int T) {
  return flops::dims_of(m.config.arch, B, T, m.config.n_embd, m.config.n_head, m.config.vocab,
                        m.shard.tp_size);
}

}  // namespace orrery::runtime
