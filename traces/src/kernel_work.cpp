// The work of GPU kernels from their launching operators' shapes (kernel_work.hpp says the rules),
// and its record in a trace's extra_json.
#include "orrery/traces/kernel_work.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "import_common.hpp"
#include "orrery/common/error.hpp"

namespace orrery::traces {

namespace {

constexpr double kMaxDim = 1099511627776.0;  // 2^40: larger is not a shape a GPU ran

// Bytes per element of an "Input type" ("c10::BFloat16", "float", "c10::Half"); 0 when unknown.
int32_t type_bytes(std::string_view type) {
  if (type.rfind("c10::", 0) == 0) type.remove_prefix(5);
  if (type == "long int" || type == "int64_t") return 8;
  return static_cast<int32_t>(detail::dtype_bytes(type));
}

// Elements of a tensor; 0 when a dimension is not a positive integer of a sane size.
double numel(const std::vector<int64_t>& dims) {
  double n = 1;
  for (int64_t d : dims) {
    if (d <= 0 || double(d) > kMaxDim) return 0;
    n *= double(d);
  }
  return n;
}

bool positive(const std::vector<int64_t>& dims) { return !dims.empty() && numel(dims) > 0; }

const OpInput* input(const std::vector<OpInput>& in, size_t i, OpInput::Kind kind) {
  return i < in.size() && in[i].kind == kind ? &in[i] : nullptr;
}

// The element size the op's operands have: the first tensor input's known type.
int32_t op_elem_bytes(const std::vector<OpInput>& in) {
  for (const auto& x : in)
    if (x.kind == OpInput::Kind::Tensor)
      if (const int32_t b = type_bytes(x.type); b > 0) return b;
  return 0;
}

// A GEMM out (m x n) = A (m x k) · B (k x n), `batch` of them.
std::optional<OpWork> gemm(double m, double n, double k, double batch, int32_t e) {
  if (!(m > 0 && n > 0 && k > 0 && batch > 0) || m > kMaxDim || n > kMaxDim || k > kMaxDim)
    return std::nullopt;
  OpWork w;
  w.cls = "gemm";
  w.m = m, w.n = n, w.k = k, w.batch = batch;
  w.elem_bytes = e > 0 ? e : 2;
  w.flops = 2.0 * batch * m * n * k;
  w.bytes = double(w.elem_bytes) * batch * (m * k + k * n + m * n);
  return w;
}

double lead(const std::vector<int64_t>& d, size_t drop) {
  return numel(std::vector<int64_t>(d.begin(), d.end() - static_cast<std::ptrdiff_t>(drop)));
}

// The matrix products (kernel_work.hpp's table): A's and B's indices, and how to read them.
std::optional<OpWork> gemm_work(std::string_view op, const std::vector<OpInput>& in) {
  const int32_t e = op_elem_bytes(in);
  const size_t a_at = op == "aten::addmm" || op == "aten::baddbmm" ? 1 : 0;
  const OpInput* a = input(in, a_at, OpInput::Kind::Tensor);
  const OpInput* b = input(in, a_at + 1, OpInput::Kind::Tensor);
  if (!a || !b || !positive(a->dims) || !positive(b->dims)) return std::nullopt;
  const auto& A = a->dims;
  const auto& B = b->dims;
  if (op == "aten::mm" || op == "aten::addmm") {
    if (A.size() != 2 || B.size() != 2 || A[1] != B[0]) return std::nullopt;
    return gemm(double(A[0]), double(B[1]), double(A[1]), 1, e);
  }
  if (op == "aten::bmm" || op == "aten::baddbmm") {
    if (A.size() != 3 || B.size() != 3 || A[0] != B[0] || A[2] != B[1]) return std::nullopt;
    return gemm(double(A[1]), double(B[2]), double(A[2]), double(A[0]), e);
  }
  if (op == "aten::linear") {  // weight [N, K]
    if (A.size() < 2 || B.size() != 2 || A.back() != B[1]) return std::nullopt;
    return gemm(lead(A, 1), double(B[0]), double(A.back()), 1, e);
  }
  // aten::matmul
  if (A.size() < 2 || B.size() < 2 || A.back() != B[B.size() - 2]) return std::nullopt;
  if (B.size() == 2) return gemm(lead(A, 1), double(B[1]), double(A.back()), 1, e);
  if (A.size() != B.size()) return std::nullopt;
  return gemm(double(A[A.size() - 2]), double(B.back()), double(A.back()), lead(A, 2), e);
}

// Fused attention: the query's input index, is_causal's (in "Concrete Inputs"; the efficient
// kernels' custom_mask_type, 1 or 2 causal), and the layout: the scaled_dot_product ops take
// [B, H, T, D], the kernels' own ops they call ([B, T, H, D]) launch the kernels in PyTorch 2.x.
struct AttentionOp {
  std::string_view name;
  size_t query;
  size_t causal;
  bool backward;
  bool bthd;
};
constexpr AttentionOp kAttention[] = {
    {"aten::_scaled_dot_product_flash_attention", 0, 4, false, false},
    {"aten::_scaled_dot_product_efficient_attention", 0, 6, false, false},
    {"aten::_scaled_dot_product_cudnn_attention", 0, 6, false, false},
    {"aten::_scaled_dot_product_flash_attention_backward", 1, 11, true, false},
    {"aten::_scaled_dot_product_efficient_attention_backward", 1, 11, true, false},
    {"aten::_scaled_dot_product_cudnn_attention_backward", 1, 14, true, false},
    {"aten::_flash_attention_forward", 0, 8, false, true},
    {"aten::_flash_attention_backward", 1, 11, true, true},
    {"aten::_efficient_attention_forward", 0, 9, false, true},
    {"aten::_efficient_attention_backward", 1, 14, true, true},
};

std::optional<OpWork> attention_work(const AttentionOp& a, const std::vector<OpInput>& in) {
  const OpInput* q = input(in, a.query, OpInput::Kind::Tensor);
  const OpInput* k = input(in, a.query + 1, OpInput::Kind::Tensor);
  if (!q || !k || q->dims.size() != 4 || k->dims.size() != 4 || !positive(q->dims) ||
      !positive(k->dims))
    return std::nullopt;
  const auto& Q = q->dims;  // [B, H, T, D], or [B, T, H, D]
  const auto& K = k->dims;
  if (Q[0] != K[0] || Q[3] != K[3]) return std::nullopt;
  const size_t t_at = a.bthd ? 1 : 2, h_at = a.bthd ? 2 : 1;
  std::string c = a.causal < in.size() ? in[a.causal].concrete : std::string();
  std::transform(c.begin(), c.end(), c.begin(), [](unsigned char x) { return std::tolower(x); });
  const bool causal = c == "true" || c == "1" || c == "2";
  OpWork w;
  w.cls = "attention";
  w.m = double(Q[t_at]), w.n = double(K[t_at]), w.k = double(Q[3]);
  w.batch = double(Q[0]) * double(Q[h_at]);
  w.elem_bytes = type_bytes(q->type) > 0 ? type_bytes(q->type) : 2;
  w.backward = a.backward;
  const double mult = a.backward ? 2.0 : 1.0;
  w.flops = mult * (causal ? 2.0 : 4.0) * w.batch * w.m * w.n * w.k;
  w.bytes = mult * double(w.elem_bytes) * w.batch * w.k * (2.0 * w.m + 2.0 * w.n);
  return w;
}

bool one_of(std::string_view op, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), op) != names.end();
}

// The memory-bound class of an op ("" for none of them).
std::string memory_class(std::string_view op) {
  if (op.rfind("aten::", 0) != 0) return {};
  const std::string_view base = op.substr(6);
  if (base.rfind("_foreach_", 0) == 0 ||
      one_of(base, {"_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_"}))
    return "optimizer";
  if (one_of(base, {"native_layer_norm", "native_layer_norm_backward", "layer_norm", "rms_norm",
                    "_fused_rms_norm", "_fused_rms_norm_backward", "native_group_norm",
                    "native_group_norm_backward"}))
    return "layernorm";
  if (one_of(base, {"_softmax", "softmax", "_log_softmax", "log_softmax", "_softmax_backward_data",
                    "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward",
                    "nll_loss", "nll_loss_nd", "cross_entropy_loss"}))
    return "softmax_loss";
  if (one_of(base, {"add",
                    "add_",
                    "mul",
                    "mul_",
                    "sub",
                    "sub_",
                    "div",
                    "div_",
                    "gelu",
                    "gelu_backward",
                    "silu",
                    "silu_backward",
                    "relu",
                    "relu_",
                    "threshold_backward",
                    "native_dropout",
                    "native_dropout_backward",
                    "copy_",
                    "_to_copy",
                    "clone",
                    "fill_",
                    "zero_",
                    "tanh",
                    "tanh_backward",
                    "sigmoid",
                    "sigmoid_backward",
                    "neg",
                    "pow",
                    "rsqrt",
                    "sqrt",
                    "exp",
                    "where",
                    "masked_fill",
                    "masked_fill_",
                    "addcmul_",
                    "addcdiv_",
                    "lerp_",
                    "mul_out",
                    "add_out"}))
    return "elementwise";
  return {};
}

double input_bytes(const OpInput& x, int32_t fallback) {
  const int32_t e = type_bytes(x.type) > 0 ? type_bytes(x.type) : fallback;
  if (x.kind == OpInput::Kind::Tensor) return double(e) * numel(x.dims);
  double s = 0;
  if (x.kind == OpInput::Kind::List)
    for (const auto& d : x.list) s += double(e) * numel(d);
  return s;
}

std::optional<OpWork> memory_work(std::string_view op, const std::string& cls,
                                  const std::vector<OpInput>& in) {
  const int32_t known = op_elem_bytes(in);
  const int32_t fallback = known > 0 ? known : 4;
  double read = 0, largest = 0;
  std::vector<double> each;
  for (const auto& x : in) {
    const double b = input_bytes(x, fallback);
    each.push_back(b);
    read += b;
    largest = std::max(largest, b);
  }
  if (read <= 0) return std::nullopt;
  double written = largest;
  const std::string_view base = op.substr(6);
  if (base.rfind("_fused_", 0) == 0) {
    // params, grads, exp_avgs, exp_avg_sqs, ...: params and both moments written.
    written = 0;
    for (size_t i : {size_t{0}, size_t{2}, size_t{3}})
      if (i < each.size() && (base != "_fused_sgd_" || i == 0)) written += each[i];
  } else if (base.rfind("_foreach_", 0) == 0 || base.back() == '_') {
    written = each.front();  // in place: the first input (or list) is overwritten
  }
  OpWork w;
  w.cls = cls;
  w.elem_bytes = fallback;
  w.bytes = read + written;
  return w;
}

std::optional<OpWork> op_work_unchecked(std::string_view op, const std::vector<OpInput>& inputs);

}  // namespace

std::optional<OpWork> op_work(std::string_view op, const std::vector<OpInput>& inputs) {
  auto sane = [](std::optional<OpWork> w) -> std::optional<OpWork> {
    // Shapes no GPU ran (a trace's junk) would overflow the span's 64-bit byte count.
    if (w && !(w->flops >= 0 && w->flops < 1e30 && w->bytes >= 0 && w->bytes < 1e18))
      return std::nullopt;
    return w;
  };
  return sane(op_work_unchecked(op, inputs));
}

namespace {
std::optional<OpWork> op_work_unchecked(std::string_view op, const std::vector<OpInput>& inputs) {
  if (one_of(op, {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear",
                  "aten::matmul"}))
    return gemm_work(op, inputs);
  for (const auto& a : kAttention)
    if (a.name == op) return attention_work(a, inputs);
  const std::string cls = memory_class(op);
  if (cls.empty()) return std::nullopt;
  return memory_work(op, cls, inputs);
}
}  // namespace

std::optional<std::pair<std::string, std::vector<OpInput>>> parse_nvtx_op(std::string_view text) {
  const size_t comma = text.find(',');
  const size_t at = text.find(", sizes = [");
  if (comma == std::string_view::npos || at == std::string_view::npos) return std::nullopt;
  // The balanced [...] after "sizes = ".
  const size_t open = at + 10;
  int depth = 0;
  size_t close = std::string_view::npos;
  for (size_t i = open; i < text.size() && close == std::string_view::npos; ++i) {
    if (text[i] == '[') ++depth;
    if (text[i] == ']' && --depth == 0) close = i;
  }
  if (close == std::string_view::npos) return std::nullopt;
  nlohmann::json sizes;
  try {
    sizes = nlohmann::json::parse(text.substr(open, close - open + 1));
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  if (!sizes.is_array()) return std::nullopt;
  std::vector<OpInput> in;
  for (const auto& v : sizes) {
    OpInput x;
    if (!v.is_array()) return std::nullopt;
    for (const auto& d : v) {
      if (!d.is_number_integer()) return std::nullopt;
      x.dims.push_back(d.get<int64_t>());
    }
    x.kind = x.dims.empty() ? OpInput::Kind::None : OpInput::Kind::Tensor;
    in.push_back(std::move(x));
  }
  return std::make_pair(std::string(text.substr(0, comma)), std::move(in));
}

// ---- the record in extra_json

namespace {
const std::vector<std::string> kColumns = {"rank", "stream", "start_ns", "end_ns",     "group",
                                           "op",   "class",  "flops",    "bytes",      "m",
                                           "n",    "k",      "batch",    "elem_bytes", "backward"};
}

void write_kernel_work(Trace& t, const std::vector<KernelWork>& rows) {
  nlohmann::json extra;
  try {
    extra = nlohmann::json::parse(t.meta.extra_json.empty() ? "{}" : t.meta.extra_json);
  } catch (const nlohmann::json::exception&) {
    extra = nlohmann::json::object();
  }
  if (!extra.is_object()) extra = nlohmann::json::object();
  if (rows.empty()) {
    extra.erase("kernel_work");
  } else {
    nlohmann::json r = nlohmann::json::array();
    for (const auto& k : rows)
      r.push_back({k.rank, k.stream, k.start_ns, k.end_ns, k.group, k.op, k.work.cls, k.work.flops,
                   k.work.bytes, k.work.m, k.work.n, k.work.k, k.work.batch, k.work.elem_bytes,
                   k.work.backward ? 1 : 0});
    extra["kernel_work"] = {{"columns", kColumns}, {"rows", std::move(r)}};
  }
  // Operator names come from imported files and may hold bytes that are not UTF-8: replaced.
  t.meta.extra_json = extra.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::vector<KernelWork> read_kernel_work(const Trace& t) {
  std::vector<KernelWork> out;
  const std::string where = (t.path.empty() ? std::string("trace") : t.path) + ": extra_json";
  nlohmann::json extra;
  try {
    extra = nlohmann::json::parse(t.meta.extra_json.empty() ? "{}" : t.meta.extra_json);
  } catch (const nlohmann::json::exception&) {
    return out;  // not ours to judge: other readers of extra_json say so
  }
  if (!extra.is_object() || !extra.contains("kernel_work")) return out;
  try {
    const auto& kw = extra.at("kernel_work");
    if (kw.at("columns").get<std::vector<std::string>>() != kColumns)
      throw InputError(where + " kernel_work: unknown columns (written by another version?)");
    for (const auto& r : kw.at("rows")) {
      if (!r.is_array() || r.size() != kColumns.size())
        throw InputError(where + " kernel_work: a row without " + std::to_string(kColumns.size()) +
                         " fields");
      KernelWork k;
      k.rank = r[0].get<int32_t>();
      k.stream = r[1].get<int32_t>();
      k.start_ns = r[2].get<int64_t>();
      k.end_ns = r[3].get<int64_t>();
      k.group = r[4].get<int64_t>();
      k.op = r[5].get<std::string>();
      k.work.cls = r[6].get<std::string>();
      k.work.flops = r[7].get<double>();
      k.work.bytes = r[8].get<double>();
      k.work.m = r[9].get<double>();
      k.work.n = r[10].get<double>();
      k.work.k = r[11].get<double>();
      k.work.batch = r[12].get<double>();
      k.work.elem_bytes = r[13].get<int32_t>();
      k.work.backward = r[14].get<int>() != 0;
      out.push_back(std::move(k));
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(where + " kernel_work: " + e.what());
  }
  return out;
}

bool tf32_tensor_core_kernel(std::string_view kernel_name) {
  std::string lower(kernel_name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* mark : {"tf32", "tensorop", "xmma", "hmma"})
    if (lower.find(mark) != std::string::npos) return true;
  return false;
}

std::vector<std::string> recorded_gpu_names(const Trace& t) {
  std::set<std::string> names;
  try {
    const auto extra = nlohmann::json::parse(t.meta.extra_json.empty() ? "{}" : t.meta.extra_json);
    if (extra.is_object() && extra.contains("import") && extra["import"].is_object() &&
        extra["import"].contains("devices") && extra["import"]["devices"].is_array())
      for (const auto& d : extra["import"]["devices"])
        if (d.is_string()) names.insert(d.get<std::string>());
  } catch (const nlohmann::json::exception&) {
  }
  for (const auto& r : t.ranks)
    if (r.device != "cpu" && !r.device.empty()) names.insert(r.device);
  return {names.begin(), names.end()};
}

}  // namespace orrery::traces
