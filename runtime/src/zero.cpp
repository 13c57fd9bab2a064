// ZeRO partition and padded storage (see zero.hpp).
#include "orrery/runtime/zero.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace orrery::runtime {

ZeroPartition zero_partition(std::size_t total, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks) throw std::invalid_argument("zero_partition: bad rank");
  ZeroPartition p;
  p.total = total;
  p.rank = rank;
  p.ranks = ranks;
  p.shard = (total + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
  return p;
}

namespace {
void rebase(float*& p, const float* old_base, float* new_base) {
  if (p != nullptr) p = new_base + (p - old_base);
}
void rebase(BlockParams& b, const float* o, float* n) {
  for (float** p : {&b.ln1w, &b.ln1b, &b.qkvw, &b.qkvb, &b.projw, &b.projb, &b.ln2w, &b.ln2b, &b.fcw,
                    &b.fcb, &b.fcprojw, &b.fcprojb})
    rebase(*p, o, n);
}
void repad(FloatArray& a, std::size_t padded, EmbedParams& e, std::vector<BlockParams>& blocks, HeadParams& h) {
  FloatArray fresh(padded);  // zero-filled
  std::copy(a.begin(), a.end(), fresh.begin());
  const float* o = a.data();
  float* n = fresh.data();
  rebase(e.wte, o, n);
  rebase(e.wpe, o, n);
  for (auto& b : blocks) rebase(b, o, n);
  rebase(h.lnfw, o, n);
  rebase(h.lnfb, o, n);
  a = std::move(fresh);
}
}  // namespace

void gpt_pad_storage(Gpt& m, std::size_t padded) {
  if (padded < m.params.size()) throw std::invalid_argument("gpt_pad_storage: smaller than the model");
  if (padded == m.params.size()) return;
  repad(m.params, padded, m.embed, m.blocks, m.head);
  repad(m.grads, padded, m.dembed, m.dblocks, m.dhead);
}

Zero3Storage::Zero3Storage(Gpt& m, int dp_rank, int dp_size) {
  const int L = m.config.n_layer;
  std::size_t total_shard = 0;
  std::size_t max_block = 0;
  for (int id = kEmbedSegment; id <= L; ++id) {
    const ParamRange r = m.segment_range(id);
    if (r.count == 0) continue;
    Segment sg;
    sg.id = id;
    sg.range = r;
    sg.part = zero_partition(r.count, dp_rank, dp_size);
    sg.shard_offset = total_shard;
    total_shard += sg.part.shard;
    if (id >= 0 && id < L) max_block = std::max(max_block, sg.part.padded());
    segments_.push_back(sg);
  }
  // The named pointers of each segment (the tensors of a block come in BlockParams' field order).
  auto block_fields = [](BlockParams& b) {
    return std::vector<float**>{&b.ln1w, &b.ln1b, &b.qkvw, &b.qkvb, &b.projw, &b.projb,
                                &b.ln2w, &b.ln2b, &b.fcw,  &b.fcb,  &b.fcprojw, &b.fcprojb};
  };
  for (auto& sg : segments_) {
    std::vector<float**> ps, gs;
    if (sg.id == kEmbedSegment) {
      ps = {&m.embed.wte, &m.embed.wpe};
      gs = {&m.dembed.wte, &m.dembed.wpe};
    } else if (sg.id == L) {
      ps = {&m.head.lnfw, &m.head.lnfb};
      gs = {&m.dhead.lnfw, &m.dhead.lnfb};
    } else {
      const auto i = static_cast<std::size_t>(sg.id - m.shard.layer_begin);
      ps = block_fields(m.blocks[i]);
      gs = block_fields(m.dblocks[i]);
    }
    for (std::size_t j = 0; j < ps.size(); ++j) {
      if (*ps[j] == nullptr) continue;  // wpe on a head-only stage
      sg.param_ptrs.push_back(ps[j]);
      sg.grad_ptrs.push_back(gs[j]);
      sg.rel.push_back(static_cast<std::size_t>(*ps[j] - m.params.data()) - sg.range.offset);
    }
  }
  params_ = FloatArray(total_shard);
  grads_ = FloatArray(total_shard);
  for (const auto& sg : segments_) {
    const std::size_t n = sg.part.count();
    std::copy(m.params.data() + sg.range.offset + sg.part.begin(),
              m.params.data() + sg.range.offset + sg.part.begin() + n, params_.data() + sg.shard_offset);
  }
  for (int slot = 0; slot < 2; ++slot) {
    pbuf_[slot] = FloatArray(max_block);
    gbuf_[slot] = FloatArray(max_block);
  }
  for (const auto& sg : segments_) {
    const int slot = sg.id == kEmbedSegment ? 2 : sg.id == L ? 3 : -1;
    if (slot < 0) continue;
    pbuf_[slot] = FloatArray(sg.part.padded());
    gbuf_[slot] = FloatArray(sg.part.padded());
  }
  m.params = FloatArray();
  m.grads = FloatArray();
}

Zero3Storage::Segment& Zero3Storage::segment(int id) {
  for (auto& sg : segments_)
    if (sg.id == id) return sg;
  throw std::out_of_range("zero3: no segment " + std::to_string(id));
}

void Zero3Storage::bind(Segment& sg, float* params, float* grads) {
  for (std::size_t j = 0; j < sg.rel.size(); ++j) {
    *sg.param_ptrs[j] = params + sg.rel[j];
    *sg.grad_ptrs[j] = grads + sg.rel[j];
  }
}

std::size_t Zero3Storage::buffer_bytes() const {
  std::size_t b = 0;
  for (int i = 0; i < 4; ++i) b += pbuf_[i].size_bytes() + gbuf_[i].size_bytes();
  return b;
}

}  // namespace orrery::runtime
