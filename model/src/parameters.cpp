// The parameter tensor table (parameters.hpp).
#include "orrery/model/parameters.hpp"

#include <algorithm>
#include <cmath>

#include "orrery/common/error.hpp"
#include "orrery/model/moe.hpp"

namespace orrery::model {

ModelShape model_shape(const Scenario& s) {
  ModelShape m{s.model.d_model, s.model.heads, s.model.vocab,      s.model.seq,
               s.model.layers,  s.parallel.tp, block_arch(s.model)};
  m.moe = s.model.moe;
  m.ep = std::max(1, s.parallel.ep);
  return m;
}

namespace {
// One FFN of width `width` (the dense MLP, a shared or a routed expert) under prefix `p`: fcw fcb
// fcprojw fcprojb, cut over tp as Megatron's MLP (model.hpp).
void ffn_specs(std::vector<ParamSpec>& specs, const std::string& p, int l, int C, int width, int tp,
               const BlockArch& a, float std_w, float std_res, bool expert) {
  const int up = a.swiglu() ? 2 : 1, Wl = width / tp;
  const std::vector<int> bands = a.swiglu() ? std::vector<int>{width, width} : std::vector<int>{};
  const std::size_t first = specs.size();
  specs.push_back({p + "fcw",
                   l,
                   up * Wl,
                   C,
                   up * width,
                   C,
                   a.swiglu() ? Slice::Bands : Slice::Rows,
                   Init::Normal,
                   std_w,
                   bands,
                   {}});
  if (a.bias) {
    ParamSpec b{p + "fcb", l, 1, up * Wl, 1, up * width, Slice::Bands, Init::Zero, 0, {}, {}};
    b.bands = a.swiglu() ? bands : std::vector<int>{width};
    specs.push_back(b);
  }
  specs.push_back({p + "fcprojw", l, C, Wl, C, width, Slice::Cols, Init::Normal, std_res, {}, {}});
  if (a.bias) specs.push_back({p + "fcprojb", l, 1, C, 1, C, Slice::None, Init::Zero, 0, {}, {}});
  for (std::size_t i = first; i < specs.size(); ++i) specs[i].expert = expert;
}
}  // namespace

int chunks_per_stage(const Scenario& s) {
  return schedule_of(s.parallel) == Schedule::Interleaved ? std::max(1, s.parallel.virtual_stages)
                                                          : 1;
}

std::vector<int> stage_layer_counts(int layers, int pp, const std::vector<int>& pp_layers) {
  if (pp < 1) throw InputError("pipeline: " + std::to_string(pp) + " stages (expected >= 1)");
  if (pp_layers.empty()) {
    const int base = layers / pp, rem = layers % pp;
    std::vector<int> counts(static_cast<size_t>(pp), base);
    for (int i = 0; i < rem; ++i) ++counts[static_cast<size_t>(i)];
    return counts;
  }
  int64_t sum = 0;
  bool positive = true;
  for (int n : pp_layers) {
    sum += n;
    positive = positive && n >= 1;
  }
  if (static_cast<int>(pp_layers.size()) != pp || !positive || sum != layers) {
    throw InputError("key 'parallel.pp_layers': " + std::to_string(pp_layers.size()) +
                     " entries summing to " + std::to_string(sum) + " for " + std::to_string(pp) +
                     " stages of " + std::to_string(layers) +
                     " layers (expected one entry >= 1 per stage, summing to model.layers)");
  }
  return pp_layers;
}

std::vector<int> stage_layer_counts(const Scenario& s) {
  return stage_layer_counts(s.model.layers, s.parallel.pp, s.parallel.pp_layers);
}

std::pair<int, int> stage_layer_range(int layers, int pp, const std::vector<int>& pp_layers,
                                      int stage) {
  if (stage < 0 || stage >= pp) {
    throw InputError("pipeline: stage " + std::to_string(stage) + " of " + std::to_string(pp) +
                     " does not exist");
  }
  if (pp_layers.empty()) {  // in closed form: the simulator asks once per stage, pp up to 100,000
    const int base = layers / pp, rem = layers % pp;
    const int first = stage * base + std::min(stage, rem);
    return {first, first + base + (stage < rem ? 1 : 0)};
  }
  const std::vector<int> counts = stage_layer_counts(layers, pp, pp_layers);
  int first = 0;
  for (int i = 0; i < stage; ++i) first += counts[static_cast<size_t>(i)];
  return {first, first + counts[static_cast<size_t>(stage)]};
}

StageContents stage_contents(const Scenario& s, int stage) {
  const int pp = s.parallel.pp, chunks = chunks_per_stage(s);
  StageContents c;
  c.embed = stage == 0;
  c.head = stage == pp - 1;
  if (chunks == 1) {
    c.layers.push_back(stage_layer_range(s.model.layers, pp, s.parallel.pp_layers, stage));
    return c;
  }
  const int per_chunk = s.model.layers / (pp * chunks);
  for (int k = 0; k < chunks; ++k) {
    c.layers.emplace_back((k * pp + stage) * per_chunk, (k * pp + stage + 1) * per_chunk);
  }
  return c;
}

std::vector<ParamSpec> parameter_tensors(const ModelShape& m, const StageContents& stage) {
  const BlockArch a = m.arch.resolve(m.heads, m.d_model);
  const int C = m.d_model, hs = m.d_model / m.heads, tp = m.tp;
  const int Cl = (m.heads / tp) * hs, Ckv = a.kv_heads * hs, Ckvl = a.kv_heads_per_rank(tp) * hs;
  const int F = a.ffn_hidden, Fl = F / tp, up = a.swiglu() ? 2 : 1;
  const bool norm_bias = a.bias && !a.rmsnorm();
  const float std_w = 0.02f;
  const float std_res = 0.02f / std::sqrt(2.0f * static_cast<float>(m.layers));
  std::vector<ParamSpec> specs;
  if (stage.embed || (stage.head && a.tied_embeddings)) {
    specs.push_back(
        {"wte", kEmbedSegment, m.vocab, C, m.vocab, C, Slice::None, Init::Normal, std_w, {}, {}});
  }
  if (stage.embed && !a.rope()) {
    specs.push_back({"wpe",
                     kEmbedSegment,
                     m.max_seq,
                     C,
                     m.max_seq,
                     C,
                     Slice::None,
                     Init::Normal,
                     std_w,
                     {},
                     {}});
  }
  const std::vector<int> qkv_bands{C, Ckv, Ckv};
  // k and v in kv-head slices: kv_heads of them when fewer than tp (each replicated).
  const int kv_shards = std::min(tp, a.kv_heads);
  const std::vector<int> qkv_shards =
      kv_shards == tp ? std::vector<int>{} : std::vector<int>{tp, kv_shards, kv_shards};
  const std::vector<int> fc_bands = a.swiglu() ? std::vector<int>{F, F} : std::vector<int>{F};
  const auto gain = [&](const std::string& n, int l) {
    return ParamSpec{n, l, 1, C, 1, C, Slice::None, Init::One, 0, {}, {}};
  };
  const auto zero = [&](const std::string& n, int l, int local, int full) {
    return ParamSpec{n, l, 1, local, 1, full, Slice::None, Init::Zero, 0, {}, {}};
  };
  for (const auto& [first, last] : stage.layers) {
    for (int l = first; l < last; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      specs.push_back(gain(p + "ln1w", l));
      if (norm_bias) specs.push_back(zero(p + "ln1b", l, C, C));
      specs.push_back({p + "qkvw", l, Cl + 2 * Ckvl, C, C + 2 * Ckv, C, Slice::Bands, Init::Normal,
                       std_w, qkv_bands, qkv_shards});
      if (a.bias) {
        ParamSpec b = zero(p + "qkvb", l, Cl + 2 * Ckvl, C + 2 * Ckv);
        b.slice = Slice::Bands;  // a (1, n) vector: its columns are cut as qkvw's rows
        b.bands = qkv_bands;
        b.band_shards = qkv_shards;
        specs.push_back(b);
      }
      specs.push_back({p + "projw", l, C, Cl, C, C, Slice::Cols, Init::Normal, std_res, {}, {}});
      if (a.bias) specs.push_back(zero(p + "projb", l, C, C));
      specs.push_back(gain(p + "ln2w", l));
      if (norm_bias) specs.push_back(zero(p + "ln2b", l, C, C));
      if (moe::is_moe_block(m.moe, l)) {
        const int E = m.moe.experts;
        const int W = m.moe.expert_ffn_hidden > 0 ? m.moe.expert_ffn_hidden : F;
        specs.push_back({p + "router", l, E, C, E, C, Slice::None, Init::Normal, std_w, {}, {}});
        for (int j = 0; j < m.moe.shared_experts; ++j) {
          ffn_specs(specs, p + "shared." + std::to_string(j) + ".", l, C, W, tp, a, std_w, std_res,
                    false);
        }
        const moe::ExpertRange r = moe::local_experts(E, m.ep, m.ep_rank);
        for (int j = r.first; j < r.first + r.count; ++j) {
          ffn_specs(specs, p + "expert." + std::to_string(j) + ".", l, C, W, tp, a, std_w, std_res,
                    true);
        }
        continue;
      }
      specs.push_back({p + "fcw",
                       l,
                       up * Fl,
                       C,
                       up * F,
                       C,
                       a.swiglu() ? Slice::Bands : Slice::Rows,
                       Init::Normal,
                       std_w,
                       a.swiglu() ? fc_bands : std::vector<int>{},
                       {}});
      if (a.bias) {
        ParamSpec b = zero(p + "fcb", l, up * Fl, up * F);
        b.slice = Slice::Bands;
        b.bands = fc_bands;
        specs.push_back(b);
      }
      specs.push_back({p + "fcprojw", l, C, Fl, C, F, Slice::Cols, Init::Normal, std_res, {}, {}});
      if (a.bias) specs.push_back(zero(p + "fcprojb", l, C, C));
    }
  }
  if (stage.head) {
    specs.push_back(gain("lnfw", m.layers));
    if (norm_bias) specs.push_back(zero("lnfb", m.layers, C, C));
    if (!a.tied_embeddings) {
      specs.push_back(
          {"lmw", m.layers, m.vocab, C, m.vocab, C, Slice::None, Init::Normal, std_w, {}, {}});
    }
  }
  return specs;
}

}  // namespace orrery::model
