// The compute cost model: what each piece of a training step costs on a device.
//
// Every compute op of the workload is a short list of kernels, each with an op class, the FLOPs it
// executes and the bytes it moves through device memory. A kernel's time is the roofline
//     t = max(flops / (peak · flops_efficiency), bytes / (bandwidth · bandwidth_efficiency)) + overhead
// with the efficiencies and overhead of its class from the hardware profile; an op's time is the sum
// of its kernels' times (kernels of one stream run one after another).
//
// FLOPs: the kernels of a block reproduce the runtime's model-FLOPs counting exactly
// (model/include/orrery/model/flops.hpp, gpt.md): per token, 2 FLOPs per parameter of each
// linear layer (weights and biases) and norm, 2·T·C per layer for attention (the causal count
// of scores plus weighted sum), 2·C·V for the LM head (tied or not); GELU or SwiGLU, RoPE, softmax,
// the loss and embedding lookups count zero FLOPs but do move bytes. Llama-style blocks (the
// scenario's BlockArch): qkv is C x (C + 2 Ckv) with grouped-query attention, SwiGLU's fc1 is
// C x 2F and its elementwise op reads 2F and writes F per token, RMSNorm has a gain only. Backward is 2× forward, kernel by kernel. Tensor
// parallelism divides every block kernel by tp (as the runtime's counting does); the head is not
// sliced. Bytes: each kernel reads its inputs and weights and writes its outputs once, with the
// scenario's activation element size (2 for bf16, 4 for fp32); backward moves twice the bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/model/flops.hpp"
#include "orrery/sim/hardware.hpp"

namespace orrery {
struct Scenario;
}

namespace orrery::sim {

// Shapes of one micro-batch on one rank.
struct ModelDims {
  int64_t batch = 1;    // B, sequences per micro-batch
  int64_t seq = 1;      // T
  int64_t d_model = 1;  // C
  int64_t heads = 1;    // H
  int64_t vocab = 1;    // V
  int64_t layers = 1;   // L (whole model)
  int64_t tp = 1;
  int64_t act_bytes = 4;  // bytes per activation element
  // Sequence parallelism (tp > 1): blocks in model/block.hpp's five pieces, the token-wise ops
  // (LayerNorms, residual adds) over B·T/tp tokens, the head's LayerNorm too.
  bool sequence_parallel = false;
  // parallel.vocab_parallel: the LM head's GEMM and the softmax/loss over this rank's V/tp logits.
  bool vocab_parallel = false;
  // The block (common/scenario.hpp, resolved): key/value heads, MLP width, SwiGLU, RMSNorm, RoPE,
  // biases. The default is GPT's (resolved against heads and d_model where used).
  BlockArch arch{};
  // runtime.precision bf16 / fp16 on device cpu: the runtime emulates the 16-bit products by
  // rounding each GEMM's fp32 operands and output (runtime kernels.cpp: rounded_operand), one
  // elementwise pass (8 bytes: read and write) per element of A, W and out (forward), and of dout,
  // inp, W and dinp (backward); op_kernels adds those passes. The sgemm itself stays fp32.
  bool emulated_16bit = false;
  // Which format it emulates (bf16 or fp16): a profile's measured rounding rate is per format
  // (HostComputeRates::rounding_ns).
  Precision emulated_format = Precision::BF16;
};
ModelDims model_dims(const Scenario& s, int64_t act_bytes);
// The FLOP-count dimensions (model/flops.hpp) of these shapes: the runtime's, for the same block.
model::flops::Dims flop_dims(const ModelDims& d);

struct Kernel {
  OpClass cls = OpClass::Elementwise;
  double flops = 0;
  double bytes = 0;
  int op = -1;  // the model::BlockOp it belongs to (block kernels), -1 elsewhere
  // A GEMM's shape, out (m x n) = in (m x k) · W (k x n); 0 when not a GEMM. In a backward kernel
  // (gemm_backward) the two products of the layer's gradients: the input gradient (m x k, over n)
  // and the weight gradient (k x n, over m), half the kernel's FLOPs each.
  double gm = 0, gn = 0, gk = 0;
  bool gemm_backward = false;
  // Attention kernels: queries (gm) x keys (gn) over the head size (gk), gbatch = sequences x
  // this rank's heads; gemm_backward marks the backward kernel. Used by unfused attention only.
  double gbatch = 1;
  double elem_bytes = 0;  // bytes per operand element (GEMM and attention kernels), 0 unknown
  // A GEMM's widest operand load in bytes (gemm_load_bytes); 0: from gm, gn and gk. Set where
  // the rows stack a batch (gm = m x batch), whose alignment is m's.
  double load_bytes = 0;
};

// What the GEMM shape model needs of the device and the operands beyond the shape: the dense peak
// of the GEMM's precision (each SM's MMA rate is peak / sms), the memory bandwidth (split-K's
// partial outputs, without an L2 figure) and the operands' element size (a main-loop iteration's K depth, its bytes).
// Without a peak (0) the model is the tile and wave quantisation alone, in units of the best
// tile's rate: no latency, operand-bytes or reduction term.
struct GemmDevice {
  double peak_flops = 0;
  double memory_bandwidth_bytes_per_s = 0;
  double elem_bytes = 2;
  double load_bytes = 0;  // the operands' widest load (gemm_load_bytes); 0: from the shape
};

// The widest load a GEMM's operands allow, in bytes: the largest power of two, up to 16, that
// divides every dimension's size in bytes (m, n and k x elem_bytes: each may be a leading
// dimension, depending on which operand is transposed, and a trace does not say). cuBLAS and
// CUTLASS load tensor-core operands 16 bytes at a time where the leading dimensions are multiples
// of 16 bytes, and run narrower `align` kernels where they are not (NVIDIA's Matrix
// Multiplication Background User's Guide, "Tensor Core Requirements": dimensions multiples of 16
// bytes are most efficient). 16 for a dimension that is not a whole number (unknown).
double gemm_load_bytes(double m, double n, double k, double elem_bytes);

// The fraction of its class ceiling a GEMM of shape (m x n, over k) reaches under `g`
// (hardware.hpp's GemmShapeModel) on `dev`: the ideal time, m·n·k MMAs spread over every SM at
// its share of the peak, over the model's time for the fastest candidate tile and split-K factor.
// A tile of (tm x tn) runs k / split over tile_k iterations, each the longer of its MMAs (at
// `relative` of the SM's share) and its operand bytes (tm + tn) x tile_k at the SM's share of the
// L2 bandwidth (times the load width over 16 bytes: dev.load_bytes, or the shape's
// gemm_load_bytes), plus the iteration latency; plus k_fixed of K at the MMA rate; waves of up to
// `sms` tiles run one after another; split > 1 (only while tiles x split <= sms) adds its fp32
// partial outputs written and read once (8 · split · m · n bytes) at the L2 bandwidth (the
// memory's without an L2 figure). 1 for
// a large shape cut evenly into full waves (less only k / (k + k_fixed) and the latency's share),
// far less for skinny or small products and shapes a wave leaves part empty. 1 when `g` is off or
// the shape unknown.
double gemm_shape_efficiency(const GemmShapeModel& g, double m, double n, double k,
                             const GemmDevice& dev = {});
// The same for a kernel (its elem_bytes, if set, for the device's): its forward product, or the
// FLOP-weighted harmonic mean of the two products of a backward kernel.
double gemm_shape_efficiency(const GemmShapeModel& g, const Kernel& k, const GemmDevice& dev = {});

// Kernels of each compute op of the step (one micro-batch, one rank).
std::vector<Kernel> embedding_forward_kernels(const ModelDims& d);
std::vector<Kernel> embedding_backward_kernels(const ModelDims& d);
// A block's forward kernels in model::BlockOp order, each tagged with its op (an op may have more
// than one: Qkv is the qkv GEMM and, under RoPE, the rotation of q and k).
std::vector<Kernel> block_forward_kernels(const ModelDims& d);
// The attention half of a block (ln1, qkv, attention, projection) and the MLP half (ln2, fc1,
// the activation, fc2); the row-parallel epilogue (bias + residual) is in each half.
std::vector<Kernel> attention_forward_kernels(const ModelDims& d);
std::vector<Kernel> mlp_forward_kernels(const ModelDims& d);
std::vector<Kernel> attention_backward_kernels(const ModelDims& d);
std::vector<Kernel> mlp_backward_kernels(const ModelDims& d);
// Final LayerNorm, tied LM head and softmax cross-entropy.
std::vector<Kernel> head_forward_kernels(const ModelDims& d);
std::vector<Kernel> head_backward_kernels(const ModelDims& d);
// AdamW over `params` parameters held by this rank, moving `bytes_per_param` bytes of parameters,
// gradients and moments per parameter (28 in fp32: p, m, v read and written, g read), 12 FLOPs per
// parameter (not model FLOPs: the workload reports optimizer ops with zero model FLOPs).
std::vector<Kernel> optimizer_kernels(double params, double bytes_per_param);

// The kernels of a compute op by its runtime name: "fwd.embed", "bwd.embed", "fwd.head", "bwd.head",
// "fwd.block" / "bwd.block" (pieces 1: the whole block; pieces 3: piece `piece` of a tensor-parallel
// block, split where the runtime sums over the tp group), "adamw" (over `opt_params` parameters, fp32
// master weights and moments), "zero_grad" (`opt_params` gradient elements set to zero); nullopt for
// any other name or piece.
std::optional<std::vector<Kernel>> op_kernels(std::string_view name, int piece, int pieces,
                                              const ModelDims& d, double opt_params = 0);

// The elements the emulated 16-bit products of `ks` round (ModelDims::emulated_16bit): per GEMM
// kernel its operands and output (a + w + out forward; dout, inp, W and dinp backward); `ks` are
// the op's fp32 kernels (without the rounding passes).
double rounded_elements(const std::vector<Kernel>& ks);

double total_flops(const std::vector<Kernel>& ks);
double total_bytes(const std::vector<Kernel>& ks);

// Roofline timing of kernels with a profile and a device's peaks. A GEMM with a shape under a
// profile with a `gemm_shape:` model computes at flops_efficiency x gemm_shape_efficiency.
class CostModel {
 public:
  // `peak_flops` and `memory_bandwidth_bytes_per_s` are the device's (the profile's non-zero
  // overrides take precedence).
  CostModel(HardwareProfile profile, double peak_flops, double memory_bandwidth_bytes_per_s);
  // The roofline plus the class's overhead; a GEMM with a shape under a shape model with a clock
  // also pays its kernel_latency_cycles (the prologue and epilogue no tile hides), so that no
  // product takes less than that floor: max(compute, bytes / (bandwidth x the gemm class's
  // bandwidth_efficiency)) + kernel latency + overhead. A skinny product whose bytes take longer
  // than its tiles is priced by its bytes.
  int64_t kernel_ns(const Kernel& k) const;
  // An attention kernel as the standard unfused implementation runs it (profile attention_fused
  // false): two batched GEMMs over the full scores and the T x T scores through HBM.
  int64_t unfused_attention_ns(const Kernel& k) const;
  int64_t op_ns(const std::vector<Kernel>& ks) const;
  // The time of a named op (op_kernels' names and arguments). Without measured ops in the profile
  // (HardwareProfile::ops) or without one of this name, op_ns of its kernels. With them, measured
  // beats modelled: the nearest measured entry of the same name (closest shape: log-distance over
  // tokens, channels, heads, vocabulary and tp, or parameters for adamw; a different piece split costs
  // more than any shape difference) times the roofline ratio op_ns(this op) / op_ns(that entry's op),
  // so an op at a measured shape costs exactly what was measured and other shapes scale from it.
  // An emulated 16-bit op (ModelDims::emulated_16bit) under a profile with a measured rounding rate
  // for its format costs its fp32 time plus rounded_elements x that rate.
  int64_t named_op_ns(std::string_view name, int piece, int pieces, const ModelDims& d,
                      double opt_params = 0) const;
  // Gradient compression's host compute (HostComputeRates): `units` of the op's work (their
  // definition per scheme: hardware.hpp) at the profile's measured rate for `scheme` ("int8",
  // "topk", "powersgd"), compress or decompress; without one, the roofline of `kernels`.
  int64_t compression_ns(std::string_view scheme, bool decompress, double units,
                         const std::vector<Kernel>& kernels) const;
  // The measured rate of that op, 0 when the profile has none.
  double compression_rate(std::string_view scheme, bool decompress) const;
  double peak_flops() const { return peak_flops_; }
  double memory_bandwidth() const { return bandwidth_; }
  const HardwareProfile& profile() const { return profile_; }

 private:
  HardwareProfile profile_;
  double peak_flops_;
  double bandwidth_;
};

// Model FLOPs of one training step over the whole job (all ranks), the runtime's counting:
// 3 × (L · block_forward + head_forward) per micro-batch of every data-parallel replica, with
// tp = 1 (MFU counts model FLOPs once, not per tensor-parallel slice).
double model_flops_per_step(const Scenario& s);

}  // namespace orrery::sim
