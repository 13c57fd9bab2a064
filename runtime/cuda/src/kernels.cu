// CUDA kernels of the reference GPT (see kernels.hpp for the conventions). Written to be obviously
// right rather than fast: elementwise kernels are grid-stride loops, row kernels give one warp (or
// one block) to a row, column sums (LayerNorm and bias gradients) give one thread to a column and
// reduce over a few row strides in shared memory, and the embedding gradient sorts the positions by
// token (no atomics), so every sum is deterministic: the same inputs give the same bits on every
// call. Matrix products go to cuBLAS. Every launch and library call is checked.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cub/device/device_radix_sort.cuh>
#include <stdexcept>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/runtime/cuda/kernels.hpp"
#include "orrery/runtime/gelu.hpp"

namespace orrery::runtime::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;

#define ORRERY_KERNEL_CHECK(name) \
  ::orrery::runtime::cuda::cuda_check(cudaGetLastError(), "launch of " name)

// Blocks for a grid-stride loop over n elements (capped: the loop covers the rest).
unsigned grid_for(std::size_t n, int threads = kThreads) {
  const std::size_t b =
      (n + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads);
  return static_cast<unsigned>(std::min<std::size_t>(b, 65535u * 8u));
}

template <class T>
__device__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `shared` holds 32 values; the leading barrier makes back-to-back calls safe.
template <class T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : T(0);
  return warp_sum(v);
}
__device__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

// ------------------------------------------------------------------------------------ kernels

__global__ void f32_to_bf16_kernel(__nv_bfloat16* out, const float* in, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(in[i]);
}

__global__ void encoder_forward_kernel(float* out, const int32_t* inp, const float* wte,
                                       const float* wpe, int T, int C, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(bt % T);
    const float e = wte[static_cast<std::size_t>(inp[bt]) * C + c];
    out[i] = wpe != nullptr ? e + wpe[static_cast<std::size_t>(t) * C + c] : e;
  }
}

// Embedding backward, deterministic and in the CPU reference's order (runtime/kernels.cpp adds the
// dout rows into their gradient rows position by position, b then t):
//  - dwpe[t, c] starts from its value and adds dout[b, t, c] for b = 0, 1, ... (one thread per
//    (t, c): the same additions in the same order as the CPU, so the same bits);
//  - dwte: the positions p = b*T + t are sorted by token with a stable radix sort (cub), so each
//    token's positions form one run in ascending order; one block per (run, chunk of channels)
//    starts from dwte[token, c] and adds the run's dout rows in that order. Again the CPU's
//    additions in the CPU's order, whatever the GPU schedules: bit-identical across calls and to
//    the CPU. Tokens that do not occur are not touched. A run is summed serially (rows prefetched
//    kEmbedUnroll at a time), so its cost grows with how often its token repeats in the batch,
//    not with B*T; the sort is O(B*T).
constexpr int kEmbedThreads = 128;
constexpr int kEmbedUnroll = 8;

__global__ void iota_kernel(int32_t* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = i;
}

// Block (run start i, channel chunk): only the block whose sorted index starts a run works.
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int32_t* tokens,
                                            const int32_t* positions, int n, int C) {
  const int i = blockIdx.x;
  const int32_t tok = tokens[i];
  if (i > 0 && tokens[i - 1] == tok) return;  // inside a run: its first block does it
  // End of the run: the first index after i whose token differs (tokens are sorted).
  int lo = i + 1, hi = n;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (tokens[mid] == tok)
      lo = mid + 1;
    else
      hi = mid;
  }
  const int end = lo;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* row = dwte + static_cast<std::size_t>(tok) * C + c;
  float s = *row;
  int j = i;
  for (; j + kEmbedUnroll <= end; j += kEmbedUnroll) {
    float v[kEmbedUnroll];
#pragma unroll
    for (int u = 0; u < kEmbedUnroll; ++u)
      v[u] = dout[static_cast<std::size_t>(positions[j + u]) * C + c];
#pragma unroll
    for (int u = 0; u < kEmbedUnroll; ++u) s += v[u];
  }
  for (; j < end; ++j) s += dout[static_cast<std::size_t>(positions[j]) * C + c];
  *row = s;
}

// dwpe (T,C): one thread per (t, c), starting from dwpe and adding b = 0, 1, ... in order.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const std::size_t n = static_cast<std::size_t>(T) * C;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float s = dwpe[i];
    for (int b = 0; b < B; ++b) s += dout[static_cast<std::size_t>(b) * n + i];
    dwpe[i] = s;
  }
}

// One warp per row.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + static_cast<std::size_t>(row) * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[c];
  const float m = warp_sum(s) / static_cast<float>(C);
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = x[c] - m;
    v += d * d;
  }
  v = warp_sum(v) / static_cast<float>(C);
  const float r = 1.0f / sqrtf(v + 1e-5f);
  float* o = out + static_cast<std::size_t>(row) * C;
  if (bias != nullptr) {
    for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * weight[c] + bias[c];
  } else {
    for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * weight[c];
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// RMSNorm: one warp per row.
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp,
                                       const float* weight, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + static_cast<std::size_t>(row) * C;
  float ss = 0.0f;
  for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
  const float r = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(C) + 1e-5f);
  float* o = out + static_cast<std::size_t>(row) * C;
  for (int c = lane; c < C; c += 32) o[c] = x[c] * r * weight[c];
  if (lane == 0) rstd[row] = r;
}

// dinp += r (w dy) - x r³/C sum(w dy x), one warp per row.
__global__ void rmsnorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                             const float* weight, const float* rstd, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const std::size_t off = static_cast<std::size_t>(row) * C;
  const float* x = inp + off;
  const float* d = dout + off;
  float* di = dinp + off;
  const float r = rstd[row];
  float dot = 0.0f;
  for (int c = lane; c < C; c += 32) dot += weight[c] * d[c] * x[c];
  const float k = warp_sum(dot) * r * r * r / static_cast<float>(C);
  for (int c = lane; c < C; c += 32) di[c] += weight[c] * d[c] * r - x[c] * k;
}

// dinp only, one warp per row; the parameter gradients are column sums (column_grads_kernel).
__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                               const float* weight, const float* mean,
                                               const float* rstd, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const std::size_t off = static_cast<std::size_t>(row) * C;
  const float* x = inp + off;
  const float* d = dout + off;
  float* di = dinp + off;
  const float m = mean[row], r = rstd[row];
  float dm = 0.0f, dnm = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float norm = (x[c] - m) * r;
    const float dnorm = weight[c] * d[c];
    dm += dnorm;
    dnm += dnorm * norm;
  }
  dm = warp_sum(dm) / static_cast<float>(C);
  dnm = warp_sum(dnm) / static_cast<float>(C);
  for (int c = lane; c < C; c += 32) {
    const float norm = (x[c] - m) * r;
    const float dnorm = weight[c] * d[c];
    di[c] += (dnorm - dm - norm * dnm) * r;
  }
}

constexpr int kColX = 32;  // columns per block
constexpr int kColY = 16;  // row strides per block

// Column sums over N rows of (N,C): dbias[c] += sum dout; with dweight (LayerNorm),
// dweight[c] += sum dout * (x - mean) * rstd (RMSNorm: mean null, taken as 0). Block (kColX, kColY), one block per 32 columns.
__global__ void column_grads_kernel(float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* mean, const float* rstd, int N,
                                    int C) {
  __shared__ float sw[kColY][kColX + 1];
  __shared__ float sb[kColY][kColX + 1];
  const int c = blockIdx.x * kColX + threadIdx.x;
  float w = 0.0f, b = 0.0f;
  if (c < C) {
    for (int i = threadIdx.y; i < N; i += kColY) {
      const std::size_t k = static_cast<std::size_t>(i) * C + c;
      const float d = dout[k];
      b += d;
      if (dweight != nullptr) w += (inp[k] - (mean != nullptr ? mean[i] : 0.0f)) * rstd[i] * d;
    }
  }
  sw[threadIdx.y][threadIdx.x] = w;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float ws = 0.0f, bs = 0.0f;
    for (int y = 0; y < kColY; ++y) {
      ws += sw[y][threadIdx.x];
      bs += sb[y][threadIdx.x];
    }
    if (dweight != nullptr) dweight[c] += ws;
    if (dbias != nullptr) dbias[c] += bs;
  }
}

__global__ void add_bias_kernel(float* out, const float* bias, int OC, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    out[i] += bias[i % OC];
}

// Element i of a (B,NH,T,hs) tensor sits at this offset of the (B,T,row) layout, heads side by side
// at columns h*hs..: row = C for a head output. `head` gets the element's head.
__device__ std::size_t head_major_to_row_major(std::size_t i, int T, int NH, int hs, int row,
                                               int* head = nullptr) {
  const int d = static_cast<int>(i % hs);
  std::size_t r = i / hs;
  const int t = static_cast<int>(r % T);
  r /= T;
  const int h = static_cast<int>(r % NH);
  const std::size_t b = r / NH;
  if (head != nullptr) *head = h;
  return (b * T + t) * static_cast<std::size_t>(row) + static_cast<std::size_t>(h) * hs + d;
}

// inp (B,T, q (NH heads) | k (NKV) | v (NKV)) -> q, k, v (B,NH,T,hs) each, query head h's k and v
// from key/value head h / (NH/NKV).
__global__ void permute_qkv_kernel(float* q, float* k, float* v, const float* inp, int T, int NH,
                                   int NKV, int hs, std::size_t n) {
  const int C = NH * hs, W = C + 2 * NKV * hs, group = NH / NKV;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    int h = 0;
    const std::size_t src = head_major_to_row_major(i, T, NH, hs, W, &h);
    const std::size_t kv = src - static_cast<std::size_t>(h) * hs +
                           static_cast<std::size_t>(h / group) * hs;  // kv head's columns
    q[i] = inp[src];
    k[i] = inp[kv + C];
    v[i] = inp[kv + C + NKV * hs];
  }
}

// dinp's q part += dq (B,NH,T,hs).
__global__ void unpermute_q_add_kernel(float* dinp, const float* dq, int T, int NH, int NKV, int hs,
                                       std::size_t n) {
  const int W = (NH + 2 * NKV) * hs;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dinp[head_major_to_row_major(i, T, NH, hs, W)] += dq[i];
}

// dinp's k and v parts += the sums of dk, dv (B,NH,T,hs) over each key/value head's group, one
// thread per element of the (B,NKV,T,hs) key/value layout, adding its query heads in order.
__global__ void unpermute_kv_add_kernel(float* dinp, const float* dk, const float* dv, int T,
                                        int NH, int NKV, int hs, std::size_t n_kv) {
  const int C = NH * hs, W = C + 2 * NKV * hs, group = NH / NKV;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n_kv;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    int g = 0;
    const std::size_t dst = head_major_to_row_major(i, T, NKV, hs, W, &g) + C;
    // (b, g, t, d) of the kv layout; query head h = g*group + j sits at ((b*NH + h)*T + t)*hs + d.
    const std::size_t d = i % hs, t = (i / hs) % T,
                      b = i / (static_cast<std::size_t>(hs) * T * NKV);
    float sk = 0.0f, sv = 0.0f;
    for (int j = 0; j < group; ++j) {
      const std::size_t h = static_cast<std::size_t>(g) * group + j;
      const std::size_t q = ((b * NH + h) * T + t) * hs + d;
      sk += dk[q];
      sv += dv[q];
    }
    dinp[dst] += sk;
    dinp[dst + static_cast<std::size_t>(NKV) * hs] += sv;
  }
}

// SwiGLU on rows [gate (F) | up (F)].
__global__ void swiglu_forward_kernel(float* out, const float* inp, int F, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t row = i / F, j = i % F;
    const float g = inp[row * 2 * F + j], u = inp[row * 2 * F + F + j];
    out[i] = g / (1.0f + expf(-g)) * u;
  }
}
__global__ void swiglu_backward_kernel(float* dinp, const float* inp, const float* dout, int F,
                                       std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t row = i / F, j = i % F;
    const float g = inp[row * 2 * F + j], u = inp[row * 2 * F + F + j];
    const float sig = 1.0f / (1.0f + expf(-g));
    dinp[row * 2 * F + F + j] += g * sig * dout[i];
    dinp[row * 2 * F + j] += u * dout[i] * sig * (1.0f + g * (1.0f - sig));
  }
}

// RoPE in place: one thread per (row, rotated head, pair i < hs/2); sign -1 rotates back.
__global__ void rope_kernel(float* qkv, int T, int NH, int NKV, int hs, double theta, float sign,
                            std::size_t n) {
  const int half = hs / 2, rotated = NH + NKV, W = (NH + 2 * NKV) * hs;
  for (std::size_t idx = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const int h = static_cast<int>((idx / half) % rotated);
    const std::size_t row = idx / (static_cast<std::size_t>(half) * rotated);
    const int t = static_cast<int>(row % T);
    const double a = static_cast<double>(t) * pow(theta, -2.0 * i / static_cast<double>(hs));
    const float c = static_cast<float>(cos(a)), sn = sign * static_cast<float>(sin(a));
    float* x = qkv + row * W + static_cast<std::size_t>(h) * hs;
    const float lo = x[i], hi = x[i + half];
    x[i] = lo * c - hi * sn;
    x[i + half] = hi * c + lo * sn;
  }
}

// (B,NH,T,hs) <-> (B,T,NH,hs). forward: out (B,T,C) = y (B,NH,T,hs); backward: dy = dout.
__global__ void unpermute_kernel(float* out, const float* y, int T, int NH, int hs, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    out[head_major_to_row_major(i, T, NH, hs, NH * hs)] = y[i];
}
__global__ void permute_kernel(float* y, const float* out, int T, int NH, int hs, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    y[i] = out[head_major_to_row_major(i, T, NH, hs, NH * hs)];
}

// In place on rows of (rows, T), row index r has t = r % T: softmax over columns [0, t], zero after.
// One warp per row.
__global__ void causal_softmax_kernel(float* att, std::size_t rows, int T) {
  const std::size_t row = blockIdx.x * static_cast<std::size_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  float* p = att + row * T;
  float mx = -INFINITY;
  for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, p[j]);
  mx = warp_max(mx);
  float s = 0.0f;
  for (int j = lane; j <= t; j += 32) {
    const float e = expf(p[j] - mx);
    p[j] = e;
    s += e;
  }
  s = warp_sum(s);
  const float inv = 1.0f / s;
  for (int j = lane; j <= t; j += 32) p[j] *= inv;
  for (int j = t + 1 + lane; j < T; j += 32) p[j] = 0.0f;
}

// In place: datt becomes dS * scale, dS = P * (dP - sum_j P dP) over [0, t], zero after.
__global__ void causal_softmax_backward_kernel(float* datt, const float* att, std::size_t rows,
                                               int T, float scale) {
  const std::size_t row = blockIdx.x * static_cast<std::size_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  float* d = datt + row * T;
  const float* p = att + row * T;
  float dot = 0.0f;
  for (int j = lane; j <= t; j += 32) dot += p[j] * d[j];
  dot = warp_sum(dot);
  for (int j = lane; j <= t; j += 32) d[j] = p[j] * (d[j] - dot) * scale;
  for (int j = t + 1 + lane; j < T; j += 32) d[j] = 0.0f;
}

__global__ void gelu_forward_kernel(float* out, const float* inp, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    out[i] = gelu::value(x, tanhf(gelu::tanh_arg(x)));
  }
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout,
                                     std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    dinp[i] += gelu::derivative(x, tanhf(gelu::tanh_arg(x))) * dout[i];
  }
}

__global__ void residual_forward_kernel(float* out, const float* a, const float* b, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

__global__ void bias_residual_forward_kernel(float* out, const float* residual,
                                             const float* partial, const float* bias, int C,
                                             std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    out[i] = residual[i] + partial[i] + (bias != nullptr ? bias[i % C] : 0.0f);
}

__global__ void scale_kernel(float* out, const float* in, float s, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    out[i] = in[i] * s;
}

// One block per row of (N, V): in place softmax, losses[row] = log(sum) - (logit[target] - max).
__global__ void softmax_crossentropy_forward_kernel(float* losses, float* logits,
                                                    const int32_t* targets, int V) {
  __shared__ float shared[32];
  const std::size_t row = blockIdx.x;
  float* p = logits + row * V;
  const int target = targets[row];
  const float target_logit = p[target];  // read before the row is overwritten below
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, p[j]);
  mx = block_max(mx, shared);
  float s = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float e = expf(p[j] - mx);
    p[j] = e;
    s += e;
  }
  s = block_sum(s, shared);
  const float inv = 1.0f / s;
  for (int j = threadIdx.x; j < V; j += blockDim.x) p[j] *= inv;
  if (threadIdx.x == 0) losses[row] = logf(s) - (target_logit - mx);
}

// out[0] = sum of losses (double), one block.
__global__ void sum_losses_kernel(double* out, const float* losses, std::size_t n) {
  __shared__ double shared[32];
  double s = 0.0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(losses[i]);
  s = block_sum(s, shared);
  if (threadIdx.x == 0) out[0] = s;
}

__global__ void softmax_crossentropy_backward_kernel(float* probs, const int32_t* targets,
                                                     float dloss, int V, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t row = i / V;
    const int j = static_cast<int>(i % V);
    const float indicator = j == targets[row] ? 1.0f : 0.0f;
    probs[i] = (probs[i] - indicator) * dloss;
  }
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, std::size_t n,
                             float decay_factor, float b1, float b2, float step_size,
                             float inv_sqrt_bc2, float eps) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay_factor - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
  }
}

// --- mixture-of-experts blocks (moe_block.hpp's CPU kernels, one thread per output element)

// One warp per row of (N, E): max, exponentials summed in double, then the row scaled.
__global__ void moe_softmax_kernel(float* p, int64_t N, int E) {
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;  // whole warps leave together
  float* r = p + row * E;
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, r[e]);
  mx = warp_max(mx);
  double sum = 0.0;
  for (int e = lane; e < E; e += 32) {
    const float v = expf(r[e] - mx);
    r[e] = v;
    sum += v;
  }
  sum = warp_sum(sum);
  const auto inv = static_cast<float>(1.0 / sum);
  for (int e = lane; e < E; e += 32) r[e] *= inv;
}

// dst row i = src row idx[i] (gather), or dst row idx[i] = src row i (scatter); n·C elements.
__global__ void moe_move_rows_kernel(float* dst, const float* src, const int64_t* idx, int C,
                                     std::size_t n, bool scatter) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t row = i / C, c = i % C;
    const std::size_t other = static_cast<std::size_t>(idx[row]) * C + c;
    if (scatter) {
      dst[other] = src[i];
    } else {
      dst[i] = src[other];
    }
  }
}

// out (N, C) += Σ_k w_k · rows[row_k] (weighted), or += Σ_k rows[row_k] (weight null), over the
// token's kept assignments in k order.
__global__ void moe_gated_sum_kernel(float* out, const float* rows, const int64_t* row,
                                     const float* weight, int K, int C, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t t = i / C, c = i % C;
    float acc = out[i];
    for (int k = 0; k < K; ++k) {
      const std::size_t a = t * K + k;
      const int64_t r = row[a];
      if (r < 0) continue;
      const float x = rows[static_cast<std::size_t>(r) * C + c];
      acc += weight != nullptr ? weight[a] * x : x;
    }
    out[i] = acc;
  }
}

// drows row row[a] = weight[a] · dy row a / K, for each kept assignment a; N·K·C elements.
__global__ void moe_gated_rows_backward_kernel(float* drows, const float* dy, const int64_t* row,
                                               const float* weight, int K, int C, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t a = i / C, c = i % C;
    const int64_t r = row[a];
    if (r >= 0) drows[static_cast<std::size_t>(r) * C + c] = weight[a] * dy[(a / K) * C + c];
  }
}

// One warp per assignment a: dgate[a] = <dy row a / K, rows row row[a]> in double (0 if dropped).
__global__ void moe_gate_grad_kernel(float* dgate, const float* dy, const float* rows,
                                     const int64_t* row, int K, int C, int64_t assignments) {
  const int64_t a = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (a >= assignments) return;  // whole warps leave together
  const int64_t r = row[a];
  double dot = 0.0;
  if (r >= 0) {
    const float* d = dy + (a / K) * C;
    const float* b = rows + r * C;
    for (int c = lane; c < C; c += 32) dot += static_cast<double>(d[c]) * b[c];
  }
  dot = warp_sum(dot);
  if (lane == 0) dgate[a] = static_cast<float>(dot);
}

void check_dims(const char* what, long long a, long long b = 1, long long c = 1) {
  if (a < 0 || b < 0 || c < 0)
    throw std::invalid_argument(std::string(what) + ": negative dimension");
}

}  // namespace

// ------------------------------------------------------------------------------------ context

MathMode math_mode_of(Precision p) {
  switch (p) {
    case Precision::FP32:
      return MathMode::kFp32;
    case Precision::TF32:
      return MathMode::kTf32;
    case Precision::BF16:
      return MathMode::kBf16;
    case Precision::FP16:
      break;
  }
  // fp16 runs on device cpu only (loss scaling is in the CPU loop): the scenario refuses it on
  // cuda, and so does this, for a caller that skipped the scenario's check.
  throw InputError("key 'runtime.precision': '" + std::string(to_string(p)) +
                   "' runs on device cpu only; device cuda takes fp32, tf32 or bf16");
}

const char* math_mode_name(MathMode m) {
  switch (m) {
    case MathMode::kFp32:
      return "fp32";
    case MathMode::kTf32:
      return "tf32";
    case MathMode::kBf16:
      return "bf16";
  }
  return "?";
}

void cublas_check(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  std::string msg = std::string("cuBLAS error: ") + what + " failed with " +
                    cublasGetStatusName(st) + " (" + cublasGetStatusString(st) + ")";
  if (st == CUBLAS_STATUS_ALLOC_FAILED) msg = "device memory exhausted: " + msg;
  throw InternalError(msg);
}

Context::Context(cudaStream_t stream, MathMode math) : stream_(stream), math_(math) {
  ORRERY_CUBLAS_CHECK(cublasCreate(&cublas_));
  try {
    ORRERY_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // fp32 products stay IEEE fp32 unless the math mode asks for TF32 (per call, below).
    ORRERY_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  } catch (...) {
    cublasDestroy(cublas_);
    throw;
  }
}

Context::~Context() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
}

float* Context::scratch_f32(int slot, std::size_t count) const {
  if (slot < 0 || slot >= kSlots)
    throw std::out_of_range("cuda::Context: scratch slot " + std::to_string(slot));
  DeviceArray<float>& a = f32_[slot];
  if (a.size() < count) {
    ORRERY_CUDA_CHECK(cudaStreamSynchronize(stream_));
    a = DeviceArray<float>();
    a.resize(count);
  }
  return a.data();
}

uint16_t* Context::scratch_bf16(int slot, std::size_t count) const {
  if (slot < 0 || slot >= kSlots)
    throw std::out_of_range("cuda::Context: scratch slot " + std::to_string(slot));
  DeviceArray<uint16_t>& a = bf16_[slot];
  if (a.size() < count) {
    ORRERY_CUDA_CHECK(cudaStreamSynchronize(stream_));
    a = DeviceArray<uint16_t>();
    a.resize(count);
  }
  return a.data();
}

std::size_t Context::scratch_bytes() const {
  std::size_t n = 0;
  for (int i = 0; i < kSlots; ++i) n += f32_[i].size_bytes() + bf16_[i].size_bytes();
  return n;
}

// ------------------------------------------------------------------------------------ gemm

void gemm(const Context& ctx, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
          const float* A, int lda, long long stride_a, const float* B, int ldb, long long stride_b,
          float beta, float* C, int ldc, long long stride_c, int batch) {
  check_dims("gemm", m, n, k);
  if (m == 0 || n == 0 || batch <= 0) return;
  if (k == 0) throw std::invalid_argument("gemm: k == 0");
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t ab_type = CUDA_R_32F;
  const void* a = A;
  const void* b = B;
  if (ctx.math() == MathMode::kTf32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  if (ctx.math() == MathMode::kBf16) {
    // Convert the whole extent each operand spans (all batches) into bf16 scratch.
    auto extent = [&](bool trans, int rows_op, int cols_op, int ld, long long stride) {
      const std::size_t rows = static_cast<std::size_t>(trans ? cols_op : rows_op);  // stored rows
      const std::size_t cols = static_cast<std::size_t>(trans ? rows_op : cols_op);
      return static_cast<std::size_t>(batch - 1) * static_cast<std::size_t>(stride) +
             static_cast<std::size_t>(ld) * (cols - 1) + rows;
    };
    const std::size_t na = extent(trans_a, m, k, lda, stride_a);
    const std::size_t nb = extent(trans_b, k, n, ldb, stride_b);
    auto* a16 = reinterpret_cast<__nv_bfloat16*>(ctx.scratch_bf16(0, na));
    auto* b16 = reinterpret_cast<__nv_bfloat16*>(ctx.scratch_bf16(1, nb));
    f32_to_bf16_kernel<<<grid_for(na), kThreads, 0, ctx.stream()>>>(a16, A, na);
    ORRERY_KERNEL_CHECK("f32_to_bf16_kernel");
    f32_to_bf16_kernel<<<grid_for(nb), kThreads, 0, ctx.stream()>>>(b16, B, nb);
    ORRERY_KERNEL_CHECK("f32_to_bf16_kernel");
    a = a16;
    b = b16;
    ab_type = CUDA_R_16BF;
  }
  if (batch == 1) {
    ORRERY_CUBLAS_CHECK(cublasGemmEx(ctx.cublas(), ta, tb, m, n, k, &alpha, a, ab_type, lda, b,
                                     ab_type, ldb, &beta, C, CUDA_R_32F, ldc, compute,
                                     CUBLAS_GEMM_DEFAULT));
  } else {
    ORRERY_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        ctx.cublas(), ta, tb, m, n, k, &alpha, a, ab_type, lda, stride_a, b, ab_type, ldb, stride_b,
        &beta, C, CUDA_R_32F, ldc, stride_c, batch, compute, CUBLAS_GEMM_DEFAULT));
  }
}

// ------------------------------------------------------------------------------------ ops

void encoder_forward(const Context& ctx, float* out, const int32_t* inp, const float* wte,
                     const float* wpe, int B, int T, int C) {
  const std::size_t n = static_cast<std::size_t>(B) * T * C;
  if (n == 0) return;
  encoder_forward_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(out, inp, wte, wpe, T, C, n);
  ORRERY_KERNEL_CHECK("encoder_forward_kernel");
}

void encoder_backward(const Context& ctx, float* dwte, float* dwpe, const float* dout,
                      const int32_t* inp, int B, int T, int C) {
  const std::size_t n = static_cast<std::size_t>(B) * T * C;
  if (n == 0) return;
  if (dwte != nullptr) {
    const std::size_t bt = static_cast<std::size_t>(B) * T;
    if (bt > static_cast<std::size_t>(INT32_MAX)) {
      throw InternalError("encoder_backward: B*T = " + std::to_string(bt) +
                          " positions exceed the sort's int range");
    }
    const int N = static_cast<int>(bt);
    // Scratch (slot 2, also attention backward's: free between ops): sorted tokens, positions in,
    // positions sorted, then cub's temporary storage, each 256-byte aligned.
    std::size_t temp_bytes = 0;
    cuda_check(cub::DeviceRadixSort::SortPairs(
                   nullptr, temp_bytes, static_cast<const int32_t*>(nullptr),
                   static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                   static_cast<int32_t*>(nullptr), N, 0, 32, ctx.stream()),
               "cub::DeviceRadixSort::SortPairs (size query)");
    const auto aligned = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
    const std::size_t array_bytes = aligned(bt * sizeof(int32_t));
    const std::size_t total = 3 * array_bytes + aligned(temp_bytes);
    auto* base = reinterpret_cast<unsigned char*>(
        ctx.scratch_f32(2, (total + sizeof(float) - 1) / sizeof(float)));
    auto* tokens = reinterpret_cast<int32_t*>(base);
    auto* pos_in = reinterpret_cast<int32_t*>(base + array_bytes);
    auto* pos_sorted = reinterpret_cast<int32_t*>(base + 2 * array_bytes);
    void* temp = base + 3 * array_bytes;
    iota_kernel<<<grid_for(bt), kThreads, 0, ctx.stream()>>>(pos_in, N);
    ORRERY_KERNEL_CHECK("iota_kernel");
    // Stable: equal tokens keep ascending positions. All 32 key bits: the vocabulary size is not
    // known here (the cost is a few passes over B*T ints).
    cuda_check(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, inp, tokens, pos_in, pos_sorted, N,
                                               0, 32, ctx.stream()),
               "cub::DeviceRadixSort::SortPairs (embedding tokens)");
    const dim3 grid(static_cast<unsigned>(N),
                    static_cast<unsigned>((C + kEmbedThreads - 1) / kEmbedThreads));
    encoder_backward_wte_kernel<<<grid, kEmbedThreads, 0, ctx.stream()>>>(dwte, dout, tokens,
                                                                          pos_sorted, N, C);
    ORRERY_KERNEL_CHECK("encoder_backward_wte_kernel");
  }
  if (dwpe != nullptr) {
    encoder_backward_wpe_kernel<<<grid_for(static_cast<std::size_t>(T) * C), kThreads, 0,
                                  ctx.stream()>>>(dwpe, dout, B, T, C);
    ORRERY_KERNEL_CHECK("encoder_backward_wpe_kernel");
  }
}

void layernorm_forward(const Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int B, int T, int C) {
  const int N = B * T;
  if (N == 0 || C == 0) return;
  const int rows_per_block = kThreads / 32;
  layernorm_forward_kernel<<<(N + rows_per_block - 1) / rows_per_block, kThreads, 0,
                             ctx.stream()>>>(out, mean, rstd, inp, weight, bias, N, C);
  ORRERY_KERNEL_CHECK("layernorm_forward_kernel");
}

void layernorm_backward(const Context& ctx, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, int B, int T, int C) {
  const int N = B * T;
  if (N == 0 || C == 0) return;
  const int rows_per_block = kThreads / 32;
  layernorm_backward_dinp_kernel<<<(N + rows_per_block - 1) / rows_per_block, kThreads, 0,
                                   ctx.stream()>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  ORRERY_KERNEL_CHECK("layernorm_backward_dinp_kernel");
  column_grads_kernel<<<(C + kColX - 1) / kColX, dim3(kColX, kColY), 0, ctx.stream()>>>(
      dweight, dbias, dout, inp, mean, rstd, N, C);
  ORRERY_KERNEL_CHECK("column_grads_kernel (layernorm)");
}

void matmul_forward(const Context& ctx, float* out, const float* inp, const float* weight,
                    const float* bias, int B, int T, int C, int OC) {
  const int N = B * T;
  if (N == 0 || OC == 0) return;
  // Row-major out (N,OC) is column-major (OC,N): out^T = W (OC,C) . inp^T.
  gemm(ctx, true, false, OC, N, C, 1.0f, weight, C, 0, inp, C, 0, 0.0f, out, OC, 0);
  if (bias != nullptr) {
    const std::size_t n = static_cast<std::size_t>(N) * OC;
    add_bias_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(out, bias, OC, n);
    ORRERY_KERNEL_CHECK("add_bias_kernel");
  }
}

void bias_backward(const Context& ctx, float* dbias, const float* dout, int B, int T, int C) {
  const int N = B * T;
  if (N == 0 || C == 0) return;
  column_grads_kernel<<<(C + kColX - 1) / kColX, dim3(kColX, kColY), 0, ctx.stream()>>>(
      nullptr, dbias, dout, nullptr, nullptr, nullptr, N, C);
  ORRERY_KERNEL_CHECK("column_grads_kernel (bias)");
}

void matmul_backward(const Context& ctx, float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight, int B, int T, int C,
                     int OC, bool accumulate_dinp) {
  const int N = B * T;
  if (N == 0) return;
  if (dinp != nullptr) {
    // dinp (N,C) = dout (N,OC) . W (OC,C); column-major (C,N) = W^T-view (C,OC) . dout-view (OC,N).
    gemm(ctx, false, false, C, N, OC, 1.0f, weight, C, 0, dout, OC, 0,
         accumulate_dinp ? 1.0f : 0.0f, dinp, C, 0);
  }
  // dweight (OC,C) += dout^T (OC,N) . inp (N,C); column-major (C,OC) = inp-view (C,N) . dout-view^T (N,OC).
  gemm(ctx, false, true, C, OC, N, 1.0f, inp, C, 0, dout, OC, 0, 1.0f, dweight, C, 0);
  if (dbias != nullptr) bias_backward(ctx, dbias, dout, B, T, OC);
}

void attention_forward(const Context& ctx, float* out, float* att, const float* inp, int B, int T,
                       int C, int NH, int NKV) {
  if (NH <= 0 || NKV <= 0 || C % NH != 0 || NH % NKV != 0)
    throw std::invalid_argument("attention_forward: C must be a multiple of NH and NH of NKV");
  const int hs = C / NH;
  const std::size_t n = static_cast<std::size_t>(B) * T * C;  // one of q, k, v
  if (n == 0) return;
  const int BNH = B * NH;
  const long long sq = static_cast<long long>(T) * hs, sa = static_cast<long long>(T) * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float* q = ctx.scratch_f32(0, 3 * n);
  float* k = q + n;
  float* v = q + 2 * n;
  float* y = ctx.scratch_f32(1, n);
  permute_qkv_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(q, k, v, inp, T, NH, NKV, hs, n);
  ORRERY_KERNEL_CHECK("permute_qkv_kernel");
  // att[t1][t2] = scale * q[t1] . k[t2], per (b, h).
  gemm(ctx, true, false, T, T, hs, scale, k, hs, sq, q, hs, sq, 0.0f, att, T, sa, BNH);
  const std::size_t rows = static_cast<std::size_t>(BNH) * T;
  const unsigned warps_per_block = kThreads / 32;
  causal_softmax_kernel<<<static_cast<unsigned>((rows + warps_per_block - 1) / warps_per_block),
                          kThreads, 0, ctx.stream()>>>(att, rows, T);
  ORRERY_KERNEL_CHECK("causal_softmax_kernel");
  // y (T,hs) = att (T,T) . v (T,hs), per (b, h).
  gemm(ctx, false, false, hs, T, T, 1.0f, v, hs, sq, att, T, sa, 0.0f, y, hs, sq, BNH);
  unpermute_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(out, y, T, NH, hs, n);
  ORRERY_KERNEL_CHECK("unpermute_kernel");
}

void attention_backward(const Context& ctx, float* dinp, float* datt, const float* dout,
                        const float* inp, const float* att, int B, int T, int C, int NH, int NKV) {
  if (NH <= 0 || NKV <= 0 || C % NH != 0 || NH % NKV != 0)
    throw std::invalid_argument("attention_backward: C must be a multiple of NH and NH of NKV");
  const int hs = C / NH;
  const std::size_t n = static_cast<std::size_t>(B) * T * C;
  if (n == 0) return;
  const int BNH = B * NH;
  const long long sq = static_cast<long long>(T) * hs, sa = static_cast<long long>(T) * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float* q = ctx.scratch_f32(0, 3 * n);
  float* k = q + n;
  float* v = q + 2 * n;
  float* dy = ctx.scratch_f32(1, n);
  float* dq = ctx.scratch_f32(2, 3 * n);
  float* dk = dq + n;
  float* dv = dq + 2 * n;
  permute_qkv_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(q, k, v, inp, T, NH, NKV, hs, n);
  ORRERY_KERNEL_CHECK("permute_qkv_kernel");
  permute_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(dy, dout, T, NH, hs, n);
  ORRERY_KERNEL_CHECK("permute_kernel");
  // datt[t1][t2] = dy[t1] . v[t2]
  gemm(ctx, true, false, T, T, hs, 1.0f, v, hs, sq, dy, hs, sq, 0.0f, datt, T, sa, BNH);
  // dv[t2] = sum_t1 att[t1][t2] dy[t1]
  gemm(ctx, false, true, hs, T, T, 1.0f, dy, hs, sq, att, T, sa, 0.0f, dv, hs, sq, BNH);
  const std::size_t rows = static_cast<std::size_t>(BNH) * T;
  const unsigned warps_per_block = kThreads / 32;
  causal_softmax_backward_kernel<<<static_cast<unsigned>((rows + warps_per_block - 1) /
                                                         warps_per_block),
                                   kThreads, 0, ctx.stream()>>>(datt, att, rows, T, scale);
  ORRERY_KERNEL_CHECK("causal_softmax_backward_kernel");
  // dq[t1] = sum_t2 dS[t1][t2] k[t2];  dk[t2] = sum_t1 dS[t1][t2] q[t1]  (scale folded into dS)
  gemm(ctx, false, false, hs, T, T, 1.0f, k, hs, sq, datt, T, sa, 0.0f, dq, hs, sq, BNH);
  gemm(ctx, false, true, hs, T, T, 1.0f, q, hs, sq, datt, T, sa, 0.0f, dk, hs, sq, BNH);
  unpermute_q_add_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(dinp, dq, T, NH, NKV, hs, n);
  ORRERY_KERNEL_CHECK("unpermute_q_add_kernel");
  const std::size_t n_kv = n / static_cast<std::size_t>(NH / NKV);
  unpermute_kv_add_kernel<<<grid_for(n_kv), kThreads, 0, ctx.stream()>>>(dinp, dk, dv, T, NH, NKV,
                                                                         hs, n_kv);
  ORRERY_KERNEL_CHECK("unpermute_kv_add_kernel");
}

void rmsnorm_forward(const Context& ctx, float* out, float* rstd, const float* inp,
                     const float* weight, int B, int T, int C) {
  const int N = B * T;
  if (N == 0 || C == 0) return;
  const int rows_per_block = kThreads / 32;
  rmsnorm_forward_kernel<<<(N + rows_per_block - 1) / rows_per_block, kThreads, 0, ctx.stream()>>>(
      out, rstd, inp, weight, N, C);
  ORRERY_KERNEL_CHECK("rmsnorm_forward_kernel");
}

void rmsnorm_backward(const Context& ctx, float* dinp, float* dweight, const float* dout,
                      const float* inp, const float* weight, const float* rstd, int B, int T,
                      int C) {
  const int N = B * T;
  if (N == 0 || C == 0) return;
  const int rows_per_block = kThreads / 32;
  rmsnorm_backward_dinp_kernel<<<(N + rows_per_block - 1) / rows_per_block, kThreads, 0,
                                 ctx.stream()>>>(dinp, dout, inp, weight, rstd, N, C);
  ORRERY_KERNEL_CHECK("rmsnorm_backward_dinp_kernel");
  column_grads_kernel<<<(C + kColX - 1) / kColX, dim3(kColX, kColY), 0, ctx.stream()>>>(
      dweight, nullptr, dout, inp, nullptr, rstd, N, C);
  ORRERY_KERNEL_CHECK("column_grads_kernel (rmsnorm)");
}

void swiglu_forward(const Context& ctx, float* out, const float* inp, std::size_t N, int F) {
  const std::size_t n = N * static_cast<std::size_t>(F);
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(out, inp, F, n);
  ORRERY_KERNEL_CHECK("swiglu_forward_kernel");
}

void swiglu_backward(const Context& ctx, float* dinp, const float* inp, const float* dout,
                     std::size_t N, int F) {
  const std::size_t n = N * static_cast<std::size_t>(F);
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(dinp, inp, dout, F, n);
  ORRERY_KERNEL_CHECK("swiglu_backward_kernel");
}

namespace {
void rope(const Context& ctx, float* qkv, int B, int T, int NH, int NKV, int hs, float theta,
          float sign) {
  if (hs % 2 != 0) throw std::invalid_argument("rope: head size " + std::to_string(hs) + " is odd");
  const std::size_t n = static_cast<std::size_t>(B) * T * (NH + NKV) * (hs / 2);
  if (n == 0) return;
  rope_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(qkv, T, NH, NKV, hs,
                                                          static_cast<double>(theta), sign, n);
  ORRERY_KERNEL_CHECK("rope_kernel");
}
}  // namespace

void rope_forward(const Context& ctx, float* qkv, int B, int T, int NH, int NKV, int hs,
                  float theta) {
  rope(ctx, qkv, B, T, NH, NKV, hs, theta, 1.0f);
}

void rope_backward(const Context& ctx, float* dqkv, int B, int T, int NH, int NKV, int hs,
                   float theta) {
  rope(ctx, dqkv, B, T, NH, NKV, hs, theta, -1.0f);
}

void gelu_forward(const Context& ctx, float* out, const float* inp, std::size_t N) {
  if (N == 0) return;
  gelu_forward_kernel<<<grid_for(N), kThreads, 0, ctx.stream()>>>(out, inp, N);
  ORRERY_KERNEL_CHECK("gelu_forward_kernel");
}

void gelu_backward(const Context& ctx, float* dinp, const float* inp, const float* dout,
                   std::size_t N) {
  if (N == 0) return;
  gelu_backward_kernel<<<grid_for(N), kThreads, 0, ctx.stream()>>>(dinp, inp, dout, N);
  ORRERY_KERNEL_CHECK("gelu_backward_kernel");
}

void residual_forward(const Context& ctx, float* out, const float* inp1, const float* inp2,
                      std::size_t N) {
  if (N == 0) return;
  residual_forward_kernel<<<grid_for(N), kThreads, 0, ctx.stream()>>>(out, inp1, inp2, N);
  ORRERY_KERNEL_CHECK("residual_forward_kernel");
}

void bias_residual_forward(const Context& ctx, float* out, const float* residual,
                           const float* partial, const float* bias, int B, int T, int C) {
  const std::size_t n = static_cast<std::size_t>(B) * T * C;
  if (n == 0) return;
  bias_residual_forward_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(out, residual, partial,
                                                                           bias, C, n);
  ORRERY_KERNEL_CHECK("bias_residual_forward_kernel");
}

float softmax_crossentropy_forward(const Context& ctx, float* losses, float* logits,
                                   const int32_t* targets, int B, int T, int V) {
  const std::size_t N = static_cast<std::size_t>(B) * T;
  if (N == 0 || V == 0) return 0.0f;
  if (N > 0x7fffffffu) throw std::invalid_argument("softmax_crossentropy_forward: too many rows");
  softmax_crossentropy_forward_kernel<<<static_cast<unsigned>(N), 512, 0, ctx.stream()>>>(
      losses, logits, targets, V);
  ORRERY_KERNEL_CHECK("softmax_crossentropy_forward_kernel");
  // Slot 3 of the scratch is reserved for this sum.
  auto* sum = reinterpret_cast<double*>(ctx.scratch_f32(3, 2));
  sum_losses_kernel<<<1, 1024, 0, ctx.stream()>>>(sum, losses, N);
  ORRERY_KERNEL_CHECK("sum_losses_kernel");
  double host_sum = 0.0;
  ORRERY_CUDA_CHECK(
      cudaMemcpyAsync(&host_sum, sum, sizeof host_sum, cudaMemcpyDeviceToHost, ctx.stream()));
  ORRERY_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
  return static_cast<float>(host_sum / static_cast<double>(N));
}

void softmax_crossentropy_backward(const Context& ctx, float* probs, const int32_t* targets,
                                   float dloss, int B, int T, int V) {
  const std::size_t n = static_cast<std::size_t>(B) * T * V;
  if (n == 0) return;
  softmax_crossentropy_backward_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(probs, targets,
                                                                                   dloss, V, n);
  ORRERY_KERNEL_CHECK("softmax_crossentropy_backward_kernel");
}

void adamw_update(const Context& ctx, float* params, const float* grads, float* m, float* v,
                  std::size_t offset, std::size_t n, std::span<const ParamRange> decay,
                  int64_t step, const AdamWConfig& cfg) {
  if (step < 1) throw std::invalid_argument("adamw_update: step counts from 1");
  // The scalars and stretches exactly as runtime::adamw_update computes them (optimizer.hpp).
  const AdamWScalars k = adamw_scalars(step, cfg);
  for_each_decay_stretch(offset, n, decay, k.keep_decayed,
                         [&](std::size_t from, std::size_t to, float factor) {
                           const std::size_t i = from - offset;
                           adamw_kernel<<<grid_for(to - from), kThreads, 0, ctx.stream()>>>(
                               params + i, grads + i, m + i, v + i, to - from, factor, cfg.beta1,
                               cfg.beta2, k.step_size, k.inv_sqrt_bc2, cfg.eps);
                           ORRERY_KERNEL_CHECK("adamw_kernel");
                         });
}

void scale(const Context& ctx, float* out, const float* in, float s, std::size_t N) {
  if (N == 0) return;
  scale_kernel<<<grid_for(N), kThreads, 0, ctx.stream()>>>(out, in, s, N);
  ORRERY_KERNEL_CHECK("scale_kernel");
}

// ------------------------------------------------------------------------ mixture of experts

namespace {

// Blocks of kThreads threads for one warp per item.
unsigned warp_grid_for(const char* what, int64_t items) {
  const int64_t warps_per_block = kThreads / 32;
  const int64_t blocks = (items + warps_per_block - 1) / warps_per_block;
  if (blocks > 0x7fffffff) throw std::invalid_argument(std::string(what) + ": too many rows");
  return static_cast<unsigned>(blocks);
}

void move_rows(const Context& ctx, float* dst, const float* src, const int64_t* idx, int64_t n,
               int C, bool scatter) {
  const std::size_t total = static_cast<std::size_t>(n) * C;
  if (total == 0) return;
  moe_move_rows_kernel<<<grid_for(total), kThreads, 0, ctx.stream()>>>(dst, src, idx, C, total,
                                                                       scatter);
  ORRERY_KERNEL_CHECK("moe_move_rows_kernel");
}

}  // namespace

void moe_softmax(const Context& ctx, float* probs, int64_t N, int E) {
  if (N == 0 || E == 0) return;
  moe_softmax_kernel<<<warp_grid_for("moe_softmax", N), kThreads, 0, ctx.stream()>>>(probs, N, E);
  ORRERY_KERNEL_CHECK("moe_softmax_kernel");
}

void moe_gather_rows(const Context& ctx, float* dst, const float* src, const int64_t* idx,
                     int64_t n, int C) {
  move_rows(ctx, dst, src, idx, n, C, false);
}

void moe_scatter_rows(const Context& ctx, float* dst, const float* src, const int64_t* idx,
                      int64_t n, int C) {
  move_rows(ctx, dst, src, idx, n, C, true);
}

void moe_gated_sum(const Context& ctx, float* out, const float* rows, const int64_t* row,
                   const float* weight, int64_t N, int K, int C) {
  const std::size_t n = static_cast<std::size_t>(N) * C;
  if (n == 0 || K == 0) return;
  moe_gated_sum_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(out, rows, row, weight, K, C, n);
  ORRERY_KERNEL_CHECK("moe_gated_sum_kernel");
}

void moe_gated_sum_backward(const Context& ctx, float* drows, float* dgate, const float* dy,
                            const float* rows, const int64_t* row, const float* weight, int64_t N,
                            int K, int C) {
  const int64_t assignments = N * K;
  if (assignments == 0) return;
  const std::size_t n = static_cast<std::size_t>(assignments) * C;
  if (n > 0) {
    moe_gated_rows_backward_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(drows, dy, row,
                                                                               weight, K, C, n);
    ORRERY_KERNEL_CHECK("moe_gated_rows_backward_kernel");
  }
  moe_gate_grad_kernel<<<warp_grid_for("moe_gated_sum_backward", assignments), kThreads, 0,
                         ctx.stream()>>>(dgate, dy, rows, row, K, C, assignments);
  ORRERY_KERNEL_CHECK("moe_gate_grad_kernel");
}

void moe_rows_add(const Context& ctx, float* d, const float* rows, const int64_t* row, int64_t N,
                  int K, int C) {
  moe_gated_sum(ctx, d, rows, row, nullptr, N, K, C);
}

}  // namespace orrery::runtime::cuda
