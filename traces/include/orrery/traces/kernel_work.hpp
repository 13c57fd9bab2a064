// The work of a trace's GPU kernels, where the trace knows it: the operator that launched each
// kernel, its class (the simulator's op classes: gemm, attention, elementwise, layernorm,
// softmax_loss, optimizer), its FLOPs and bytes, and a matrix product's shape. `orrery calibrate`
// fits a GPU hardware profile from it (sim/calibrate.hpp); the simulator's cost model prices the
// same quantities.
//
// Where it comes from: `orrery import kineto` reads it from PyTorch's profiler with
// record_shapes=True, which writes "Input Dims", "Input type" and "Concrete Inputs" on each cpu_op
// event; a kernel names its launching op through its "External id" (or its launch's). Kineto
// before PyTorch 1.13 gave launches and kernels their correlation id as "External id": in such a
// file (every launch's External id its correlation id) a launch's op is the innermost shaped
// cpu_op open on its thread when the launch started.
// `orrery import nsys` reads it from the NVTX ranges of emit_nvtx(record_shapes=True) (parse_nvtx_op):
// a kernel's op is the innermost such range open on the thread when its launch (the runtime call
// with its correlation id) was made. NVTX carries no dtypes, so only GEMM and attention ops are
// attributed there (their FLOPs need none; their operands are taken as 16-bit), not the
// memory-bound ones, whose bytes would be a guess. The work of
// an op launching several kernels (split-K and its reduction, a fused optimizer's chunks) belongs
// to the op instance (`group`): calibrate sums the kernels of a group, and each kernel span carries
// an equal share of the op's flops and bytes, so sums over spans stay exact.
//
// Stored in the trace's meta.extra_json under "kernel_work" ({"columns": [...], "rows": [[...]]}):
// spans have no free-form attributes, so a row names its kernel span by (rank, stream, start_ns,
// end_ns), which the trace store keeps exactly.
//
// The rules (op_work), per operator (M x N output over K, batch b; e = bytes per element of the
// operands, from "Input type"):
//   aten::mm [M,K],[K,N]; aten::addmm (bias),[M,K],[K,N]; aten::bmm [b,M,K],[b,K,N];
//   aten::baddbmm (c),[b,M,K],[b,K,N]; aten::linear [...,K],[N,K] (M = the product of the leading
//   dims); aten::matmul [...,M,K] with [K,N] (M the product) or [...,K,N] (batched):
//     gemm, flops 2·b·M·N·K, bytes e·b·(M·K + K·N + M·N).
//   aten::_scaled_dot_product_{flash,efficient,cudnn}_attention and their _backward: q [B,H,T,D],
//   k [B,H,S,D] (the query's index in the op's inputs differs in the backward ops), is_causal from
//   "Concrete Inputs"; the ops they call, which launch the kernels, aten::_flash_attention_forward /
//   _backward and aten::_efficient_attention_forward / _backward: q [B,T,H,D], k [B,S,H,D], causal
//   from is_causal or custom_mask_type (1, 2): attention, with the simulator's counting (cost_model.hpp): forward 2·B·H·T·S·D
//   causal, 4·B·H·T·S·D not, backward twice the forward; bytes e·B·H·D·(2T + 2S) (q, k, v read, out
//   written), backward twice.
//   Norms (native_layer_norm, rms_norm, ... and backward): layernorm; softmax, log_softmax, nll_loss,
//   cross_entropy (and backward): softmax_loss; elementwise maps (add, mul, gelu, silu, dropout,
//   copy_, ...): elementwise; aten::_foreach_* and _fused_adam(w)_ / _fused_sgd_: optimizer. Their
//   bytes: every tensor input read once and the output written once, the output being the largest
//   input (the first input, or list, for in-place and _foreach_ ops; params, exp_avg and exp_avg_sq
//   for the fused optimizers). Zero FLOPs (the simulator prices them by bytes).
//   Anything else, or shapes that do not fit the rule (a K that differs between operands, a
//   dimension that is not a positive integer): no work (the kernel is not attributed).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "orrery/traces/trace.hpp"

namespace orrery::traces {

// The work of one operator instance (op_work's result).
struct OpWork {
  std::string cls;  // gemm | attention | elementwise | layernorm | softmax_loss | optimizer
  double flops = 0;
  double bytes = 0;
  // gemm: out (m x n) over k, `batch` products; attention: queries m, keys n, head size k, batch =
  // sequences x heads. 0 for the memory-bound classes.
  double m = 0, n = 0, k = 0, batch = 1;
  int32_t elem_bytes = 0;  // bytes per element of the operands (0: unknown)
  bool backward = false;   // attention: the backward kernel
};

// One kernel span's share of its op's work.
struct KernelWork {
  int32_t rank = 0;
  int32_t stream = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t group = 0;  // the op instance (unique per rank): its kernels share the op's work
  std::string op;     // "aten::mm"
  OpWork work;        // the whole op's work (not the kernel's share)
};

// One input of an operator as the profiler recorded it: a tensor's dims ("Input Dims" entry with
// numbers), a tensor list's dims (an entry of lists), or neither (scalars, empty entries); its
// "Input type" and "Concrete Inputs" texts.
struct OpInput {
  enum class Kind { None, Tensor, List };
  Kind kind = Kind::None;
  std::vector<int64_t> dims;               // Tensor
  std::vector<std::vector<int64_t>> list;  // List
  std::string type;                        // "c10::BFloat16", "float", "TensorList", ...
  std::string concrete;                    // "True", "0.0", ""
};

// The work of an operator from its profiler arguments; nullopt when the op is not one of the rules
// above or its shapes do not fit them.
std::optional<OpWork> op_work(std::string_view op, const std::vector<OpInput>& inputs);

// An operator range of PyTorch's NVTX annotations (torch.autograd.profiler.emit_nvtx with
// record_shapes=True, as nsys records them): "aten::mm, seq = 12, op_id = 40, sizes = [[64, 128],
// [128, 32]], input_op_ids = [...]" -> the op's name and its inputs' dims (no dtypes: NVTX does not
// carry them). nullopt for a range without "sizes = [...]" or with sizes that are not lists of
// integers.
std::optional<std::pair<std::string, std::vector<OpInput>>> parse_nvtx_op(std::string_view text);

// The kernel work recorded in a trace (empty when it has none). InputError naming the trace when
// "kernel_work" is present but malformed.
std::vector<KernelWork> read_kernel_work(const Trace& t);
// Records `rows` in t.meta.extra_json (replacing any earlier kernel_work).
void write_kernel_work(Trace& t, const std::vector<KernelWork>& rows);

// A GEMM kernel that multiplies 32-bit operands on tensor cores in TF32 (PyTorch with
// allow_tf32, cuBLAS's default for fp32 on Ampere and Hopper), by its name: NVIDIA's tensor-core
// GEMM kernels say "tf32" (cuBLAS's "ampere_tf32_s1688gemm_...", "sm80_xmma_gemm_tf32f32_..."),
// "tensorop" (CUTLASS's "cutlass_80_tensorop_s1688gemm_..."), "xmma" or "hmma"; the CUDA-core
// kernels ("ampere_sgemm_128x64_nn", "volta_sgemm_...", "gemv2T_kernel...") do not. Only meaningful
// for a kernel whose operator's operands are 4 bytes.
bool tf32_tensor_core_kernel(std::string_view kernel_name);

// The GPU names a trace records (Kineto's deviceProperties, kept by the importer under
// extra_json "import"."devices", and the ranks' device descriptions). Empty when none.
std::vector<std::string> recorded_gpu_names(const Trace& t);

}  // namespace orrery::traces
