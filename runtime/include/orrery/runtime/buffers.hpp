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
};
inline BufferShape buffer_shape(const BlockDims& d, const GptConfig& c, const GptShard& sh,
                                std::size_t blocks, int B, int T) {
  return BufferShape{std::size_t(B),       std::size_t(T),   std::size_t(d.C),
                     std::size_t(d.Cl),    std::size_t(d.F), std::size_t(d.NH),
                     std::size_t(c.vocab), blocks,           sh.has_head};
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

template <class Acts>
void carve_activations(Acts& a, const BufferShape& s, std::size_t align) {
  const std::size_t BT = s.B * s.T, att = s.B * s.NH * s.T * s.T;
  BufferCarver count(align);
  const std::size_t per_block = count.up(BT * s.C) * 6 + count.up(BT) * 4 +
                                count.up(BT * 3 * s.Cl) + count.up(BT * s.Cl) + count.up(att) +
                                count.up(BT * s.F) * 2;
  std::size_t total = count.up((s.blocks + 1) * BT * s.C) + s.blocks * per_block;
  if (s.head) total += count.up(BT * s.C) + count.up(BT) * 3 + count.up(BT * s.V);
  a.B = int(s.B);
  a.T = int(s.T);
  a.boundary_elems = BT * s.C;
  a.memory.resize(total);
  BufferCarver c(align, a.memory.data());
  a.stream = c.take((s.blocks + 1) * BT * s.C);
  for (std::size_t l = 0; l < s.blocks; ++l) {
    BlockActivations b{};
    b.ln1 = c.take(BT * s.C);
    b.ln1_mean = c.take(BT);
    b.ln1_rstd = c.take(BT);
    b.qkv = c.take(BT * 3 * s.Cl);
    b.atty = c.take(BT * s.Cl);
    b.att = c.take(att);
    b.attproj = c.take(BT * s.C);
    b.res2 = c.take(BT * s.C);
    b.ln2 = c.take(BT * s.C);
    b.ln2_mean = c.take(BT);
    b.ln2_rstd = c.take(BT);
    b.fch = c.take(BT * s.F);
    b.fch_gelu = c.take(BT * s.F);
    b.fcproj = c.take(BT * s.C);
    a.blocks.push_back(b);
  }
  if (s.head) {
    a.lnf = c.take(BT * s.C);
    a.lnf_mean = c.take(BT);
    a.lnf_rstd = c.take(BT);
    a.logits = c.take(BT * s.V);
    a.losses = c.take(BT);
  }
}

template <class Scratch>
void carve_grad_scratch(Scratch& g, const BufferShape& s, std::size_t align) {
  const std::size_t BT = s.B * s.T, att = s.B * s.NH * s.T * s.T;
  BufferCarver count(align);
  g.B = int(s.B);
  g.T = int(s.T);
  g.memory.resize(count.up(BT * s.C) * 2 + count.up(BT * 3 * s.Cl) + count.up(BT * s.Cl) +
                  count.up(att) + count.up(BT * s.F) * 2);
  BufferCarver c(align, g.memory.data());
  g.dres = c.take(BT * s.C);
  g.dln = c.take(BT * s.C);
  g.dqkv = c.take(BT * 3 * s.Cl);
  g.datty = c.take(BT * s.Cl);
  g.datt = c.take(att);
  g.dfch = c.take(BT * s.F);
  g.dfch_gelu = c.take(BT * s.F);
}

}  // namespace orrery::runtime
