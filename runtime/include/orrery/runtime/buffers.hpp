// The activation and backward-scratch buffers of one shard for a (B, T) micro-batch, carved out of
// one allocation: the layout the CPU model (model.hpp: GptActivations, GptGradScratch) and the CUDA
// model (cuda/model.hpp: GpuActivations, GpuGradScratch) share. `Acts` / `Scratch` hold a `memory`
// array with resize(n) and data() (host FloatArray or DeviceArray<float>) and the pointer fields of
// the CPU structs; `align` floats per buffer keep every pointer aligned (16 floats = 64 bytes on
// CPUs, 64 floats = cudaMalloc's 256 bytes on GPUs).
#pragma once

#include <cstddef>

#include "orrery/runtime/model.hpp"

namespace orrery::runtime {

struct BufferShape {
  std::size_t B = 0, T = 0;                  // micro-batch
  std::size_t C = 0, Cl = 0, F = 0, NH = 0;  // BlockDims
  std::size_t V = 0;                         // vocab
  std::size_t blocks = 0;                    // blocks this shard holds
  bool head = false;                         // final LayerNorm, logits and losses (the last stage)
  Recompute recompute = Recompute::None;     // what each block keeps (see carve_activations)
};
inline BufferShape buffer_shape(const BlockDims& d, const GptConfig& c, const GptShard& sh,
                                std::size_t blocks, int B, int T,
                                Recompute recompute = Recompute::None) {
  return BufferShape{std::size_t(B),   std::size_t(T),    std::size_t(d.C),     std::size_t(d.Cl),
                     std::size_t(d.F), std::size_t(d.NH), std::size_t(c.vocab), blocks,
                     sh.has_head,      recompute};
}

// Hands out consecutive buffers of a counted allocation, each rounded up to `align` floats.
class BufferCarver {
 public:
  explicit BufferCarver(std::size_t align, float* base = nullptr) : align_(align), p_(base) {}
  std::size_t up(std::size_t n) const { return (n + align_ - 1) / align_ * align_; }
  float* take(std::size_t n) {
    float* r = p_;
    p_ += up(n);
    return r;
  }

 private:
  std::size_t align_;
  float* p_;
};

// Floats of one block's saved activations, by field (the carve order of carve_block): all of them
// without recomputation, all but the attention probabilities under selective recomputation, none
// under full recomputation (the block's input is the residual stream, counted apart).
inline std::size_t block_floats(const BufferShape& s, std::size_t align, Recompute keep) {
  const std::size_t BT = s.B * s.T, att = s.B * s.NH * s.T * s.T;
  const BufferCarver count(align);
  if (keep == Recompute::Full) return 0;
  // ln1, attproj, res2, ln2, fcproj; four statistics; qkv; atty; probabilities; fch, fch_gelu.
  return count.up(BT * s.C) * 5 + count.up(BT) * 4 + count.up(BT * 3 * s.Cl) + count.up(BT * s.Cl) +
         (keep == Recompute::Selective ? 0 : count.up(att)) + count.up(BT * s.F) * 2;
}

// One block's buffers from `c`; the attention probabilities only when `with_att`.
inline BlockActivations carve_block(BufferCarver& c, const BufferShape& s, bool with_att) {
  const std::size_t BT = s.B * s.T, att = s.B * s.NH * s.T * s.T;
  BlockActivations b{};
  b.ln1 = c.take(BT * s.C);
  b.ln1_mean = c.take(BT);
  b.ln1_rstd = c.take(BT);
  b.qkv = c.take(BT * 3 * s.Cl);
  b.atty = c.take(BT * s.Cl);
  b.att = with_att ? c.take(att) : nullptr;
  b.attproj = c.take(BT * s.C);
  b.res2 = c.take(BT * s.C);
  b.ln2 = c.take(BT * s.C);
  b.ln2_mean = c.take(BT);
  b.ln2_rstd = c.take(BT);
  b.fch = c.take(BT * s.F);
  b.fch_gelu = c.take(BT * s.F);
  b.fcproj = c.take(BT * s.C);
  return b;
}

// A micro-batch's saved activations. Under recomputation the buffers a block does not keep (all of
// them under full, the attention probabilities under selective) are left null here: they live once
// per rank in the backward scratch's workspace (carve_grad_scratch), which
// bind_recompute_workspace points them to.
template <class Acts>
void carve_activations(Acts& a, const BufferShape& s, std::size_t align) {
  const std::size_t BT = s.B * s.T;
  BufferCarver count(align);
  std::size_t total =
      count.up((s.blocks + 1) * BT * s.C) + s.blocks * block_floats(s, align, s.recompute);
  if (s.head) total += count.up(BT * s.C) + count.up(BT) * 3 + count.up(BT * s.V);
  a.B = int(s.B);
  a.T = int(s.T);
  a.boundary_elems = BT * s.C;
  a.recompute = s.recompute;
  a.memory.resize(total);
  BufferCarver c(align, a.memory.data());
  a.stream = c.take((s.blocks + 1) * BT * s.C);
  for (std::size_t l = 0; l < s.blocks; ++l) {
    a.blocks.push_back(s.recompute == Recompute::Full
                           ? BlockActivations{}
                           : carve_block(c, s, s.recompute == Recompute::None));
  }
  if (s.head) {
    a.lnf = c.take(BT * s.C);
    a.lnf_mean = c.take(BT);
    a.lnf_rstd = c.take(BT);
    a.logits = c.take(BT * s.V);
    a.losses = c.take(BT);
  }
}

// The backward scratch, plus under recomputation the per-rank workspace the recomputed buffers
// live in between a block's forward (or recomputation) and its backward: one whole block under
// full, one attention-probability buffer under selective.
template <class Scratch>
void carve_grad_scratch(Scratch& g, const BufferShape& s, std::size_t align) {
  const std::size_t BT = s.B * s.T, att = s.B * s.NH * s.T * s.T;
  BufferCarver count(align);
  g.B = int(s.B);
  g.T = int(s.T);
  const std::size_t work = s.recompute == Recompute::Full
                               ? block_floats(s, align, Recompute::None)
                               : (s.recompute == Recompute::Selective ? count.up(att) : 0);
  g.memory.resize(count.up(BT * s.C) * 2 + count.up(BT * 3 * s.Cl) + count.up(BT * s.Cl) +
                  count.up(att) + count.up(BT * s.F) * 2 + work);
  BufferCarver c(align, g.memory.data());
  g.dres = c.take(BT * s.C);
  g.dln = c.take(BT * s.C);
  g.dqkv = c.take(BT * 3 * s.Cl);
  g.datty = c.take(BT * s.Cl);
  g.datt = c.take(att);
  g.dfch = c.take(BT * s.F);
  g.dfch_gelu = c.take(BT * s.F);
  g.work = BlockActivations{};
  if (s.recompute == Recompute::Full) g.work = carve_block(c, s, true);
  if (s.recompute == Recompute::Selective) g.work.att = c.take(att);
}

// Points the buffers a micro-batch's blocks do not keep at the scratch's workspace (a no-op
// without recomputation). `g` must outlive `a` and not be re-carved while `a` is in use.
template <class Acts, class Scratch>
void bind_recompute_workspace(Acts& a, const Scratch& g) {
  for (BlockActivations& b : a.blocks) {
    if (a.recompute == Recompute::Full) b = g.work;
    if (a.recompute == Recompute::Selective) b.att = g.work.att;
  }
}

}  // namespace orrery::runtime
