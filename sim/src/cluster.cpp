// Device presets and cluster files (YAML): parsing with file:line:key errors, and resizing a cluster
// design for sweeps.
#include "orrery/sim/cluster.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include "orrery/common/error.hpp"

namespace orrery::sim {

namespace {

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& ch : r) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return r;
}

constexpr double kT = 1e12;
constexpr double kG = 1e9;

const std::vector<Device>& presets() {
  // Vendor datasheets (shared/reference/facts.md); FP32 is the non-tensor-core dense rate.
  static const std::vector<Device> p = {
      {"A100-SXM-80GB", 19.5 * kT, 156 * kT, 312 * kT, 2039 * kG, 80LL * 1000 * 1000 * 1000},
      {"H100-SXM", 67 * kT, 495 * kT, 989 * kT, 3350 * kG, 80LL * 1000 * 1000 * 1000},
      {"H200", 67 * kT, 495 * kT, 989 * kT, 4800 * kG, 141LL * 1000 * 1000 * 1000},
      // A rough 2-core x86 machine (AVX2 FMA, ~2.5 GHz: 2 x 32 FLOP/cycle); calibration replaces it.
      {"cpu", 160e9, 160e9, 160e9, 20 * kG, 8LL * 1000 * 1000 * 1000, false},
  };
  return p;
}

}  // namespace

double Device::peak_flops(Precision p) const {
  switch (p) {
    case Precision::FP32:
      return peak_fp32_flops;
    case Precision::TF32:
      return peak_tf32_flops;
    case Precision::BF16:
    case Precision::FP16:
      return peak_bf16_flops;
  }
  return 0;
}

std::optional<Device> device_preset(std::string_view name) {
  const std::string l = lower(name);
  for (const Device& d : presets())
    if (lower(d.name) == l) return d;
  // Common aliases.
  if (l == "a100" || l == "a100-sxm4-80gb" || l == "a100-80gb") return presets()[0];
  if (l == "h100" || l == "h100-sxm5-80gb" || l == "h100-sxm5") return presets()[1];
  if (l == "h200-sxm" || l == "h200-sxm-141gb") return presets()[2];
  return std::nullopt;
}

std::vector<std::string> device_preset_names() {
  std::vector<std::string> r;
  for (const Device& d : presets()) r.push_back(d.name);
  return r;
}

std::string_view to_string(Protocol p) {
  switch (p) {
    case Protocol::Auto:
      return "auto";
    case Protocol::LL:
      return "LL";
    case Protocol::LL128:
      return "LL128";
    case Protocol::Simple:
      return "Simple";
  }
  return "?";
}

std::optional<Protocol> protocol_from_string(std::string_view s) {
  const std::string l = lower(s);
  if (l == "auto") return Protocol::Auto;
  if (l == "ll") return Protocol::LL;
  if (l == "ll128") return Protocol::LL128;
  if (l == "simple") return Protocol::Simple;
  return std::nullopt;
}

std::string_view to_string(TopologyKind k) {
  switch (k) {
    case TopologyKind::Crossbar:
      return "crossbar";
    case TopologyKind::FatTree:
      return "fat-tree";
    case TopologyKind::Ring:
      return "ring";
    case TopologyKind::Torus:
      return "torus";
  }
  return "?";
}

namespace {

class Parser {
 public:
  explicit Parser(std::string origin) : origin_(std::move(origin)) {}

  [[noreturn]] void fail(const YAML::Node& n, const std::string& key,
                         const std::string& what) const {
    std::ostringstream os;
    os << origin_;
    if (n.Mark().line >= 0) os << ":" << n.Mark().line + 1;
    os << ": " << key << ": " << what;
    throw InputError(os.str());
  }

  void check_keys(const YAML::Node& map, const std::string& where,
                  const std::set<std::string>& known) const {
    if (!map.IsMap()) fail(map, where, "expected a mapping");
    for (const auto& kv : map) {
      // "? [a, b]: 1" is valid YAML; as<std::string>() would throw a YAML exception.
      if (!kv.first.IsScalar())
        fail(kv.first, where.empty() ? "key" : where, "a key must be a name, not a list or map");
      const std::string k = kv.first.as<std::string>();
      if (!known.count(k)) {
        std::string list;
        for (const auto& s : known) list += (list.empty() ? "" : ", ") + s;
        fail(kv.first, where.empty() ? k : where + "." + k,
             "unknown key; expected one of: " + list);
      }
    }
  }

  template <typename T>
  T get(const YAML::Node& map, const std::string& where, const std::string& key, T def) const {
    const YAML::Node n = map[key];
    if (!n) return def;
    try {
      return n.as<T>();
    } catch (const YAML::Exception&) {
      fail(n, where + key, std::string("expected a ") + type_name<T>());
    }
  }

  template <typename T>
  static const char* type_name() {
    if constexpr (std::is_same_v<T, bool>)
      return "boolean (true/false)";
    else if constexpr (std::is_integral_v<T>)
      return "whole number";
    else if constexpr (std::is_floating_point_v<T>)
      return "number";
    else
      return "string";
  }

  double positive(const YAML::Node& map, const std::string& where, const std::string& key,
                  double def) const {
    const double v = get<double>(map, where, key, def);
    if (!(v > 0)) fail(map[key], where + key, "expected a number > 0");
    return v;
  }
  int64_t non_negative(const YAML::Node& map, const std::string& where, const std::string& key,
                       int64_t def) const {
    const int64_t v = get<int64_t>(map, where, key, def);
    if (v < 0) fail(map[key], where + key, "expected a number >= 0");
    return v;
  }

  std::string origin_;
};

Device parse_device(const Parser& p, const YAML::Node& n) {
  std::string preset_name;
  if (n.IsScalar()) {
    preset_name = n.as<std::string>();
  } else {
    p.check_keys(n, "device",
                 {"preset", "name", "peak_fp32_tflops", "peak_tf32_tflops", "peak_bf16_tflops",
                  "mem_bandwidth_gb_per_s", "mem_capacity_gb"});
    preset_name = p.get<std::string>(n, "device.", "preset", "");
  }
  Device d;
  // An empty scalar ("device: !x") is neither a preset nor a mapping: refused below, not subscripted.
  if (!preset_name.empty()) {
    auto found = device_preset(preset_name);
    if (!found) {
      std::string list;
      for (const auto& s : device_preset_names()) list += (list.empty() ? "" : ", ") + s;
      p.fail(n.IsScalar() ? n : n["preset"], "device",
             "unknown device '" + preset_name + "'; expected one of: " + list);
    }
    d = *found;
  } else if (!n.IsMap() || !n["peak_bf16_tflops"] || !n["mem_bandwidth_gb_per_s"] ||
             !n["mem_capacity_gb"]) {
    p.fail(n, "device",
           "without a preset, give name, peak_fp32/tf32/bf16_tflops, mem_bandwidth_gb_per_s and "
           "mem_capacity_gb");
  }
  if (n.IsMap()) {
    d.name = p.get<std::string>(n, "device.", "name", d.name.empty() ? "custom" : d.name);
    d.peak_bf16_flops = p.positive(n, "device.", "peak_bf16_tflops", d.peak_bf16_flops / kT) * kT;
    d.peak_fp32_flops =
        p.positive(n, "device.", "peak_fp32_tflops",
                   d.peak_fp32_flops > 0 ? d.peak_fp32_flops / kT : d.peak_bf16_flops / kT) *
        kT;
    d.peak_tf32_flops =
        p.positive(n, "device.", "peak_tf32_tflops",
                   d.peak_tf32_flops > 0 ? d.peak_tf32_flops / kT : d.peak_fp32_flops / kT) *
        kT;
    d.mem_bandwidth_bytes_per_s =
        p.positive(n, "device.", "mem_bandwidth_gb_per_s", d.mem_bandwidth_bytes_per_s / kG) * kG;
    d.mem_capacity_bytes = static_cast<int64_t>(
        p.positive(n, "device.", "mem_capacity_gb", d.mem_capacity_bytes / kG) * kG);
  }
  return d;
}

double fraction(const Parser& p, const YAML::Node& map, const std::string& where,
                const std::string& key, double def) {
  const double v = p.get<double>(map, where, key, def);
  if (!(v > 0 && v <= 1)) p.fail(map[key], where + key, "expected a fraction in (0, 1]");
  return v;
}

double non_negative_us(const Parser& p, const YAML::Node& map, const std::string& where,
                       const std::string& key, double def) {
  const double v = p.get<double>(map, where, key, def);
  if (!(v >= 0)) p.fail(map[key], where + key, "expected a number of microseconds >= 0");
  return v;
}

double non_negative_gb_per_s(const Parser& p, const YAML::Node& map, const std::string& where,
                             const std::string& key, double def) {
  const double v = p.get<double>(map, where, key, def);
  if (!(v >= 0)) p.fail(map[key], where + key, "expected GB/s >= 0 (0 = no limit)");
  return v;
}

void parse_protocol(const Parser& p, const YAML::Node& n, const std::string& where,
                    NcclProtocolParams& pp) {
  p.check_keys(n, where,
               {"efficiency", "base_latency_us", "nvlink_step_latency_us", "net_step_latency_us",
                "tree_base_latency_us", "tree_nvlink_step_latency_us", "tree_net_step_latency_us"});
  const std::string w = where + ".";
  pp.efficiency = fraction(p, n, w, "efficiency", pp.efficiency);
  pp.base_latency_us = non_negative_us(p, n, w, "base_latency_us", pp.base_latency_us);
  pp.nvlink_step_latency_us =
      non_negative_us(p, n, w, "nvlink_step_latency_us", pp.nvlink_step_latency_us);
  pp.net_step_latency_us = non_negative_us(p, n, w, "net_step_latency_us", pp.net_step_latency_us);
  pp.tree_base_latency_us =
      non_negative_us(p, n, w, "tree_base_latency_us", pp.tree_base_latency_us);
  pp.tree_nvlink_step_latency_us =
      non_negative_us(p, n, w, "tree_nvlink_step_latency_us", pp.tree_nvlink_step_latency_us);
  pp.tree_net_step_latency_us =
      non_negative_us(p, n, w, "tree_net_step_latency_us", pp.tree_net_step_latency_us);
}

// The `nccl:` section. Defaults by device: NVLink efficiency from NCCL's per-link bandwidths
// (src/graph/topo.h: SM80_NVLINK_BW 20 GB/s of A100's 12 links at 25 GB/s, SM90_NVLINK_BW 20.6 GB/s of
// H100/H200's 18 links at 25 GB/s); NIC efficiency 0.94 (an NVIDIA maintainer on NVIDIA/nccl-tests#290:
// "for NDR @ 400Gbps you should see 46-48GB/s per NIC", of 50); NVLS on Hopper (NVLink 4 NVSwitch).
void parse_nccl(const Parser& p, const YAML::Node& n, Cluster& c) {
  if (n.IsScalar() || n.IsNull()) {
    // "nccl: {}" or "nccl:" alone: the defaults.
  } else {
    p.check_keys(
        n, "nccl",
        {"nvlink_efficiency", "nic_efficiency", "nvls", "nvls_efficiency", "nvls_latency_us",
         "nvls_tree_latency_us", "nvls_tree_net_step_latency_us", "ll_max_busbw_2_nodes_gb_per_s",
         "ll_max_busbw_gb_per_s", "net_overhead_us", "max_channels", "ll", "ll128", "simple"});
  }
  NcclModel& m = c.nccl;
  m.enabled = true;
  const std::string dev = lower(c.device.name);
  const bool hopper =
      dev.find("h100") != std::string::npos || dev.find("h200") != std::string::npos;
  const bool ampere = dev.find("a100") != std::string::npos;
  m.nvlink_efficiency = hopper ? 20.6 / 25.0 : ampere ? 20.0 / 25.0 : 1.0;
  m.nic_efficiency = 0.94;
  m.nvls = hopper;
  // LL between nodes: NCCL's llMaxBws for 2 and for 4+ nodes (tuning.cc, Hopper 45/35, Ampere 22.5/19).
  m.ll_max_busbw_2_nodes_gb_per_s = hopper ? 45.0 : ampere ? 22.5 : 0.0;
  m.ll_max_busbw_gb_per_s = hopper ? 35.0 : ampere ? 19.0 : 0.0;
  // LL: NCCL's llMaxBws cap on one node (tuning.cc: Ampere 87.7 GB/s, Hopper 141 GB/s of busbw) as a
  // share of the effective NVLink rate, when it is below LL's half.
  auto ll_default = [&] {
    if (hopper || ampere)
      m.ll.efficiency =
          std::min(0.5, (hopper ? 141.0 : 87.7) / (c.topo.nvlink_gb_per_s * m.nvlink_efficiency));
  };
  if (!n.IsMap()) {
    ll_default();
    return;
  }
  const std::string w = "nccl.";
  m.nvlink_efficiency = fraction(p, n, w, "nvlink_efficiency", m.nvlink_efficiency);
  ll_default();
  m.nic_efficiency = fraction(p, n, w, "nic_efficiency", m.nic_efficiency);
  m.nvls = p.get<bool>(n, w, "nvls", m.nvls);
  m.nvls_efficiency = fraction(p, n, w, "nvls_efficiency", m.nvls_efficiency);
  m.nvls_latency_us = non_negative_us(p, n, w, "nvls_latency_us", m.nvls_latency_us);
  m.nvls_tree_latency_us = non_negative_us(p, n, w, "nvls_tree_latency_us", m.nvls_tree_latency_us);
  m.nvls_tree_net_step_latency_us =
      non_negative_us(p, n, w, "nvls_tree_net_step_latency_us", m.nvls_tree_net_step_latency_us);
  m.ll_max_busbw_2_nodes_gb_per_s = non_negative_gb_per_s(p, n, w, "ll_max_busbw_2_nodes_gb_per_s",
                                                          m.ll_max_busbw_2_nodes_gb_per_s);
  m.ll_max_busbw_gb_per_s =
      non_negative_gb_per_s(p, n, w, "ll_max_busbw_gb_per_s", m.ll_max_busbw_gb_per_s);
  m.net_overhead_us = non_negative_us(p, n, w, "net_overhead_us", m.net_overhead_us);
  m.max_channels = p.get<int>(n, w, "max_channels", 0);
  if (m.max_channels < 0)
    p.fail(n["max_channels"], "nccl.max_channels", "expected a whole number >= 0");
  if (n["ll"]) parse_protocol(p, n["ll"], "nccl.ll", m.ll);
  if (n["ll128"]) parse_protocol(p, n["ll128"], "nccl.ll128", m.ll128);
  if (n["simple"]) parse_protocol(p, n["simple"], "nccl.simple", m.simple);
}

}  // namespace

Cluster parse_cluster(const std::string& yaml_text, const std::string& origin) {
  Parser p(origin);
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw InputError(origin + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
  if (!root || !root.IsMap()) throw InputError(origin + ": expected a mapping of cluster keys");
  p.check_keys(root, "",
               {"name", "device", "nodes", "gpus_per_node", "topology", "collective", "nccl"});
  Cluster c;
  c.path = origin;
  c.name = p.get<std::string>(root, "", "name", "");
  if (c.name.empty()) {
    std::string stem = origin.substr(origin.find_last_of('/') + 1);
    c.name = stem.substr(0, stem.find_last_of('.'));
  }
  if (!root["device"]) p.fail(root, "device", "missing; expected a preset name or a mapping");
  c.device = parse_device(p, root["device"]);
  c.nodes = p.get<int>(root, "", "nodes", 1);
  if (c.nodes < 1) p.fail(root["nodes"], "nodes", "expected a whole number >= 1");
  c.gpus_per_node = p.get<int>(root, "", "gpus_per_node", 8);
  if (c.gpus_per_node < 1)
    p.fail(root["gpus_per_node"], "gpus_per_node", "expected a whole number >= 1");

  const YAML::Node t = root["topology"];
  if (!t)
    p.fail(root, "topology",
           "missing; expected a mapping with kind: crossbar | fat-tree | ring | torus");
  p.check_keys(t, "topology",
               {"kind", "nvlink_gb_per_s", "nvlink_latency_ns", "nic_gb_per_s", "nic_latency_ns",
                "switch_latency_ns", "rail_optimized", "tiers", "radix", "oversubscription",
                "link_gb_per_s", "link_latency_ns", "dims"});
  const std::string kind = p.get<std::string>(t, "topology.", "kind", "");
  TopologyConfig& tc = c.topo;
  if (kind == "crossbar")
    tc.kind = TopologyKind::Crossbar;
  else if (kind == "fat-tree" || kind == "fat_tree" || kind == "fattree")
    tc.kind = TopologyKind::FatTree;
  else if (kind == "ring")
    tc.kind = TopologyKind::Ring;
  else if (kind == "torus")
    tc.kind = TopologyKind::Torus;
  else
    p.fail(t["kind"] ? t["kind"] : t, "topology.kind",
           "unknown topology '" + kind + "'; expected crossbar, fat-tree, ring or torus");
  const std::string w = "topology.";
  tc.nvlink_gb_per_s = p.positive(t, w, "nvlink_gb_per_s", tc.nvlink_gb_per_s);
  tc.nvlink_latency_ns = p.non_negative(t, w, "nvlink_latency_ns", tc.nvlink_latency_ns);
  tc.nic_gb_per_s = p.positive(t, w, "nic_gb_per_s", tc.nic_gb_per_s);
  tc.nic_latency_ns = p.non_negative(t, w, "nic_latency_ns", tc.nic_latency_ns);
  tc.switch_latency_ns = p.non_negative(t, w, "switch_latency_ns", tc.switch_latency_ns);
  tc.rail_optimized = p.get<bool>(t, w, "rail_optimized", tc.rail_optimized);
  tc.tiers = p.get<int>(t, w, "tiers", tc.tiers);
  if (tc.tiers != 2 && tc.tiers != 3) p.fail(t["tiers"], "topology.tiers", "expected 2 or 3");
  tc.radix = p.get<int>(t, w, "radix", tc.radix);
  if (tc.radix < 4) p.fail(t["radix"], "topology.radix", "expected a whole number >= 4");
  tc.oversubscription = p.get<double>(t, w, "oversubscription", tc.oversubscription);
  if (tc.oversubscription < 1)
    p.fail(t["oversubscription"], "topology.oversubscription", "expected a number >= 1 (down:up)");
  tc.link_gb_per_s = p.positive(t, w, "link_gb_per_s", tc.link_gb_per_s);
  tc.link_latency_ns = p.non_negative(t, w, "link_latency_ns", tc.link_latency_ns);
  if (t["dims"]) {
    if (!t["dims"].IsSequence())
      p.fail(t["dims"], "topology.dims", "expected a list of 2 or 3 sizes");
    try {
      tc.dims = t["dims"].as<std::vector<int>>();
    } catch (const YAML::Exception&) {
      p.fail(t["dims"], "topology.dims", "expected a list of whole numbers");
    }
  }
  if (tc.kind == TopologyKind::Torus && tc.dims.empty())
    p.fail(t, "topology.dims", "a torus needs dims: [x, y] or [x, y, z]");

  if (const YAML::Node col = root["collective"]) {
    p.check_keys(col, "collective", {"step_latency_ns", "channels"});
    c.coll.step_latency_ns = p.non_negative(col, "collective.", "step_latency_ns", 0);
    c.coll.channels = p.get<int>(col, "collective.", "channels", 0);
    if (c.coll.channels < 0)
      p.fail(col["channels"], "collective.channels", "expected a whole number >= 0 (0: automatic)");
  }
  if (const YAML::Node n = root["nccl"]) parse_nccl(p, n, c);
  try {
    build_topology(c);
  } catch (const InputError& e) {
    throw InputError(origin + ": " + e.what());
  }
  return c;
}

Cluster load_cluster(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open cluster file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_cluster(ss.str(), path);
}

Cluster resize_cluster(const Cluster& c, int gpus) {
  if (gpus < 1) throw InputError("cluster size must be >= 1 GPU");
  Cluster r = c;
  switch (c.topo.kind) {
    case TopologyKind::Crossbar:
      if (gpus > c.num_gpus()) {
        throw InputError(c.name + ": a crossbar cluster of " + std::to_string(c.num_gpus()) +
                         " GPUs cannot hold " + std::to_string(gpus));
      }
      r.nodes = 1;
      r.gpus_per_node = gpus;
      break;
    case TopologyKind::FatTree:
      if (gpus < c.gpus_per_node) {
        r.nodes = 1;
        r.gpus_per_node = gpus;
      } else {
        r.nodes = (gpus + c.gpus_per_node - 1) / c.gpus_per_node;
      }
      try {
        build_topology(r);
        return r;
      } catch (const InputError&) {
        if (r.topo.tiers == 3) throw;
        r.topo.tiers = 3;
      }
      break;
    case TopologyKind::Ring:
      r.nodes = gpus;
      r.gpus_per_node = 1;
      break;
    case TopologyKind::Torus:
      if (gpus != c.num_gpus()) {
        throw InputError(c.name + ": a torus cannot be resized to " + std::to_string(gpus) +
                         " GPUs; write a cluster file with its dims");
      }
      break;
  }
  build_topology(r);
  return r;
}

}  // namespace orrery::sim
