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
  std::size_t tp = 1;                        // > 1 with sequence parallelism: tokens sharded by tp
  std::size_t QKV = 0;                       // qkv width held (Cl + 2 Ckvl); 0 = 3 Cl
  std::size_t F1 = 0;                        // fc1 width held (2F for SwiGLU); 0 = F
  bool means = true;  // the norms keep their means (LayerNorm; RMSNorm has none)
  std::size_t qkv() const { return QKV ? QKV : 3 * Cl; }
  std::size_t f1() const { return F1 ? F1 : F; }
  std::size_t mean(std::size_t n) const { return means ? n : 0; }
  std::size_t tokens() const { return B * T; }
  std::size_t local_tokens() const { return B * T / tp; }  // the residual stream's tokens
};
inline BufferShape buffer_shape(const BlockDims& d, const GptConfig& c, const GptShard& sh,
                                std::size_t blocks, int B, int T,
                                Recompute recompute = Recompute::None) {
  return BufferShape{std::size_t(B),
                     std::size_t(T),
                     std::size_t(d.C),
                     std::size_t(d.Cl),
                     std::size_t(d.F),
                     std::size_t(d.NH),
                     std::size_t(c.vocab),
                     blocks,
                     sh.has_head,
                     recompute,
                     sh.sp() ? std::size_t(sh.tp_size) : 1,
                     std::size_t(d.qkv()),
                     std::size_t(d.fc1()),
                     !c.arch.rmsnorm()};
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
// under full recomputation (the block's input is the residual stream, counted apart). Under
// sequence parallelism (n = B·T/tp local tokens, N = B·T) the statistics, attproj, res2 and fcproj
// hold the n local tokens; ln1 and ln2 hold their all-gathered N.
inline std::size_t block_floats(const BufferShape& s, std::size_t align, Recompute keep) {
  const std::size_t N = s.tokens(), n = s.local_tokens(), att = s.B * s.NH * s.T * s.T;
  const BufferCarver count(align);
  if (keep == Recompute::Full) return 0;
  // ln1, ln2 (N,C); attproj, res2, fcproj (n,C); the norms' statistics (n: rstd, and the mean of
  // a LayerNorm); qkv; atty; probabilities; fch (N, fc1 width), fch_gelu (N, F).
  return count.up(N * s.C) * 2 + count.up(n * s.C) * 3 + (count.up(n) + count.up(s.mean(n))) * 2 +
         count.up(N * s.qkv()) + count.up(N * s.Cl) +
         (keep == Recompute::Selective ? 0 : count.up(att)) + count.up(N * s.f1()) +
         count.up(N * s.F);
}

// One block's buffers from `c`; the attention probabilities only when `with_att`.
inline BlockActivations carve_block(BufferCarver& c, const BufferShape& s, bool with_att) {
  const std::size_t N = s.tokens(), n = s.local_tokens(), att = s.B * s.NH * s.T * s.T;
  BlockActivations b{};
  b.ln1 = c.take(N * s.C);
  b.ln1_mean = s.means ? c.take(n) : nullptr;
  b.ln1_rstd = c.take(n);
  b.qkv = c.take(N * s.qkv());
  b.atty = c.take(N * s.Cl);
  b.att = with_att ? c.take(att) : nullptr;
  b.attproj = c.take(n * s.C);
  b.res2 = c.take(n * s.C);
  b.ln2 = c.take(N * s.C);
  b.ln2_mean = s.means ? c.take(n) : nullptr;
  b.ln2_rstd = c.take(n);
  b.fch = c.take(N * s.f1());
  b.fch_gelu = c.take(N * s.F);
  b.fcproj = c.take(n * s.C);
  return b;
}

// A micro-batch's saved activations. Under recomputation the buffers a block does not keep (all of
// them under full, the attention probabilities under selective) are left null here: they live once
// per rank in the backward scratch's workspace (carve_grad_scratch), which
// bind_workspace points them to (and sequence parallelism's tp_partial / tp_local).
template <class Acts>
void carve_activations(Acts& a, const BufferShape& s, std::size_t align) {
  const std::size_t N = s.tokens(), n = s.local_tokens();
  BufferCarver count(align);
  std::size_t total =
      count.up((s.blocks + 1) * n * s.C) + s.blocks * block_floats(s, align, s.recompute);
  // The head: lnf (all-gathered under sequence parallelism), its statistics (n), logits, losses.
  if (s.head) {
    total +=
        count.up(N * s.C) + count.up(n) + count.up(s.mean(n)) + count.up(N * s.V) + count.up(N);
  }
  a.B = int(s.B);
  a.T = int(s.T);
  a.boundary_elems = n * s.C;
  a.full_elems = N * s.C;
  a.recompute = s.recompute;
  a.memory.resize(total);
  BufferCarver c(align, a.memory.data());
  a.stream = c.take((s.blocks + 1) * n * s.C);
  for (std::size_t l = 0; l < s.blocks; ++l) {
    a.blocks.push_back(s.recompute == Recompute::Full
                           ? BlockActivations{}
                           : carve_block(c, s, s.recompute == Recompute::None));
  }
  if (s.head) {
    a.lnf = c.take(N * s.C);
    a.lnf_mean = s.means ? c.take(n) : nullptr;
    a.lnf_rstd = c.take(n);
    a.logits = c.take(N * s.V);
    a.losses = c.take(N);
  }
}

// The backward scratch, plus under recomputation the per-rank workspace the recomputed buffers
// live in between a block's forward (or recomputation) and its backward: one whole block under
// full, one attention-probability buffer under selective; plus sequence parallelism's buffers.
template <class Scratch>
void carve_grad_scratch(Scratch& g, const BufferShape& s, std::size_t align) {
  const std::size_t N = s.tokens(), n = s.local_tokens(), att = s.B * s.NH * s.T * s.T;
  BufferCarver count(align);
  g.B = int(s.B);
  g.T = int(s.T);
  const std::size_t work = s.recompute == Recompute::Full
                               ? block_floats(s, align, Recompute::None)
                               : (s.recompute == Recompute::Selective ? count.up(att) : 0);
  const bool sp = s.tp > 1;
  const std::size_t sp_floats =
      sp ? count.up(N * s.C) * 2 + count.up(n * s.C) + count.up(6 * s.C) : 0;
  g.memory.resize(count.up(n * s.C) + count.up(N * s.C) + count.up(N * s.qkv()) +
                  count.up(N * s.Cl) + count.up(att) + count.up(N * s.f1()) + count.up(N * s.F) +
                  work + sp_floats);
  BufferCarver c(align, g.memory.data());
  g.dres = c.take(n * s.C);
  g.dln = c.take(N * s.C);
  g.dqkv = c.take(N * s.qkv());
  g.datty = c.take(N * s.Cl);
  g.datt = c.take(att);
  g.dfch = c.take(N * s.f1());
  g.dfch_gelu = c.take(N * s.F);
  g.work = BlockActivations{};
  if (s.recompute == Recompute::Full) g.work = carve_block(c, s, true);
  if (s.recompute == Recompute::Selective) g.work.att = c.take(att);
  if (sp) {
    g.tp_full = c.take(N * s.C);
    g.tp_partial = c.take(N * s.C);
    g.tp_local = c.take(n * s.C);
    g.tp_grads = c.take(6 * s.C);
  }
}

// Points the buffers a micro-batch's blocks do not keep at the scratch's workspace (a no-op
// without recomputation or sequence parallelism). `g` must outlive `a` and not be re-carved while
// `a` is in use.
template <class Acts, class Scratch>
void bind_workspace(Acts& a, const Scratch& g) {
  for (BlockActivations& b : a.blocks) {
    if (a.recompute == Recompute::Full) b = g.work;
    if (a.recompute == Recompute::Selective) b.att = g.work.att;
  }
  a.tp_partial = g.tp_partial;
  a.tp_local = g.tp_local;
}

}  // namespace orrery::runtime
