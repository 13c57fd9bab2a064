// fp32 CPU kernels of the reference GPT, forward and backward, written by hand (llm.c style): free
// functions, outputs first, gradients `d`-prefixed. Matrix products go through OpenBLAS sgemm; the
// other ops are tight loops, split over rows on a small thread pool (workers sleep when idle).
//
// Conventions, used by every function here:
// - B batch, T sequence, C channels in, OC channels out, V vocabulary, NH heads; tensors row-major,
//   shapes in the comments; a linear layer's weight is (OC, C) as in PyTorch (out = inp @ W^T + b).
// - Backward functions ACCUMULATE (+=) into every output gradient, activation and parameter alike;
//   the caller zeroes what must start at zero. Null gradient pointers are skipped where noted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "orrery/common/scenario.hpp"

namespace orrery::runtime {

// Threads used by the kernels of the calling process: OpenBLAS threads and the kernels' own pool.
void set_compute_threads(int threads);
int compute_threads();
// Number format of the matrix products of the calling process (runtime.precision, set by the CPU
// backend as the threads are): fp32 (and tf32, which is not run on a CPU), or bf16 / fp16 emulated:
// matmul_forward rounds its input, weight and output to 16 bits (half.hpp, round to nearest even),
// matmul_backward its dout, input and weight (and dinp when it overwrites it); sgemm accumulates
// in fp32 on the rounded values and the weights themselves stay fp32 (the master copy the
// optimizer steps). Other kernels compute in fp32 on what they are given.
void set_matmul_precision(Precision p);
Precision matmul_precision();
// dst (n) = src rounded to p (half.hpp round_to); dst may equal src.
void round_to_precision(float* dst, const float* src, std::size_t n, Precision p);
// Runs fn(begin, end) over contiguous chunks of [0, n), one per compute thread, on the kernels'
// pool (inline when one thread is set or `work`, in elements touched, is too small to pay for a
// wake-up). Returns when all chunks are done. One job at a time; a concurrent caller runs inline.
void parallel_for(std::ptrdiff_t n, std::size_t work,
                  const std::function<void(std::ptrdiff_t, std::ptrdiff_t)>& fn);

// out (B,T,C) = wte[inp] (V,C) + wpe[t] (T,C); inp (B,T) token ids in [0, V). wpe may be null
// (rotary positions: no position embedding).
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C);
// dwte (V,C), dwpe (T,C) += scatter of dout (B,T,C). Either gradient may be null (skipped).
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                      int C);

// out (B,T,C) = (inp - mean) * rstd * weight + bias over the last axis, eps 1e-5;
// mean, rstd (B,T) are kept for the backward. bias may be null (no shift; model.bias false).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int B, int T, int C);
// dinp (B,T,C), dweight (C), dbias (C) += ...; dbias may be null (skipped).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int B, int T, int C);

// RMSNorm (Zhang & Sennrich 2019): out (B,T,C) = inp * rstd * weight, rstd = 1/sqrt(mean(inp²) +
// 1e-5) over the last axis; rstd (B,T) is kept for the backward.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int B, int T,
                     int C);
// dinp (B,T,C), dweight (C) += ...
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int B, int T, int C);

// SwiGLU (Shazeer 2020): inp (N, 2F) holds each row's [gate (F) | up (F)];
// out (N, F) = silu(gate) * up, silu(x) = x / (1 + exp(-x)).
void swiglu_forward(float* out, const float* inp, std::size_t N, int F);
// dinp (N, 2F) += the gradients of gate and up from dout (N, F).
void swiglu_backward(float* dinp, const float* inp, const float* dout, std::size_t N, int F);

// Rotary position embedding (Su et al. 2021), the rotate-half pairing of GPT-NeoX and Llama's
// Hugging Face port: in each head of q and k, channel i and channel i + hs/2 (i < hs/2) are rotated
// by the angle t * theta^(-2i/hs) for the token at position t (0-based in its sequence). In place
// on qkv (B,T,(NH + 2 NKV) hs): the q heads [0, NH hs) and k heads [NH hs, (NH + NKV) hs) of each
// row; v is untouched. Angles, their cosines and sines in double, then rounded to float.
void rope_forward(float* qkv, int B, int T, int NH, int NKV, int hs, float theta);
// In place: dqkv's q and k parts rotated back (the rotation's transpose), v untouched. The one
// backward that does not accumulate: it turns the gradient of the rotated q, k into the gradient of
// the unrotated ones.
void rope_backward(float* dqkv, int B, int T, int NH, int NKV, int hs, float theta);

// out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC); bias may be null. out is overwritten.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int B,
                    int T, int C, int OC);
// dinp (B,T,C), dweight (OC,C), dbias (OC) += ...; dinp and dbias may be null (skipped).
// accumulate_dinp = false overwrites dinp instead (saves zeroing a scratch buffer first).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int B, int T, int C, int OC, bool accumulate_dinp = true);

// Causal self-attention over a fused qkv, multi-head (NKV = NH), grouped-query (NH % NKV == 0) or
// multi-query (NKV = 1). inp (B,T,C + 2 NKV hs) holds [q (NH heads) | k (NKV heads) | v (NKV
// heads)], head h at columns h*hs..(h+1)*hs of its part, hs = C/NH; query head h uses key/value
// head h / (NH/NKV); scores scaled by 1/sqrt(hs). out (B,T,C) heads concatenated; att (B,NH,T,T)
// softmax probabilities (upper triangle zero). `C` and `NH`, `NKV` here are the channels and heads
// this call sees: the full model's, or 1/tp of them under tensor parallelism.
void attention_forward(float* out, float* att, const float* inp, int B, int T, int C, int NH,
                       int NKV);
// dinp (B,T,C + 2 NKV hs) += ... (a key/value head's gradient sums over its group's query heads);
// datt (B,NH,T,T) is scratch (overwritten).
void attention_backward(float* dinp, float* datt, const float* dout, const float* inp,
                        const float* att, int B, int T, int C, int NH, int NKV);

// GELU, tanh approximation, elementwise over N values.
void gelu_forward(float* out, const float* inp, std::size_t N);
// dinp += gelu'(inp) * dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t N);

// out (N) = inp1 + inp2.
void residual_forward(float* out, const float* inp1, const float* inp2, std::size_t N);
// out (B,T,C) = residual + partial + bias (C): the epilogue of a row-parallel linear layer, run once
// after its partial products are summed over the tensor-parallel group. bias may be null.
void bias_residual_forward(float* out, const float* residual, const float* partial,
                           const float* bias, int B, int T, int C);
// dbias (C) += column sums of dout (B,T,C).
void bias_backward(float* dbias, const float* dout, int B, int T, int C);

// In place: logits (B,T,V) become softmax probabilities; losses (B,T) = -log p[target].
// Returns the mean loss over the B*T tokens (accumulated in double).
float softmax_crossentropy_forward(float* losses, float* logits, const int32_t* targets, int B,
                                   int T, int V);
// In place: probs (B,T,V) become dlogits = (probs - onehot(target)) * dloss, where dloss is the
// gradient of the objective with respect to each token's loss (1/(B*T) for the mean).
void softmax_crossentropy_backward(float* probs, const int32_t* targets, float dloss, int B, int T,
                                   int V);

}  // namespace orrery::runtime

// The kernels the model's pieces call (gpt_pieces.hpp), by name: each backend's `Kernels` forwards
// every one of them to its own implementation (CpuKernels; cuda::CudaKernels adds its Context).
// clang-format off
#define ORRERY_MODEL_KERNELS(X) \
  X(encoder_forward) X(encoder_backward) \
  X(layernorm_forward) X(layernorm_backward) \
  X(rmsnorm_forward) X(rmsnorm_backward) \
  X(swiglu_forward) X(swiglu_backward) \
  X(rope_forward) X(rope_backward) \
  X(matmul_forward) X(matmul_backward) \
  X(attention_forward) X(attention_backward) \
  X(gelu_forward) X(gelu_backward) \
  X(residual_forward) X(bias_residual_forward) X(bias_backward) \
  X(softmax_crossentropy_forward) X(softmax_crossentropy_backward)
// clang-format on
