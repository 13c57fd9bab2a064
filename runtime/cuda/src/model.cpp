// The reference GPT on one CUDA device (see cuda/model.hpp): the CPU model's layout on device
// buffers, and the pieces of gpt_pieces.hpp (the CPU model's, written once) over the CUDA kernels.
#include "orrery/runtime/cuda/model.hpp"

#include <stdexcept>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/model/flops.hpp"
#include "orrery/runtime/buffers.hpp"
#include "orrery/runtime/gpt_pieces.hpp"

namespace orrery::runtime::cuda {
namespace {

// A host pointer's place in a device array of the same layout (dev_base null: unbound, null).
float* rebase(const float* host_ptr, const float* host_base, float* dev_base) {
  if (host_ptr == nullptr || dev_base == nullptr) return nullptr;
  return dev_base + (host_ptr - host_base);
}

BlockParams rebase(const BlockParams& p, const float* hb, float* db) {
  return BlockParams{rebase(p.ln1w, hb, db), rebase(p.ln1b, hb, db),    rebase(p.qkvw, hb, db),
                     rebase(p.qkvb, hb, db), rebase(p.projw, hb, db),   rebase(p.projb, hb, db),
                     rebase(p.ln2w, hb, db), rebase(p.ln2b, hb, db),    rebase(p.fcw, hb, db),
                     rebase(p.fcb, hb, db),  rebase(p.fcprojw, hb, db), rebase(p.fcprojb, hb, db)};
}

FfnParams rebase(const FfnParams& p, const float* hb, float* db) {
  return FfnParams{rebase(p.fcw, hb, db), rebase(p.fcb, hb, db), rebase(p.fcprojw, hb, db),
                   rebase(p.fcprojb, hb, db)};
}

MoeParams rebase(const MoeParams& p, const float* hb, float* db) {
  MoeParams out;
  out.router = rebase(p.router, hb, db);
  for (const auto& f : p.shared) out.shared.push_back(rebase(f, hb, db));
  for (const auto& f : p.experts) out.experts.push_back(rebase(f, hb, db));
  return out;
}

void zero_async(const Context& ctx, float* p, std::size_t n) {
  if (n == 0) return;
  ORRERY_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), ctx.stream()));
}

}  // namespace

const FloatArray& GpuGpt::download_params() {
  params.copy_to_host(host.params.data(), host.params.size());
  return host.params;
}

GpuGpt gpu_gpt_create(Gpt host, bool device_storage) {
  // Any shard gpt_create made (it validated the layer range): a pipeline stage keeps its blocks at
  // index layer - layer_begin, and a head-only stage its own wte copy (wpe null), as on the CPU.
  GpuGpt m;
  m.host = std::move(host);
  if (!device_storage) {  // ZeRO 3 (cuda/zero3.hpp) binds every pointer to its working buffers
    m.blocks.resize(m.host.blocks.size());
    m.dblocks.resize(m.host.dblocks.size());
    // The MoE blocks' pointer structs in the host's shape (experts, shared experts), unbound.
    for (const auto& b : m.host.moe) m.moe.push_back(rebase(b, nullptr, nullptr));
    m.dmoe = m.moe;
    return m;
  }
  const std::size_t n = m.host.params.size();
  m.params.resize(n);
  m.grads.resize(n);
  m.params.copy_from_host(m.host.params.data(), n);
  const float* hp = m.host.params.data();
  const float* hg = m.host.grads.data();
  float* dp = m.params.data();
  float* dg = m.grads.data();
  m.embed = EmbedParams{rebase(m.host.embed.wte, hp, dp), rebase(m.host.embed.wpe, hp, dp)};
  m.dembed = EmbedParams{rebase(m.host.dembed.wte, hg, dg), rebase(m.host.dembed.wpe, hg, dg)};
  for (const auto& b : m.host.blocks) m.blocks.push_back(rebase(b, hp, dp));
  for (const auto& b : m.host.dblocks) m.dblocks.push_back(rebase(b, hg, dg));
  for (const auto& b : m.host.moe) m.moe.push_back(rebase(b, hp, dp));
  for (const auto& b : m.host.dmoe) m.dmoe.push_back(rebase(b, hg, dg));
  m.head = HeadParams{rebase(m.host.head.lnfw, hp, dp), rebase(m.host.head.lnfb, hp, dp),
                      rebase(m.host.head.lmw, hp, dp)};
  m.dhead = HeadParams{rebase(m.host.dhead.lnfw, hg, dg), rebase(m.host.dhead.lnfb, hg, dg),
                       rebase(m.host.dhead.lmw, hg, dg)};
  return m;
}

void gpu_zero_grad(const Context& ctx, GpuGpt& model) {
  zero_async(ctx, model.grads.data(), model.grads.size());
}

GpuActivations gpu_activations(const GpuGpt& m, int B, int T, Recompute recompute) {
  if (B < 1 || T < 1 || T > m.config().max_seq) {
    throw InputError("model: batch (" + std::to_string(B) + ", " + std::to_string(T) +
                     ") needs B >= 1 and 1 <= T <= seq " + std::to_string(m.config().max_seq));
  }
  GpuActivations a;
  // Rounded to 64 floats (256 bytes) per buffer: every pointer keeps cudaMalloc's alignment.
  carve_activations(a,
                    buffer_shape(m.dims(), m.config(), m.host.shard,
                                 std::size_t(m.host.num_blocks()), B, T, recompute),
                    64);
  a.inputs.resize(std::size_t(B) * T);
  a.targets.resize(std::size_t(B) * T);
  if (m.config().moe.enabled()) a.moe.resize(std::size_t(m.host.num_blocks()));
  return a;
}

GpuGradScratch gpu_grad_scratch(const GpuGpt& m, int B, int T, Recompute recompute) {
  GpuGradScratch s;
  carve_grad_scratch(s,
                     buffer_shape(m.dims(), m.config(), m.host.shard,
                                  std::size_t(m.host.num_blocks()), B, T, recompute),
                     64);
  return s;
}

// ---------------------------------------------------------------- pieces (gpt_pieces.hpp)

void CudaKernels::zero(float* p, std::size_t n) const { zero_async(*ctx, p, n); }

void CudaKernels::copy(float* dst, const float* src, std::size_t n) const {
  ORRERY_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, ctx->stream()));
}

void CudaKernels::upload_tokens(int32_t* dst, const int32_t* src, std::size_t n) const {
  ORRERY_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, n * sizeof(int32_t), cudaMemcpyHostToDevice, ctx->stream()));
}

const float* CudaKernels::to_host(const float* p, std::size_t n,
                                  std::vector<float>& staging) const {
  staging.resize(n);
  if (n == 0) return staging.data();
  ORRERY_CUDA_CHECK(
      cudaMemcpyAsync(staging.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost, ctx->stream()));
  ORRERY_CUDA_CHECK(cudaStreamSynchronize(ctx->stream()));
  return staging.data();
}

void CudaKernels::upload_bytes(void* dst, const void* src, std::size_t bytes) const {
  if (bytes == 0) return;
  ORRERY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream()));
}

void gpu_embed_forward(const Context& ctx, const GpuGpt& m, GpuActivations& acts,
                       const int32_t* inputs, const GptHooks& hooks) {
  pieces::embed_forward(CudaKernels{&ctx}, m, acts, inputs, hooks);
}

void gpu_block_forward(const Context& ctx, const GpuGpt& m, GpuActivations& acts, int layer,
                       const GptHooks& hooks) {
  pieces::block_forward(CudaKernels{&ctx}, m, acts, layer, hooks);
}

float gpu_head_forward(const Context& ctx, const GpuGpt& m, GpuActivations& acts,
                       const int32_t* targets, const GptHooks& hooks) {
  return pieces::head_forward(CudaKernels{&ctx}, m, acts, targets, hooks);
}

void gpu_head_backward(const Context& ctx, GpuGpt& m, GpuActivations& acts, GpuGradScratch& s,
                       float loss_scale, const GptHooks& hooks) {
  pieces::head_backward(CudaKernels{&ctx}, m, acts, s, loss_scale, hooks);
}

void gpu_block_backward(const Context& ctx, GpuGpt& m, GpuActivations& acts, GpuGradScratch& s,
                        int layer, const GptHooks& hooks) {
  pieces::block_backward(CudaKernels{&ctx}, m, acts, s, layer, hooks);
}

void gpu_embed_backward(const Context& ctx, GpuGpt& m, GpuActivations& acts, GpuGradScratch& s,
                        const GptHooks& hooks) {
  pieces::embed_backward(CudaKernels{&ctx}, m, acts, s, hooks);
}

float gpu_forward(const Context& ctx, const GpuGpt& m, GpuActivations& acts, const int32_t* inputs,
                  const int32_t* targets, const GptHooks& hooks) {
  return pieces::forward(CudaKernels{&ctx}, m, acts, inputs, targets, hooks);
}

void gpu_backward(const Context& ctx, GpuGpt& m, GpuActivations& acts, GpuGradScratch& s,
                  float loss_scale, const GptHooks& hooks) {
  pieces::backward(CudaKernels{&ctx}, m, acts, s, loss_scale, hooks);
}

}  // namespace orrery::runtime::cuda
