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

namespace orrery::runtime {

// Threads used by the kernels of the calling process: OpenBLAS threads and the kernels' own pool.
void set_compute_threads(int threads);
int compute_threads();
// Runs fn(begin, end) over contiguous chunks of [0, n), one per compute thread, on the kernels'
// pool (inline when one thread is set or `work`, in elements touched, is too small to pay for a
// wake-up). Returns when all chunks are done. One job at a time; a concurrent caller runs inline.
void parallel_for(std::ptrdiff_t n, std::size_t work,
                  const std::function<void(std::ptrdiff_t, std::ptrdiff_t)>& fn);

// out (B,T,C) = wte[inp] (V,C) + wpe[t] (T,C); inp (B,T) token ids in [0, V).
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C);
// dwte (V,C), dwpe (T,C) += scatter of dout (B,T,C). Either gradient may be null (skipped).
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                      int C);

// out (B,T,C) = (inp - mean) * rstd * weight + bias over the last axis, eps 1e-5;
// mean, rstd (B,T) are kept for the backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int B, int T, int C);
// dinp (B,T,C), dweight (C), dbias (C) += ...
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int B, int T, int C);

// out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC); bias may be null. out is overwritten.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int B,
                    int T, int C, int OC);
// dinp (B,T,C), dweight (OC,C), dbias (OC) += ...; dinp and dbias may be null (skipped).
// accumulate_dinp = false overwrites dinp instead (saves zeroing a scratch buffer first).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int B, int T, int C, int OC, bool accumulate_dinp = true);

// Causal multi-head self-attention over a fused qkv. inp (B,T,3C) holds [q | k | v], head h at
// columns h*hs..(h+1)*hs of each third, hs = C/NH; scores scaled by 1/sqrt(hs).
// out (B,T,C) heads concatenated; att (B,NH,T,T) softmax probabilities (upper triangle zero).
// `C` here is the channels of the heads this call sees: the full C, or C/tp under tensor parallelism.
void attention_forward(float* out, float* att, const float* inp, int B, int T, int C, int NH);
// dinp (B,T,3C) += ...; datt (B,NH,T,T) is scratch (overwritten).
void attention_backward(float* dinp, float* datt, const float* dout, const float* inp,
                        const float* att, int B, int T, int C, int NH);

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
  X(matmul_forward) X(matmul_backward) \
  X(attention_forward) X(attention_backward) \
  X(gelu_forward) X(gelu_backward) \
  X(residual_forward) X(bias_residual_forward) X(bias_backward) \
  X(softmax_crossentropy_forward) X(softmax_crossentropy_backward)
// clang-format on
