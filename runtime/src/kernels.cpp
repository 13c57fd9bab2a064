// fp32 CPU kernels of the reference GPT (see kernels.hpp for the conventions). Matrix products go
// to OpenBLAS; everything else is a loop over rows, split over a small pool of threads whose idle
// workers sleep. Not OpenMP on purpose: libgomp's idle workers spin, and on a few cores they steal
// time from OpenBLAS's own threads at every switch between a loop and a matmul.
// Compiled with -O3 (and -march=native unless ORRERY_NATIVE=OFF): the loops below are written so
// that GCC vectorises them (no calls to libm in the hot loops: exp_approx instead of expf).
#include "orrery/runtime/kernels.hpp"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "orrery/runtime/gelu.hpp"
#include "orrery/runtime/half.hpp"

namespace orrery::runtime {
namespace {

int g_threads = 1;

// e^x for x in about [-87, 88] (clamped outside), relative error < 1e-7: Cody-Waite reduction to
// [-ln2/2, ln2/2] and the Cephes expf polynomial. Written branch-free so loops vectorise.
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float t = x * 1.4426950408889634f;
  const float r = (t + 12582912.0f) - 12582912.0f;  // round to nearest integer (1.5 * 2^23 trick)
  const float f = (x - r * 0.693359375f) - r * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * f + 1.3981999507e-3f;
  p = p * f + 8.3334519073e-3f;
  p = p * f + 4.1665795894e-2f;
  p = p * f + 1.6666665459e-1f;
  p = p * f + 5.0000001201e-1f;
  p = p * f * f + f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(r) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

inline float tanh_approx(float u) { return 1.0f - 2.0f / (1.0f + exp_approx(2.0f * u)); }

// OpenBLAS (pthread build) must not start its own threads inside our parallel loops; while one is
// active every sgemm runs on the calling thread.
class BlasSingleThreaded {
 public:
  BlasSingleThreaded() : saved_(g_threads) {
    if (saved_ > 1) openblas_set_num_threads(1);
  }
  ~BlasSingleThreaded() {
    if (saved_ > 1) openblas_set_num_threads(saved_);
  }
  BlasSingleThreaded(const BlasSingleThreaded&) = delete;
  BlasSingleThreaded& operator=(const BlasSingleThreaded&) = delete;

 private:
  int saved_;
};

// Splits [0, n) into one contiguous chunk per thread; the caller runs chunk 0. Workers sleep on a
// condition variable between jobs. One job at a time: a second concurrent caller runs serially.
class ThreadPool {
 public:
  using Fn = std::function<void(std::ptrdiff_t, std::ptrdiff_t)>;
  ~ThreadPool() { resize(1); }

  void resize(int threads) {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
    std::lock_guard<std::mutex> lk(m_);
    stop_ = false;
    // Each worker starts from the current generation, so a job posted before it first waits is
    // still seen as new.
    for (int i = 1; i < threads; ++i)
      workers_.emplace_back([this, i, g = generation_] { work(i, g); });
  }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(std::ptrdiff_t n, const Fn& fn) {
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (workers_.empty() || n < 2 || !busy.owns_lock()) {
      fn(0, n);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(m_);
      job_ = &fn;
      n_ = n;
      pending_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    cv_.notify_all();
    const auto [b, e] = chunk(0);
    fn(b, e);
    std::unique_lock<std::mutex> lk(m_);
    done_.wait(lk, [this] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  std::pair<std::ptrdiff_t, std::ptrdiff_t> chunk(int i) const {
    const std::ptrdiff_t parts = size();
    return {n_ * i / parts, n_ * (i + 1) / parts};
  }
  void work(int i, uint64_t seen) {
    for (;;) {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      if (stop_) return;
      const Fn* fn = job_;
      const auto [b, e] = chunk(i);
      lk.unlock();
      if (b < e) (*fn)(b, e);
      lk.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::mutex m_;
  std::condition_variable cv_, done_;
  const Fn* job_ = nullptr;
  std::ptrdiff_t n_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

ThreadPool& pool() {
  static ThreadPool p;
  return p;
}

// Runs fn(begin, end) over [0, n) on the pool when the work is worth a wake-up, else inline.
template <class F>
void parallel_rows(std::ptrdiff_t n, std::size_t work, F&& fn) {
  if (g_threads > 1 && work >= 16384 && n > 1) {
    pool().run(n, ThreadPool::Fn(std::forward<F>(fn)));
  } else {
    fn(std::ptrdiff_t{0}, n);
  }
}

}  // namespace

void parallel_for(std::ptrdiff_t n, std::size_t work,
                  const std::function<void(std::ptrdiff_t, std::ptrdiff_t)>& fn) {
  parallel_rows(n, work, fn);
}

void set_compute_threads(int threads) {
  threads = std::max(1, threads);
  openblas_set_num_threads(threads);
  if (threads != pool().size()) pool().resize(threads);
  g_threads = threads;
}

int compute_threads() { return g_threads; }

namespace {
std::atomic<Precision> g_matmul_precision{Precision::FP32};

// The rounded copies of a product's operands, per calling thread (ranks in one process each run
// their own thread).
struct RoundedOperands {
  std::vector<float> a, b, c;
};
thread_local RoundedOperands t_rounded;

// src rounded into buf (grown as needed) when p is a 16-bit format; src itself otherwise.
const float* rounded_operand(std::vector<float>& buf, const float* src, std::size_t n,
                             Precision p) {
  if (!is_16_bit(p) || src == nullptr) return src;
  if (buf.size() < n) buf.resize(n);
  round_to_precision(buf.data(), src, n, p);
  return buf.data();
}
}  // namespace

void set_matmul_precision(Precision p) { g_matmul_precision.store(p); }
Precision matmul_precision() { return g_matmul_precision.load(); }

void round_to_precision(float* dst, const float* src, std::size_t n, Precision p) {
  parallel_for(static_cast<std::ptrdiff_t>(n), n, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
    for (std::ptrdiff_t i = i0; i < i1; ++i) dst[i] = round_to(p, src[i]);
  });
}

// ------------------------------------------------------------------------------------ embedding

void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* o = out + (static_cast<std::size_t>(b) * T + t) * C;
      const float* we = wte + static_cast<std::size_t>(inp[b * T + t]) * C;
      if (wpe == nullptr) {  // rotary positions: the token embedding alone
        for (int c = 0; c < C; ++c) o[c] = we[c];
        continue;
      }
      const float* pe = wpe + static_cast<std::size_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] = we[c] + pe[c];
    }
  }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                      int C) {
  // Serial: two positions may hold the same token, and the work is tiny next to the matmuls.
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const float* d = dout + (static_cast<std::size_t>(b) * T + t) * C;
      if (dwte != nullptr) {
        float* dw = dwte + static_cast<std::size_t>(inp[b * T + t]) * C;
        for (int c = 0; c < C; ++c) dw[c] += d[c];
      }
      if (dwpe != nullptr) {
        float* dp = dwpe + static_cast<std::size_t>(t) * C;
        for (int c = 0; c < C; ++c) dp[c] += d[c];
      }
    }
  }
}

// ------------------------------------------------------------------------------------ layernorm

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int B, int T, int C) {
  const std::ptrdiff_t N = static_cast<std::ptrdiff_t>(B) * T;
  parallel_rows(N, static_cast<std::size_t>(N) * C, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
    for (std::ptrdiff_t i = i0; i < i1; ++i) {
      const float* x = inp + i * C;
      float* o = out + i * C;
      float s = 0.0f;
      for (int c = 0; c < C; ++c) s += x[c];
      const float m = s / static_cast<float>(C);
      float v = 0.0f;
      for (int c = 0; c < C; ++c) {
        const float d = x[c] - m;
        v += d * d;
      }
      v /= static_cast<float>(C);
      const float r = 1.0f / std::sqrt(v + 1e-5f);
      if (bias != nullptr) {
        for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * r * weight[c] + bias[c];
      } else {
        for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * r * weight[c];
      }
      mean[i] = m;
      rstd[i] = r;
    }
  });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int B, int T, int C) {
  const std::ptrdiff_t N = static_cast<std::ptrdiff_t>(B) * T;
  std::mutex merge;
  parallel_rows(N, static_cast<std::size_t>(N) * C, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
    // Per-chunk parameter-gradient partial sums, merged under a lock at the end.
    std::vector<float> dw(static_cast<std::size_t>(C), 0.0f), db(static_cast<std::size_t>(C), 0.0f);
    float* dwp = dw.data();
    float* dbp = db.data();
    for (std::ptrdiff_t i = i0; i < i1; ++i) {
      const float* x = inp + i * C;
      const float* d = dout + i * C;
      float* di = dinp + i * C;
      const float m = mean[i];
      const float r = rstd[i];
      float dnorm_mean = 0.0f;
      float dnorm_norm_mean = 0.0f;
      for (int c = 0; c < C; ++c) {
        const float norm = (x[c] - m) * r;
        const float dnorm = weight[c] * d[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
        dbp[c] += d[c];
        dwp[c] += norm * d[c];
      }
      dnorm_mean /= static_cast<float>(C);
      dnorm_norm_mean /= static_cast<float>(C);
      for (int c = 0; c < C; ++c) {
        const float norm = (x[c] - m) * r;
        const float dnorm = weight[c] * d[c];
        di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
      }
    }
    std::lock_guard<std::mutex> lk(merge);
    for (int c = 0; c < C; ++c) dweight[c] += dwp[c];
    if (dbias != nullptr) {
      for (int c = 0; c < C; ++c) dbias[c] += dbp[c];
    }
  });
}

// ------------------------------------------------------------------------------------ rmsnorm

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int B, int T,
                     int C) {
  const std::ptrdiff_t N = static_cast<std::ptrdiff_t>(B) * T;
  parallel_rows(N, static_cast<std::size_t>(N) * C, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
    for (std::ptrdiff_t i = i0; i < i1; ++i) {
      const float* x = inp + i * C;
      float* o = out + i * C;
      float ss = 0.0f;
      for (int c = 0; c < C; ++c) ss += x[c] * x[c];
      const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + 1e-5f);
      for (int c = 0; c < C; ++c) o[c] = x[c] * r * weight[c];
      rstd[i] = r;
    }
  });
}

// y = x r w, r = (mean(x²) + eps)^(-1/2): dx_c = r (w_c dy_c) - x_c r³ / C · sum_j (w_j dy_j x_j).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int B, int T, int C) {
  const std::ptrdiff_t N = static_cast<std::ptrdiff_t>(B) * T;
  std::mutex merge;
  parallel_rows(N, static_cast<std::size_t>(N) * C, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
    std::vector<float> dw(static_cast<std::size_t>(C), 0.0f);
    for (std::ptrdiff_t i = i0; i < i1; ++i) {
      const float* x = inp + i * C;
      const float* d = dout + i * C;
      float* di = dinp + i * C;
      const float r = rstd[i];
      float dot = 0.0f;
      for (int c = 0; c < C; ++c) {
        dot += weight[c] * d[c] * x[c];
        dw[static_cast<std::size_t>(c)] += x[c] * r * d[c];
      }
      const float k = dot * r * r * r / static_cast<float>(C);
      for (int c = 0; c < C; ++c) di[c] += weight[c] * d[c] * r - x[c] * k;
    }
    std::lock_guard<std::mutex> lk(merge);
    for (int c = 0; c < C; ++c) dweight[c] += dw[static_cast<std::size_t>(c)];
  });
}

// ------------------------------------------------------------------------------------ rope

namespace {
// cos and sin of the rotation of pair i at position t: angle t · theta^(-2i/hs), in double.
void rope_table(std::vector<float>& cs, std::vector<float>& sn, int T, int hs, float theta) {
  const int half = hs / 2;
  cs.resize(static_cast<std::size_t>(T) * half);
  sn.resize(cs.size());
  for (int i = 0; i < half; ++i) {
    const double inv = std::pow(static_cast<double>(theta), -2.0 * i / static_cast<double>(hs));
    for (int t = 0; t < T; ++t) {
      const double a = static_cast<double>(t) * inv;
      cs[static_cast<std::size_t>(t) * half + i] = static_cast<float>(std::cos(a));
      sn[static_cast<std::size_t>(t) * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

// Rotates the q and k heads of every row by +angle (sign 1) or -angle (sign -1).
void rope_apply(float* qkv, int B, int T, int NH, int NKV, int hs, float theta, float sign) {
  if (hs % 2 != 0) throw std::invalid_argument("rope: head size " + std::to_string(hs) + " is odd");
  std::vector<float> cs, sn;
  rope_table(cs, sn, T, hs, theta);
  const int half = hs / 2, W = (NH + 2 * NKV) * hs, rotated = NH + NKV;
  const std::ptrdiff_t rows = static_cast<std::ptrdiff_t>(B) * T;
  parallel_rows(rows, static_cast<std::size_t>(rows) * rotated * hs,
                [&](std::ptrdiff_t r0, std::ptrdiff_t r1) {
                  for (std::ptrdiff_t r = r0; r < r1; ++r) {
                    const std::size_t t = static_cast<std::size_t>(r % T);
                    const float* c = cs.data() + t * half;
                    const float* s = sn.data() + t * half;
                    for (int h = 0; h < rotated; ++h) {
                      float* x =
                          qkv + static_cast<std::size_t>(r) * W + static_cast<std::size_t>(h) * hs;
                      for (int i = 0; i < half; ++i) {
                        const float a = x[i], b = x[i + half], sv = sign * s[i];
                        x[i] = a * c[i] - b * sv;
                        x[i + half] = b * c[i] + a * sv;
                      }
                    }
                  }
                });
}
}  // namespace

void rope_forward(float* qkv, int B, int T, int NH, int NKV, int hs, float theta) {
  rope_apply(qkv, B, T, NH, NKV, hs, theta, 1.0f);
}

void rope_backward(float* dqkv, int B, int T, int NH, int NKV, int hs, float theta) {
  rope_apply(dqkv, B, T, NH, NKV, hs, theta, -1.0f);
}

// ------------------------------------------------------------------------------------ matmul

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int B,
                    int T, int C, int OC) {
  const int N = B * T;
  const Precision p = matmul_precision();
  inp = rounded_operand(t_rounded.a, inp, static_cast<std::size_t>(N) * C, p);
  weight = rounded_operand(t_rounded.b, weight, static_cast<std::size_t>(OC) * C, p);
  float beta = 0.0f;
  if (bias != nullptr) {
    // Start from the bias and let sgemm accumulate: one pass over out instead of two.
    parallel_rows(N, static_cast<std::size_t>(N) * OC, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
      for (std::ptrdiff_t i = i0; i < i1; ++i) std::memcpy(out + i * OC, bias, sizeof(float) * OC);
    });
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta, out,
              OC);
  if (is_16_bit(p)) round_to_precision(out, out, static_cast<std::size_t>(N) * OC, p);
}

void bias_backward(float* dbias, const float* dout, int B, int T, int C) {
  const std::size_t N = static_cast<std::size_t>(B) * T;
  // Split by column bands of 16 (one cache line), rows in order: same sums for any thread count.
  const std::ptrdiff_t bands = (C + 15) / 16;
  parallel_rows(bands, N * static_cast<std::size_t>(C), [&](std::ptrdiff_t b0, std::ptrdiff_t b1) {
    const int c0 = static_cast<int>(b0 * 16), c1 = std::min(C, static_cast<int>(b1 * 16));
    for (std::size_t i = 0; i < N; ++i) {
      const float* d = dout + i * C;
      for (int c = c0; c < c1; ++c) dbias[c] += d[c];
    }
  });
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int B, int T, int C, int OC, bool accumulate_dinp) {
  const int N = B * T;
  const Precision p = matmul_precision();
  dout = rounded_operand(t_rounded.c, dout, static_cast<std::size_t>(N) * OC, p);
  inp = rounded_operand(t_rounded.a, inp, static_cast<std::size_t>(N) * C, p);
  weight = rounded_operand(t_rounded.b, weight, static_cast<std::size_t>(OC) * C, p);
  if (dinp != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                accumulate_dinp ? 1.0f : 0.0f, dinp, C);
    // An overwritten dinp is the product's output (16 bits); one accumulated into is a sum the
    // caller holds in fp32 (the residual stream's gradient), as autocast's fp32 residual adds.
    if (!accumulate_dinp && is_16_bit(p))
      round_to_precision(dinp, dinp, static_cast<std::size_t>(N) * C, p);
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
              dweight, C);
  if (dbias != nullptr) bias_backward(dbias, dout, B, T, OC);
}

// ------------------------------------------------------------------------------------ attention
//
// Per (batch, head): S = scale * Q K^T, P = causal softmax(S), Y = P V, all with sgemm on strided
// views of the fused qkv. Causality is exploited in row blocks of kBlock: rows [r0, r1) only need
// keys [0, r1), which halves the work for long sequences. (batch, head) pairs are split over the
// threads, each sgemm single-threaded.

namespace {
constexpr int kBlock = 64;

// One query head over its key/value head: q, k, v point at the head's first row in the fused qkv
// (row stride W), y at its columns of out (row stride C).
void attention_forward_head(float* y, float* P, const float* q, const float* k, const float* v,
                            int T, int W, int C, int hs, float scale) {
  for (int r0 = 0; r0 < T; r0 += kBlock) {
    const int r1 = std::min(T, r0 + kBlock);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, scale,
                q + static_cast<std::size_t>(r0) * W, W, k, W, 0.0f,
                P + static_cast<std::size_t>(r0) * T, T);
  }
  for (int t = 0; t < T; ++t) {
    float* row = P + static_cast<std::size_t>(t) * T;
    float mx = row[0];
    for (int j = 1; j <= t; ++j) mx = std::max(mx, row[j]);
    float sum = 0.0f;
    for (int j = 0; j <= t; ++j) {
      const float e = exp_approx(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
    for (int j = 0; j <= t; ++j) row[j] *= inv;
    for (int j = t + 1; j < T; ++j) row[j] = 0.0f;
  }
  for (int r0 = 0; r0 < T; r0 += kBlock) {
    const int r1 = std::min(T, r0 + kBlock);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, 1.0f,
                P + static_cast<std::size_t>(r0) * T, T, v, W, 0.0f,
                y + static_cast<std::size_t>(r0) * C, C);
  }
}

// Its backward: dq, dk, dv (the same offsets in dinp) += ...; dP is scratch.
void attention_backward_head(float* dq, float* dk, float* dv, float* dP, const float* dy,
                             const float* q, const float* k, const float* v, const float* P, int T,
                             int W, int C, int hs, float scale) {
  for (int r0 = 0; r0 < T; r0 += kBlock) {
    const int r1 = std::min(T, r0 + kBlock);
    // dP[r0:r1, 0:r1] = dY[r0:r1] V[0:r1]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, 1.0f,
                dy + static_cast<std::size_t>(r0) * C, C, v, W, 0.0f,
                dP + static_cast<std::size_t>(r0) * T, T);
    // dV[r0:r1] += P[r0:T, r0:r1]^T dY[r0:T]  (P is zero above the diagonal)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1 - r0, hs, T - r0, 1.0f,
                P + static_cast<std::size_t>(r0) * T + r0, T, dy + static_cast<std::size_t>(r0) * C,
                C, 1.0f, dv + static_cast<std::size_t>(r0) * W, W);
  }
  // Softmax backward: dS = P * (dP - sum_j P dP); the scale is folded into the next products.
  for (int t = 0; t < T; ++t) {
    const float* p = P + static_cast<std::size_t>(t) * T;
    float* d = dP + static_cast<std::size_t>(t) * T;
    float dot = 0.0f;
    for (int j = 0; j <= t; ++j) dot += p[j] * d[j];
    for (int j = 0; j <= t; ++j) d[j] = p[j] * (d[j] - dot);
    for (int j = t + 1; j < T; ++j) d[j] = 0.0f;
  }
  for (int r0 = 0; r0 < T; r0 += kBlock) {
    const int r1 = std::min(T, r0 + kBlock);
    // dQ[r0:r1] += scale * dS[r0:r1, 0:r1] K[0:r1]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, scale,
                dP + static_cast<std::size_t>(r0) * T, T, k, W, 1.0f,
                dq + static_cast<std::size_t>(r0) * W, W);
    // dK[r0:r1] += scale * dS[r0:T, r0:r1]^T Q[r0:T]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1 - r0, hs, T - r0, scale,
                dP + static_cast<std::size_t>(r0) * T + r0, T, q + static_cast<std::size_t>(r0) * W,
                W, 1.0f, dk + static_cast<std::size_t>(r0) * W, W);
  }
}

void check_heads(const char* fn, int C, int NH, int NKV) {
  if (NH < 1 || NKV < 1 || C % NH != 0 || NH % NKV != 0) {
    throw std::invalid_argument(std::string(fn) + ": C (" + std::to_string(C) +
                                ") must be a multiple of NH (" + std::to_string(NH) +
                                ") and NH of NKV (" + std::to_string(NKV) + ")");
  }
}

}  // namespace

void attention_forward(float* out, float* att, const float* inp, int B, int T, int C, int NH,
                       int NKV) {
  check_heads("attention_forward", C, NH, NKV);
  const int hs = C / NH, W = C + 2 * NKV * hs, group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  BlasSingleThreaded blas_guard;
  const std::ptrdiff_t pairs = static_cast<std::ptrdiff_t>(B) * NH;
  parallel_rows(pairs, pairs * 16384, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
    for (std::ptrdiff_t i = i0; i < i1; ++i) {
      const std::ptrdiff_t b = i / NH, h = i % NH, g = h / group;
      const float* row0 = inp + static_cast<std::size_t>(b) * T * W;
      attention_forward_head(out + static_cast<std::size_t>(b) * T * C + h * hs,
                             att + static_cast<std::size_t>(i) * T * T, row0 + h * hs,
                             row0 + C + g * hs, row0 + C + (NKV + g) * hs, T, W, C, hs, scale);
    }
  });
}

void attention_backward(float* dinp, float* datt, const float* dout, const float* inp,
                        const float* att, int B, int T, int C, int NH, int NKV) {
  check_heads("attention_backward", C, NH, NKV);
  const int hs = C / NH, W = C + 2 * NKV * hs, group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  BlasSingleThreaded blas_guard;
  // Split over (batch, key/value head): the query heads of a group add into the same dk, dv, so one
  // thread runs them in head order (with NKV = NH this is one head per item, as before).
  const std::ptrdiff_t items = static_cast<std::ptrdiff_t>(B) * NKV;
  parallel_rows(items, items * group * 16384, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
    for (std::ptrdiff_t i = i0; i < i1; ++i) {
      const std::ptrdiff_t b = i / NKV, g = i % NKV;
      const std::size_t row0 = static_cast<std::size_t>(b) * T * W;
      const std::size_t koff = row0 + C + g * hs, voff = row0 + C + (NKV + g) * hs;
      for (std::ptrdiff_t h = g * group; h < (g + 1) * group; ++h) {
        const std::size_t qoff = row0 + h * hs;
        const std::size_t pair = static_cast<std::size_t>(b * NH + h);
        attention_backward_head(dinp + qoff, dinp + koff, dinp + voff, datt + pair * T * T,
                                dout + static_cast<std::size_t>(b) * T * C + h * hs, inp + qoff,
                                inp + koff, inp + voff, att + pair * T * T, T, W, C, hs, scale);
      }
    }
  });
}

// ------------------------------------------------------------------------------------ gelu

void gelu_forward(float* out, const float* inp, std::size_t N) {
  parallel_rows(static_cast<std::ptrdiff_t>(N), N, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
    for (std::ptrdiff_t i = i0; i < i1; ++i) {
      const float x = inp[i];
      out[i] = gelu::value(x, tanh_approx(gelu::tanh_arg(x)));
    }
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t N) {
  parallel_rows(static_cast<std::ptrdiff_t>(N), N, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
    for (std::ptrdiff_t i = i0; i < i1; ++i) {
      const float x = inp[i];
      dinp[i] += gelu::derivative(x, tanh_approx(gelu::tanh_arg(x))) * dout[i];
    }
  });
}

// ------------------------------------------------------------------------------------ residual

// ------------------------------------------------------------------------------------ swiglu

void swiglu_forward(float* out, const float* inp, std::size_t N, int F) {
  const std::size_t Fs = static_cast<std::size_t>(F);
  parallel_rows(static_cast<std::ptrdiff_t>(N), N * Fs, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
    for (std::ptrdiff_t i = i0; i < i1; ++i) {
      const float* gate = inp + static_cast<std::size_t>(i) * 2 * Fs;
      const float* up = gate + Fs;
      float* o = out + static_cast<std::size_t>(i) * Fs;
      for (std::size_t j = 0; j < Fs; ++j) {
        const float g = gate[j];
        o[j] = g / (1.0f + std::exp(-g)) * up[j];
      }
    }
  });
}

// out = silu(g) u: du = silu(g) dout; dg = u dout sig(g) (1 + g (1 - sig(g))).
void swiglu_backward(float* dinp, const float* inp, const float* dout, std::size_t N, int F) {
  const std::size_t Fs = static_cast<std::size_t>(F);
  parallel_rows(static_cast<std::ptrdiff_t>(N), N * Fs, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
    for (std::ptrdiff_t i = i0; i < i1; ++i) {
      const float* gate = inp + static_cast<std::size_t>(i) * 2 * Fs;
      const float* up = gate + Fs;
      float* dgate = dinp + static_cast<std::size_t>(i) * 2 * Fs;
      float* dup = dgate + Fs;
      const float* d = dout + static_cast<std::size_t>(i) * Fs;
      for (std::size_t j = 0; j < Fs; ++j) {
        const float g = gate[j];
        const float sig = 1.0f / (1.0f + std::exp(-g));
        dup[j] += g * sig * d[j];
        dgate[j] += up[j] * d[j] * sig * (1.0f + g * (1.0f - sig));
      }
    }
  });
}

void residual_forward(float* out, const float* inp1, const float* inp2, std::size_t N) {
  for (std::size_t i = 0; i < N; ++i) out[i] = inp1[i] + inp2[i];
}

void bias_residual_forward(float* out, const float* residual, const float* partial,
                           const float* bias, int B, int T, int C) {
  const std::ptrdiff_t N = static_cast<std::ptrdiff_t>(B) * T;
  parallel_rows(N, static_cast<std::size_t>(N) * C, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
    for (std::ptrdiff_t i = i0; i < i1; ++i) {
      float* o = out + i * C;
      const float* r = residual + i * C;
      const float* p = partial + i * C;
      if (bias != nullptr) {
        for (int c = 0; c < C; ++c) o[c] = r[c] + p[c] + bias[c];
      } else {
        for (int c = 0; c < C; ++c) o[c] = r[c] + p[c];
      }
    }
  });
}

// ------------------------------------------------------------------------------------ loss

float softmax_crossentropy_forward(float* losses, float* logits, const int32_t* targets, int B,
                                   int T, int V) {
  const std::ptrdiff_t N = static_cast<std::ptrdiff_t>(B) * T;
  parallel_rows(N, static_cast<std::size_t>(N) * V, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
    for (std::ptrdiff_t i = i0; i < i1; ++i) {
      float* row = logits + i * V;
      float mx = row[0];
      for (int j = 1; j < V; ++j) mx = std::max(mx, row[j]);
      const float target_logit = row[targets[i]];
      float sum = 0.0f;
      for (int j = 0; j < V; ++j) {
        const float e = exp_approx(row[j] - mx);
        row[j] = e;
        sum += e;
      }
      const float inv = 1.0f / sum;
      for (int j = 0; j < V; ++j) row[j] *= inv;
      // -log softmax from the logits (not from the rounded probability): exact for tiny p too.
      losses[i] = std::log(sum) - (target_logit - mx);
    }
  });
  double total = 0.0;  // in row order: the same for any thread count
  for (std::ptrdiff_t i = 0; i < N; ++i) total += losses[i];
  return static_cast<float>(total / static_cast<double>(N));
}

void softmax_crossentropy_backward(float* probs, const int32_t* targets, float dloss, int B, int T,
                                   int V) {
  const std::ptrdiff_t N = static_cast<std::ptrdiff_t>(B) * T;
  parallel_rows(N, static_cast<std::size_t>(N) * V, [&](std::ptrdiff_t i0, std::ptrdiff_t i1) {
    for (std::ptrdiff_t i = i0; i < i1; ++i) {
      float* row = probs + i * V;
      row[targets[i]] -= 1.0f;
      for (int j = 0; j < V; ++j) row[j] *= dloss;
    }
  });
}

}  // namespace orrery::runtime
