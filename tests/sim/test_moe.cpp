// Mixture of experts in the simulator (model/moe.hpp, sim/moe_cost.hpp): the op graph's names,
// order, streams and bytes per rank in closed form, ep = 1 against ep > 1, the expert memory, the
// router skew and the capacity drop, the all-to-all algorithms, and that every layout simulates.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "calibration_fixtures.hpp"
#include "orrery/common/error.hpp"
#include "orrery/model/moe.hpp"
#include "orrery/model/zero_partition.hpp"
#include "orrery/sim/calibrate.hpp"
#include "orrery/sim/collectives.hpp"
#include "orrery/sim/memory.hpp"
#include "orrery/sim/moe_cost.hpp"
#include "orrery/sim/network.hpp"
#include "orrery/sim/sweep.hpp"
#include "orrery/sim/workload.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim {
namespace {

using testing::h100_cluster;
using testing::h100_cost;
using testing::small_scenario;
using traces::CollOp;

// 4 blocks (0 and 2 MoE: every 2), 4 experts top 2, GPT blocks (C 256, F 1024, biases), n = 2 x 128
// tokens per micro-batch.
Scenario moe_scenario(int dp, int tp, int pp, int m, int ep, const char* schedule = "1f1b") {
  Scenario s = small_scenario(4, dp, tp, pp, m, schedule);
  s.model.moe.experts = 4;
  s.model.moe.top_k = 2;
  s.model.moe.every = 2;
  s.parallel.ep = ep;
  return s;
}

std::vector<std::string> names_of_layer(const Workload& w, const StageProgram& p, int mb, int layer,
                                        PhaseKind ph) {
  std::vector<std::string> out;
  for (const auto& op : p.ops)
    if (op.micro_batch == mb && op.layer == layer && op.phase == ph && op.group != GroupRole::EDP &&
        op.group != GroupRole::DP)
      out.push_back(w.names[op.name]);
  return out;
}

std::map<std::string, int> count_by_name(const Workload& w, const StageProgram& p) {
  std::map<std::string, int> n;
  for (const auto& op : p.ops) ++n[w.names[op.name]];
  return n;
}

const std::string kFwd(names::kBlockForward), kBwd(names::kBlockBackward),
    kTpAr(names::kTpAllReduce);

TEST(MoeWorkload, SpanOrderOfAnMoeBlockIsModelMoeHpps) {
  const Workload w1 = build_workload(moe_scenario(2, 1, 1, 2, 2), h100_cost());
  const auto& p1 = w1.stages[0];
  const std::vector<std::string> f1{
      kFwd, "moe.router", "moe.dispatch", "moe.experts", "moe.combine", "moe.gated_sum", kFwd};
  const std::vector<std::string> b1{kBwd,
                                    "moe.gated_sum.bwd",
                                    "moe.combine.bwd",
                                    "moe.experts.bwd",
                                    "moe.dispatch.bwd",
                                    "moe.router.bwd",
                                    kBwd};
  EXPECT_EQ(names_of_layer(w1, p1, 1, 2, PhaseKind::Forward), f1);
  EXPECT_EQ(names_of_layer(w1, p1, 1, 2, PhaseKind::Backward), b1);
  // A dense block between them is unchanged: one piece each way at tp 1.
  EXPECT_EQ(names_of_layer(w1, p1, 1, 1, PhaseKind::Forward), std::vector<std::string>{kFwd});

  // tp 2: the attention's all-reduce splits the dense pieces, the gated sum's is the block's
  // usual one, the gate gradient has its own.
  const Workload w2 = build_workload(moe_scenario(2, 2, 1, 2, 2), h100_cost());
  const std::vector<std::string> f2{kFwd,          "moe.router",    "moe.dispatch", "moe.experts",
                                    "moe.combine", "moe.gated_sum", kTpAr,          kFwd};
  std::vector<std::string> f2full{kFwd, kTpAr};
  f2full.insert(f2full.end(), f2.begin(), f2.end());
  EXPECT_EQ(names_of_layer(w2, w2.stages[0], 0, 0, PhaseKind::Forward), f2full);
  const std::vector<std::string> b2{kBwd,
                                    "moe.gated_sum.bwd",
                                    "tp.moe_gate_all_reduce",
                                    "moe.combine.bwd",
                                    "moe.experts.bwd",
                                    "moe.dispatch.bwd",
                                    "moe.router.bwd",
                                    kTpAr,
                                    kBwd,
                                    kTpAr,
                                    kBwd};
  EXPECT_EQ(names_of_layer(w2, w2.stages[0], 0, 0, PhaseKind::Backward), b2);
}

TEST(MoeWorkload, OpCountsStreamsAndBytesPerRankInClosedForm) {
  const int m = 3, dp = 4, ep = 2, moe_blocks = 2, dense_blocks = 2;
  const Scenario s = moe_scenario(dp, 1, 1, m, ep);
  const Workload w = build_workload(s, h100_cost());
  const auto& p = w.stages[0];
  auto n = count_by_name(w, p);
  // Per MoE block and micro-batch: 5 compute + 2 all_to_all forward, the same backward.
  EXPECT_EQ(n[kFwd], m * (2 * moe_blocks + dense_blocks));
  EXPECT_EQ(n[kBwd], m * (2 * moe_blocks + dense_blocks));
  for (const char* name :
       {"moe.router", "moe.experts", "moe.gated_sum", "moe.router.bwd", "moe.experts.bwd",
        "moe.gated_sum.bwd", "moe.dispatch", "moe.combine", "moe.dispatch.bwd", "moe.combine.bwd"})
    EXPECT_EQ(n[name], m * moe_blocks) << name;
  EXPECT_EQ(n["tp.moe_gate_all_reduce"], 0);  // tp 1
  // Expert gradients: one edp bucket (25 MB holds both blocks' experts) on the last micro-batch.
  EXPECT_EQ(n[std::string(names::kEdpAllReduce)], 1);
  // n·top_k rows of C fp32 values, every all-to-all; on comm.ep over the ep group.
  const int64_t tokens = 2 * 128, a2a = tokens * 2 * 256 * 4;
  // One whole expert (tp 1): fc1 1024 x 256 + bias, fc2 256 x 1024 + bias.
  const int64_t expert = model::moe::expert_parameters(256, 1024, false, true);
  ASSERT_EQ(expert, 2 * 256 * 1024 + 1024 + 256);
  EXPECT_EQ(p.expert_param_count, moe_blocks * (4 / ep) * expert);
  for (const auto& op : p.ops) {
    if (op.coll == CollOp::AllToAll) {
      EXPECT_EQ(op.bytes, a2a);
      EXPECT_EQ(op.stream, kStreamEp);
      EXPECT_EQ(op.group, GroupRole::EP);
      EXPECT_EQ(op.kind, traces::SpanKind::Collective);
    }
    if (w.names[op.name] == names::kEdpAllReduce) {
      EXPECT_EQ(op.bytes, p.expert_param_count * 4);
      EXPECT_EQ(op.group, GroupRole::EDP);
      EXPECT_EQ(op.micro_batch, m - 1);
    }
  }
  // Dense parameters: the dense model's, less the MoE blocks' dense MLP, plus their routers.
  const Workload dense = build_workload(small_scenario(4, dp, 1, 1, m), h100_cost());
  EXPECT_EQ(p.param_count,
            dense.stages[0].param_count - moe_blocks * expert + moe_blocks * 4 * 256);
  // The groups: ep consecutive dp ranks; the edp group the dp ranks of one ep rank.
  const Layout l = w.layout;
  const int r = l.rank_of(3, 0, 0);
  EXPECT_EQ(group_members(l, r, GroupRole::EP, ep),
            (std::vector<int32_t>{l.rank_of(2, 0, 0), l.rank_of(3, 0, 0)}));
  EXPECT_EQ(group_members(l, r, GroupRole::EDP, ep),
            (std::vector<int32_t>{l.rank_of(1, 0, 0), l.rank_of(3, 0, 0)}));
}

TEST(MoeWorkload, EpOneIsTheSameGraphWithoutTheAllToAlls) {
  const Workload a = build_workload(moe_scenario(4, 1, 2, 4, 1), h100_cost());
  const Workload b = build_workload(moe_scenario(4, 1, 2, 4, 2), h100_cost());
  for (int st = 0; st < 2; ++st) {
    std::vector<std::string> na, nb;
    double fa = 0, fb = 0;
    for (const auto& op : a.stages[st].ops) {
      EXPECT_NE(op.coll, CollOp::AllToAll);
      if (op.group != GroupRole::EDP) na.push_back(a.names[op.name]);
      fa += op.flops;
    }
    for (const auto& op : b.stages[st].ops) {
      if (op.coll != CollOp::AllToAll && op.group != GroupRole::EDP) nb.push_back(b.names[op.name]);
      fb += op.flops;
    }
    EXPECT_EQ(na, nb) << "stage " << st;
    // Uniform routing: ep 2 runs half the experts on twice the rows, the same FLOPs.
    EXPECT_NEAR(fa, fb, 1e-9 * fa);
  }
}

TEST(MoeWorkload, ModelFlopsMatchTheSpans) {
  // Uniform and dropless, the spans run exactly the model's count: the router GEMM and top_k
  // expert FFNs plus the shared experts per token in each MoE block, the dense blocks as before.
  Scenario s = moe_scenario(2, 1, 2, 4, 2);
  s.model.moe.shared_experts = 1;
  s.model.moe.expert_ffn_hidden = 512;
  const Workload w = build_workload(s, h100_cost());
  double span_flops = 0;
  for (const auto& p : w.stages)
    for (const auto& op : p.ops) span_flops += op.flops;
  EXPECT_NEAR(span_flops * s.parallel.dp, w.model_flops_per_step, 1e-9 * w.model_flops_per_step);
  // And the MoE blocks' share in closed form: 3 x tokens x (2·C·E + (top_k + shared) x 2 x
  // expert parameters) per block, against the dense fc1 + fc2's 3 x tokens x 2 x (2·C·F + F + C).
  const double tokens = 2.0 * 128 * s.micro_batches_per_step() * s.parallel.dp, C = 256;
  const double expert = double(model::moe::expert_parameters(256, 512, false, true));
  const double dense =
      build_workload(small_scenario(4, 2, 1, 2, 4), h100_cost()).model_flops_per_step;
  EXPECT_NEAR(w.model_flops_per_step - dense,
              2 * 3 * tokens * ((2 * C * 4 + 3 * 2 * expert) - 2 * (2 * C * 1024 + 1024 + C)),
              1e-9 * dense);
}

// model.moe.first_dense: the leading blocks run the dense MLP. With every 1 and first_dense 1 on 4
// blocks, blocks 1-3 are MoE: three MoE blocks' FLOPs over the dense model's, and no MoE op in
// block 0.
TEST(MoeWorkload, FirstDenseBlocksRunTheDenseMlp) {
  Scenario s = moe_scenario(2, 1, 1, 2, 2);
  s.model.moe.every = 1;
  s.model.moe.first_dense = 1;
  const Workload w = build_workload(s, h100_cost());
  const double tokens = 2.0 * 128 * s.micro_batches_per_step() * s.parallel.dp, C = 256;
  const double expert = double(model::moe::expert_parameters(256, 1024, false, true));
  const double dense =
      build_workload(small_scenario(4, 2, 1, 1, 2), h100_cost()).model_flops_per_step;
  EXPECT_NEAR(w.model_flops_per_step - dense,
              3 * 3 * tokens * ((2 * C * 4 + 2 * 2 * expert) - 2 * (2 * C * 1024 + 1024 + C)),
              1e-9 * dense);
  std::map<int, int> routers;  // block -> router ops
  for (const auto& op : w.stages[0].ops)
    if (w.names[op.name] == names::kMoeRouter) ++routers[op.layer];
  EXPECT_EQ(routers.count(0), 0u);
  EXPECT_EQ(routers.size(), 3u);
  // The sim's model FLOPs (MFU's numerator) count the same three blocks.
  double span_flops = 0;
  for (const auto& p : w.stages)
    for (const auto& op : p.ops) span_flops += op.flops;
  EXPECT_NEAR(span_flops * s.parallel.dp, w.model_flops_per_step, 1e-9 * w.model_flops_per_step);
}

TEST(MoeWorkload, OpsStayWithinTheClosedFormBound) {
  // workload_ops_bound sizes the simulation before building it (sweep.hpp's memory check).
  for (const auto& [tp, pp, zero, schedule] : std::vector<std::tuple<int, int, int, const char*>>{
           {1, 1, 0, "1f1b"}, {2, 2, 1, "1f1b"}, {2, 2, 0, "interleaved"}, {1, 2, 2, "gpipe"}}) {
    Scenario s = moe_scenario(2, tp, pp, 4, 2, schedule);
    s.model.moe.every = 1;
    s.parallel.zero = zero;
    s.training.recompute = "selective";
    if (std::string(schedule) == "interleaved") s.parallel.virtual_stages = 2;
    const Workload w = build_workload(s, h100_cost(), {2, precision_config("fp32")});
    for (const auto& p : w.stages)
      EXPECT_LE(double(p.ops.size()), workload_ops_bound(s, 2)) << schedule << " tp" << tp;
  }
}

TEST(MoeWorkload, SkewPricesTheBusiestRankAndTheCapacityCapsIt) {
  Scenario s = moe_scenario(4, 1, 1, 1, 2);
  s.model.moe.router_skew = 1.0;
  const MoeLoad u = moe_load(moe_scenario(4, 1, 1, 1, 2));
  const MoeLoad k = moe_load(s);
  const double n = 256, top_k = 2, ep = 2;
  // Shares (e+1)^-1 / (1 + 1/2 + 1/3 + 1/4): rank 0 holds experts 0 and 1, the busiest.
  const double h = 1 + 1.0 / 2 + 1.0 / 3 + 1.0 / 4;
  ASSERT_EQ(k.busiest_rank, 0);
  ASSERT_EQ(k.busiest_rows.size(), 2u);
  EXPECT_NEAR(k.busiest_rows[0], ep * n * top_k * (1 / h), 1e-9);
  EXPECT_NEAR(k.busiest_rows[1], ep * n * top_k * (0.5 / h), 1e-9);
  EXPECT_NEAR(u.busiest_rows[0], ep * n * top_k / 4, 1e-9);
  EXPECT_DOUBLE_EQ(k.send_rows, n * top_k);  // dropless: every assignment sent
  // The all-to-alls at the busiest rank's volume: it receives 2·n·top_k·(1 + 1/2)/h rows, 1.44
  // times the n·top_k every rank sends; uniform, the send buffer (fp32 activations here).
  EXPECT_NEAR(k.busiest_received_rows, ep * n * top_k * 1.5 / h, 1e-9);
  EXPECT_EQ(moe_all_to_all_bytes(k, s, 4), std::llround(ep * n * top_k * 1.5 / h * 256 * 4));
  EXPECT_EQ(moe_all_to_all_bytes(u, s, 4), int64_t(n * top_k * 256 * 4));
  {
    const Workload wk = build_workload(s, h100_cost());
    int a2a = 0;
    for (const auto& op : wk.stages[0].ops)
      if (op.group == GroupRole::EP) {
        ++a2a;
        EXPECT_EQ(op.bytes, moe_all_to_all_bytes(k, s, 4)) << wk.names[op.name];
      }
    EXPECT_GT(a2a, 0);
  }
  // FLOPs of moe.experts: 2 per expert parameter per row it receives (tp 1).
  const double per_row = 2.0 * double(model::moe::expert_parameters(256, 1024, false, true));
  const Workload wk = build_workload(s, h100_cost());
  for (const auto& op : wk.stages[0].ops)
    if (wk.names[op.name] == names::kMoeExperts) {
      EXPECT_NEAR(op.flops, per_row * (k.busiest_rows[0] + k.busiest_rows[1]), 1e-6 * op.flops);
    }

  // Capacity factor 1: each expert keeps ceil(1 · 256 · 2 / 4) = 128 of a rank's assignments.
  s.model.moe.capacity_factor = 1.0;
  const MoeLoad c = moe_load(s);
  EXPECT_EQ(c.capacity, 128);
  const double routed0 = n * top_k / h, routed1 = routed0 / 2;  // 245.8 and 122.9
  EXPECT_NEAR(c.busiest_rows[0], ep * 128, 1e-9);
  EXPECT_NEAR(c.busiest_rows[1], ep * routed1, 1e-9);
  EXPECT_NEAR(c.dropped_rows, routed0 - 128, 1e-9);
  EXPECT_NEAR(c.send_rows, n * top_k - (routed0 - 128), 1e-9);
  // The all-to-all at the busiest rank's received rows (2·128 + 2·122.9 = 501.8), not the
  // 394.2 rows every rank sends.
  EXPECT_EQ(moe_all_to_all_bytes(c, s, 2),
            int64_t(std::llround((ep * 128 + ep * routed1) * 256 * 2)));
  // The busiest rank's expert time: skewed above uniform (491.5 + 245.8 rows against 2 x 256),
  // and the capacity cuts it back (256 + 245.8).
  const ModelDims d = model_dims(s, 2);
  const CostModel cost = h100_cost();
  const auto t = [&](const MoeLoad& x) { return cost.op_ns(moe_expert_kernels(d, s, x)); };
  EXPECT_GT(t(k), t(u));
  EXPECT_GT(t(k), t(c));
}

TEST(MoeMemory, ExpertStatesInClosedForm) {
  for (int zero : {0, 1, 2, 3}) {
    Scenario s = moe_scenario(4, 1, 1, 2, 2);
    s.parallel.zero = zero;
    const PrecisionConfig p = precision_config("mixed");  // 2 / 2 / 12 bytes
    const auto mem = estimate_memory(s, p, 0);
    const Workload w = build_workload(s, h100_cost(), {1, p});
    const double dense = double(w.stages[0].param_count),
                 expert = double(w.stages[0].expert_param_count), dp = 4, edp = 2;
    EXPECT_EQ(mem[0].param_count, int64_t(dense + expert));
    const auto near = [](double got, double want) { EXPECT_NEAR(got, want, 1e-9 * want); };
    // ZeRO 3: every state of the dense tensors over dp, of the experts over edp.
    near(mem[0].parameters_bytes,
         zero == 3 ? 2 * dense / dp + 2 * expert / edp : 2 * (dense + expert));
    near(mem[0].gradients_bytes, zero == 3   ? 2 * dense / dp + 2 * expert / edp
                                 : zero == 2 ? 2 * dense / dp + 2 * expert
                                             : 2 * (dense + expert));
    near(mem[0].optimizer_bytes,
         zero >= 1 ? 12 * dense / dp + 12 * expert / edp : 12 * (dense + expert));
    // NVMe offload: the file holds the state of what this rank updates, the experts' over edp.
    Scenario o = s;
    o.zero.offload_optimizer = "nvme";
    o.zero.nvme_path = "/tmp";
    near(estimate_memory(o, p, 0)[0].offload_nvme_bytes,
         offload_bytes_per_param(o, p) * (zero >= 1 ? dense / dp + expert / edp : dense + expert));
  }
  // Activations: each MoE block's routed rows instead of its dense act and fc2 terms, plus one
  // dispatch's send and receive buffers.
  const Scenario moe = moe_scenario(2, 1, 1, 1, 2);
  const Scenario dense = small_scenario(4, 2, 1, 1, 1);
  const PrecisionConfig p = precision_config("mixed");
  const double n = 256, C = 256, F = 1024, rows = n * 2;  // ep 2 x 2 experts x n·2/4 rows
  const double moe_act = 4 * n * 4 + 2 * rows * (C + F + F) + 2 * rows * C;
  const double dense_mlp = 2 * n * (F + F);  // GPT: the act and fc2 inputs, (n, F) each
  EXPECT_DOUBLE_EQ(moe_activation_bytes(moe, 2), moe_act);
  EXPECT_DOUBLE_EQ(dense_mlp_activation_bytes(moe, 2), dense_mlp);
  const double a2a = 2.0 * double(int64_t(rows) * int64_t(C) * 2);
  EXPECT_NEAR(estimate_memory(moe, p, 0)[0].activations_bytes,
              estimate_memory(dense, p, 0)[0].activations_bytes + 2 * (moe_act - dense_mlp) + a2a,
              1e-6);
}

// 4 DGX-style nodes of 8 GPUs, rail-optimized (test_collectives.cpp's hierarchical cluster).
Cluster dgx4() {
  Cluster c;
  c.name = "dgx4";
  c.device = *device_preset("H100-SXM");
  c.nodes = 4;
  c.gpus_per_node = 8;
  c.topo.kind = TopologyKind::FatTree;
  c.topo.nvlink_gb_per_s = 400;
  c.topo.nvlink_latency_ns = 300;
  c.topo.nic_gb_per_s = 50;
  c.topo.nic_latency_ns = 900;
  c.topo.switch_latency_ns = 400;
  c.coll.step_latency_ns = 1000;
  build_topology(c);
  return c;
}

CollectiveRequest all_to_all(int n, Algorithm a, int64_t bytes) {
  CollectiveRequest r;
  r.op = CollOp::AllToAll;
  r.members.resize(size_t(n));
  std::iota(r.members.begin(), r.members.end(), 0);
  r.algo = a;
  r.bytes = bytes;
  return r;
}

void expect_both_models(const Cluster& c, const CollectiveRequest& r, double want) {
  for (auto model : {NetworkModel::Analytical, NetworkModel::Flow})
    EXPECT_NEAR(double(collective_time_ns(c, r, model)), want, want * 1e-3) << to_string(model);
}

TEST(MoeAllToAll, OneNvSwitchNodeIsItsLinkBandwidthPlusLatency) {
  // n ranks on one crossbar: each sends (n-1)/n of its buffer over its own link.
  for (int n : {2, 4, 8}) {
    Cluster c = h100_cluster(n);
    const double S = double(1 << 28), bw = c.topo.nvlink_gb_per_s;
    const double alpha = 2 * double(c.topo.nvlink_latency_ns) + double(c.coll.step_latency_ns);
    const auto r = all_to_all(n, Algorithm::Auto, int64_t(S));
    EXPECT_EQ(resolve_collective(c, r).algo, Algorithm::Direct);
    expect_both_models(c, all_to_all(n, Algorithm::Direct, int64_t(S)),
                       alpha + (n - 1.0) / n * S / bw);
  }
}

TEST(MoeAllToAll, AcrossNodesHierarchicalIsTheSlowerOfNvlinkAndNicPlusLatency) {
  const Cluster c = dgx4();
  const double S = double(1 << 30), g = 8, N = 4;
  // One pipelined phase of two steps: g(g-1)N NVLink flows (GPU-switch-GPU, 600 ns) and N(N-1)g
  // rail flows (GPU-NIC-leaf-NIC-GPU, 1800 ns); alpha = their weighted mean path + step latency.
  const double intra = g * (g - 1) * N, inter = N * (N - 1) * g;
  const double alpha = (intra * 600 + inter * 1800) / (intra + inter) + 1000;
  const double want = 2 * alpha + std::max((g - 1) / g * S / 400, (N - 1) / N * S / 50);
  expect_both_models(c, all_to_all(32, Algorithm::Hierarchical, int64_t(S)), want);
  // Auto picks it across rail-optimized nodes (NCCL's PXN); a direct exchange is bounded by the
  // NICs too: each GPU sends (n-g)/n of its buffer off the node.
  EXPECT_EQ(resolve_collective(c, all_to_all(32, Algorithm::Auto, int64_t(S))).algo,
            Algorithm::Hierarchical);
  const double direct = double(
      collective_time_ns(c, all_to_all(32, Algorithm::Direct, int64_t(S)), NetworkModel::Flow));
  EXPECT_GE(direct, (32 - g) / 32 * S / 50);
}

TEST(MoeSimulate, EveryScheduleAndZeroStageSimulatesAndZero3IsRefused) {
  struct L {
    int dp, tp, pp, ep, zero;
    const char* schedule;
  };
  for (const L& x : {L{4, 1, 1, 2, 0, "1f1b"}, L{2, 2, 2, 2, 1, "1f1b"}, L{2, 1, 2, 2, 2, "gpipe"},
                     L{2, 2, 2, 1, 1, "interleaved"}, L{4, 2, 1, 4, 2, "1f1b"}}) {
    Scenario s = moe_scenario(x.dp, x.tp, x.pp, 4, x.ep, x.schedule);
    s.parallel.zero = x.zero;
    if (std::string(x.schedule) == "interleaved") s.parallel.virtual_stages = 2;
    const int gpus = x.dp * x.tp * x.pp;
    const SimResult r = simulate(s, h100_cluster(gpus), {});
    SCOPED_TRACE(std::string(x.schedule) + " dp" + std::to_string(x.dp) + " ep" +
                 std::to_string(x.ep));
    EXPECT_GT(r.step_time_ns, 0);
    EXPECT_TRUE(r.moe);
    EXPECT_EQ(r.ep, x.ep);
    EXPECT_LE(r.breakdown.exposed_ep_ns, r.breakdown.exposed_dp_ns + 1e-6);
    if (x.ep == 1) {
      EXPECT_EQ(r.breakdown.exposed_ep_ns, 0);
    }
  }
  // ZeRO 3 (the runtime's Zero3Storage): each MoE block's experts gathered over edp before its
  // forward and its backward and reduce-scattered after its backward, every micro-batch, right after
  // the block's own, with the padded bytes of the block's local experts over edp; no edp buckets.
  Scenario z3 = moe_scenario(4, 1, 1, 2, 2);  // dp 4, ep 2: edp 2; m 2 micro-batches
  z3.parallel.zero = 3;
  const Workload w = build_workload(z3, h100_cost());
  const StageProgram& p = w.stages[0];
  const int64_t per_block = p.expert_param_count / 2;  // blocks 0 and 2
  const auto padded = int64_t(model::zero_partition(size_t(per_block), 0, 2).padded());
  std::map<std::string, int> edp;
  for (const auto& op : p.ops) {
    if (op.group != GroupRole::EDP) continue;
    ++edp[w.names[op.name]];
    EXPECT_EQ(op.bytes, padded * 4) << w.names[op.name];
    EXPECT_TRUE(op.layer == 0 || op.layer == 2) << op.layer;
  }
  EXPECT_EQ(edp[std::string(names::kZeroAllGather)], 2 * 2 * 2);  // blocks x micro-batches x 2
  EXPECT_EQ(edp[std::string(names::kDpReduceScatter)], 2 * 2);
  EXPECT_EQ(edp[std::string(names::kEdpAllReduce)], 0);
  EXPECT_GT(simulate(z3, h100_cluster(4), {}).step_time_ns, 0);
}

}  // namespace
}  // namespace orrery::sim

namespace orrery::sim {
namespace {

TEST(MoeSweep, SearchTriesEveryEpAndSaysTheAllToAll) {
  Scenario s = moe_scenario(2, 1, 1, 4, 2);  // global batch 16 sequences
  SweepOptions opt;
  // 4 GPUs: 8 would try pp 4 with ZeRO 2, whose per-micro-batch blocking sum of the tied
  // embedding deadlocks the dense simulator too (tp 1, pp 4, dp 2, 4 micro-batches: a known,
  // separate bug).
  opt.gpus = {4};
  opt.search = true;
  opt.search_top = 1000;  // simulate every candidate
  opt.sim.network = NetworkModel::Analytical;
  const auto rows = sweep(s, h100_cluster(4), opt);
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_TRUE(rows[0].ok) << rows[0].note;
  std::set<int> eps, zeros;
  std::vector<SimResult> all = rows[0].others;
  all.push_back(rows[0].result);
  for (const SimResult& r : all) {
    EXPECT_TRUE(r.moe);
    EXPECT_EQ(r.dp % r.ep, 0);
    EXPECT_EQ(4 % r.ep, 0);
    zeros.insert(r.zero);
    eps.insert(r.ep);
  }
  // dp 4 (tp 1, pp 1): ep 1, 2 and 4 (4 experts); dp 2 and 1 as far as they divide.
  EXPECT_EQ(eps, (std::set<int>{1, 2, 4}));
  EXPECT_EQ(zeros, (std::set<int>{0, 1, 2, 3}));  // ZeRO 3 with MoE is simulated too
  EXPECT_EQ(rows[0].simulated, rows[0].candidates);
  const SimResult& x = rows[0].result;
  char want[96];
  std::snprintf(want, sizeof want, "ep=%d zero %d mb %d", x.ep, x.zero, x.micro_batch);
  const std::string why = explain_choice(rows[0]);
  EXPECT_NE(why.find(want), std::string::npos) << why;
  std::snprintf(want, sizeof want, "(of which ep all-to-all %.1f %%)",
                100.0 * x.breakdown.exposed_ep_ns / x.breakdown.window_ns);
  EXPECT_NE(why.find(want), std::string::npos) << why;
}

}  // namespace
}  // namespace orrery::sim

namespace orrery::sim {
namespace {

TEST(MoeCalibrate, TokenCountersBecomeTheExpertSharesThatPriceTheExperts) {
  namespace fx = testing_fixtures;
  // A real run's moe.tokens counters (model/moe.hpp): 2 blocks x 4 experts, 2 steps; expert 0 takes
  // 6 in 10 assignments, expert 1 2, experts 2 and 3 one each.
  traces::Trace t = fx::make_run(fx::tiny(1), fx::Truth{}, 1.0);
  const double per[4] = {6, 2, 1, 1};
  for (int step = 0; step < 2; ++step)
    for (int l = 0; l < 2; ++l)
      for (int e = 0; e < 4; ++e)
        t.counters.push_back({0, t.strings.intern(model::moe::moe_tokens_counter(l, e)),
                              int64_t(step) * 1000, 100 * per[e]});
  const CalibrationResult r = calibrate({t});
  const std::vector<double> want{0.6, 0.2, 0.1, 0.1};
  ASSERT_EQ(r.profile.moe_expert_shares.size(), 4u);
  for (int e = 0; e < 4; ++e)
    EXPECT_NEAR(r.profile.moe_expert_shares[size_t(e)], want[size_t(e)], 1e-12);
  // Through the profile's YAML and back, then into the load: ep 2, rank 0 holds experts 0 and 1.
  const HardwareProfile back = parse_hardware_profile(calibrated_yaml(r), "cal.yaml");
  ASSERT_EQ(back.moe_expert_shares.size(), 4u);
  const MoeLoad m = moe_load(moe_scenario(4, 1, 1, 1, 2), back.moe_expert_shares);
  const double n = 256, top_k = 2, ep = 2;
  EXPECT_EQ(m.busiest_rank, 0);
  EXPECT_NEAR(m.busiest_rows[0], ep * n * top_k * 0.6, 1e-6);
  EXPECT_NEAR(m.busiest_rows[1], ep * n * top_k * 0.2, 1e-6);
  // A histogram of another model's experts is not used: the router_skew rule instead (uniform).
  EXPECT_NEAR(moe_load(moe_scenario(4, 1, 1, 1, 2), {0.5, 0.5}).busiest_rows[0], ep * n * top_k / 4,
              1e-9);
  EXPECT_THROW(parse_hardware_profile("name: x\nmoe_expert_shares: [1, -1]\n", "m.yaml"),
               InputError);
}

}  // namespace
}  // namespace orrery::sim
