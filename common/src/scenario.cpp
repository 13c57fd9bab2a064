// Scenario parsing and validation. The YAML tree is checked against one table of known keys
// (kKeys), so an unknown key gets a "did you mean" and every message names file, line and key.
#include "orrery/common/scenario.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>

#include "orrery/common/error.hpp"

namespace orrery {

namespace {
// runtime.precision as a scenario writes it: lower case, one of fp32, tf32, bf16, fp16.
std::optional<Precision> scenario_precision(const std::string& text) {
  const auto p = precision_from_string(text);
  if (!p || text != to_string(*p)) return std::nullopt;
  return p;
}

// runtime.precision by device (cpu: fp32, bf16, fp16; cuda: fp32, tf32, bf16), fp16's loss
// scaling keys, and parallel.grad_dtype (not with gradient compression).
void check_precision(const Scenario& s, const std::string& origin);
void check_moe(const Scenario& s, const std::string& origin);
// zero.offload_* against each other, parallel.zero and the device (check_offload).
void check_offload(const Scenario& s, const std::string& origin);
}  // namespace

namespace {

enum class Type { Int, Uint, Double, Bool, String, IntList };

const char* type_name(Type t) {
  switch (t) {
    case Type::Int:
      return "an integer";
    case Type::Uint:
      return "a non-negative integer";
    case Type::Double:
      return "a number";
    case Type::Bool:
      return "true or false";
    case Type::String:
      return "a string";
    case Type::IntList:
      return "a list of integers ([11, 12, 12, 13], or 11,12,12,13 on the command line)";
  }
  return "?";
}

struct KeySpec {
  const char* path;  // "model.layers"
  Type type;
  std::function<void(Scenario&, const YAML::Node&)> set;
  std::function<void(const Scenario&, YAML::Emitter&)> emit;
};

// A list of integers: a YAML sequence ([1, 3]) or a comma-separated scalar ("1,3", which is what
// --set parallel.pp_layers=1,3 gives); an empty scalar is the empty list. nullopt when an entry is
// not an integer.
std::optional<std::vector<int>> int_list(const YAML::Node& n) {
  std::vector<int> out;
  if (n.IsSequence()) {
    for (const auto& e : n) {
      if (!e.IsScalar()) return std::nullopt;
      try {
        out.push_back(e.as<int>());
      } catch (const YAML::BadConversion&) {
        return std::nullopt;
      }
    }
    return out;
  }
  if (!n.IsScalar()) return std::nullopt;
  std::string text = n.Scalar();
  if (text.find_first_not_of(" \t") == std::string::npos) return out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) return std::nullopt;
    item = item.substr(b, e - b + 1);
    size_t used = 0;
    try {
      const long v = std::stol(item, &used);
      if (used != item.size() || v < std::numeric_limits<int>::min() ||
          v > std::numeric_limits<int>::max())
        return std::nullopt;
      out.push_back(static_cast<int>(v));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return out;
}

std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return "[" + out + "]";
}

#define ORRERY_KEY(path, type, field, T)                                       \
  KeySpec {                                                                    \
    path, type, [](Scenario& s, const YAML::Node& n) { s.field = n.as<T>(); }, \
        [](const Scenario& s, YAML::Emitter& e) { e << s.field; }              \
  }

const std::vector<KeySpec>& key_table() {
  static const std::vector<KeySpec> keys = {
      ORRERY_KEY("name", Type::String, name, std::string),
      ORRERY_KEY("model.name", Type::String, model.name, std::string),
      ORRERY_KEY("model.layers", Type::Int, model.layers, int),
      ORRERY_KEY("model.d_model", Type::Int, model.d_model, int),
      ORRERY_KEY("model.heads", Type::Int, model.heads, int),
      ORRERY_KEY("model.vocab", Type::Int, model.vocab, int),
      ORRERY_KEY("model.seq", Type::Int, model.seq, int),
      ORRERY_KEY("model.kv_heads", Type::Int, model.kv_heads, int),
      ORRERY_KEY("model.ffn_hidden", Type::Int, model.ffn_hidden, int),
      ORRERY_KEY("model.activation", Type::String, model.activation, std::string),
      ORRERY_KEY("model.norm", Type::String, model.norm, std::string),
      ORRERY_KEY("model.position", Type::String, model.position, std::string),
      ORRERY_KEY("model.rope_theta", Type::Double, model.rope_theta, double),
      ORRERY_KEY("model.tied_embeddings", Type::Bool, model.tied_embeddings, bool),
      ORRERY_KEY("model.bias", Type::Bool, model.bias, bool),
      ORRERY_KEY("model.moe.experts", Type::Int, model.moe.experts, int),
      ORRERY_KEY("model.moe.top_k", Type::Int, model.moe.top_k, int),
      ORRERY_KEY("model.moe.every", Type::Int, model.moe.every, int),
      ORRERY_KEY("model.moe.first_dense", Type::Int, model.moe.first_dense, int),
      ORRERY_KEY("model.moe.expert_ffn_hidden", Type::Int, model.moe.expert_ffn_hidden, int),
      ORRERY_KEY("model.moe.shared_experts", Type::Int, model.moe.shared_experts, int),
      ORRERY_KEY("model.moe.capacity_factor", Type::Double, model.moe.capacity_factor, double),
      ORRERY_KEY("model.moe.aux_loss_coef", Type::Double, model.moe.aux_loss_coef, double),
      ORRERY_KEY("model.moe.router_skew", Type::Double, model.moe.router_skew, double),
      ORRERY_KEY("training.steps", Type::Int, training.steps, int),
      ORRERY_KEY("training.global_batch", Type::Int, training.global_batch, int),
      ORRERY_KEY("training.micro_batch", Type::Int, training.micro_batch, int),
      ORRERY_KEY("training.seed", Type::Uint, training.seed, uint64_t),
      ORRERY_KEY("training.lr", Type::Double, training.lr, double),
      ORRERY_KEY("training.beta1", Type::Double, training.beta1, double),
      ORRERY_KEY("training.beta2", Type::Double, training.beta2, double),
      ORRERY_KEY("training.eps", Type::Double, training.eps, double),
      ORRERY_KEY("training.weight_decay", Type::Double, training.weight_decay, double),
      ORRERY_KEY("training.warmup_steps", Type::Int, training.warmup_steps, int),
      ORRERY_KEY("training.recompute", Type::String, training.recompute, std::string),
      ORRERY_KEY("training.loss_scale", Type::Double, training.loss_scale, double),
      ORRERY_KEY("training.loss_scale_window", Type::Int, training.loss_scale_window, int),
      ORRERY_KEY("data.source", Type::String, data.source, std::string),
      ORRERY_KEY("data.path", Type::String, data.path, std::string),
      ORRERY_KEY("parallel.dp", Type::Int, parallel.dp, int),
      ORRERY_KEY("parallel.tp", Type::Int, parallel.tp, int),
      ORRERY_KEY("parallel.pp", Type::Int, parallel.pp, int),
      ORRERY_KEY("parallel.zero", Type::Int, parallel.zero, int),
      ORRERY_KEY("parallel.schedule", Type::String, parallel.schedule, std::string),
      ORRERY_KEY("parallel.virtual_stages", Type::Int, parallel.virtual_stages, int),
      KeySpec{"parallel.pp_layers", Type::IntList,
              [](Scenario& s, const YAML::Node& n) {
                const auto v = int_list(n);
                if (!v) throw YAML::BadConversion(n.Mark());
                s.parallel.pp_layers = *v;
              },
              [](const Scenario& s, YAML::Emitter& e) {
                e << YAML::Flow << YAML::BeginSeq;
                for (int x : s.parallel.pp_layers) e << x;
                e << YAML::EndSeq;
              }},
      ORRERY_KEY("parallel.bucket_mb", Type::Double, parallel.bucket_mb, double),
      ORRERY_KEY("parallel.overlap", Type::Bool, parallel.overlap, bool),
      ORRERY_KEY("parallel.placement", Type::String, parallel.placement, std::string),
      ORRERY_KEY("parallel.comm_backend", Type::String, parallel.comm_backend, std::string),
      ORRERY_KEY("parallel.sequence_parallel", Type::Bool, parallel.sequence_parallel, bool),
      ORRERY_KEY("parallel.vocab_parallel", Type::Bool, parallel.vocab_parallel, bool),
      ORRERY_KEY("parallel.grad_compression", Type::String, parallel.grad_compression, std::string),
      ORRERY_KEY("parallel.grad_dtype", Type::String, parallel.grad_dtype, std::string),
      ORRERY_KEY("parallel.ep", Type::Int, parallel.ep, int),
      ORRERY_KEY("compression.powersgd_rank", Type::Int, compression.powersgd_rank, int),
      ORRERY_KEY("compression.topk_ratio", Type::Double, compression.topk_ratio, double),
      ORRERY_KEY("compression.start_step", Type::Int, compression.start_step, int),
      ORRERY_KEY("zero.offload_optimizer", Type::String, zero.offload_optimizer, std::string),
      ORRERY_KEY("zero.offload_params", Type::String, zero.offload_params, std::string),
      ORRERY_KEY("zero.nvme_path", Type::String, zero.nvme_path, std::string),
      ORRERY_KEY("zero.offload_chunk_mb", Type::Double, zero.offload_chunk_mb, double),
      ORRERY_KEY("zero.overlap_grad_reduce", Type::Bool, zero.overlap_grad_reduce, bool),
      ORRERY_KEY("zero.overlap_param_gather", Type::Bool, zero.overlap_param_gather, bool),
      ORRERY_KEY("runtime.device", Type::String, runtime.device, std::string),
      ORRERY_KEY("runtime.threads", Type::Int, runtime.threads, int),
      ORRERY_KEY("runtime.precision", Type::String, runtime.precision, std::string),
      ORRERY_KEY("runtime.watchdog_s", Type::Double, runtime.watchdog_s, double),
      ORRERY_KEY("profile.enabled", Type::Bool, profile.enabled, bool),
      ORRERY_KEY("checkpoint.every", Type::Int, checkpoint.every, int),
      ORRERY_KEY("checkpoint.dir", Type::String, checkpoint.dir, std::string),
      ORRERY_KEY("checkpoint.background", Type::Bool, checkpoint.background, bool),
      // Test-only fault injection (see scenarios/README.md).
      ORRERY_KEY("faults.step", Type::Int, faults.step, int),
      ORRERY_KEY("faults.skip_collective_rank", Type::Int, faults.skip_collective_rank, int),
      ORRERY_KEY("faults.size_mismatch_rank", Type::Int, faults.size_mismatch_rank, int),
      ORRERY_KEY("faults.wrong_op_rank", Type::Int, faults.wrong_op_rank, int),
      ORRERY_KEY("faults.sleep_rank", Type::Int, faults.sleep_rank, int),
      ORRERY_KEY("faults.sleep_ms", Type::Int, faults.sleep_ms, int),
      ORRERY_KEY("faults.kill_rank", Type::Int, faults.kill_rank, int),
      ORRERY_KEY("faults.offload_remove_rank", Type::Int, faults.offload_remove_rank, int),
      ORRERY_KEY("faults.kill_after_step", Type::Int, faults.kill_after_step, int),
      ORRERY_KEY("faults.every_attempt", Type::Bool, faults.every_attempt, bool),
  };
  return keys;
}
#undef ORRERY_KEY

// Levenshtein distance, for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] =
          std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string suggestion(const std::string& key) {
  // Candidates: every key path and every section name.
  std::set<std::string> candidates;
  for (const auto& k : key_table()) {
    const std::string p = k.path;
    candidates.insert(p);
    if (p.find('.') != std::string::npos) candidates.insert(p.substr(0, p.find('.')));
  }
  const auto last_of = [](const std::string& s) {
    return s.substr(s.rfind('.') == std::string::npos ? 0 : s.rfind('.') + 1);
  };
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& p : candidates) {
    // Whole paths, or last components (+1), so "model.layer" and "layers" both find model.layers.
    const size_t d = std::min(edit_distance(key, p), edit_distance(last_of(key), last_of(p)) + 1);
    if (d < best_d) {
      best_d = d;
      best = p;
    }
  }
  if (best_d <= std::max<size_t>(2, key.size() / 3)) return " (did you mean '" + best + "'?)";
  return "";
}

std::string where(const std::string& origin, const YAML::Node& n, const std::string& key) {
  std::ostringstream os;
  os << origin;
  if (n.IsDefined() && n.Mark().line >= 0) os << ":" << (n.Mark().line + 1);
  os << ": key '" << key << "'";
  return os.str();
}

bool is_known_prefix(const std::string& prefix) {
  for (const auto& k : key_table()) {
    const std::string p = k.path;
    if (p.size() > prefix.size() && p.compare(0, prefix.size(), prefix) == 0 &&
        p[prefix.size()] == '.')
      return true;
  }
  return false;
}

const KeySpec* find_key(const std::string& path) {
  for (const auto& k : key_table())
    if (path == k.path) return &k;
  return nullptr;
}

// Walks the tree: every leaf must be a known key, every map a known section.
void walk(const YAML::Node& node, const std::string& prefix, const std::string& origin,
          std::vector<std::pair<std::string, YAML::Node>>& leaves) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (!it->first.IsScalar()) {  // "? [a, b]: 1" is valid YAML; as<std::string>() would throw
      throw InputError(where(origin, it->first, prefix) +
                       ": a key must be a name, not a list or map");
    }
    const std::string k = it->first.as<std::string>();
    const std::string path = prefix.empty() ? k : prefix + "." + k;
    // A copy: it->second lives in a proxy that dies with this statement (ASan: use after scope).
    const YAML::Node v = it->second;
    if (is_known_prefix(path)) {
      if (!v.IsMap()) {
        throw InputError(where(origin, it->first, path) + ": expected a section (a map of keys)");
      }
      walk(v, path, origin, leaves);
    } else if (find_key(path)) {
      leaves.emplace_back(path, v);
    } else {
      throw InputError(where(origin, it->first, path) + ": unknown key" + suggestion(path));
    }
  }
}

void apply_override(YAML::Node& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw InputError("--set '" + assignment +
                     "': expected key=value, e.g. --set training.steps=20");
  }
  const std::string key = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  if (!find_key(key)) {
    throw InputError("--set '" + assignment + "': unknown key '" + key + "'" + suggestion(key));
  }
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  // yaml-cpp's operator[] on a non-const node returns a reference-like proxy; walk by reassigning.
  std::vector<YAML::Node> chain{root};
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = chain.back()[parts[i]];
    if (next.IsDefined() && !next.IsNull() && !next.IsMap()) {  // operator[] below would throw
      throw InputError("--set '" + assignment + "': key '" + parts[i] +
                       "' in the scenario is not a section (a map of keys)");
    }
    if (!next.IsDefined() || next.IsNull()) {
      chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next.reset(chain.back()[parts[i]]);  // rebind; operator= would assign into the tree
    }
    chain.push_back(next);
  }
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception&) {
    parsed = YAML::Node(value);
  }
  if (!parsed.IsDefined() || parsed.IsNull()) parsed = YAML::Node(value);
  chain.back()[parts.back()] = parsed;
}

void check_range(bool ok, const std::string& origin, const std::string& key,
                 const std::string& what) {
  if (!ok) throw InputError(origin + ": key '" + key + "': " + what);
}

}  // namespace

namespace {
void check_moe(const Scenario& s, const std::string& origin) {
  const auto& e = s.model.moe;
  check_range(e.experts >= 0, origin, "model.moe.experts", "must be >= 0 (0: a dense model)");
  check_range(s.parallel.ep >= 1, origin, "parallel.ep", "must be >= 1");
  if (!e.enabled()) {
    check_range(s.parallel.ep == 1, origin, "parallel.ep",
                "expert parallelism shards the experts of model.moe, but model.moe.experts is 0 "
                "(a dense model): set model.moe.experts or use ep 1");
    return;
  }
  check_range(e.top_k >= 1 && e.top_k <= e.experts, origin, "model.moe.top_k",
              "must be between 1 and model.moe.experts (" + std::to_string(e.experts) + "), got " +
                  std::to_string(e.top_k));
  check_range(e.every >= 1, origin, "model.moe.every", "must be >= 1");
  check_range(
      e.first_dense >= 0, origin, "model.moe.first_dense",
      "must be >= 0 (the number of leading dense blocks), got " + std::to_string(e.first_dense));
  {
    bool any = false;
    for (int l = e.first_dense; l < s.model.layers && !any; ++l) any = l % e.every == 0;
    check_range(any, origin, "model.moe.first_dense",
                "leaves no MoE block: blocks " + std::to_string(e.first_dense) + ".." +
                    std::to_string(s.model.layers - 1) + " of model.layers " +
                    std::to_string(s.model.layers) + " hold none with l % model.moe.every (" +
                    std::to_string(e.every) + ") == 0; lower it or set model.moe.experts 0");
  }
  check_range(e.expert_ffn_hidden >= 0, origin, "model.moe.expert_ffn_hidden",
              "must be >= 0 (0: the dense FFN width)");
  check_range(e.shared_experts >= 0, origin, "model.moe.shared_experts", "must be >= 0");
  check_range(
      e.capacity_factor >= 0, origin, "model.moe.capacity_factor",
      "must be >= 0 (0: dropless), got " + (std::ostringstream() << e.capacity_factor).str());
  check_range(e.aux_loss_coef >= 0, origin, "model.moe.aux_loss_coef", "must be >= 0");
  check_range(e.router_skew >= 0, origin, "model.moe.router_skew", "must be >= 0 (0: uniform)");
}

void check_precision(const Scenario& s, const std::string& origin) {
  const auto p = scenario_precision(s.runtime.precision);
  check_range(p.has_value(), origin, "runtime.precision",
              "expected fp32, tf32, bf16 or fp16, got '" + s.runtime.precision + "'");
  const bool cuda = parse_device(s.runtime.device) == Device::Cuda;
  // fp16 on a GPU would need loss scaling in the CUDA loop, which it does not have: refused.
  check_range(!(cuda && *p == Precision::FP16), origin, "runtime.precision",
              "fp16 runs on device cpu only (device cuda: fp32, tf32 or bf16)");
  // TF32 is a tensor-core format; the CPU's sgemm has no such mode, and running fp32 instead
  // would record a precision that did not run.
  check_range(cuda || *p != Precision::TF32, origin, "runtime.precision",
              "tf32 runs on device cuda only (device cpu: fp32, bf16 or fp16)");
  check_range(s.training.loss_scale > 0 && std::isfinite(s.training.loss_scale), origin,
              "training.loss_scale", "must be a finite number > 0");
  check_range(s.training.loss_scale_window >= 1, origin, "training.loss_scale_window",
              "must be >= 1");
  const auto& par = s.parallel;
  const auto g = scenario_precision(par.grad_dtype);
  check_range(g && *g != Precision::TF32, origin, "parallel.grad_dtype",
              "expected fp32, bf16 or fp16, got '" + par.grad_dtype + "'");
  check_range(*g == Precision::FP32 || !cuda, origin, "parallel.grad_dtype",
              "16-bit gradient all-reduce runs on device cpu only");
  check_range(*g == Precision::FP32 || par.zero == 0, origin, "parallel.grad_dtype",
              "'" + par.grad_dtype + "' sends DDP's all-reduce in 16 bits, which ZeRO stage " +
                  std::to_string(par.zero) + " replaces: use parallel.zero 0, or fp32");
  check_range(*g == Precision::FP32 || par.grad_compression == "none", origin,
              "parallel.grad_dtype",
              "'" + par.grad_dtype + "' needs parallel.grad_compression none (got '" +
                  par.grad_compression + "'): a compressed gradient is not sent in 16 bits");
}
}  // namespace

namespace {
void check_offload(const Scenario& s, const std::string& origin) {
  const ZeroConfig& z = s.zero;
  check_range(z.offload_optimizer == "none" || z.offload_optimizer == "host" || z.nvme(), origin,
              "zero.offload_optimizer",
              "expected none, host or nvme, got '" + z.offload_optimizer + "'");
  check_range(z.offload_params == "none" || z.offload_params == "nvme", origin,
              "zero.offload_params", "expected none or nvme, got '" + z.offload_params + "'");
  check_range(z.offload_chunk_mb > 0 && std::isfinite(z.offload_chunk_mb), origin,
              "zero.offload_chunk_mb", "must be a finite number > 0");
  // On device cpu the moments are in host memory already: "host" would name a move that is not.
  check_range(z.offload_optimizer != "host" || parse_device(s.runtime.device) != Device::Cpu,
              origin, "zero.offload_optimizer",
              "'host' moves the optimizer state from GPU to host memory, where it already is on "
              "device cpu: use none or nvme");
  check_range(z.offload_params == "none" || s.parallel.zero == 3, origin, "zero.offload_params",
              "'" + z.offload_params +
                  "' offloads ZeRO 3's parameter shards: needs parallel.zero "
                  "3 (got " +
                  std::to_string(s.parallel.zero) + ")");
  check_range(z.offload_params == "none" || z.nvme(), origin, "zero.offload_params",
              "'nvme' keeps the parameter shards with the optimizer state: needs "
              "zero.offload_optimizer nvme (got '" +
                  z.offload_optimizer + "')");
  check_range(!z.nvme() || !z.nvme_path.empty(), origin, "zero.nvme_path",
              "zero.offload_optimizer is nvme but zero.nvme_path is not set (a directory)");
}
}  // namespace

namespace {
// zero.overlap_grad_reduce / overlap_param_gather (the per-bucket distributed optimizer) against
// the stage and what it does not cover yet.
void check_zero_overlap(const Scenario& s, const std::string& origin) {
  const ZeroConfig& z = s.zero;
  const ParallelConfig& p = s.parallel;
  check_range(!z.overlap_param_gather || z.overlap_grad_reduce, origin, "zero.overlap_param_gather",
              "needs zero.overlap_grad_reduce true (the all-gathers go per bucket of its "
              "partition), as Megatron-LM's --overlap-param-gather needs --overlap-grad-reduce");
  if (!z.overlap_grad_reduce) return;
  const std::string key = "zero.overlap_grad_reduce";
  check_range(p.zero == 1 || p.zero == 2, origin, key,
              "buckets ZeRO 1/2's reduce-scatter: needs parallel.zero 1 or 2 (got " +
                  std::to_string(p.zero) +
                  "; zero 0 overlaps DDP's all-reduce through parallel.overlap, zero 3 "
                  "scatters per segment already)");
  check_range(p.grad_compression == "none", origin, key,
              "not with parallel.grad_compression '" + p.grad_compression +
                  "' (a compressed step replaces the reduce-scatter): use none");
  check_range(!s.model.moe.enabled(), origin, key,
              "not supported with mixture-of-experts blocks (model.moe.experts) yet");
  check_range(z.offload_optimizer == "none", origin, key,
              "not supported with zero.offload_optimizer '" + z.offload_optimizer + "' yet");
  check_range(schedule_of(p) != Schedule::Interleaved, origin, key,
              "not supported with parallel.schedule interleaved yet");
}
}  // namespace

void check_nvme_path(const Scenario& s) {
  if (!s.zero.nvme()) return;
  const std::string origin = s.path.empty() ? std::string("scenario") : s.path;
  const std::string& dir = s.zero.nvme_path;
  std::error_code ec;
  check_range(std::filesystem::is_directory(dir, ec), origin, "zero.nvme_path",
              "'" + dir + "' is not an existing directory");
  // access() says yes to root on any mode, so a real file is created (and removed) to be sure:
  // a read-only mount refuses it to everyone.
  const std::string probe =
      (std::filesystem::path(dir) / ".orrery-probe-").string() + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd < 0) {
    const int err = errno;
    check_range(false, origin, "zero.nvme_path",
                "cannot create files in '" + dir + "': " + std::strerror(err) +
                    " (a writable directory is needed)");
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

Scenario parse_scenario(const std::string& yaml_text, const std::string& origin,
                        const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    throw InputError(origin + ":" + std::to_string(e.mark.line + 1) + ": malformed YAML: " + e.msg);
  }
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap())
    throw InputError(origin + ": expected a YAML map of sections (model, training, ...)");
  for (const auto& o : overrides) apply_override(root, o);

  Scenario s;
  std::vector<std::pair<std::string, YAML::Node>> leaves;
  walk(root, "", origin, leaves);
  for (const auto& [path, node] : leaves) {
    const KeySpec* spec = find_key(path);
    if (!node.IsScalar() && !(spec->type == Type::IntList && node.IsSequence())) {
      throw InputError(where(origin, node, path) + ": expected " + type_name(spec->type));
    }
    try {
      if (spec->type == Type::Uint && !node.Scalar().empty() && node.Scalar()[0] == '-') {
        throw YAML::BadConversion(node.Mark());
      }
      spec->set(s, node);
    } catch (const YAML::BadConversion&) {
      const std::string got = node.IsSequence() ? YAML::Dump(node) : node.Scalar();
      throw InputError(where(origin, node, path) + ": expected " + type_name(spec->type) +
                       ", got '" + got + "'");
    }
  }
  if (s.name.empty()) s.name = s.model.name;
  if (s.name.empty()) s.name = "scenario";

  // Ranges of single keys.
  const auto& m = s.model;
  check_range(m.layers >= 1, origin, "model.layers", "must be >= 1");
  check_range(m.d_model >= 1, origin, "model.d_model", "must be >= 1");
  check_range(m.heads >= 1, origin, "model.heads", "must be >= 1");
  check_range(m.d_model % m.heads == 0, origin, "model.heads",
              "model.d_model (" + std::to_string(m.d_model) +
                  ") must be divisible by model.heads (" + std::to_string(m.heads) + ")");
  check_range(m.vocab >= 2, origin, "model.vocab", "must be >= 2");
  check_range(m.seq >= 1, origin, "model.seq", "must be >= 1");
  check_range(m.kv_heads >= 0, origin, "model.kv_heads", "must be >= 0 (0: model.heads)");
  check_range(m.kv_heads == 0 || m.heads % m.kv_heads == 0, origin, "model.kv_heads",
              "model.heads (" + std::to_string(m.heads) +
                  ") must be divisible by model.kv_heads (" + std::to_string(m.kv_heads) +
                  "): each key/value head serves a whole group");
  check_range(m.ffn_hidden >= 0, origin, "model.ffn_hidden", "must be >= 0 (0: 4 x d_model)");
  check_range(m.activation == "gelu" || m.activation == "swiglu", origin, "model.activation",
              "expected gelu or swiglu, got '" + m.activation + "'");
  check_range(m.norm == "layernorm" || m.norm == "rmsnorm", origin, "model.norm",
              "expected layernorm or rmsnorm, got '" + m.norm + "'");
  check_range(m.position == "learned" || m.position == "rope", origin, "model.position",
              "expected learned or rope, got '" + m.position + "'");
  check_range(m.rope_theta > 0, origin, "model.rope_theta", "must be > 0");
  check_range(m.position != "rope" || (m.d_model / m.heads) % 2 == 0, origin, "model.position",
              "rope rotates pairs of channels: the head size d_model / heads (" +
                  std::to_string(m.d_model / m.heads) + ") must be even");
  check_moe(s, origin);
  const auto& t = s.training;
  check_range(t.steps >= 1, origin, "training.steps", "must be >= 1");
  check_range(t.global_batch >= 1, origin, "training.global_batch", "must be >= 1");
  check_range(t.micro_batch >= 1, origin, "training.micro_batch", "must be >= 1");
  check_range(t.lr > 0, origin, "training.lr", "must be > 0");
  check_range(t.warmup_steps >= 0, origin, "training.warmup_steps", "must be >= 0");
  check_range(parse_recompute(t.recompute).has_value(), origin, "training.recompute",
              "expected none, selective or full, got '" + t.recompute + "'");
  check_range(s.data.source == "synthetic" || s.data.source == "text", origin, "data.source",
              "expected 'synthetic' or 'text', got '" + s.data.source + "'");
  check_range(s.data.source != "text" || !s.data.path.empty(), origin, "data.path",
              "data.source is 'text' but data.path is not set");
  check_range(s.data.source != "text" || m.vocab >= 256, origin, "model.vocab",
              "text data uses byte-level tokens: model.vocab must be >= 256");
  const auto& p = s.parallel;
  check_range(p.dp >= 1, origin, "parallel.dp", "must be >= 1");
  check_range(p.tp >= 1, origin, "parallel.tp", "must be >= 1");
  check_range(p.pp >= 1, origin, "parallel.pp", "must be >= 1");
  check_range(p.zero >= 0 && p.zero <= 3, origin, "parallel.zero", "expected 0, 1, 2 or 3");
  check_range(parse_schedule(p.schedule).has_value(), origin, "parallel.schedule",
              "expected gpipe, 1f1b or interleaved, got '" + p.schedule + "'");
  check_range(p.virtual_stages >= 1, origin, "parallel.virtual_stages", "must be >= 1");
  check_range(p.bucket_mb > 0, origin, "parallel.bucket_mb", "must be > 0");
  check_range(
      parse_placement(p.placement).has_value(), origin, "parallel.placement",
      "expected a permutation of tp,dp,pp (fastest-varying first), got '" + p.placement + "'");
  check_range(parse_device(s.runtime.device).has_value(), origin, "runtime.device",
              "expected 'cpu' or 'cuda', got '" + s.runtime.device + "'");
  check_range(s.runtime.threads >= 1, origin, "runtime.threads", "must be >= 1");
  check_precision(s, origin);
  check_range(p.comm_backend == "auto" || p.comm_backend == "nccl" || p.comm_backend == "mpi",
              origin, "parallel.comm_backend",
              "expected auto, nccl or mpi, got '" + p.comm_backend + "'");
  check_range(p.grad_compression == "none" || p.grad_compression == "int8" ||
                  p.grad_compression == "powersgd" || p.grad_compression == "topk",
              origin, "parallel.grad_compression",
              "expected none, int8, powersgd or topk, got '" + p.grad_compression + "'");
  const auto& c = s.compression;
  check_range(c.powersgd_rank >= 1, origin, "compression.powersgd_rank", "must be >= 1");
  check_range(c.topk_ratio > 0 && c.topk_ratio <= 1, origin, "compression.topk_ratio",
              "must be in (0, 1]");
  check_range(c.start_step >= 0, origin, "compression.start_step", "must be >= 0");
  check_range(p.grad_compression == "none" || p.zero <= 1, origin, "parallel.grad_compression",
              "'" + p.grad_compression + "' compresses the dp all-reduce, which ZeRO stage " +
                  std::to_string(p.zero) +
                  " replaces with a reduce-scatter: use parallel.zero 0 or 1, or none");
  check_offload(s, origin);
  check_zero_overlap(s, origin);
  check_range(s.runtime.watchdog_s > 0, origin, "runtime.watchdog_s", "must be > 0");
  check_range(s.checkpoint.every >= 0, origin, "checkpoint.every",
              "must be >= 0 (0: no checkpoints)");

  s.path = origin;
  YAML::Emitter out;
  out << root;
  s.text = out.c_str();
  s.text += "\n";
  try {
    validate_layout(s);
  } catch (const InputError& e) {
    throw InputError(origin + ": " + e.what());
  }
  return s;
}

Scenario load_scenario(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) {
    throw InputError(path + ": cannot open scenario file (" +
                     (std::filesystem::exists(path) ? "permission denied" : "no such file") + ")");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  Scenario s = parse_scenario(ss.str(), path, overrides);
  if (s.name == "scenario") s.name = std::filesystem::path(path).stem().string();
  return s;
}

namespace {
// parallel.pp_layers against pp, the layers and the schedule (validate_layout).
void check_pp_layers(const Scenario& s, const std::string& layout) {
  const auto& p = s.parallel;
  const std::string key = "key 'parallel.pp_layers': " + join_ints(p.pp_layers) + ": ";
  if (schedule_of(p) == Schedule::Interleaved) {
    throw InputError(key +
                     "the interleaved schedule cuts the layers into pp x virtual_stages "
                     "equal chunks and cannot take layers per stage; use schedule gpipe or "
                     "1f1b with pp_layers, or leave pp_layers empty");
  }
  if (static_cast<int>(p.pp_layers.size()) != p.pp) {
    throw InputError(key + std::to_string(p.pp_layers.size()) + " entries, but " + layout +
                     " has " + std::to_string(p.pp) + " pipeline stages (one entry per stage)");
  }
  int64_t sum = 0;
  for (size_t i = 0; i < p.pp_layers.size(); ++i) {
    if (p.pp_layers[i] < 1) {
      throw InputError(key + "stage " + std::to_string(i) + " has " +
                       std::to_string(p.pp_layers[i]) + " layers; every stage needs at least 1");
    }
    sum += p.pp_layers[i];
  }
  if (sum != s.model.layers) {
    throw InputError(key + "the stages hold " + std::to_string(sum) + " layers in all, but " +
                     "model.layers is " + std::to_string(s.model.layers));
  }
}
// model.moe and parallel.ep against the layout (validate_layout; model/moe.hpp has the rules).
void check_moe_layout(const Scenario& s, const std::string& layout) {
  const auto& e = s.model.moe;
  const auto& p = s.parallel;
  const std::string at = layout + " ep=" + std::to_string(p.ep);
  if (p.dp % p.ep != 0) {
    throw InputError("key 'parallel.ep': " + at +
                     ": ep must divide dp: the experts are sharded over " +
                     "ep consecutive ranks of the data-parallel group");
  }
  if (e.experts % p.ep != 0) {
    throw InputError("key 'parallel.ep': " + at + ": model.moe.experts (" +
                     std::to_string(e.experts) + ") must be divisible by ep, each rank holding " +
                     "experts / ep whole experts");
  }
  const int width = e.expert_ffn_hidden > 0 ? e.expert_ffn_hidden : block_arch(s.model).ffn_hidden;
  if (width % p.tp != 0) {
    throw InputError(
        "key 'parallel.tp': " + at + ": the expert FFN width " +
        std::string(e.expert_ffn_hidden ? "model.moe.expert_ffn_hidden" : "(the dense width)") +
        " (" + std::to_string(width) +
        ") must be divisible by tp: each expert is split over tp as the dense MLP is");
  }
  if (p.sequence_parallel) {
    throw InputError("key 'parallel.sequence_parallel': " + at +
                     ": sequence parallelism with mixture-of-experts blocks is not supported yet "
                     "(the router would see 1/tp of the tokens); turn one of them off");
  }
  if (recompute_of(s.training) == Recompute::Full) {
    throw InputError(
        "key 'training.recompute': full recomputation of mixture-of-experts blocks is "
        "not supported yet (it would rerun the all-to-alls); use selective or none");
  }
}
}  // namespace

void validate_layout(const Scenario& s) {
  const auto& m = s.model;
  const auto& p = s.parallel;
  const auto& t = s.training;
  const std::string layout =
      "dp=" + std::to_string(p.dp) + " tp=" + std::to_string(p.tp) + " pp=" + std::to_string(p.pp);
  if (p.sequence_parallel && p.tp < 2) {
    throw InputError("key 'parallel.sequence_parallel': " + layout +
                     ": sequence parallelism shards the tensor-parallel group's LayerNorm and "
                     "dropout regions along the sequence and needs tp > 1");
  }
  if (p.sequence_parallel && (int64_t(t.micro_batch) * m.seq) % p.tp != 0) {
    throw InputError("key 'parallel.sequence_parallel': " + layout + ": the " +
                     std::to_string(int64_t(t.micro_batch) * m.seq) +
                     " tokens of a micro-batch (training.micro_batch x model.seq) must be "
                     "divisible by tp to shard them");
  }
  if (s.zero.overlap_grad_reduce && p.tp > 1 && block_arch(m).kv_heads < p.tp) {
    throw InputError(
        "key 'zero.overlap_grad_reduce': " + layout +
        ": not supported yet with key/value heads replicated over tp (model.kv_heads " +
        std::to_string(block_arch(m).kv_heads) +
        " < tp): their tp sum would have to come before each bucket's reduce-scatter");
  }
  if (p.vocab_parallel && m.vocab % p.tp != 0) {
    throw InputError("key 'parallel.vocab_parallel': " + layout + ": the vocabulary of " +
                     std::to_string(m.vocab) +
                     " (model.vocab) must be divisible by tp to split it");
  }
  if (m.heads % p.tp != 0) {
    throw InputError("key 'parallel.tp': " + layout + ": model.heads (" + std::to_string(m.heads) +
                     ") must be divisible by tp");
  }
  const BlockArch arch = block_arch(m);
  // kv heads sharded over tp (each rank whole groups), or, with fewer kv heads than tp ranks, each
  // one replicated on tp / kv_heads consecutive ranks (their gradients summed over them).
  if (arch.kv_heads % p.tp != 0 && p.tp % arch.kv_heads != 0) {
    throw InputError("key 'parallel.tp': " + layout + ": the key/value heads (model.kv_heads " +
                     std::to_string(arch.kv_heads) + ") must be divisible by tp (" +
                     std::to_string(p.tp) +
                     "), each tensor-parallel rank holding whole groups, or divide it, each head "
                     "replicated on tp / kv_heads ranks");
  }
  if (arch.ffn_hidden % p.tp != 0) {
    throw InputError("key 'parallel.tp': " + layout + ": the MLP width " +
                     std::string(m.ffn_hidden ? "model.ffn_hidden" : "4*d_model") + " (" +
                     std::to_string(arch.ffn_hidden) + ") must be divisible by tp");
  }
  if (m.moe.enabled()) check_moe_layout(s, layout);
  // Layers per stage given: they replace the "layers divisible by pp" rule.
  if (!p.pp_layers.empty()) check_pp_layers(s, layout);
  const int chunks = p.pp * (schedule_of(p) == Schedule::Interleaved ? p.virtual_stages : 1);
  if (chunks > m.layers) {
    throw InputError("key 'parallel.pp': " + layout + ": " + std::to_string(chunks) +
                     " pipeline stages but only " + std::to_string(m.layers) + " layers");
  }
  if (m.layers % chunks != 0 && schedule_of(p) == Schedule::Interleaved) {
    throw InputError("key 'parallel.virtual_stages': " + layout +
                     " virtual_stages=" + std::to_string(p.virtual_stages) + ": model.layers (" +
                     std::to_string(m.layers) + ") must be divisible by pp x virtual_stages (" +
                     std::to_string(chunks) + ")");
  }
  if (p.pp_layers.empty() && m.layers % chunks != 0) {
    throw InputError(
        "key 'parallel.pp': " + layout + ": model.layers (" + std::to_string(m.layers) +
        ") must be divisible by the number of pipeline stages (" + std::to_string(chunks) +
        "), or give each stage's layers in parallel.pp_layers");
  }
  if (p.zero > 0 && p.dp < 2) {
    throw InputError("key 'parallel.zero': ZeRO stage " + std::to_string(p.zero) +
                     " shards over the data-parallel group, which needs parallel.dp >= 2 (got " +
                     std::to_string(p.dp) + ")");
  }
  // In int64: dp x micro_batch overflows int (65536 x 65536 wrapped to 0: SIGFPE on the modulo).
  if (t.global_batch % (int64_t(p.dp) * t.micro_batch) != 0) {
    throw InputError("key 'training.global_batch': " + std::to_string(t.global_batch) +
                     " sequences must be divisible by dp (" + std::to_string(p.dp) +
                     ") x training.micro_batch (" + std::to_string(t.micro_batch) + ")");
  }
  if (schedule_of(p) == Schedule::Interleaved && p.pp > 1 &&
      s.micro_batches_per_step() % p.pp != 0) {
    throw InputError(
        "key 'parallel.schedule': interleaved 1F1B needs the micro-batches per step (" +
        std::to_string(s.micro_batches_per_step()) + ") to be a multiple of pp (" +
        std::to_string(p.pp) + ")");
  }
}

std::string to_yaml(const Scenario& s) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  std::string section;
  for (const auto& k : key_table()) {
    const std::string path = k.path;
    const auto dot = path.find('.');
    const std::string sec = dot == std::string::npos ? "" : path.substr(0, dot);
    const std::string leaf = dot == std::string::npos ? path : path.substr(dot + 1);
    if (sec != section) {
      if (!section.empty()) e << YAML::EndMap;
      section = sec;
      if (!section.empty()) e << YAML::Key << section << YAML::Value << YAML::BeginMap;
    }
    e << YAML::Key << leaf << YAML::Value;
    k.emit(s, e);
  }
  if (!section.empty()) e << YAML::EndMap;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

std::optional<Schedule> parse_schedule(const std::string& name) {
  if (name == "gpipe") return Schedule::GPipe;
  if (name == "1f1b") return Schedule::OneFOneB;
  if (name == "interleaved") return Schedule::Interleaved;
  return std::nullopt;
}

Schedule schedule_of(const ParallelConfig& p) {
  const auto s = parse_schedule(p.schedule);
  if (!s) {
    throw InputError("key 'parallel.schedule': expected gpipe, 1f1b or interleaved, got '" +
                     p.schedule + "'");
  }
  return *s;
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::GPipe:
      return "gpipe";
    case Schedule::OneFOneB:
      return "1f1b";
    case Schedule::Interleaved:
      return "interleaved";
  }
  return "?";
}

std::optional<Device> parse_device(const std::string& name) {
  if (name == "cpu") return Device::Cpu;
  if (name == "cuda") return Device::Cuda;
  return std::nullopt;
}

Device device_of(const RuntimeConfig& r) {
  const auto d = parse_device(r.device);
  if (!d)
    throw InputError("key 'runtime.device': expected 'cpu' or 'cuda', got '" + r.device + "'");
  return *d;
}

const char* device_name(Device d) { return d == Device::Cuda ? "cuda" : "cpu"; }

std::optional<Precision> precision_from_string(std::string_view s) {
  std::string l(s);
  for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l == "fp32") return Precision::FP32;
  if (l == "tf32") return Precision::TF32;
  if (l == "bf16") return Precision::BF16;
  if (l == "fp16") return Precision::FP16;
  return std::nullopt;
}

std::string_view to_string(Precision p) {
  switch (p) {
    case Precision::FP32:
      return "fp32";
    case Precision::TF32:
      return "tf32";
    case Precision::BF16:
      return "bf16";
    case Precision::FP16:
      return "fp16";
  }
  return "?";
}

Precision precision_of(const RuntimeConfig& r) {
  const auto p = scenario_precision(r.precision);
  if (!p)
    throw InputError("key 'runtime.precision': expected fp32, tf32, bf16 or fp16, got '" +
                     r.precision + "'");
  return *p;
}

Precision grad_dtype_of(const ParallelConfig& p) {
  const auto g = scenario_precision(p.grad_dtype);
  if (!g || *g == Precision::TF32)
    throw InputError("key 'parallel.grad_dtype': expected fp32, bf16 or fp16, got '" +
                     p.grad_dtype + "'");
  return *g;
}

std::optional<Recompute> parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  if (name == "full") return Recompute::Full;
  return std::nullopt;
}

Recompute recompute_of(const TrainingConfig& t) {
  const auto r = parse_recompute(t.recompute);
  if (!r) {
    throw InputError("key 'training.recompute': expected none, selective or full, got '" +
                     t.recompute + "'");
  }
  return *r;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None:
      return "none";
    case Recompute::Selective:
      return "selective";
    case Recompute::Full:
      return "full";
  }
  return "?";
}

BlockArch block_arch(const ModelConfig& m) {
  BlockArch a;
  a.kv_heads = m.kv_heads > 0 ? m.kv_heads : m.heads;
  a.ffn_hidden = m.ffn_hidden > 0 ? m.ffn_hidden : 4 * m.d_model;
  if (m.activation == "gelu") {
    a.activation = Activation::Gelu;
  } else if (m.activation == "swiglu") {
    a.activation = Activation::Swiglu;
  } else {
    throw InputError("key 'model.activation': expected gelu or swiglu, got '" + m.activation + "'");
  }
  if (m.norm == "layernorm") {
    a.norm = Norm::LayerNorm;
  } else if (m.norm == "rmsnorm") {
    a.norm = Norm::RmsNorm;
  } else {
    throw InputError("key 'model.norm': expected layernorm or rmsnorm, got '" + m.norm + "'");
  }
  if (m.position == "learned") {
    a.position = Position::Learned;
  } else if (m.position == "rope") {
    a.position = Position::Rope;
  } else {
    throw InputError("key 'model.position': expected learned or rope, got '" + m.position + "'");
  }
  a.rope_theta = m.rope_theta;
  a.tied_embeddings = m.tied_embeddings;
  a.bias = m.bias;
  return a;
}

const char* activation_name(Activation a) { return a == Activation::Swiglu ? "swiglu" : "gelu"; }
const char* norm_name(Norm n) { return n == Norm::RmsNorm ? "rmsnorm" : "layernorm"; }
const char* position_name(Position p) { return p == Position::Rope ? "rope" : "learned"; }

std::optional<std::array<int, 3>> parse_placement(const std::string& placement) {
  std::array<int, 3> axes{};
  std::array<bool, 3> seen{};
  int n = 0;
  std::stringstream ss(placement);
  for (std::string a; std::getline(ss, a, ',');) {
    const int id = a == "dp" ? 0 : a == "tp" ? 1 : a == "pp" ? 2 : -1;
    if (id < 0 || n == 3 || seen[static_cast<size_t>(id)]) return std::nullopt;
    seen[static_cast<size_t>(id)] = true;
    axes[static_cast<size_t>(n++)] = id;
  }
  if (n != 3) return std::nullopt;
  return axes;
}

}  // namespace orrery
