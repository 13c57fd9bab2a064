// Hardware profiles: YAML reading and writing, validation, and the built-in per-device defaults.
#include "orrery/sim/hardware.hpp"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "orrery/common/error.hpp"

namespace orrery::sim {

namespace {

constexpr const char* kClassNames[kOpClassCount] = {"gemm",      "attention",    "elementwise",
                                                    "layernorm", "softmax_loss", "optimizer"};

std::string where(const std::string& origin, const YAML::Node& n, const std::string& key) {
  std::ostringstream o;
  o << origin;
  if (n.Mark().line >= 0) o << ":" << n.Mark().line + 1;
  o << ": key '" << key << "'";
  return o.str();
}

void check_keys(const YAML::Node& map, const std::set<std::string>& allowed,
                const std::string& origin, const std::string& prefix) {
  if (!map.IsMap()) throw InputError(where(origin, map, prefix) + ": expected a mapping");
  for (const auto& kv : map) {
    // "? [a, b]: 1" is valid YAML; as<std::string>() would throw a YAML exception.
    if (!kv.first.IsScalar())
      throw InputError(where(origin, kv.first, prefix) +
                       ": a key must be a name, not a list or map");
    const std::string k = kv.first.as<std::string>();
    if (!allowed.count(k)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      throw InputError(where(origin, kv.first, prefix + k) +
                       ": unknown key (expected one of: " + list + ")");
    }
  }
}

double get_number(const YAML::Node& n, const std::string& origin, const std::string& key) {
  try {
    return n.as<double>();
  } catch (const YAML::Exception&) {
    throw InputError(where(origin, n, key) + ": expected a number, got '" + n.as<std::string>("?") +
                     "'");
  }
}

// A scalar as a string: a list or map where a name belongs is the user's mistake, not a YAML
// exception.
std::string get_string(const YAML::Node& n, const std::string& origin, const std::string& key) {
  if (!n.IsScalar()) throw InputError(where(origin, n, key) + ": expected a string");
  return n.Scalar();
}

// A whole number read as a double, range-checked before the cast (a cast out of range is
// undefined).
int to_int(double v, const YAML::Node& n, const std::string& origin, const std::string& key) {
  if (!(v <= 2147483647.0))
    throw InputError(where(origin, n, key) + ": expected a number <= 2147483647");
  return static_cast<int>(v);
}

int64_t us_to_ns(double us, const YAML::Node& n, const std::string& origin,
                 const std::string& key) {
  if (!(us >= 0) || !(us < 9.2e15))
    throw InputError(where(origin, n, key) + ": expected a time >= 0 (microseconds)");
  return static_cast<int64_t>(std::llround(us * 1000.0));
}

}  // namespace

std::string_view to_string(OpClass c) { return kClassNames[static_cast<int>(c)]; }

const CollectiveOverride* HardwareProfile::find_override(traces::CollOp op, bool intra_node,
                                                         int group_size) const {
  // Most specific first: the group's size and scope, its size, the scope, then any.
  const CollectiveOverride* best = nullptr;
  int best_score = -1;
  for (const auto& o : collectives) {
    if (o.op != op) continue;
    if (o.ranks != 0 && o.ranks != group_size) continue;
    if (o.scope != CollectiveScope::Any && (o.scope == CollectiveScope::IntraNode) != intra_node)
      continue;
    const int score = (o.ranks != 0 ? 2 : 0) + (o.scope != CollectiveScope::Any ? 1 : 0);
    if (score > best_score) best = &o, best_score = score;
  }
  return best;
}

int64_t CollectiveOverride::time_ns(int64_t bytes, int group_size) const {
  if (table.empty()) {
    const double secs =
        double(bytes) * traces::busbw_factor(op, group_size) / bus_bandwidth_bytes_per_s;
    return latency_ns + static_cast<int64_t>(std::ceil(secs * 1e9));
  }
  if (table.size() == 1 || bytes <= table.front().first) return table.front().second;
  size_t i = 1;
  while (i + 1 < table.size() && table[i].first < bytes) ++i;
  const auto [x0, y0] = table[i - 1];
  const auto [x1, y1] = table[i];
  const double t = double(y0) + double(y1 - y0) * double(bytes - x0) / double(x1 - x0);
  return std::max<int64_t>(0, static_cast<int64_t>(std::llround(t)));
}

namespace {

// The profile's document; a YAML syntax error names the file and line.
YAML::Node load_document(const std::string& yaml_text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw InputError(origin + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) throw InputError(origin + ": a hardware profile must be a YAML mapping");
  check_keys(root,
             {"name",
              "device",
              "precision",
              "peak_flops",
              "memory_bandwidth_gbps",
              "data_load_us",
              "kernels",
              "collectives",
              "machine",
              "cluster",
              "sharing",
              "ops",
              "rank_jitter",
              "op_jitter",
              "gemm_shape",
              "attention_kernel",
              "comm_compute_share",
              "offload",
              "moe_expert_shares",
              "compression",
              "rounding"},
             origin, "");
  return root;
}

// The top-level scalars (name, device, precision, peaks, jitters, data load): a profile with only
// those set. `root` is taken by value (a handle on the same document, like the caller's).
HardwareProfile parse_device(YAML::Node root, const std::string& origin) {
  HardwareProfile p;
  p.name = root["name"] ? get_string(root["name"], origin, "name") : origin;
  if (root["device"]) p.device = get_string(root["device"], origin, "device");
  if (root["precision"]) {
    const std::string text = get_string(root["precision"], origin, "precision");
    const auto prec = precision_from_string(text);
    if (!prec || to_string(*prec) != text)
      throw InputError(where(origin, root["precision"], "precision") +
                       ": expected bf16, fp16, tf32 or fp32, got '" + text + "'");
    p.precision = *prec;
  }
  if (root["peak_flops"]) {
    p.peak_flops = get_number(root["peak_flops"], origin, "peak_flops");
    if (p.peak_flops < 0)
      throw InputError(where(origin, root["peak_flops"], "peak_flops") + ": expected >= 0");
  }
  if (root["memory_bandwidth_gbps"]) {
    const double g = get_number(root["memory_bandwidth_gbps"], origin, "memory_bandwidth_gbps");
    if (g < 0)
      throw InputError(where(origin, root["memory_bandwidth_gbps"], "memory_bandwidth_gbps") +
                       ": expected >= 0");
    p.memory_bandwidth_bytes_per_s = g * 1e9;
  }
  if (root["rank_jitter"]) {
    p.rank_jitter = get_number(root["rank_jitter"], origin, "rank_jitter");
    if (!(p.rank_jitter >= 0) || !(p.rank_jitter < 1))
      throw InputError(where(origin, root["rank_jitter"], "rank_jitter") +
                       ": expected a fraction in [0, 1)");
  }
  if (const YAML::Node m = root["moe_expert_shares"]) {
    const std::string at = where(origin, m, "moe_expert_shares");
    if (!m.IsSequence() || m.size() == 0)
      throw InputError(at + ": expected a list of each expert's share (numbers >= 0)");
    double sum = 0;
    for (const auto& x : m) {
      const double v = get_number(x, origin, "moe_expert_shares");
      if (!(v >= 0)) throw InputError(at + ": expected shares >= 0");
      p.moe_expert_shares.push_back(v);
      sum += v;
    }
    if (!(sum > 0)) throw InputError(at + ": the shares sum to 0");
  }
  if (root["op_jitter"]) {
    p.op_jitter = get_number(root["op_jitter"], origin, "op_jitter");
    if (!(p.op_jitter >= 0) || !(p.op_jitter < 1))
      throw InputError(where(origin, root["op_jitter"], "op_jitter") +
                       ": expected a fraction in [0, 1)");
  }
  if (root["comm_compute_share"]) {
    p.comm_compute_share = get_number(root["comm_compute_share"], origin, "comm_compute_share");
    if (!(p.comm_compute_share >= 0) || !(p.comm_compute_share < 1))
      throw InputError(where(origin, root["comm_compute_share"], "comm_compute_share") +
                       ": expected a fraction in [0, 1)");
  }
  if (root["data_load_us"])
    p.data_load_ns = us_to_ns(get_number(root["data_load_us"], origin, "data_load_us"),
                              root["data_load_us"], origin, "data_load_us");
  return p;
}

// One op class of the `kernels:` section (`pre` is its key path, "kernels.gemm.").
ClassCost parse_class_cost(const YAML::Node& n, const std::string& origin, const std::string& pre) {
  if (!n.IsMap()) throw InputError(where(origin, n, pre) + ": expected a mapping");
  check_keys(n, {"flops_efficiency", "bandwidth_efficiency", "overhead_us"}, origin, pre);
  ClassCost cc;
  for (const char* key : {"flops_efficiency", "bandwidth_efficiency"}) {
    if (!n[key]) continue;
    const double v = get_number(n[key], origin, pre + key);
    if (!(v > 0 && v <= 1))
      throw InputError(where(origin, n[key], pre + key) + ": expected a fraction in (0, 1]");
    (std::string(key) == "flops_efficiency" ? cc.flops_efficiency : cc.bandwidth_efficiency) = v;
  }
  if (n["overhead_us"])
    cc.overhead_ns = us_to_ns(get_number(n["overhead_us"], origin, pre + "overhead_us"),
                              n["overhead_us"], origin, pre + "overhead_us");
  return cc;
}

// The `kernels:` section; classes it leaves out keep the defaults.
std::array<ClassCost, kOpClassCount> parse_kernels(const YAML::Node& k, const std::string& origin) {
  if (!k.IsMap())
    throw InputError(where(origin, k, "kernels") + ": expected a mapping of op classes");
  check_keys(k,
             {kClassNames[0], kClassNames[1], kClassNames[2], kClassNames[3], kClassNames[4],
              kClassNames[5]},
             origin, "kernels.");
  std::array<ClassCost, kOpClassCount> classes{};
  for (int c = 0; c < kOpClassCount; ++c) {
    const auto n = k[kClassNames[c]];
    if (!n) continue;
    classes[c] = parse_class_cost(n, origin, std::string("kernels.") + kClassNames[c] + ".");
  }
  return classes;
}

// A collective override's measured `table:` of [bytes, microseconds] pairs, ascending in bytes.
std::vector<std::pair<int64_t, int64_t>> parse_table(const YAML::Node& t,
                                                     const std::string& origin) {
  const std::string key = "collectives[].table";
  if (!t.IsSequence())
    throw InputError(where(origin, t, key) + ": expected a list of [bytes, microseconds]");
  std::vector<std::pair<int64_t, int64_t>> table;
  for (const auto& pt : t) {
    if (!pt.IsSequence() || pt.size() != 2)
      throw InputError(where(origin, pt, key) + ": expected a pair [bytes, microseconds]");
    const double b = get_number(pt[0], origin, key);
    if (!(b >= 0) || !(b < 9.2e18) || b != std::floor(b))
      throw InputError(where(origin, pt[0], key) + ": expected whole bytes >= 0");
    const int64_t bytes = static_cast<int64_t>(b);
    if (!table.empty() && bytes <= table.back().first)
      throw InputError(where(origin, pt[0], key) + ": sizes must ascend");
    table.emplace_back(bytes, us_to_ns(get_number(pt[1], origin, key), pt[1], origin, key));
  }
  return table;
}

// One entry of the `collectives:` list.
CollectiveOverride parse_collective_override(const YAML::Node& n, const std::string& origin) {
  if (!n.IsMap()) throw InputError(where(origin, n, "collectives[]") + ": expected a mapping");
  check_keys(n,
             {"op", "scope", "ranks", "latency_us", "bus_bandwidth_gbps", "ranks_on_node", "table"},
             origin, "collectives[].");
  CollectiveOverride o;
  const std::string op = n["op"] ? get_string(n["op"], origin, "collectives[].op") : "";
  const auto parsed = traces::coll_op_from_string(op);
  if (!parsed || *parsed == traces::CollOp::None)
    throw InputError(where(origin, n, "collectives[].op") + ": unknown collective '" + op +
                     "' (expected all_reduce, reduce_scatter, all_gather, broadcast, reduce, "
                     "all_to_all, send, recv)");
  o.op = *parsed;
  const std::string scope =
      n["scope"] ? get_string(n["scope"], origin, "collectives[].scope") : "any";
  if (scope == "any")
    o.scope = CollectiveScope::Any;
  else if (scope == "intra_node")
    o.scope = CollectiveScope::IntraNode;
  else if (scope == "inter_node")
    o.scope = CollectiveScope::InterNode;
  else
    throw InputError(where(origin, n["scope"], "collectives[].scope") +
                     ": expected any, intra_node or inter_node");
  if (n["ranks"]) {
    const double r = get_number(n["ranks"], origin, "collectives[].ranks");
    if (!(r >= 0) || r != std::floor(r))
      throw InputError(where(origin, n["ranks"], "collectives[].ranks") +
                       ": expected a whole number >= 0");
    o.ranks = to_int(r, n["ranks"], origin, "collectives[].ranks");
  }
  if (n["latency_us"])
    o.latency_ns = us_to_ns(get_number(n["latency_us"], origin, "collectives[].latency_us"),
                            n["latency_us"], origin, "collectives[].latency_us");
  if (!n["bus_bandwidth_gbps"])
    throw InputError(where(origin, n, "collectives[].bus_bandwidth_gbps") + ": required");
  const double g = get_number(n["bus_bandwidth_gbps"], origin, "collectives[].bus_bandwidth_gbps");
  if (!(g > 0))
    throw InputError(where(origin, n["bus_bandwidth_gbps"], "collectives[].bus_bandwidth_gbps") +
                     ": expected > 0");
  o.bus_bandwidth_bytes_per_s = g * 1e9;
  if (n["ranks_on_node"]) {
    const double r = get_number(n["ranks_on_node"], origin, "collectives[].ranks_on_node");
    if (!(r >= 0) || r != std::floor(r))
      throw InputError(where(origin, n["ranks_on_node"], "collectives[].ranks_on_node") +
                       ": expected a whole number >= 0");
    o.ranks_on_node = to_int(r, n["ranks_on_node"], origin, "collectives[].ranks_on_node");
  }
  if (const auto t = n["table"]) o.table = parse_table(t, origin);
  return o;
}

// The `collectives:` section.
std::vector<CollectiveOverride> parse_collectives(const YAML::Node& cs, const std::string& origin) {
  if (!cs.IsSequence()) throw InputError(where(origin, cs, "collectives") + ": expected a list");
  std::vector<CollectiveOverride> collectives;
  for (const auto& n : cs) collectives.push_back(parse_collective_override(n, origin));
  return collectives;
}

// One entry of the `ops:` list.
MeasuredOp parse_measured_op(const YAML::Node& n, const std::string& origin) {
  if (!n.IsMap()) throw InputError(where(origin, n, "ops[]") + ": expected a mapping");
  check_keys(n,
             {"name", "piece", "pieces", "batch", "seq", "d_model", "heads", "vocab", "tp",
              "params", "time_us"},
             origin, "ops[].");
  MeasuredOp o;
  if (!n["name"]) throw InputError(where(origin, n, "ops[].name") + ": required");
  o.name = get_string(n["name"], origin, "ops[].name");
  if (o.name.empty())
    throw InputError(where(origin, n["name"], "ops[].name") + ": expected a name");
  auto whole = [&](const char* key, double lo, double fallback) -> int64_t {
    if (!n[key]) return static_cast<int64_t>(fallback);
    const double v = get_number(n[key], origin, std::string("ops[].") + key);
    if (!(v >= lo) || !(v <= 1e12) || v != std::floor(v))
      throw InputError(where(origin, n[key], std::string("ops[].") + key) +
                       ": expected a whole number >= " + std::to_string(static_cast<int>(lo)));
    return static_cast<int64_t>(v);
  };
  o.pieces = static_cast<int>(whole("pieces", 1, 1));
  o.piece = static_cast<int>(whole("piece", 0, 0));
  if (o.piece >= o.pieces)
    throw InputError(where(origin, n["piece"], "ops[].piece") +
                     ": expected a piece below ops[].pieces (" + std::to_string(o.pieces) + ")");
  o.batch = whole("batch", 1, 1);
  o.seq = whole("seq", 1, 1);
  o.d_model = whole("d_model", 1, 1);
  o.heads = whole("heads", 1, 1);
  o.vocab = whole("vocab", 1, 1);
  o.tp = whole("tp", 1, 1);
  if (n["params"]) {
    o.params = get_number(n["params"], origin, "ops[].params");
    if (!(o.params >= 0) || !(o.params < 1e15))
      throw InputError(where(origin, n["params"], "ops[].params") + ": expected a number >= 0");
  }
  if (!n["time_us"]) throw InputError(where(origin, n, "ops[].time_us") + ": required");
  o.time_ns = us_to_ns(get_number(n["time_us"], origin, "ops[].time_us"), n["time_us"], origin,
                       "ops[].time_us");
  return o;
}

// The `ops:` section.
std::vector<MeasuredOp> parse_ops(const YAML::Node& ops, const std::string& origin) {
  if (!ops.IsSequence()) throw InputError(where(origin, ops, "ops") + ": expected a list");
  std::vector<MeasuredOp> measured;
  for (const auto& n : ops) measured.push_back(parse_measured_op(n, origin));
  return measured;
}

// The `cluster:` section (the machine a calibrated profile was measured on).
MachineDescription parse_cluster(const YAML::Node& c, const std::string& origin) {
  if (!c.IsMap()) throw InputError(where(origin, c, "cluster") + ": expected a mapping");
  check_keys(c,
             {"device", "nodes", "ranks_per_node", "peak_flops", "memory_bandwidth_gbps",
              "memory_capacity_gb", "link", "link_gb_per_s", "link_latency_us"},
             origin, "cluster.");
  auto num = [&](const char* key, double lo) {
    const double v = get_number(c[key], origin, std::string("cluster.") + key);
    if (!(v >= lo))
      throw InputError(where(origin, c[key], std::string("cluster.") + key) +
                       ": expected a number >= " + std::to_string(static_cast<int>(lo)));
    return v;
  };
  MachineDescription m;
  if (c["device"]) m.device = get_string(c["device"], origin, "cluster.device");
  m.nodes = c["nodes"] ? to_int(num("nodes", 1), c["nodes"], origin, "cluster.nodes") : 1;
  if (!c["ranks_per_node"])
    throw InputError(where(origin, c, "cluster.ranks_per_node") + ": required");
  m.ranks_per_node =
      to_int(num("ranks_per_node", 1), c["ranks_per_node"], origin, "cluster.ranks_per_node");
  if (c["peak_flops"]) m.peak_flops = num("peak_flops", 0);
  if (c["memory_bandwidth_gbps"])
    m.memory_bandwidth_bytes_per_s = num("memory_bandwidth_gbps", 0) * 1e9;
  if (c["memory_capacity_gb"]) {
    const double gb = num("memory_capacity_gb", 0);
    if (!(gb < 9.2e9))
      throw InputError(where(origin, c["memory_capacity_gb"], "cluster.memory_capacity_gb") +
                       ": expected a number < 9.2e9");
    m.memory_capacity_bytes = static_cast<int64_t>(gb * 1e9);
  }
  if (c["link"]) m.link = get_string(c["link"], origin, "cluster.link");
  if (c["link_gb_per_s"]) m.link_bytes_per_s = num("link_gb_per_s", 0) * 1e9;
  if (c["link_latency_us"])
    m.link_latency_ns = us_to_ns(num("link_latency_us", 0), c["link_latency_us"], origin,
                                 "cluster.link_latency_us");
  return m;
}

// The `offload:` section: what it gives, the rest from `dflt`.
OffloadLinks parse_offload(const YAML::Node& n, const std::string& origin, OffloadLinks dflt) {
  if (!n.IsMap()) throw InputError(where(origin, n, "offload") + ": expected a mapping");
  check_keys(n,
             {"host_link_gbps", "host_link_shared_by", "host_adamw_gbps", "nvme_read_gbps",
              "nvme_write_gbps"},
             origin, "offload.");
  auto num = [&](const char* key, double& out) {
    if (!n[key]) return;
    const double v = get_number(n[key], origin, std::string("offload.") + key);
    if (!(v >= 0) || !std::isfinite(v))
      throw InputError(where(origin, n[key], std::string("offload.") + key) +
                       ": expected a number >= 0 (GB/s; 0: no such link)");
    out = v * 1e9;
  };
  num("host_link_gbps", dflt.host_link_bytes_per_s);
  num("host_adamw_gbps", dflt.host_adamw_bytes_per_s);
  num("nvme_read_gbps", dflt.nvme_read_bytes_per_s);
  num("nvme_write_gbps", dflt.nvme_write_bytes_per_s);
  if (const auto k = n["host_link_shared_by"]) {
    const double v = get_number(k, origin, "offload.host_link_shared_by");
    if (!(v >= 1) || v != std::floor(v) || v > 1024)
      throw InputError(where(origin, k, "offload.host_link_shared_by") +
                       ": expected an integer >= 1 (GPUs behind one host link)");
    dflt.host_link_shared_by = static_cast<int>(v);
  }
  return dflt;
}

// A rate of the `compression:` or `rounding:` section: ns per unit, >= 0.
double parse_rate(const YAML::Node& n, const std::string& origin, const std::string& key) {
  const double v = get_number(n, origin, key);
  if (!(v >= 0) || !std::isfinite(v))
    throw InputError(where(origin, n, key) +
                     ": expected a number >= 0 (ns per unit; 0: not measured)");
  return v;
}

// The `compression:` section: per scheme, compress_ns and decompress_ns (HostComputeRates).
std::map<std::string, CompressionRate> parse_compression(const YAML::Node& n,
                                                         const std::string& origin) {
  if (!n.IsMap()) throw InputError(where(origin, n, "compression") + ": expected a mapping");
  check_keys(n, {"int8", "topk", "powersgd"}, origin, "compression.");
  std::map<std::string, CompressionRate> out;
  for (const auto& kv : n) {
    const std::string scheme = kv.first.as<std::string>();
    const std::string at = "compression." + scheme;
    if (!kv.second.IsMap()) throw InputError(where(origin, kv.second, at) + ": expected a mapping");
    check_keys(kv.second, {"compress_ns", "decompress_ns"}, origin, at + ".");
    CompressionRate r;
    if (kv.second["compress_ns"])
      r.compress_ns = parse_rate(kv.second["compress_ns"], origin, at + ".compress_ns");
    if (kv.second["decompress_ns"])
      r.decompress_ns = parse_rate(kv.second["decompress_ns"], origin, at + ".decompress_ns");
    out[scheme] = r;
  }
  return out;
}

// The `rounding:` section: ns per element rounded, per emulated 16-bit format.
std::map<std::string, double> parse_rounding(const YAML::Node& n, const std::string& origin) {
  if (!n.IsMap()) throw InputError(where(origin, n, "rounding") + ": expected a mapping");
  check_keys(n, {"bf16", "fp16"}, origin, "rounding.");
  std::map<std::string, double> out;
  for (const auto& kv : n) {
    const std::string f = kv.first.as<std::string>();
    out[f] = parse_rate(kv.second, origin, "rounding." + f);
  }
  return out;
}

// The `sharing:` section (ranks sharing the cores of a node).
CoreSharing parse_sharing(const YAML::Node& sh, const std::string& origin) {
  if (!sh.IsMap()) throw InputError(where(origin, sh, "sharing") + ": expected a mapping");
  check_keys(sh,
             {"cores", "threads_per_rank", "contention_at_full", "oversubscription_exponent",
              "comm_exponent", "comm_compute_weight", "comm_thread_weight"},
             origin, "sharing.");
  auto num = [&](const char* key, double lo) {
    const double v = get_number(sh[key], origin, std::string("sharing.") + key);
    if (!(v >= lo) || !std::isfinite(v))
      throw InputError(where(origin, sh[key], std::string("sharing.") + key) +
                       ": expected a number >= " + std::to_string(lo));
    return v;
  };
  CoreSharing cs;
  if (!sh["cores"]) throw InputError(where(origin, sh, "sharing.cores") + ": required");
  cs.cores = to_int(num("cores", 1), sh["cores"], origin, "sharing.cores");
  if (sh["threads_per_rank"])
    cs.threads_per_rank = to_int(num("threads_per_rank", 1), sh["threads_per_rank"], origin,
                                 "sharing.threads_per_rank");
  if (sh["contention_at_full"]) {
    cs.contention_at_full = num("contention_at_full", 0.0);
    if (!(cs.contention_at_full > 0))
      throw InputError(where(origin, sh["contention_at_full"], "sharing.contention_at_full") +
                       ": expected a number > 0");
  }
  if (sh["oversubscription_exponent"])
    cs.oversubscription_exponent = num("oversubscription_exponent", 0.0);
  if (sh["comm_exponent"]) cs.comm_exponent = num("comm_exponent", 0.0);
  if (sh["comm_compute_weight"]) cs.comm_compute_weight = num("comm_compute_weight", 0.0);
  if (sh["comm_thread_weight"]) cs.comm_thread_weight = num("comm_thread_weight", 0.0);
  return cs;
}

// The `machine:` section (free-form strings).
std::map<std::string, std::string> parse_machine(const YAML::Node& m, const std::string& origin) {
  if (!m.IsMap()) throw InputError(where(origin, m, "machine") + ": expected a mapping of strings");
  std::map<std::string, std::string> machine;
  for (const auto& kv : m) {
    if (!kv.first.IsScalar())
      throw InputError(where(origin, kv.first, "machine") +
                       ": a key must be a name, not a list or map");
    machine[kv.first.as<std::string>()] = kv.second.as<std::string>("");
  }
  return machine;
}

// The `gemm_shape:` section.
GemmShapeModel parse_gemm_shape(const YAML::Node& n, const std::string& origin) {
  const std::string pre = "gemm_shape.";
  if (!n.IsMap()) throw InputError(where(origin, n, "gemm_shape") + ": expected a mapping");
  check_keys(n,
             {"sms", "tiles", "k_fixed", "max_split_k", "clock_mhz", "l2_bandwidth_gbps",
              "iteration_latency_cycles", "tile_k_bytes", "kernel_latency_cycles"},
             origin, pre);
  GemmShapeModel g;
  auto whole = [&](const char* key, int lo) {
    const double v = get_number(n[key], origin, pre + key);
    if (!(v >= lo) || v != std::floor(v) || v > 1e6)
      throw InputError(where(origin, n[key], pre + key) +
                       ": expected a whole number >= " + std::to_string(lo));
    return static_cast<int>(v);
  };
  if (!n["sms"] || !n["tiles"])
    throw InputError(where(origin, n, "gemm_shape") + ": needs sms and tiles");
  g.sms = whole("sms", 1);
  if (n["max_split_k"]) g.max_split_k = whole("max_split_k", 1);
  if (n["tile_k_bytes"]) g.tile_k_bytes = whole("tile_k_bytes", 1);
  auto non_negative = [&](const char* key, double scale, double& out) {
    if (!n[key]) return;
    const double v = get_number(n[key], origin, pre + key);
    if (!(v >= 0) || v > 1e9)
      throw InputError(where(origin, n[key], pre + key) + ": expected >= 0");
    out = v * scale;
  };
  non_negative("k_fixed", 1.0, g.k_fixed);
  non_negative("clock_mhz", 1e6, g.clock_hz);
  non_negative("l2_bandwidth_gbps", 1e9, g.l2_bytes_per_s);
  non_negative("iteration_latency_cycles", 1.0, g.iteration_latency_cycles);
  non_negative("kernel_latency_cycles", 1.0, g.kernel_latency_cycles);
  for (const char* key : {"iteration_latency_cycles", "kernel_latency_cycles"})
    if (n[key] && get_number(n[key], origin, pre + key) > 0 && !(g.clock_hz > 0))
      throw InputError(where(origin, n[key], pre + key) +
                       ": needs clock_mhz (the clock its cycles are counted in)");
  const YAML::Node ts = n["tiles"];
  if (!ts.IsSequence() || ts.size() == 0)
    throw InputError(where(origin, ts, pre + "tiles") + ": expected a list of {m, n, relative}");
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string tp = pre + "tiles[" + std::to_string(i) + "].";
    const YAML::Node t = ts[i];
    if (!t.IsMap()) throw InputError(where(origin, t, tp) + ": expected {m, n, relative}");
    check_keys(t, {"m", "n", "relative"}, origin, tp);
    GemmTile tile;
    for (const char* key : {"m", "n"}) {
      if (!t[key]) throw InputError(where(origin, t, tp) + ": needs " + key);
      const double v = get_number(t[key], origin, tp + key);
      if (!(v >= 1) || v != std::floor(v) || v > 4096)
        throw InputError(where(origin, t[key], tp + key) +
                         ": expected a whole number in [1, 4096]");
      (std::string(key) == "m" ? tile.m : tile.n) = static_cast<int>(v);
    }
    if (t["relative"]) {
      tile.relative = get_number(t["relative"], origin, tp + "relative");
      if (!(tile.relative > 0 && tile.relative <= 1))
        throw InputError(where(origin, t["relative"], tp + "relative") +
                         ": expected a fraction in (0, 1]");
    }
    g.tiles.push_back(tile);
  }
  return g;
}

}  // namespace

// The sections are read in this order, so that a file with several mistakes reports the same one.
HardwareProfile parse_hardware_profile(const std::string& yaml_text, const std::string& origin) {
  YAML::Node root = load_document(yaml_text, origin);
  HardwareProfile p = parse_device(root, origin);
  if (const auto k = root["kernels"]) p.classes = parse_kernels(k, origin);
  if (const auto cs = root["collectives"]) p.collectives = parse_collectives(cs, origin);
  if (const auto ops = root["ops"]) p.ops = parse_ops(ops, origin);
  if (const auto c = root["cluster"]) p.cluster = parse_cluster(c, origin);
  if (const auto sh = root["sharing"]) p.sharing = parse_sharing(sh, origin);
  p.offload = offload_defaults(p.device, p.device != "cpu");
  if (const auto off = root["offload"]) p.offload = parse_offload(off, origin, p.offload);
  if (const auto c = root["compression"]) p.host.compression = parse_compression(c, origin);
  if (const auto r = root["rounding"]) p.host.rounding_ns = parse_rounding(r, origin);
  if (const auto m = root["machine"]) p.machine = parse_machine(m, origin);
  if (const auto g = root["gemm_shape"]) p.gemm_shape = parse_gemm_shape(g, origin);
  if (const auto a = root["attention_kernel"]) {
    const std::string v = get_string(a, origin, "attention_kernel");
    if (v != "fused" && v != "unfused")
      throw InputError(where(origin, a, "attention_kernel") + ": expected fused or unfused, got '" +
                       v + "'");
    p.attention_fused = v == "fused";
  }
  return p;
}

HardwareProfile load_hardware_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read the hardware profile (no such file?)");
  std::stringstream ss;
  ss << in.rdbuf();
  HardwareProfile p = parse_hardware_profile(ss.str(), path);
  p.path = path;
  return p;
}

namespace {
// A string that would not read back as itself when written plain (empty, control characters such as
// a lone \r, surrounding spaces) is emitted double-quoted, escaped: a fuzz_hardware finding.
YAML::Emitter& emit_string(YAML::Emitter& e, const std::string& s) {
  bool plain = !s.empty() && s.front() != ' ' && s.back() != ' ';
  for (const char c : s) plain = plain && static_cast<unsigned char>(c) >= 0x20 && c != 0x7f;
  if (!plain) return e << YAML::DoubleQuoted << s;
  return e << s;
}
}  // namespace

std::string to_yaml(const HardwareProfile& p) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  emit_string(e << YAML::Key << "name" << YAML::Value, p.name);
  emit_string(e << YAML::Key << "device" << YAML::Value, p.device);
  emit_string(e << YAML::Key << "precision" << YAML::Value, std::string(to_string(p.precision)));
  e << YAML::Key << "peak_flops" << YAML::Value << p.peak_flops;
  e << YAML::Key << "memory_bandwidth_gbps" << YAML::Value << p.memory_bandwidth_bytes_per_s / 1e9;
  e << YAML::Key << "data_load_us" << YAML::Value << p.data_load_ns / 1000.0;
  if (p.rank_jitter > 0) e << YAML::Key << "rank_jitter" << YAML::Value << p.rank_jitter;
  if (p.op_jitter > 0) e << YAML::Key << "op_jitter" << YAML::Value << p.op_jitter;
  if (p.comm_compute_share > 0)
    e << YAML::Key << "comm_compute_share" << YAML::Value << p.comm_compute_share;
  if (!p.moe_expert_shares.empty()) {
    e << YAML::Key << "moe_expert_shares" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (double v : p.moe_expert_shares) e << v;
    e << YAML::EndSeq;
  }
  e << YAML::Key << "kernels" << YAML::Value << YAML::BeginMap;
  for (int c = 0; c < kOpClassCount; ++c) {
    e << YAML::Key << kClassNames[c] << YAML::Value << YAML::Flow << YAML::BeginMap;
    e << YAML::Key << "flops_efficiency" << YAML::Value << p.classes[c].flops_efficiency;
    e << YAML::Key << "bandwidth_efficiency" << YAML::Value << p.classes[c].bandwidth_efficiency;
    e << YAML::Key << "overhead_us" << YAML::Value << p.classes[c].overhead_ns / 1000.0;
    e << YAML::EndMap;
  }
  e << YAML::EndMap;
  if (!p.attention_fused) e << YAML::Key << "attention_kernel" << YAML::Value << "unfused";
  if (p.gemm_shape.enabled()) {
    const GemmShapeModel& g = p.gemm_shape;
    e << YAML::Key << "gemm_shape" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "sms" << YAML::Value << g.sms;
    e << YAML::Key << "tiles" << YAML::Value << YAML::BeginSeq;
    for (const auto& t : g.tiles) {
      e << YAML::Flow << YAML::BeginMap << YAML::Key << "m" << YAML::Value << t.m << YAML::Key
        << "n" << YAML::Value << t.n << YAML::Key << "relative" << YAML::Value << t.relative
        << YAML::EndMap;
    }
    e << YAML::EndSeq;
    e << YAML::Key << "k_fixed" << YAML::Value << g.k_fixed;
    e << YAML::Key << "max_split_k" << YAML::Value << g.max_split_k;
    e << YAML::Key << "clock_mhz" << YAML::Value << g.clock_hz / 1e6;
    e << YAML::Key << "l2_bandwidth_gbps" << YAML::Value << g.l2_bytes_per_s / 1e9;
    e << YAML::Key << "iteration_latency_cycles" << YAML::Value << g.iteration_latency_cycles;
    e << YAML::Key << "tile_k_bytes" << YAML::Value << g.tile_k_bytes;
    e << YAML::Key << "kernel_latency_cycles" << YAML::Value << g.kernel_latency_cycles;
    e << YAML::EndMap;
  }
  if (!p.collectives.empty()) {
    e << YAML::Key << "collectives" << YAML::Value << YAML::BeginSeq;
    for (const auto& o : p.collectives) {
      e << YAML::Flow << YAML::BeginMap;
      e << YAML::Key << "op" << YAML::Value << std::string(traces::to_string(o.op));
      e << YAML::Key << "scope" << YAML::Value
        << (o.scope == CollectiveScope::Any         ? "any"
            : o.scope == CollectiveScope::IntraNode ? "intra_node"
                                                    : "inter_node");
      if (o.ranks != 0) e << YAML::Key << "ranks" << YAML::Value << o.ranks;
      e << YAML::Key << "latency_us" << YAML::Value << o.latency_ns / 1000.0;
      e << YAML::Key << "bus_bandwidth_gbps" << YAML::Value << o.bus_bandwidth_bytes_per_s / 1e9;
      if (o.ranks_on_node > 0) e << YAML::Key << "ranks_on_node" << YAML::Value << o.ranks_on_node;
      if (!o.table.empty()) {
        e << YAML::Key << "table" << YAML::Value << YAML::Flow << YAML::BeginSeq;
        for (const auto& [b, ns] : o.table)
          e << YAML::Flow << YAML::BeginSeq << b << ns / 1000.0 << YAML::EndSeq;
        e << YAML::EndSeq;
      }
      e << YAML::EndMap;
    }
    e << YAML::EndSeq;
  }
  if (p.cluster.nodes > 0) {
    const MachineDescription& m = p.cluster;
    e << YAML::Key << "cluster" << YAML::Value << YAML::BeginMap;
    emit_string(e << YAML::Key << "device" << YAML::Value, m.device);
    e << YAML::Key << "nodes" << YAML::Value << m.nodes;
    e << YAML::Key << "ranks_per_node" << YAML::Value << m.ranks_per_node;
    e << YAML::Key << "peak_flops" << YAML::Value << m.peak_flops;
    e << YAML::Key << "memory_bandwidth_gbps" << YAML::Value
      << m.memory_bandwidth_bytes_per_s / 1e9;
    e << YAML::Key << "memory_capacity_gb" << YAML::Value << double(m.memory_capacity_bytes) / 1e9;
    if (!m.link.empty()) e << YAML::Key << "link" << YAML::Value << m.link;
    e << YAML::Key << "link_gb_per_s" << YAML::Value << m.link_bytes_per_s / 1e9;
    e << YAML::Key << "link_latency_us" << YAML::Value << m.link_latency_ns / 1000.0;
    e << YAML::EndMap;
  }
  e << YAML::Key << "offload" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "host_link_gbps" << YAML::Value << p.offload.host_link_bytes_per_s / 1e9;
  e << YAML::Key << "host_link_shared_by" << YAML::Value << p.offload.host_link_shared_by;
  e << YAML::Key << "host_adamw_gbps" << YAML::Value << p.offload.host_adamw_bytes_per_s / 1e9;
  e << YAML::Key << "nvme_read_gbps" << YAML::Value << p.offload.nvme_read_bytes_per_s / 1e9;
  e << YAML::Key << "nvme_write_gbps" << YAML::Value << p.offload.nvme_write_bytes_per_s / 1e9;
  e << YAML::EndMap;
  if (p.sharing.cores > 0) {
    const CoreSharing& cs = p.sharing;
    e << YAML::Key << "sharing" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "cores" << YAML::Value << cs.cores;
    e << YAML::Key << "threads_per_rank" << YAML::Value << cs.threads_per_rank;
    e << YAML::Key << "contention_at_full" << YAML::Value << cs.contention_at_full;
    e << YAML::Key << "oversubscription_exponent" << YAML::Value << cs.oversubscription_exponent;
    e << YAML::Key << "comm_exponent" << YAML::Value << cs.comm_exponent;
    e << YAML::Key << "comm_compute_weight" << YAML::Value << cs.comm_compute_weight;
    e << YAML::Key << "comm_thread_weight" << YAML::Value << cs.comm_thread_weight;
    e << YAML::EndMap;
  }
  if (!p.host.compression.empty()) {
    e << YAML::Key << "compression" << YAML::Value << YAML::BeginMap;
    for (const auto& [scheme, r] : p.host.compression) {
      e << YAML::Key << scheme << YAML::Value << YAML::Flow << YAML::BeginMap;
      e << YAML::Key << "compress_ns" << YAML::Value << r.compress_ns;
      e << YAML::Key << "decompress_ns" << YAML::Value << r.decompress_ns;
      e << YAML::EndMap;
    }
    e << YAML::EndMap;
  }
  if (!p.host.rounding_ns.empty()) {
    e << YAML::Key << "rounding" << YAML::Value << YAML::BeginMap;
    for (const auto& [f, ns] : p.host.rounding_ns) e << YAML::Key << f << YAML::Value << ns;
    e << YAML::EndMap;
  }
  if (!p.ops.empty()) {
    e << YAML::Key << "ops" << YAML::Value << YAML::BeginSeq;
    for (const auto& o : p.ops) {
      e << YAML::Flow << YAML::BeginMap;
      emit_string(e << YAML::Key << "name" << YAML::Value, o.name);
      if (o.pieces > 1)
        e << YAML::Key << "piece" << YAML::Value << o.piece << YAML::Key << "pieces" << YAML::Value
          << o.pieces;
      if (o.params > 0) {
        e << YAML::Key << "params" << YAML::Value << o.params;
      } else {
        e << YAML::Key << "batch" << YAML::Value << o.batch << YAML::Key << "seq" << YAML::Value
          << o.seq;
        e << YAML::Key << "d_model" << YAML::Value << o.d_model << YAML::Key << "heads"
          << YAML::Value << o.heads;
        e << YAML::Key << "vocab" << YAML::Value << o.vocab << YAML::Key << "tp" << YAML::Value
          << o.tp;
      }
      e << YAML::Key << "time_us" << YAML::Value << o.time_ns / 1000.0;
      e << YAML::EndMap;
    }
    e << YAML::EndSeq;
  }
  e << YAML::Key << "machine" << YAML::Value << YAML::BeginMap;
  for (const auto& [k, v] : p.machine) emit_string(e << YAML::Key << k << YAML::Value, v);
  e << YAML::EndMap;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

GemmShapeModel gemm_shape_model(const std::string& device) {
  GemmShapeModel g;
  // SMs: NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 on A100), NVIDIA H100 Tensor
  // Core GPU Architecture whitepaper (132 on H100 SXM5; H200 is the same GH100 with HBM3e). Clocks:
  // the boost clocks their dense peaks are counted at, peak / (SMs x FLOP per clock per SM): A100
  // 312 TFLOP/s / (108 x 2048) = 1410 MHz (the whitepaper's boost clock), H100 989.4 TFLOP/s /
  // (132 x 4096) = 1830 MHz (the H100 whitepaper: twice the A100 SM's dense MMA rate per clock).
  // L2: the A100 whitepaper's 5120 bytes per clock at 1410 MHz; no published H100 figure was
  // found, so the operand-bytes term is off there (scenarios/hardware/README.md).
  if (device == "A100-SXM-80GB") {
    g.sms = 108;
    g.clock_hz = 1410e6;
    g.l2_bytes_per_s = 5120.0 * 1410e6;
  } else if (device == "H100-SXM" || device == "H200") {
    g.sms = 132;
    g.clock_hz = 1830e6;
  } else {
    return g;
  }
  // cuBLAS's tile shapes (NVIDIA, Matrix Multiplication Background User's Guide, "Tile
  // quantization": 256x128 down to 64x64); a tile's rate relative to the largest by its operand
  // reuse, tm·tn / (tm + tn) over 128·256 / 384 (the guide: larger tiles reuse more data).
  g.tiles = {{128, 256, 1.0}, {256, 128, 1.0}, {128, 128, 0.75},
             {64, 128, 0.5},  {128, 64, 0.5},  {64, 64, 0.375}};
  // Fitted, with the ceiling, to two published H100-class maxima (scenarios/hardware/README.md).
  g.k_fixed = 32;
  // Split K until the grid fills the SMs once, whatever the factor (cuBLAS's grids do).
  g.max_split_k = g.sms;
  // Chosen, not sourced (README): a barrier and the wait for the next stage per iteration;
  // `orrery calibrate` fits it from GPU traces with shapes.
  g.iteration_latency_cycles = 64;
  g.tile_k_bytes = 128;  // 32 TF32 or 64 16-bit elements: CUTLASS's and cuBLAS's kernel names
  // An assumption, not sourced (README): the prologue waits for the first stage's operands from
  // memory and the epilogue for the output's stores, two memory round trips of several hundred
  // cycles; `orrery calibrate` fits it from GPU traces with shapes.
  g.kernel_latency_cycles = 1000;
  return g;
}

OffloadLinks offload_defaults(const std::string& device, bool is_gpu) {
  // Sources: scenarios/hardware/README.md's offload table. Link rates, not measurements.
  OffloadLinks o;
  if (!is_gpu) {
    // A CPU rank's state is in host memory already (no host link); its disk is unknown: a
    // SATA-class 0.5 GB/s both ways stands in until `orrery calibrate` measures it.
    o.nvme_read_bytes_per_s = 0.5e9;
    o.nvme_write_bytes_per_s = 0.5e9;
    return o;
  }
  const bool hopper = device == "H100-SXM" || device == "H200";
  // PCIe 4.0 x16 (A100) / 5.0 x16 (H100, H200): 16 / 32 GT/s x 16 lanes x 128b/130b, per direction.
  o.host_link_bytes_per_s = hopper ? 63.0e9 : 31.5e9;
  // The host's DRAM peak, a bound on AdamW's state traffic: DGX A100's two AMD EPYC 7742 with 8
  // channels of DDR4-3200 each (2 x 8 x 25.6 GB/s), DGX H100/H200's two Xeon Platinum 8480C with
  // 8 channels of DDR5-4800 each (2 x 8 x 38.4 GB/s).
  o.host_adamw_bytes_per_s = hopper ? 614.4e9 : 409.6e9;
  // DGX A100: 4, DGX H100/H200: 8 U.2 NVMe drives per node (NVIDIA DGX datasheets), each assumed
  // PCIe 4.0 datacenter class at 7.0 GB/s read and 3.8 GB/s write sequential (Samsung PM1733
  // datasheet), striped.
  const double drives = hopper ? 8 : 4;
  o.nvme_read_bytes_per_s = drives * 7.0e9;
  o.nvme_write_bytes_per_s = drives * 3.8e9;
  return o;
}

HardwareProfile default_hardware_profile(const std::string& device, bool is_gpu) {
  HardwareProfile p;
  p.name = device + "-default";
  p.device = device;
  p.machine["source"] = "built-in uncalibrated defaults (datasheet peaks, typical efficiencies)";
  auto set = [&](OpClass c, double fe, double be, int64_t overhead_ns) {
    p.classes[static_cast<int>(c)] = ClassCost{fe, be, overhead_ns};
  };
  if (is_gpu) {
    // bf16 on NVIDIA datacenter GPUs; the sources of each number are in scenarios/hardware/README.md.
    // GEMMs: by shape (gemm_shape_model) under the ceiling a large GEMM reaches, fitted to the
    // published maximum achievable matmul FLOPS; devices without a shape model at a flat 0.70.
    // Fused attention about half of peak, memory-bound kernels 80-90 % of HBM bandwidth, a few
    // microseconds of launch overhead per kernel.
    p.precision = Precision::BF16;
    p.data_load_ns = 20'000;
    p.gemm_shape = gemm_shape_model(device);
    const double gemm_ceiling = device == "A100-SXM-80GB"                  ? 0.899
                                : device == "H100-SXM" || device == "H200" ? 0.878
                                                                           : 0.70;
    set(OpClass::Gemm, gemm_ceiling, 0.85, 4'000);
    set(OpClass::Attention, 0.50, 0.85, 6'000);
    set(OpClass::Elementwise, 1.0, 0.85, 3'000);
    set(OpClass::LayerNorm, 1.0, 0.80, 3'000);
    set(OpClass::SoftmaxLoss, 1.0, 0.80, 4'000);
    set(OpClass::Optimizer, 1.0, 0.85, 10'000);
  } else {
    // fp32 CPU kernels (OpenBLAS sgemm at half of peak, hand-written loops memory-bound).
    p.precision = Precision::FP32;
    p.data_load_ns = 50'000;
    set(OpClass::Gemm, 0.50, 0.60, 2'000);
    set(OpClass::Attention, 0.25, 0.50, 2'000);
    set(OpClass::Elementwise, 1.0, 0.50, 1'000);
    set(OpClass::LayerNorm, 1.0, 0.50, 1'000);
    set(OpClass::SoftmaxLoss, 1.0, 0.50, 1'000);
    set(OpClass::Optimizer, 1.0, 0.50, 2'000);
  }
  p.offload = offload_defaults(device, is_gpu);
  return p;
}

}  // namespace orrery::sim
