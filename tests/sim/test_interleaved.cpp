// The interleaved 1F1B schedule (Megatron-LM, Narayanan et al., SC21): the order of passes against
// hand-derived sequences (the paper's figure 4, p = 4, v = 2, m = 8), the programs' op counts and
// the pairing of every send with a receive across stages, the step time in closed form with free
// communication ((m·v + p - 1)·Lc·(tf + tb)), runs with data parallelism and a real network, and
// the inputs it refuses.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "orrery/common/error.hpp"
#include "orrery/common/pipeline_schedule.hpp"
#include "orrery/sim/executor.hpp"
#include "test_workload_util.hpp"

namespace orrery::sim {
namespace {

using testing::h100_cluster;
using testing::h100_cost;
using testing::small_scenario;

// "F0.3" = forward of chunk 0 on micro-batch 3, "B1.0" = backward of chunk 1 on micro-batch 0.
std::string render(const std::vector<PipelinePass>& order) {
  std::ostringstream o;
  for (size_t i = 0; i < order.size(); ++i)
    o << (i ? " " : "") << (order[i].forward ? 'F' : 'B') << order[i].chunk << '.' << order[i].micro_batch;
  return o.str();
}

Scenario interleaved_scenario(int layers, int dp, int pp, int v, int m) {
  Scenario s = small_scenario(layers, dp, 1, pp, m, "interleaved");
  s.parallel.virtual_stages = v;
  return s;
}

// Hand-derived from the definition (forward k: chunk (k/p)%v, micro-batch (k/(pv))·p + k%p;
// backward k: chunk v-1-(k/p)%v): stage 0 of p = 4 runs 2·3 + 1·4 = 10 warm-up forwards, then 6
// forward/backward pairs, then 10 backwards, as in the paper's figure 4 (device 1).
TEST(InterleavedOrder, PaperFigureP4V2M8Stage0) {
  EXPECT_EQ(render(pipeline_interleaved_order(4, 0, 8, 2)),
            "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 F0.4 F0.5 "
            "F0.6 B1.0 F0.7 B1.1 F1.4 B1.2 F1.5 B1.3 F1.6 B0.0 F1.7 B0.1 "
            "B0.2 B0.3 B1.4 B1.5 B1.6 B1.7 B0.4 B0.5 B0.6 B0.7");
}

// Stage 3 (the last): (v-1)·p = 4 warm-up forwards, then 12 pairs, then 4 backwards.
TEST(InterleavedOrder, PaperFigureP4V2M8Stage3) {
  EXPECT_EQ(render(pipeline_interleaved_order(4, 3, 8, 2)),
            "F0.0 F0.1 F0.2 F0.3 "
            "F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F1.3 B1.3 F0.4 B0.0 F0.5 B0.1 F0.6 B0.2 F0.7 B0.3 "
            "F1.4 B1.4 F1.5 B1.5 F1.6 B1.6 F1.7 B1.7 "
            "B0.4 B0.5 B0.6 B0.7");
}

// Stage 1 of p = 2, v = 3, m = 2: warm-up 0·2 + 2·2 = 4 forwards, 2 pairs, 4 backwards.
TEST(InterleavedOrder, HandDerivedP2V3M2) {
  EXPECT_EQ(render(pipeline_interleaved_order(2, 1, 2, 3)),
            "F0.0 F0.1 F1.0 F1.1 F2.0 B2.0 F2.1 B2.1 B1.0 B1.1 B0.0 B0.1");
  // Stage 0: 1·2 + 2·2 = 6 = m·v warm-up forwards: all forwards, then all backwards.
  EXPECT_EQ(render(pipeline_interleaved_order(2, 0, 2, 3)),
            "F0.0 F0.1 F1.0 F1.1 F2.0 F2.1 B2.0 B2.1 B1.0 B1.1 B0.0 B0.1");
}

// Every (chunk, micro-batch) forward and backward exactly once per stage, the forward first; each
// chunk's micro-batches in order; the warm-up length as defined.
TEST(InterleavedOrder, EveryPassOnceForwardBeforeBackward) {
  for (int p : {2, 3, 4, 8})
    for (int v : {1, 2, 3, 4})
      for (int m : {p, 2 * p, 3 * p})
        for (int s = 0; s < p; ++s) {
          const auto order = pipeline_interleaved_order(p, s, m, v);
          ASSERT_EQ(order.size(), size_t(2 * m * v));
          std::map<std::tuple<int, int, bool>, size_t> at;
          std::map<std::pair<int, bool>, int> next_mb;
          for (size_t i = 0; i < order.size(); ++i) {
            const auto& x = order[i];
            ASSERT_TRUE(x.chunk >= 0 && x.chunk < v && x.micro_batch >= 0 && x.micro_batch < m);
            EXPECT_TRUE(at.emplace(std::tuple{x.chunk, x.micro_batch, x.forward}, i).second);
            const std::pair<int, bool> key{x.chunk, x.forward};
            EXPECT_EQ(next_mb[key]++, x.micro_batch);
          }
          for (int c = 0; c < v; ++c)
            for (int mb = 0; mb < m; ++mb) EXPECT_LT((at[{c, mb, true}]), (at[{c, mb, false}]));
          const int warmup = std::min((p - s - 1) * 2 + (v - 1) * p, m * v);
          for (int i = 0; i < warmup; ++i) {
            EXPECT_TRUE(order[i].forward);
          }
          if (warmup < m * v) {
            EXPECT_FALSE(order[warmup + 1].forward) << p << " " << v << " " << m << " " << s;
          }
        }
}

TEST(InterleavedOrder, BadArgumentsAreInputErrors) {
  EXPECT_THROW(pipeline_interleaved_order(4, 0, 6, 2), InputError);  // m not a multiple of p
  EXPECT_THROW(pipeline_interleaved_order(4, 4, 8, 2), InputError);
  EXPECT_THROW(pipeline_interleaved_order(4, 0, 8, 0), InputError);
}

// Every stage's program: per layer of its chunks m forward and m backward blocks (and no other
// layer), v·m chunk forwards and backwards (receive or embedding; receive or head), and the sends of
// each stage pair up with the receives of its peer in count, micro-batch and sequence number.
TEST(InterleavedWorkload, CountsAndMatchingSendsAndReceives) {
  for (auto [p, v, m, dp] : {std::tuple{4, 2, 8, 1}, std::tuple{2, 3, 4, 2}, std::tuple{3, 4, 6, 1},
                             std::tuple{4, 3, 4, 2}}) {
    const int L = 2 * p * v, Lc = L / (p * v);
    const Scenario sc = interleaved_scenario(L, dp, p, v, m);
    const Workload w = build_workload(sc, h100_cost());
    ASSERT_EQ(w.stages.size(), size_t(p));
    for (const auto& prog : w.stages) EXPECT_LE(double(prog.ops.size()), workload_ops_bound(sc, 1));
    std::map<int, int> owner;  // layer -> stage
    // (src stage, dst stage, gradient?) -> (micro-batch, seq) in program order
    std::map<std::tuple<int, int, bool>, std::vector<std::pair<int, int>>> sends, recvs;
    for (int s = 0; s < p; ++s) {
      const StageProgram& prog = w.stages[s];
      std::map<int, int> fwd, bwd;
      std::map<std::string, int> count;
      for (const Op& op : prog.ops) {
        const std::string& n = w.names[op.name];
        ++count[n];
        if (n == names::kBlockForward) ++fwd[op.layer];
        if (n == names::kBlockBackward) ++bwd[op.layer];
        if (op.kind != traces::SpanKind::P2P) continue;
        const int peer = pp_peer(w.layout, s, op.group);
        const bool grad = op.seq % 2 == 1;
        if (op.coll == traces::CollOp::Send) sends[{s, peer, grad}].push_back({op.micro_batch, op.seq});
        else recvs[{peer, s, grad}].push_back({op.micro_batch, op.seq});
      }
      EXPECT_EQ(fwd.size(), size_t(v * Lc));
      for (int c = 0; c < v; ++c)
        for (int l = (c * p + s) * Lc; l < (c * p + s + 1) * Lc; ++l) {
          EXPECT_EQ(fwd[l], m) << "stage " << s << " layer " << l;
          EXPECT_EQ(bwd[l], m) << "stage " << s << " layer " << l;
          EXPECT_TRUE(owner.emplace(l, s).second);
        }
      const bool first = s == 0, last = s == p - 1;
      EXPECT_EQ(count[std::string(names::kEmbedForward)], first ? m : 0);
      EXPECT_EQ(count[std::string(names::kHeadForward)], last ? m : 0);
      EXPECT_EQ(count[std::string(names::kRecvActivation)], v * m - (first ? m : 0));
      EXPECT_EQ(count[std::string(names::kSendActivation)], v * m - (last ? m : 0));
      EXPECT_EQ(count[std::string(names::kRecvGradient)], v * m - (last ? m : 0));
      EXPECT_EQ(count[std::string(names::kSendGradient)], v * m - (first ? m : 0));
      EXPECT_EQ(count[std::string(names::kEmbedAllReduce)], (first || last) ? 1 : 0);
      EXPECT_EQ(count[std::string(names::kDpAllReduce)], dp > 1 ? int(prog.bucket_params.size()) : 0);
    }
    EXPECT_EQ(owner.size(), size_t(L));
    EXPECT_EQ(sends.size(), recvs.size());
    for (const auto& [key, list] : sends) {
      EXPECT_EQ(list, recvs[key]) << "stage " << std::get<0>(key) << " -> " << std::get<1>(key);
      EXPECT_FALSE(list.empty());
    }
    // Activations flow s -> s+1 and, between chunks, p-1 -> 0: m·(v-1) of them.
    EXPECT_EQ((sends[{p - 1, 0, false}].size()), size_t(m * (v - 1))) << p;
  }
}

// Every block forward takes tf, every block backward tb, everything else (embedding, head, data,
// optimizer, communication) nothing.
void per_layer_costs(Workload& w, int64_t tf, int64_t tb) {
  for (auto& prog : w.stages)
    for (auto& op : prog.ops) {
      const std::string& n = w.names[op.name];
      op.duration_ns = n == names::kBlockForward ? tf : n == names::kBlockBackward ? tb : 0;
    }
}

ExecutorOptions free_network() {
  ExecutorOptions o;
  o.comm_time = [](const CollectiveRequest&) { return int64_t(0); };
  return o;
}

// With per-chunk forward F = Lc·tf and backward B = Lc·tb and free communication, the interleaved
// step takes (m·v + p - 1)·(F + B). A lower bound: stage p-1's first forward (chunk 0, micro-batch 0)
// waits for the p-1 stages before it, (p-1)·F; the stage then computes m·v·(F + B); its last pass,
// the backward of chunk 0 on micro-batch m-1, is also every stage's last one, and its gradient still
// crosses chunk 0 of stages p-2..0, (p-1)·B. The schedule attains the bound: with Megatron's warm-up
// of (p-s-1)·2 + (v-1)·p forwards the last stage never waits after its first forward, and the drain
// is the chain above. The simulation must give it exactly, for tb = 2·tf (the paper's figure) and
// tb = tf. 1F1B on the same model takes (m + p - 1)·Ls·(tf + tb), Ls = v·Lc (the same bound with
// v = 1), so the bubble shrinks from (p-1)/(m+p-1) to (p-1)/(m·v+p-1) of the step.
TEST(InterleavedExecutor, StepTimeClosedForm) {
  const Cluster c = h100_cluster(8);
  for (auto [tf, tb] : {std::pair<int64_t, int64_t>{1000, 2000}, std::pair<int64_t, int64_t>{1000, 1000}})
    for (auto [p, v, m] : {std::tuple{4, 2, 8}, std::tuple{4, 2, 4}, std::tuple{2, 3, 4}, std::tuple{4, 3, 12},
                           std::tuple{8, 2, 16}, std::tuple{3, 4, 6}}) {
      for (int Lc : {1, 2}) {
        const int L = p * v * Lc, Ls = v * Lc;
        Workload wi = build_workload(interleaved_scenario(L, 1, p, v, m), h100_cost());
        per_layer_costs(wi, tf, tb);
        const ExecResult ri = execute(wi, c, free_network());
        const int64_t expected = int64_t(m * v + p - 1) * Lc * (tf + tb);
        EXPECT_EQ(ri.makespan_ns, expected) << "p=" << p << " v=" << v << " m=" << m << " Lc=" << Lc
                                            << " tf=" << tf << " tb=" << tb;
        Workload w1 = build_workload(small_scenario(L, 1, 1, p, m, "1f1b"), h100_cost());
        per_layer_costs(w1, tf, tb);
        const ExecResult r1 = execute(w1, c, free_network());
        EXPECT_EQ(r1.makespan_ns, int64_t(m + p - 1) * Ls * (tf + tb));
        EXPECT_LT(ri.makespan_ns, r1.makespan_ns);
        for (const auto& rank : ri.ranks) {
          int64_t busy = 0;
          for (size_t i = 0; i < rank.ops.size(); ++i)
            if (rank.program->ops[i].stream == kStreamCompute) busy += rank.ops[i].end_ns - rank.ops[i].start_ns;
          EXPECT_EQ(busy, int64_t(m) * Ls * (tf + tb));
          EXPECT_DOUBLE_EQ(1.0 - double(busy) / double(ri.makespan_ns), double(p - 1) / double(m * v + p - 1));
        }
      }
    }
}

// Data parallelism with DDP buckets and ZeRO 1, overlap on and off, on the flow network: every
// op runs (the executor throws on a deadlock), every rank simulated, two steps.
TEST(InterleavedExecutor, DataParallelRunsOnTheNetwork) {
  const Cluster c = h100_cluster(16);
  for (int zero : {0, 1})
    for (bool overlap : {true, false})
      for (auto [p, v, m] : {std::tuple{4, 2, 8}, std::tuple{2, 2, 4}}) {
        SCOPED_TRACE("zero " + std::to_string(zero) + " overlap " + std::to_string(overlap) + " p " +
                     std::to_string(p) + " v " + std::to_string(v) + " m " + std::to_string(m));
        Scenario s = interleaved_scenario(2 * p * v, 2, p, v, m);
        s.parallel.zero = zero;
        s.parallel.overlap = overlap;
        s.parallel.bucket_mb = 1;
        const Workload w = build_workload(s, h100_cost(), {2, precision_config("mixed")});
        ExecutorOptions o;
        o.all_ranks = true;
        try {
          const ExecResult r = execute(w, c, o);
          EXPECT_EQ(r.ranks.size(), size_t(2 * p));
          EXPECT_GT(r.makespan_ns, 0);
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
        }
      }
}

TEST(InterleavedWorkload, RefusedInputsNameTheKey) {
  auto message = [](const Scenario& s) {
    try {
      build_workload(s, h100_cost());
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // 12 layers over pp 2 x 4 chunks.
  EXPECT_NE(message(interleaved_scenario(12, 1, 2, 4, 4)).find("parallel.virtual_stages"), std::string::npos);
  for (int zero : {2, 3}) {
    Scenario z = interleaved_scenario(8, 2, 2, 2, 4);
    z.parallel.zero = zero;
    EXPECT_NE(message(z).find("key 'parallel.zero'"), std::string::npos) << zero;
  }
  EXPECT_NE(message(interleaved_scenario(8, 1, 1, 2, 4)).find("parallel.pp >= 2"), std::string::npos);
  EXPECT_NE(message(interleaved_scenario(8, 1, 4, 2, 6)).find("multiple of pp"), std::string::npos);
}

}  // namespace
}  // namespace orrery::sim
