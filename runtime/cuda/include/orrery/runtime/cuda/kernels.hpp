// CUDA versions of every CPU kernel of runtime/kernels.hpp, same semantics: same argument order
// (outputs first, `d`-prefixed gradients), same shapes, backward functions ACCUMULATE (+=) into
// their gradients exactly where the CPU ones do. All pointers are device pointers; every call is
// queued on ctx.stream and returns without waiting, except softmax_crossentropy_forward, which
// returns the mean loss and so waits for its stream.
//
// Matrix products go to cuBLAS (column-major calls on the row-major tensors, as llm.c does) in the
// context's math mode:
//   kFp32: fp32 inputs, fp32 compute (CUBLAS_COMPUTE_32F): matches the CPU to rounding;
//   kTf32: fp32 inputs, TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32);
//   kBf16: inputs converted to bf16 into the context's scratch, bf16 tensor cores with fp32
//          accumulation and fp32 output (CUBLAS_COMPUTE_32F). Parameters, gradients, optimizer
//          state and all other kernels stay fp32: bf16 mixed precision with fp32 master weights.
// Attention is llm.c's: q, k, v permuted to (B,NH,T,hs), strided-batched GEMMs for the scores and
// the weighted sum, a causal softmax kernel between them. LayerNorm's bias and the embedding's wpe
// may be null, as on the CPU.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/runtime/cuda/device.hpp"
#include "orrery/runtime/kernels.hpp"    // ORRERY_MODEL_KERNELS
#include "orrery/runtime/moe_block.hpp"  // ORRERY_MOE_KERNELS
#include "orrery/runtime/optimizer.hpp"
#include "orrery/runtime/tensor.hpp"

namespace orrery::runtime::cuda {

enum class MathMode { kFp32, kTf32, kBf16 };
// runtime.precision (parsed once by the scenario: precision_of) as cuBLAS's math mode: fp32, tf32,
// bf16; fp16 throws InputError naming the key (the CUDA trainer has no loss scaling).
MathMode math_mode_of(Precision p);
const char* math_mode_name(MathMode m);

// Throws InternalError naming the call and cuBLAS's status string when st != success.
void cublas_check(cublasStatus_t st, const char* what);

// What every kernel call needs: the stream it is queued on, a cuBLAS handle bound to that stream,
// the math mode of the matrix products, and grow-on-demand device scratch (attention's permuted
// q/k/v, bf16 copies of GEMM operands). Not thread-safe; one per stream.
class Context {
 public:
  Context(cudaStream_t stream, MathMode math);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  MathMode math() const { return math_; }
  void set_math(MathMode m) { math_ = m; }

  // Device scratch of at least `count` elements in one of kSlots independent slots. Growing waits
  // for the stream first (the old buffer may still be read by queued kernels). Contents undefined.
  static constexpr int kSlots = 4;
  float* scratch_f32(int slot, std::size_t count) const;
  uint16_t* scratch_bf16(int slot, std::size_t count) const;  // raw __nv_bfloat16 storage
  std::size_t scratch_bytes() const;

 private:
  cudaStream_t stream_;
  cublasHandle_t cublas_ = nullptr;
  MathMode math_;
  mutable DeviceArray<float> f32_[kSlots];
  mutable DeviceArray<uint16_t> bf16_[kSlots];
};

// Column-major GEMM C = alpha op(A) op(B) + beta C in the context's math mode (the building block
// of the kernels below; exposed for tests). `batch` > 1: strided-batched.
void gemm(const Context& ctx, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
          const float* A, int lda, long long stride_a, const float* B, int ldb, long long stride_b,
          float beta, float* C, int ldc, long long stride_c, int batch = 1);

// --- the ops of runtime/kernels.hpp
void encoder_forward(const Context& ctx, float* out, const int32_t* inp, const float* wte,
                     const float* wpe, int B, int T, int C);
// Deterministic: no atomics. dwpe sums over b in order; for dwte the B*T positions are sorted by token
// on the device (stable radix sort; scratch slot 2) and each token's dout rows are added to its row
// in ascending position order. These are the CPU reference's additions in its order, so the result
// is bit-identical from call to call and equal to runtime::encoder_backward's. The host is not
// waited for, unless scratch slot 2 has to grow.
void encoder_backward(const Context& ctx, float* dwte, float* dwpe, const float* dout,
                      const int32_t* inp, int B, int T, int C);

void layernorm_forward(const Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int B, int T, int C);
void layernorm_backward(const Context& ctx, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, int B, int T, int C);

void matmul_forward(const Context& ctx, float* out, const float* inp, const float* weight,
                    const float* bias, int B, int T, int C, int OC);
void matmul_backward(const Context& ctx, float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight, int B, int T, int C,
                     int OC, bool accumulate_dinp = true);

// Grouped-query (NKV < NH, NH % NKV == 0) and multi-query attention as on the CPU: the permute
// copies each query head's key/value head into the per-head layout, and the backward's un-permute
// sums a key/value head's gradient over its group's query heads in head order (a gather, no
// atomics: deterministic).
void attention_forward(const Context& ctx, float* out, float* att, const float* inp, int B, int T,
                       int C, int NH, int NKV);
void attention_backward(const Context& ctx, float* dinp, float* datt, const float* dout,
                        const float* inp, const float* att, int B, int T, int C, int NH, int NKV);

// Llama-style blocks (runtime/kernels.hpp): RMSNorm (one warp per row; the gain's gradient as
// column sums), SwiGLU on [gate | up] rows, RoPE in place (angles, cosines and sines in double).
void rmsnorm_forward(const Context& ctx, float* out, float* rstd, const float* inp,
                     const float* weight, int B, int T, int C);
void rmsnorm_backward(const Context& ctx, float* dinp, float* dweight, const float* dout,
                      const float* inp, const float* weight, const float* rstd, int B, int T,
                      int C);
void swiglu_forward(const Context& ctx, float* out, const float* inp, std::size_t N, int F);
void swiglu_backward(const Context& ctx, float* dinp, const float* inp, const float* dout,
                     std::size_t N, int F);
void rope_forward(const Context& ctx, float* qkv, int B, int T, int NH, int NKV, int hs,
                  float theta);
void rope_backward(const Context& ctx, float* dqkv, int B, int T, int NH, int NKV, int hs,
                   float theta);

void gelu_forward(const Context& ctx, float* out, const float* inp, std::size_t N);
void gelu_backward(const Context& ctx, float* dinp, const float* inp, const float* dout,
                   std::size_t N);

void residual_forward(const Context& ctx, float* out, const float* inp1, const float* inp2,
                      std::size_t N);
void bias_residual_forward(const Context& ctx, float* out, const float* residual,
                           const float* partial, const float* bias, int B, int T, int C);
void bias_backward(const Context& ctx, float* dbias, const float* dout, int B, int T, int C);

// Returns the mean loss over B*T tokens (summed in double on the device); waits for ctx.stream().
float softmax_crossentropy_forward(const Context& ctx, float* losses, float* logits,
                                   const int32_t* targets, int B, int T, int V);
void softmax_crossentropy_backward(const Context& ctx, float* probs, const int32_t* targets,
                                   float dloss, int B, int T, int V);

// AdamW on elements [offset, offset + n) of the flat arrays, the maths of runtime::adamw_update
// (optimizer.hpp), decay ranges in absolute flat coordinates (host memory, sorted).
void adamw_update(const Context& ctx, float* params, const float* grads, float* m, float* v,
                  std::size_t offset, std::size_t n, std::span<const ParamRange> decay,
                  int64_t step, const AdamWConfig& cfg);

// out (N) = in * scale, in place allowed (used for loss scaling and averaging).
void scale(const Context& ctx, float* out, const float* in, float s, std::size_t N);

// --- the mixture-of-experts kernels of runtime/moe_block.hpp (ORRERY_MOE_KERNELS), same
// arguments, index tables in device memory. The softmax gives a warp to a row and sums in double;
// rows are moved and weighted one thread per element, each output element summed over its token's
// top_k choices in k order (no atomics: deterministic); the gates' gradient gives a warp to an
// assignment, its dot product summed in double.
void moe_softmax(const Context& ctx, float* probs, int64_t N, int E);
void moe_gather_rows(const Context& ctx, float* dst, const float* src, const int64_t* idx,
                     int64_t n, int C);
void moe_scatter_rows(const Context& ctx, float* dst, const float* src, const int64_t* idx,
                      int64_t n, int C);
void moe_gated_sum(const Context& ctx, float* out, const float* rows, const int64_t* row,
                   const float* weight, int64_t N, int K, int C);
void moe_gated_sum_backward(const Context& ctx, float* drows, float* dgate, const float* dy,
                            const float* rows, const int64_t* row, const float* weight, int64_t N,
                            int K, int C);
void moe_rows_add(const Context& ctx, float* d, const float* rows, const int64_t* row, int64_t N,
                  int K, int C);

// The kernels above as gpt_pieces.hpp's `Kernels`: each call queued on the context's stream.
struct CudaKernels {
  const Context* ctx = nullptr;
#define ORRERY_CUDA_KERNEL(name)                                       \
  template <class... A>                                                \
  auto name(A&&... a) const {                                          \
    return ::orrery::runtime::cuda::name(*ctx, std::forward<A>(a)...); \
  }
  ORRERY_MODEL_KERNELS(ORRERY_CUDA_KERNEL)
  ORRERY_MOE_KERNELS(ORRERY_CUDA_KERNEL)
#undef ORRERY_CUDA_KERNEL
  void zero(float* p, std::size_t n) const;  // cudaMemsetAsync
  void copy(float* dst, const float* src,
            std::size_t n) const;  // cudaMemcpyAsync, device to device
  // Host token ids copied into device storage on the stream (pageable source: the copy is staged
  // before the call returns, so the host buffer may be refilled at once).
  void upload_tokens(int32_t* dst, const int32_t* src, std::size_t n) const;

  // moe_pieces.hpp's buffers: device arrays that only grow (by half again at least, so routing
  // that varies from step to step soon stops reallocating). Growing waits for the stream first
  // (queued kernels may still read the old storage) and drops the contents.
  template <class T>
  using Buffer = DeviceArray<T>;
  template <class T>
  T* fit(DeviceArray<T>& b, std::size_t n) const {
    if (b.size() < n) {
      ORRERY_CUDA_CHECK(cudaStreamSynchronize(ctx->stream()));
      b.resize(std::max(n, b.size() + b.size() / 2));
    }
    return b.data();
  }
  // The n device values at p, downloaded into `staging` (the host waits for the stream).
  const float* to_host(const float* p, std::size_t n, std::vector<float>& staging) const;
  // The n host values at h, uploaded into `staging` on the stream (pageable: staged before the
  // call returns, so the host array may change at once).
  template <class T>
  const T* to_device(const T* h, std::size_t n, DeviceArray<T>& staging) const {
    T* d = fit(staging, n);
    upload_bytes(d, h, n * sizeof(T));
    return d;
  }

 private:
  void upload_bytes(void* dst, const void* src, std::size_t bytes) const;
};

}  // namespace orrery::runtime::cuda

#define ORRERY_CUBLAS_STR2(x) #x
#define ORRERY_CUBLAS_STR(x) ORRERY_CUBLAS_STR2(x)
#define ORRERY_CUBLAS_CHECK(expr)               \
  ::orrery::runtime::cuda::cublas_check((expr), \
                                        #expr " at " __FILE__ ":" ORRERY_CUBLAS_STR(__LINE__))
