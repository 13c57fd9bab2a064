// Mixture-of-experts load, kernels, sizes and parameters for the simulator (see moe_cost.hpp).
#include "orrery/sim/moe_cost.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "orrery/model/activations.hpp"
#include "orrery/model/moe.hpp"
#include "orrery/model/parameters.hpp"
#include "orrery/sim/workload.hpp"

namespace orrery::sim {

namespace moe = ::orrery::model::moe;

MoeLoad moe_load(const Scenario& s, const std::vector<double>& measured) {
  const MoeConfig& c = s.model.moe;
  MoeLoad m;
  if (!c.enabled()) return m;
  m.experts = c.experts;
  m.top_k = c.top_k;
  m.ep = std::max(1, s.parallel.ep);
  m.local_experts = c.experts / m.ep;
  const int64_t n = int64_t(s.training.micro_batch) * s.model.seq;
  m.tokens = double(n);
  m.capacity = moe::capacity(c, n);
  m.shares = moe::expert_load_shares(c.experts, c.router_skew);
  if (measured.size() == size_t(c.experts)) {
    double sum = 0;
    for (double v : measured) sum += v;
    if (sum > 0)
      for (int e = 0; e < c.experts; ++e) m.shares[size_t(e)] = measured[size_t(e)] / sum;
  }
  m.kept.resize(size_t(c.experts));
  for (int e = 0; e < c.experts; ++e) {
    const double routed = m.tokens * c.top_k * m.shares[size_t(e)];
    m.kept[size_t(e)] = m.capacity < 0 ? routed : std::min(routed, double(m.capacity));
    m.send_rows += m.kept[size_t(e)];
  }
  m.dropped_rows = std::max(0.0, m.tokens * c.top_k - m.send_rows);
  m.mean_rows_per_rank = m.send_rows;
  double best = -1;
  for (int r = 0; r < m.ep; ++r) {
    const auto range = moe::local_experts(c.experts, m.ep, r);
    double rows = 0;
    for (int e = range.first; e < range.first + range.count; ++e) rows += m.ep * m.kept[size_t(e)];
    if (rows > best) {
      best = rows;
      m.busiest_rank = r;
    }
  }
  const auto range = moe::local_experts(c.experts, m.ep, m.busiest_rank);
  for (int e = range.first; e < range.first + range.count; ++e) {
    m.busiest_rows.push_back(m.ep * m.kept[size_t(e)]);
    m.busiest_received_rows += m.busiest_rows.back();
  }
  return m;
}

std::vector<double> measured_expert_shares(const std::vector<traces::Trace>& traces) {
  std::vector<double> tokens;
  for (const auto& t : traces) {
    std::vector<int> expert_of(t.strings.size(), -1);  // by counter name id
    for (size_t i = 0; i < t.strings.size(); ++i) {
      int l = 0, e = 0;
      char close = 0;
      const std::string& n = t.strings.str(traces::NameId(i));
      if (std::sscanf(n.c_str(), "moe.tokens[l=%d,e=%d%c", &l, &e, &close) == 3 && close == ']' &&
          e >= 0)
        expert_of[i] = e;
    }
    for (const auto& c : t.counters) {
      const int e = c.name < expert_of.size() ? expert_of[c.name] : -1;
      if (e < 0) continue;
      if (tokens.size() <= size_t(e)) tokens.resize(size_t(e) + 1, 0.0);
      tokens[size_t(e)] += c.value;
    }
  }
  double sum = 0;
  for (double v : tokens) sum += v;
  if (!(sum > 0)) return {};
  for (double& v : tokens) v /= sum;
  return tokens;
}

int64_t moe_all_to_all_bytes(const MoeLoad& m, const Scenario& s, int act_bytes) {
  // A uniform router's busiest rank receives send_rows up to the rounding of the shares' sums:
  // those bytes stay the send buffer's, as the runtime's spans carry them.
  double rows = std::max(m.send_rows, m.busiest_received_rows);
  if (rows - m.send_rows <= 1e-9 * m.send_rows) rows = m.send_rows;
  return int64_t(std::llround(rows * double(s.model.d_model) * act_bytes));
}

int64_t moe_gate_all_reduce_bytes(const Scenario& s, int act_bytes) {
  return int64_t(s.training.micro_batch) * s.model.seq * s.model.moe.top_k * act_bytes;
}

namespace {
struct FfnShape {
  double c, fs, up, b, e;  // channels, width slice F/tp, fc1 bands, biases, element bytes
  bool swiglu;
};
FfnShape ffn_shape(const ModelDims& d, const Scenario& s) {
  const BlockArch a = d.arch.resolve(int(d.heads), int(d.d_model));
  return {double(d.d_model),      double(moe::expert_width(s.model)) / double(d.tp),
          a.swiglu() ? 2.0 : 1.0, a.bias ? 1.0 : 0.0,
          double(d.act_bytes),    a.swiglu()};
}
// out (rows x oc) = in (rows x ic) · W + bias: 2 FLOPs per weight and bias element per row.
Kernel gemm(double rows, double ic, double oc, double bias, double e) {
  Kernel k{OpClass::Gemm, rows * 2.0 * (ic * oc + bias), e * (rows * ic + ic * oc + rows * oc)};
  k.gm = rows;
  k.gn = oc;
  k.gk = ic;
  return k;
}
}  // namespace

std::vector<Kernel> expert_ffn_kernels(const ModelDims& d, const Scenario& s, double rows) {
  const FfnShape x = ffn_shape(d, s);
  if (rows <= 0) return {};
  return {
      gemm(rows, x.c, x.up * x.fs, x.b * x.up * x.fs, x.e),
      // GELU reads and writes (rows, F/tp); SwiGLU reads gate and up and writes (rows, F/tp).
      {OpClass::Elementwise, 0.0, x.e * (x.swiglu ? 3.0 : 2.0) * rows * x.fs},
      gemm(rows, x.fs, x.c, x.b * x.c / d.tp, x.e),
  };
}

std::vector<Kernel> moe_router_kernels(const ModelDims& d, const Scenario&, const MoeLoad& m) {
  const double n = m.tokens, c = double(d.d_model), e = double(d.act_bytes), E = m.experts;
  return {
      gemm(n, c, E, 0.0, e),
      // Softmax over the E logits and the top-k selection: read and write (n, E) in fp32.
      {OpClass::SoftmaxLoss, 0.0, 4.0 * 2.0 * n * E},
      // The permutation: gather the kept rows (read n·C, write send_rows·C).
      {OpClass::Elementwise, 0.0, e * (n * c + m.send_rows * c)},
  };
}

std::vector<Kernel> moe_expert_kernels(const ModelDims& d, const Scenario& s, const MoeLoad& m) {
  std::vector<Kernel> ks;
  for (const double rows : m.busiest_rows) {
    const auto e = expert_ffn_kernels(d, s, rows);
    ks.insert(ks.end(), e.begin(), e.end());
  }
  for (int k = 0; k < s.model.moe.shared_experts; ++k) {
    const auto e = expert_ffn_kernels(d, s, m.tokens);
    ks.insert(ks.end(), e.begin(), e.end());
  }
  return ks;
}

std::vector<Kernel> moe_gated_sum_kernels(const ModelDims& d, const Scenario& s, const MoeLoad& m) {
  const double n = m.tokens, c = double(d.d_model), e = double(d.act_bytes);
  const double shared = s.model.moe.shared_experts > 0 ? n * c : 0.0;
  return {{OpClass::Elementwise, 0.0, e * (m.send_rows * c + shared + n * c)}};
}

std::vector<Kernel> backward_kernels(std::vector<Kernel> ks) {
  for (auto& k : ks) {
    k.flops *= 2;
    k.bytes *= 2;
    k.gemm_backward = k.gm > 0;
  }
  std::reverse(ks.begin(), ks.end());
  return ks;
}

MoeBlockParams moe_block_params(const Scenario& s) {
  MoeBlockParams p;
  const MoeConfig& c = s.model.moe;
  if (!c.enabled()) return p;
  const BlockArch a = block_arch(s.model).resolve(s.model.heads, s.model.d_model);
  const int64_t C = s.model.d_model, tp = s.parallel.tp;
  const bool sw = a.swiglu(), bias = a.bias;
  // A tp slice of one FFN of width w: fc1 (up·w/tp rows of C, its bias slice), fc2 (C rows of w/tp)
  // and fc2's whole bias (held on every tp rank, added by rank 0), as model::parameter_tensors
  // slices the dense MLP.
  auto slice = [&](int64_t w) {
    const int64_t up = sw ? 2 : 1, ws = w / tp;
    return up * ws * C + C * ws + (bias ? up * ws + C : 0);
  };
  const int64_t ew = moe::expert_width(s.model);
  p.expert = int64_t(c.experts / std::max(1, s.parallel.ep)) * slice(ew);
  return p;
}

int stage_moe_blocks(const Scenario& s, int stage) {
  int n = 0;
  for (const auto& [first, last] : model::stage_contents(s, stage).layers)
    n += moe::moe_blocks(s.model.moe, first, last);
  return n;
}

int64_t stage_expert_params(const Scenario& s, int stage) {
  return stage_moe_blocks(s, stage) * moe_block_params(s).expert;
}

int64_t stage_dense_params(const Scenario& s, int stage) {
  int64_t n = 0;
  for (const auto& t : stage_parameters(s, stage)) n += t.count;  // the experts left out there
  return n;
}

double moe_activation_bytes(const Scenario& s, int act_bytes) {
  if (!s.model.moe.enabled()) return 0;
  const MoeLoad m = moe_load(s);
  const BlockArch a = block_arch(s.model).resolve(s.model.heads, s.model.d_model);
  const double c = s.model.d_model, e = act_bytes, up = a.swiglu() ? 2.0 : 1.0;
  const double fs = double(moe::expert_width(s.model)) / s.parallel.tp;
  double received = 0;
  for (double r : m.busiest_rows) received += r;
  const double per_row = c + up * fs + fs;  // fc1 input, activation input, fc2 input
  return 4.0 * m.tokens * m.experts + e * received * per_row + e * m.send_rows * c +
         e * s.model.moe.shared_experts * m.tokens * (up * fs + fs);
}

double dense_mlp_activation_bytes(const Scenario& s, int act_bytes) {
  const BlockArch arch = block_arch(s.model);
  double sbh = 0;
  for (const auto& t : model::block_activation_terms(arch, s.model.heads, s.model.d_model,
                                                     s.model.seq, s.parallel.tp)) {
    if (t.op == "act" || t.op == "fc2") sbh += t.tp_split ? t.sbh / s.parallel.tp : t.sbh;
  }
  return sbh * double(s.model.seq) * s.training.micro_batch * s.model.d_model * (act_bytes / 2.0);
}

}  // namespace orrery::sim
