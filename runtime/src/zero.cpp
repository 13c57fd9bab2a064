// ZeRO partition and padded storage (see zero.hpp).
#include "orrery/runtime/zero.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace orrery::runtime {

namespace {
void rebase(float*& p, const float* old_base, float* new_base) {
  if (p != nullptr) p = new_base + (p - old_base);
}
void rebase(BlockParams& b, const float* o, float* n) {
  for (float** p : {&b.ln1w, &b.ln1b, &b.qkvw, &b.qkvb, &b.projw, &b.projb, &b.ln2w, &b.ln2b,
                    &b.fcw, &b.fcb, &b.fcprojw, &b.fcprojb})
    rebase(*p, o, n);
}
void rebase(MoeParams& m, const float* o, float* n) {
  rebase(m.router, o, n);
  for (auto* ffns : {&m.shared, &m.experts}) {
    for (auto& f : *ffns) {
      for (float** p : {&f.fcw, &f.fcb, &f.fcprojw, &f.fcprojb}) rebase(*p, o, n);
    }
  }
}
void repad(FloatArray& a, std::size_t padded, EmbedParams& e, std::vector<BlockParams>& blocks,
           std::vector<MoeParams>& moe, HeadParams& h) {
  FloatArray fresh(padded);  // zero-filled
  std::copy(a.begin(), a.end(), fresh.begin());
  const float* o = a.data();
  float* n = fresh.data();
  rebase(e.wte, o, n);
  rebase(e.wpe, o, n);
  for (auto& b : blocks) rebase(b, o, n);
  for (auto& b : moe) rebase(b, o, n);
  rebase(h.lnfw, o, n);
  rebase(h.lnfb, o, n);
  rebase(h.lmw, o, n);
  a = std::move(fresh);
}
}  // namespace

void gpt_pad_storage(Gpt& m, std::size_t padded) {
  if (padded < m.params.size())
    throw std::invalid_argument("gpt_pad_storage: smaller than the model");
  if (padded == m.params.size()) return;
  repad(m.params, padded, m.embed, m.blocks, m.moe, m.head);
  repad(m.grads, padded, m.dembed, m.dblocks, m.dmoe, m.dhead);
}

void Zero3Segment::bind(float* params, float* grads) const {
  for (std::size_t j = 0; j < rel.size(); ++j) {
    *param_ptrs[j] = params + rel[j];
    *grad_ptrs[j] = grads + rel[j];
  }
}

namespace {
// An FFN's four pointers, in one order for the layout and the bound copies.
std::vector<float**> ffn_fields(FfnParams& f) { return {&f.fcw, &f.fcb, &f.fcprojw, &f.fcprojb}; }
std::vector<float* const*> ffn_fields(const FfnParams& f) {
  return {&f.fcw, &f.fcb, &f.fcprojw, &f.fcprojb};
}

// MoE: block segment `sg`'s router and shared experts (dense: in its range), or (sg.expert) its
// routed experts, appended to its layout and bound pointer lists.
void moe_fields(const Gpt& m, const Zero3Segment& sg, GptPointers& bound,
                std::vector<float* const*>& layout, std::vector<float**>& ps,
                std::vector<float**>& gs) {
  const auto i = static_cast<std::size_t>(sg.id - m.shard.layer_begin);
  if (m.moe.empty() || !m.is_moe_block(sg.id)) return;
  if (bound.moe == nullptr || bound.dmoe == nullptr)
    throw std::logic_error("zero3_segments: MoE blocks without bound MoE pointers");
  const MoeParams& lm = m.moe[i];
  MoeParams &pm = bound.moe->at(i), &gm = bound.dmoe->at(i);
  auto add_ffns = [&](const std::vector<FfnParams>& l, std::vector<FfnParams>& p,
                      std::vector<FfnParams>& g) {
    for (std::size_t j = 0; j < l.size(); ++j) {
      for (float* const* f : ffn_fields(l[j])) layout.push_back(f);
      for (float** f : ffn_fields(p.at(j))) ps.push_back(f);
      for (float** f : ffn_fields(g.at(j))) gs.push_back(f);
    }
  };
  if (sg.expert) {
    add_ffns(lm.experts, pm.experts, gm.experts);
    return;
  }
  layout.push_back(&lm.router);
  ps.push_back(&pm.router);
  gs.push_back(&gm.router);
  add_ffns(lm.shared, pm.shared, gm.shared);
}
}  // namespace

std::vector<Zero3Segment> zero3_segments(const Gpt& m, int dp_rank, int dp_size, GptPointers bound,
                                         int ep) {
  const int L = m.config.n_layer;
  std::vector<Zero3Segment> segments;
  std::size_t total_shard = 0;
  auto add = [&](int id, bool expert, ParamRange r, int rank, int ranks) {
    Zero3Segment sg;
    sg.id = id;
    sg.expert = expert;
    sg.range = r;
    sg.part = zero_partition(r.count, rank, ranks);
    sg.shard_offset = total_shard;
    total_shard += sg.part.shard;
    segments.push_back(sg);
  };
  for (int id = kEmbedSegment; id <= L; ++id) {
    const ParamRange r = m.segment_range(id);
    if (r.count > 0) add(id, false, r, dp_rank, dp_size);
  }
  if (ep < 1 || dp_size % ep != 0)
    throw std::invalid_argument("zero3_segments: ep does not divide the dp size");
  for (int l = m.shard.layer_begin; l < m.shard.layer_end; ++l) {  // after every dense tensor
    const ParamRange r = m.expert_range(l);
    if (r.count > 0) add(l, true, r, dp_rank / ep, dp_size / ep);
  }
  // The named pointers of each segment (the tensors of a block come in BlockParams' field order),
  // read from the layout model and bound to the same fields of `bound`.
  auto block_fields = [](auto& b) {
    return std::vector<decltype(&b.ln1w)>{&b.ln1w,  &b.ln1b,  &b.qkvw,    &b.qkvb,
                                          &b.projw, &b.projb, &b.ln2w,    &b.ln2b,
                                          &b.fcw,   &b.fcb,   &b.fcprojw, &b.fcprojb};
  };
  for (auto& sg : segments) {
    std::vector<float* const*> layout;
    std::vector<float**> ps, gs;
    if (sg.id == kEmbedSegment) {
      layout = {&m.embed.wte, &m.embed.wpe};
      ps = {&bound.embed.wte, &bound.embed.wpe};
      gs = {&bound.dembed.wte, &bound.dembed.wpe};
    } else if (sg.id == L) {
      layout = {&m.head.lnfw, &m.head.lnfb, &m.head.lmw};
      ps = {&bound.head.lnfw, &bound.head.lnfb, &bound.head.lmw};
      gs = {&bound.dhead.lnfw, &bound.dhead.lnfb, &bound.dhead.lmw};
    } else if (!sg.expert) {
      const auto i = static_cast<std::size_t>(sg.id - m.shard.layer_begin);
      for (float* const* f : block_fields(m.blocks[i])) layout.push_back(f);
      ps = block_fields(bound.blocks.at(i));
      gs = block_fields(bound.dblocks.at(i));
    }
    if (sg.id != kEmbedSegment && sg.id != L) moe_fields(m, sg, bound, layout, ps, gs);
    for (std::size_t j = 0; j < layout.size(); ++j) {
      if (*layout[j] == nullptr) continue;  // wpe on a head-only stage, absent biases, ...
      sg.param_ptrs.push_back(ps[j]);
      sg.grad_ptrs.push_back(gs[j]);
      sg.rel.push_back(static_cast<std::size_t>(*layout[j] - m.params.data()) - sg.range.offset);
    }
  }
  return segments;
}

std::size_t zero3_max_block(const std::vector<Zero3Segment>& segments, int n_layer) {
  std::size_t max_block = 0;
  for (const auto& sg : segments) {
    if (!sg.expert && sg.id >= 0 && sg.id < n_layer)
      max_block = std::max(max_block, sg.part.padded());
  }
  return max_block;
}

std::size_t zero3_max_experts(const std::vector<Zero3Segment>& segments) {
  std::size_t max_experts = 0;
  for (const auto& sg : segments) {
    if (sg.expert) max_experts = std::max(max_experts, sg.part.padded());
  }
  return max_experts;
}

Zero3Storage::Zero3Storage(Gpt& m, int dp_rank, int dp_size, int ep) {
  allocate(zero3_segments(m, dp_rank, dp_size,
                          GptPointers{m.embed, m.dembed, m.blocks, m.dblocks, m.head, m.dhead,
                                      &m.moe, &m.dmoe},
                          ep),
           m.config.n_layer);
  for (const auto& sg : segments_) {
    const std::size_t n = sg.part.count();
    std::copy(m.params.data() + sg.range.offset + sg.part.begin(),
              m.params.data() + sg.range.offset + sg.part.begin() + n,
              params_.data() + sg.shard_offset);
  }
  m.params = FloatArray();
  m.grads = FloatArray();
}

Zero3Segment& zero3_segment(std::vector<Zero3Segment>& segments, int id) {
  for (auto& sg : segments)
    if (sg.id == id && !sg.expert) return sg;
  throw std::out_of_range("zero3: no segment " + std::to_string(id));
}

Zero3Segment* zero3_expert_segment(std::vector<Zero3Segment>& segments, int layer) {
  for (auto& sg : segments)
    if (sg.id == layer && sg.expert) return &sg;
  return nullptr;
}

}  // namespace orrery::runtime
