// Topologies built from parameters (crossbar, DGX nodes on a fat-tree, ring, torus) with structural
// shortest-path routing and hash-based ECMP, plus a BFS router used to check them.
#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/sim/cluster.hpp"

namespace orrery::sim {

namespace {

// splitmix64 step: decorrelates the ECMP hash for each decision.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class CrossbarTopology final : public Topology {
 public:
  CrossbarTopology(int gpus, double gbps, int64_t lat_ns) {
    gpus_ = gpus;
    for (int g = 0; g < gpus; ++g) add_vertex("gpu" + std::to_string(g));
    const int sw = add_vertex("nvswitch");
    for (int g = 0; g < gpus; ++g) {
      up_.push_back(add_link(g, sw, gbps, lat_ns));
      down_.push_back(add_link(sw, g, gbps, lat_ns));
    }
    description_ =
        "crossbar: " + std::to_string(gpus) + " GPUs, " + fmt(gbps) + " GB/s per direction";
  }
  void route(int32_t src, int32_t dst, uint64_t, std::vector<int32_t>& out) const override {
    out.push_back(up_[src]);
    out.push_back(down_[dst]);
  }
  static std::string fmt(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return b;
  }

 private:
  std::vector<int32_t> up_, down_;
};

class FatTreeTopology final : public Topology {
 public:
  FatTreeTopology(const TopologyConfig& t, int nodes, int gpn)
      : gpn_(gpn), rail_(t.rail_optimized) {
    const int n = nodes * gpn;
    gpus_ = n;
    if (t.radix < 4) throw InputError("topology.radix must be at least 4");
    if (t.oversubscription < 1.0)
      throw InputError("topology.oversubscription must be >= 1 (down:up)");
    down_ports_ = fat_tree_leaf_down_ports(t);
    up_ports_ = t.radix - down_ports_;
    for (int g = 0; g < n; ++g) add_vertex("gpu" + std::to_string(g));
    for (int k = 0; k < nodes; ++k)
      nvs_.push_back(add_vertex("node" + std::to_string(k) + "/nvswitch"));
    for (int g = 0; g < n; ++g)
      nic_v_.push_back(
          add_vertex("node" + std::to_string(g / gpn) + "/nic" + std::to_string(g % gpn)));
    // Leaf of each NIC.
    nic_leaf_idx_.resize(n);
    if (rail_) {
      leaves_per_rail_ = (nodes + down_ports_ - 1) / down_ports_;
      for (int g = 0; g < n; ++g)
        nic_leaf_idx_[g] = (g % gpn) * leaves_per_rail_ + (g / gpn) / down_ports_;
      num_leaves_ = gpn * leaves_per_rail_;
    } else {
      for (int g = 0; g < n; ++g) nic_leaf_idx_[g] = g / down_ports_;
      num_leaves_ = (n + down_ports_ - 1) / down_ports_;
    }
    tiers_ = t.tiers;
    if (tiers_ != 2 && tiers_ != 3) throw InputError("topology.tiers must be 2 or 3");
    if (tiers_ == 2 && num_leaves_ > t.radix) {
      throw InputError("a 2-tier fat-tree of radix " + std::to_string(t.radix) + " holds at most " +
                       std::to_string(t.radix) + " leaves; this cluster needs " +
                       std::to_string(num_leaves_) + " (use tiers: 3 or a larger radix)");
    }
    for (int l = 0; l < num_leaves_; ++l) leaf_v_.push_back(add_vertex("leaf" + std::to_string(l)));
    for (int g = 0; g < n; ++g) {
      const int k = g / gpn;
      gpu_nvs_.push_back(add_link(g, nvs_[k], t.nvlink_gb_per_s, t.nvlink_latency_ns));
      nvs_gpu_.push_back(add_link(nvs_[k], g, t.nvlink_gb_per_s, t.nvlink_latency_ns));
      gpu_nic_.push_back(add_link(g, nic_v_[g], t.nic_gb_per_s, 0));
      nic_gpu_.push_back(add_link(nic_v_[g], g, t.nic_gb_per_s, 0));
      // PXN path (NVSwitch to another GPU's NIC), used on rail-optimized fabrics only.
      nvs_nic_.push_back(rail_ ? add_link(nvs_[k], nic_v_[g], t.nvlink_gb_per_s, 0) : -1);
      nic_up_.push_back(
          add_link(nic_v_[g], leaf_v_[nic_leaf_idx_[g]], t.nic_gb_per_s, t.nic_latency_ns));
      nic_down_.push_back(
          add_link(leaf_v_[nic_leaf_idx_[g]], nic_v_[g], t.nic_gb_per_s, t.nic_latency_ns));
    }
    const double port = t.nic_gb_per_s;
    const int64_t sl = t.switch_latency_ns;
    if (tiers_ == 2) {
      // up_ports_ spines; each leaf has one port to each spine.
      for (int s = 0; s < up_ports_; ++s)
        spine_v_.push_back(add_vertex("spine" + std::to_string(s)));
      leaf_up_.assign(static_cast<size_t>(num_leaves_) * up_ports_, -1);
      leaf_down_.assign(static_cast<size_t>(num_leaves_) * up_ports_, -1);
      for (int l = 0; l < num_leaves_; ++l)
        for (int s = 0; s < up_ports_; ++s) {
          leaf_up_[l * up_ports_ + s] = add_link(leaf_v_[l], spine_v_[s], port, sl);
          leaf_down_[l * up_ports_ + s] = add_link(spine_v_[s], leaf_v_[l], port, sl);
        }
    } else {
      // Pods of radix/2 leaves, each pod with up_ports_ aggregation switches (one port from every
      // leaf of the pod to each); aggregation switch j of every pod has radix/2 ports up, one to each
      // core of core group j.
      leaves_per_pod_ = t.radix / 2;
      pods_ = (num_leaves_ + leaves_per_pod_ - 1) / leaves_per_pod_;
      cores_per_group_ = t.radix / 2;
      if (pods_ > t.radix) {
        throw InputError("a 3-tier fat-tree of radix " + std::to_string(t.radix) +
                         " holds at most " + std::to_string(t.radix) +
                         " pods; this cluster needs " + std::to_string(pods_));
      }
      for (int p = 0; p < pods_; ++p)
        for (int j = 0; j < up_ports_; ++j)
          agg_v_.push_back(add_vertex("pod" + std::to_string(p) + "/agg" + std::to_string(j)));
      for (int j = 0; j < up_ports_; ++j)
        for (int c = 0; c < cores_per_group_; ++c)
          core_v_.push_back(add_vertex("core" + std::to_string(j) + "." + std::to_string(c)));
      leaf_up_.assign(static_cast<size_t>(num_leaves_) * up_ports_, -1);
      leaf_down_.assign(static_cast<size_t>(num_leaves_) * up_ports_, -1);
      for (int l = 0; l < num_leaves_; ++l) {
        const int p = l / leaves_per_pod_;
        for (int j = 0; j < up_ports_; ++j) {
          leaf_up_[l * up_ports_ + j] = add_link(leaf_v_[l], agg_v_[p * up_ports_ + j], port, sl);
          leaf_down_[l * up_ports_ + j] = add_link(agg_v_[p * up_ports_ + j], leaf_v_[l], port, sl);
        }
      }
      agg_up_.assign(static_cast<size_t>(pods_) * up_ports_ * cores_per_group_, -1);
      agg_down_.assign(agg_up_.size(), -1);
      for (int p = 0; p < pods_; ++p)
        for (int j = 0; j < up_ports_; ++j)
          for (int c = 0; c < cores_per_group_; ++c) {
            const size_t i = (static_cast<size_t>(p) * up_ports_ + j) * cores_per_group_ + c;
            agg_up_[i] =
                add_link(agg_v_[p * up_ports_ + j], core_v_[j * cores_per_group_ + c], port, sl);
            agg_down_[i] =
                add_link(core_v_[j * cores_per_group_ + c], agg_v_[p * up_ports_ + j], port, sl);
          }
    }
    description_ = std::to_string(nodes) + " nodes x " + std::to_string(gpn) + " GPUs, " +
                   (rail_ ? "rail-optimized " : "") + std::to_string(tiers_) +
                   "-tier fat-tree (radix " + std::to_string(t.radix) + ", " +
                   std::to_string(down_ports_) + " down / " + std::to_string(up_ports_) +
                   " up per leaf, " + std::to_string(num_leaves_) + " leaves)";
  }

  std::pair<int32_t, int32_t> ecmp_endpoints(int32_t a, int32_t b) const override {
    if (!rail_ || a / gpn_ == b / gpn_ || a % gpn_ != b % gpn_) return {a, b};
    return {a - a % gpn_, b - b % gpn_};
  }

  bool rails_are_copies() const override {
    if (!rail_) return false;
    if (tiers_ == 2 || leaves_per_rail_ % leaves_per_pod_ == 0) return true;
    // Otherwise each rail must stay inside one pod (its traffic never reaches the aggregation
    // switches' uplinks, which the pod's other rails use).
    for (int r = 0; r < gpn_; ++r)
      if ((r * leaves_per_rail_) / leaves_per_pod_ !=
          ((r + 1) * leaves_per_rail_ - 1) / leaves_per_pod_)
        return false;
    return true;
  }

  void route(int32_t a, int32_t b, uint64_t hash, std::vector<int32_t>& out) const override {
    const int ka = a / gpn_, kb = b / gpn_;
    if (ka == kb) {
      out.push_back(gpu_nvs_[a]);
      out.push_back(nvs_gpu_[b]);
      return;
    }
    // Leave the node through the NIC on the destination's rail (NCCL's PXN) when rail-optimized:
    // same-rail traffic then stays below the rail's leaves.
    int src_nic = a;
    if (rail_ && (a % gpn_) != (b % gpn_)) {
      src_nic = ka * gpn_ + (b % gpn_);
      out.push_back(gpu_nvs_[a]);
      out.push_back(nvs_nic_[src_nic]);
    } else {
      out.push_back(gpu_nic_[a]);
    }
    out.push_back(nic_up_[src_nic]);
    const int la = nic_leaf_idx_[src_nic], lb = nic_leaf_idx_[b];
    if (la != lb) {
      const uint64_t h = mix(hash);
      const int j = static_cast<int>(h % static_cast<uint64_t>(up_ports_));
      if (tiers_ == 2) {
        out.push_back(leaf_up_[la * up_ports_ + j]);
        out.push_back(leaf_down_[lb * up_ports_ + j]);
      } else {
        const int pa = la / leaves_per_pod_, pb = lb / leaves_per_pod_;
        out.push_back(leaf_up_[la * up_ports_ + j]);
        if (pa != pb) {
          const int c = static_cast<int>((h / up_ports_) % static_cast<uint64_t>(cores_per_group_));
          out.push_back(agg_up_[(static_cast<size_t>(pa) * up_ports_ + j) * cores_per_group_ + c]);
          out.push_back(
              agg_down_[(static_cast<size_t>(pb) * up_ports_ + j) * cores_per_group_ + c]);
        }
        out.push_back(leaf_down_[lb * up_ports_ + j]);
      }
    }
    out.push_back(nic_down_[b]);
    out.push_back(nic_gpu_[b]);
  }

 private:
  int gpn_;
  bool rail_;
  int down_ports_ = 0, up_ports_ = 0, num_leaves_ = 0, leaves_per_rail_ = 0, tiers_ = 2;
  int leaves_per_pod_ = 0, pods_ = 0, cores_per_group_ = 0;
  std::vector<int32_t> nvs_, nic_v_, leaf_v_, spine_v_, agg_v_, core_v_, nic_leaf_idx_;
  std::vector<int32_t> gpu_nvs_, nvs_gpu_, gpu_nic_, nic_gpu_, nvs_nic_, nic_up_, nic_down_;
  std::vector<int32_t> leaf_up_, leaf_down_, agg_up_, agg_down_;
};

// Ring and torus: GPUs are the vertices; dimension-order routing, the shorter way round in each
// dimension (a tie, half-way round, chosen by the hash).
class TorusTopology final : public Topology {
 public:
  TorusTopology(std::vector<int> dims, double gbps, int64_t lat, bool ring)
      : dims_(std::move(dims)) {
    int n = 1;
    for (int d : dims_) n *= d;
    gpus_ = n;
    for (int g = 0; g < n; ++g) add_vertex("gpu" + std::to_string(g));
    const int nd = static_cast<int>(dims_.size());
    plus_.assign(static_cast<size_t>(n) * nd, -1);
    minus_.assign(static_cast<size_t>(n) * nd, -1);
    stride_.resize(nd);
    int s = 1;
    for (int d = 0; d < nd; ++d) {
      stride_[d] = s;
      s *= dims_[d];
    }
    for (int g = 0; g < n; ++g)
      for (int d = 0; d < nd; ++d) {
        const int size = dims_[d];
        if (size < 2) continue;
        const int c = (g / stride_[d]) % size;
        const int up = g + (((c + 1) % size) - c) * stride_[d];
        plus_[g * nd + d] = add_link(g, up, gbps, lat);
        if (size > 2) {
          const int dn = g + (((c + size - 1) % size) - c) * stride_[d];
          minus_[g * nd + d] = add_link(g, dn, gbps, lat);
        }
      }
    if (ring) {
      description_ = "ring of " + std::to_string(n) + " GPUs";
    } else {
      description_ = std::to_string(nd) + "D torus ";
      for (int d = 0; d < nd; ++d) description_ += (d ? "x" : "") + std::to_string(dims_[d]);
    }
  }
  void route(int32_t a, int32_t b, uint64_t hash, std::vector<int32_t>& out) const override {
    const int nd = static_cast<int>(dims_.size());
    uint64_t h = mix(hash);
    int cur = a;
    for (int d = 0; d < nd; ++d) {
      const int size = dims_[d];
      const int ca = (cur / stride_[d]) % size, cb = (b / stride_[d]) % size;
      if (ca == cb) continue;
      const int fwd = (cb - ca + size) % size, back = size - fwd;
      bool go_plus = fwd < back || (fwd == back && (h & 1));
      if (size == 2) go_plus = true;
      h >>= 1;
      const int hops = go_plus ? fwd : back;
      for (int i = 0; i < hops; ++i) {
        const int32_t l = go_plus ? plus_[cur * nd + d] : minus_[cur * nd + d];
        out.push_back(l);
        cur = links_[l].dst;
      }
    }
  }

 private:
  std::vector<int> dims_, stride_;
  std::vector<int32_t> plus_, minus_;
};

}  // namespace

int fat_tree_leaf_down_ports(const TopologyConfig& t) {
  const int down =
      static_cast<int>(std::lround(t.radix * t.oversubscription / (1.0 + t.oversubscription)));
  return std::clamp(down, 1, std::max(1, t.radix - 1));
}

int Topology::add_vertex(std::string name) {
  vertex_names_.push_back(std::move(name));
  out_links_.emplace_back();
  return static_cast<int>(vertex_names_.size()) - 1;
}

int Topology::add_link(int src, int dst, double gb_per_s, int64_t latency_ns) {
  links_.push_back(Link{src, dst, gb_per_s, latency_ns});
  const int id = static_cast<int>(links_.size()) - 1;
  out_links_[src].push_back(id);
  return id;
}

int64_t Topology::path_latency_ns(const std::vector<int32_t>& path) const {
  int64_t t = 0;
  for (int32_t l : path) t += links_[l].latency_ns;
  return t;
}

double Topology::path_gb_per_s(const std::vector<int32_t>& path) const {
  double b = std::numeric_limits<double>::infinity();
  for (int32_t l : path) b = std::min(b, links_[l].gb_per_s);
  return b;
}

void Topology::route_bfs(int32_t src, int32_t dst, uint64_t hash, std::vector<int32_t>& out) const {
  const int nv = num_vertices();
  std::vector<int> dist(nv, -1);
  std::deque<int> q{src};
  dist[src] = 0;
  while (!q.empty()) {
    const int v = q.front();
    q.pop_front();
    for (int32_t l : out_links_[v]) {
      const int w = links_[l].dst;
      if (dist[w] < 0) {
        dist[w] = dist[v] + 1;
        q.push_back(w);
      }
    }
  }
  if (dist[dst] < 0)
    throw InternalError("no path from GPU " + std::to_string(src) + " to " + std::to_string(dst));
  // Walk back from dst choosing among the in-links on shortest paths.
  std::vector<std::vector<int32_t>> in(nv);
  for (size_t l = 0; l < links_.size(); ++l) in[links_[l].dst].push_back(static_cast<int32_t>(l));
  std::vector<int32_t> rev;
  int v = dst;
  uint64_t h = mix(hash);
  while (v != src) {
    std::vector<int32_t> cand;
    for (int32_t l : in[v])
      if (dist[links_[l].src] == dist[v] - 1) cand.push_back(l);
    const int32_t l = cand[h % cand.size()];
    h = mix(h);
    rev.push_back(l);
    v = links_[l].src;
  }
  out.insert(out.end(), rev.rbegin(), rev.rend());
}

void build_topology(Cluster& c) {
  // With the nccl model, links carry what NCCL's copies reach of their line rate (NcclModel).
  TopologyConfig eff = c.topo;
  if (c.nccl.enabled) {
    eff.nvlink_gb_per_s *= c.nccl.nvlink_efficiency;
    eff.nic_gb_per_s *= c.nccl.nic_efficiency;
  }
  const TopologyConfig& t = eff;
  const int n = c.num_gpus();
  if (c.nodes < 1 || c.gpus_per_node < 1)
    throw InputError("cluster: nodes and gpus_per_node must be >= 1");
  switch (t.kind) {
    case TopologyKind::Crossbar:
      if (c.nodes != 1) {
        throw InputError("topology kind 'crossbar' is one node; got nodes: " +
                         std::to_string(c.nodes) + " (use kind: fat-tree for several nodes)");
      }
      c.topology = std::make_shared<CrossbarTopology>(n, t.nvlink_gb_per_s, t.nvlink_latency_ns);
      return;
    case TopologyKind::FatTree:
      c.topology = std::make_shared<FatTreeTopology>(t, c.nodes, c.gpus_per_node);
      return;
    case TopologyKind::Ring:
      c.topology = std::make_shared<TorusTopology>(std::vector<int>{n}, t.link_gb_per_s,
                                                   t.link_latency_ns, true);
      return;
    case TopologyKind::Torus: {
      if (t.dims.size() != 2 && t.dims.size() != 3)
        throw InputError("topology.dims: expected 2 or 3 sizes for a torus");
      int prod = 1;
      for (int d : t.dims) {
        if (d < 1) throw InputError("topology.dims: sizes must be >= 1");
        prod *= d;
      }
      if (prod != n) {
        throw InputError("topology.dims multiply to " + std::to_string(prod) +
                         " but the cluster has " + std::to_string(n) +
                         " GPUs (nodes x gpus_per_node)");
      }
      c.topology =
          std::make_shared<TorusTopology>(t.dims, t.link_gb_per_s, t.link_latency_ns, false);
      return;
    }
  }
}

}  // namespace orrery::sim
