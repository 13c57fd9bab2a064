// Mixture-of-experts blocks of the CPU model (moe_block.hpp, model/moe.hpp): the parameter table,
// finite differences through the router (top-k renormalisation, capacity drops, the aux loss, the
// shared experts; GELU and SwiGLU experts) away from ties, dropped-token counts and the routed
// output on a hand-built routing, tp slices against the whole model, and the counters and spans of
// a training step.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fd_check.hpp"
#include "orrery/common/error.hpp"
#include "orrery/model/moe.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/buffers.hpp"
#include "orrery/runtime/moe_block.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/runtime/zero.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime {
namespace {

constexpr int kB = 2, kT = 8;

// L 2, C 16, H 2, V 32, T 8; 4 experts, top 2, an MoE FFN in block 0 only (every 2), expert width
// 24, one shared expert.
GptConfig tiny_moe(bool swiglu, double capacity, double aux = 0.05) {
  BlockArch a;
  if (swiglu) {
    a.activation = Activation::Swiglu;
    a.bias = false;
  }
  GptConfig c{2, 16, 2, 32, 8, a};
  c.moe.experts = 4;
  c.moe.top_k = 2;
  c.moe.every = 2;
  c.moe.expert_ffn_hidden = 24;
  c.moe.shared_experts = 1;
  c.moe.capacity_factor = capacity;
  c.moe.aux_loss_coef = aux;
  return c;
}

std::vector<std::string> names_of(const Gpt& m) {
  std::vector<std::string> out;
  for (const auto& t : m.tensors) out.push_back(t.name);
  return out;
}

TEST(MoeModel, ParameterTableAndExpertLayout) {
  const GptConfig cfg = tiny_moe(false, 0);
  GptShard sh;
  sh.ep_size = 2;
  sh.ep_rank = 1;  // experts 2 and 3
  const Gpt m = gpt_create(cfg, sh, 1);
  const std::vector<std::string> names = names_of(m);
  std::vector<std::string> block0;
  for (const auto& n : names) {
    if (n.rfind("h.0.", 0) == 0) block0.push_back(n);
  }
  EXPECT_EQ(block0, (std::vector<std::string>{"h.0.ln1w",
                                              "h.0.ln1b",
                                              "h.0.qkvw",
                                              "h.0.qkvb",
                                              "h.0.projw",
                                              "h.0.projb",
                                              "h.0.ln2w",
                                              "h.0.ln2b",
                                              "h.0.router",
                                              "h.0.shared.0.fcw",
                                              "h.0.shared.0.fcb",
                                              "h.0.shared.0.fcprojw",
                                              "h.0.shared.0.fcprojb",
                                              "h.0.expert.2.fcw",
                                              "h.0.expert.2.fcb",
                                              "h.0.expert.2.fcprojw",
                                              "h.0.expert.2.fcprojb",
                                              "h.0.expert.3.fcw",
                                              "h.0.expert.3.fcb",
                                              "h.0.expert.3.fcprojw",
                                              "h.0.expert.3.fcprojb"}));
  EXPECT_EQ(m.tensor("h.0.router").rows, 4);
  EXPECT_EQ(m.tensor("h.0.expert.3.fcw").rows, 24);
  EXPECT_EQ(m.tensor("h.1.fcw").rows, 64);  // block 1 is dense (4C)
  // The experts come after every dense tensor, outside every segment's range.
  const ParamRange ex = m.expert_range(0);
  EXPECT_EQ(ex.count, 2u * (24 * 16 + 24 + 16 * 24 + 16));
  EXPECT_EQ(ex.end(), m.num_params());
  for (int seg = kEmbedSegment; seg <= cfg.n_layer; ++seg) {
    EXPECT_LE(m.segment_range(seg).end(), ex.offset) << seg;
  }
  EXPECT_EQ(m.expert_range(1).count, 0u);
  EXPECT_EQ(m.moe_dims.first, 2);
  // The same expert is the same tensor on any ep layout (drawn from its own stream by name).
  const Gpt whole = gpt_create(cfg, GptShard{}, 1);
  const ParamTensor& a = m.tensor("h.0.expert.3.fcw");
  const ParamTensor& b = whole.tensor("h.0.expert.3.fcw");
  EXPECT_EQ(0, std::memcmp(m.params.data() + a.offset, whole.params.data() + b.offset,
                           a.count * sizeof(float)));
}

// Checkpoints' global coordinates (model.hpp global_flat_runs): every tensor of an ep rank's array
// lands where the ep 1 array has the same-named tensor, the dense prefix is one identity run, and
// the ep ranks' experts tile the global expert ranges exactly once.
TEST(MoeModel, GlobalCoordinatesAreTheEp1Layout) {
  GptConfig cfg = tiny_moe(false, 0);
  cfg.n_layer = 4;  // MoE FFNs in blocks 0 and 2: two expert ranges per ep rank
  const Gpt whole = gpt_create(cfg, GptShard{}, 1);
  EXPECT_EQ(global_flat_elems(whole), whole.num_params());
  const std::vector<FlatRun> one = global_flat_runs(whole);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].local, 0u);
  EXPECT_EQ(one[0].global, 0u);
  EXPECT_EQ(one[0].count, whole.num_params());
  std::vector<int> covered(whole.num_params(), 0);
  for (int ep_rank = 0; ep_rank < 2; ++ep_rank) {
    GptShard sh;
    sh.ep_size = 2;
    sh.ep_rank = ep_rank;
    const Gpt m = gpt_create(cfg, sh, 1);
    EXPECT_EQ(global_flat_elems(m), whole.num_params());
    const std::vector<FlatRun> runs = global_flat_runs(m);
    // The dense prefix (identity), then one run per MoE block's two experts; ep rank 0's first
    // experts follow the dense prefix in both arrays, so they extend its run.
    ASSERT_EQ(runs.size(), ep_rank == 0 ? 2u : 3u) << ep_rank;
    EXPECT_EQ(runs[0].global, 0u);
    EXPECT_EQ(runs[0].count, m.expert_range(ep_rank == 0 ? 2 : 0).offset);
    std::size_t local = 0;
    for (const FlatRun& r : runs) {
      EXPECT_EQ(r.local, local);  // the runs tile the local array in order
      local += r.count;
      for (std::size_t i = 0; i < r.count; ++i) ++covered[r.global + i];
    }
    EXPECT_EQ(local, m.num_params());
    for (const auto& t : m.tensors) {
      const auto it = std::find_if(runs.begin(), runs.end(), [&](const FlatRun& r) {
        return t.offset >= r.local && t.offset < r.local + r.count;
      });
      ASSERT_NE(it, runs.end()) << t.name;
      const ParamTensor& w = whole.tensor(t.name);
      EXPECT_EQ(it->global + (t.offset - it->local), w.offset) << t.name;
      EXPECT_EQ(0, std::memcmp(m.params.data() + t.offset, whole.params.data() + w.offset,
                               t.count * sizeof(float)))
          << t.name;
    }
  }
  // The dense prefix twice (both ep ranks hold it), every expert element once.
  const std::size_t dense = whole.expert_range(0).offset;
  for (std::size_t i = 0; i < covered.size(); ++i) {
    ASSERT_EQ(covered[i], i < dense ? 2 : 1) << "global element " << i;
  }
}

// ZeRO 1/2 pad the flat arrays (zero.hpp): the MoE pointers follow them.
TEST(MoeModel, PaddedStorageRebasesTheMoePointers) {
  Gpt m = gpt_create(tiny_moe(true, 0), GptShard{}, 3);
  const std::vector<float> before(m.params.begin(), m.params.end());
  gpt_pad_storage(m, m.num_params() + 7);
  const ParamTensor& r = m.tensor("h.0.router");
  EXPECT_EQ(m.moe[0].router, m.params.data() + r.offset);
  EXPECT_EQ(m.dmoe[0].router, m.grads.data() + r.offset);
  const ParamTensor& w = m.tensor("h.0.expert.3.fcprojw");
  EXPECT_EQ(m.moe[0].experts[3].fcprojw, m.params.data() + w.offset);
  EXPECT_EQ(m.dmoe[0].shared[0].fcw, m.grads.data() + m.tensor("h.0.shared.0.fcw").offset);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), m.params.begin()));
}

struct Run {
  double objective = 0;  // LM loss + the aux losses
  std::vector<float> grads;
  std::vector<std::vector<int>> choices;  // per MoE block: the routing's experts and kept flags
};

std::vector<std::vector<int>> choices_of(const GptActivations& acts) {
  std::vector<std::vector<int>> out;
  for (const auto& st : acts.moe) {
    std::vector<int> c = st.routing.expert;
    for (uint8_t k : st.routing.kept) c.push_back(k);
    out.push_back(c);
  }
  return out;
}

Run forward_backward(Gpt& m, const std::vector<int32_t>& in, const std::vector<int32_t>& tg) {
  auto acts = gpt_activations(m, kB, kT);
  auto scratch = gpt_grad_scratch(m, kB, kT);
  gpt_zero_grad(m);
  Run r;
  r.objective = gpt_forward(m, acts, in.data(), tg.data()) + gpt_aux_loss(acts);
  r.choices = choices_of(acts);
  gpt_backward(m, acts, scratch, 1.0f);
  r.grads.assign(m.grads.begin(), m.grads.end());
  return r;
}

// Every parameter against central differences of LM loss + aux loss, skipping the entries whose
// ±eps changes a routing choice or a drop (a tie: the objective is not differentiable there).
void check_finite_differences(const GptConfig& cfg, uint32_t seed) {
  Gpt m = gpt_create(cfg, GptShard{}, seed);
  fd::scramble(m, seed + 1);
  const auto in = fd::tokens(kB * kT, cfg.vocab, seed + 2);
  const auto tg = fd::tokens(kB * kT, cfg.vocab, seed + 3);
  const Run base = forward_backward(m, in, tg);
  auto acts = gpt_activations(m, kB, kT);
  const float eps = 1e-2f;
  std::size_t skipped = 0, checked = 0;
  for (const auto& t : m.tensors) {
    double worst = 0;
    std::size_t worst_i = 0;
    for (std::size_t i = 0; i < t.count; ++i) {
      float& p = m.params[t.offset + i];
      const float saved = p;
      p = saved + eps;
      const double up = gpt_forward(m, acts, in.data(), tg.data()) + gpt_aux_loss(acts);
      const bool tie_up = choices_of(acts) != base.choices;
      p = saved - eps;
      const double down = gpt_forward(m, acts, in.data(), tg.data()) + gpt_aux_loss(acts);
      const bool tie_down = choices_of(acts) != base.choices;
      p = saved;
      if (tie_up || tie_down) {
        ++skipped;
        continue;
      }
      ++checked;
      const double numeric = (up - down) / (2.0 * eps);
      const double analytic = base.grads[t.offset + i];
      const double err =
          std::abs(numeric - analytic) / (std::abs(numeric) + std::abs(analytic) + 1e-2);
      if (err > worst) {
        worst = err;
        worst_i = i;
      }
    }
    EXPECT_LT(worst, 1e-2) << t.name << "[" << worst_i << "]";
  }
  // Away from ties: nearly every entry is checked.
  EXPECT_LT(skipped, checked / 50) << skipped << " skipped of " << skipped + checked;
}

TEST(MoeModel, FiniteDifferencesGeluDropless) { check_finite_differences(tiny_moe(false, 0), 11); }
TEST(MoeModel, FiniteDifferencesGeluWithDrops) {
  check_finite_differences(tiny_moe(false, 1.0), 21);
}
TEST(MoeModel, FiniteDifferencesSwigluWithDrops) {
  check_finite_differences(tiny_moe(true, 1.25), 31);
}
// model.moe.first_dense 1 with every 1: block 0 keeps the dense MLP (no router, 4C fc), block 1 is
// the MoE block, and the gradients through both are still the finite differences'.
TEST(MoeModel, FirstDenseBlockKeepsTheDenseMlp) {
  GptConfig cfg = tiny_moe(false, 0);
  cfg.moe.every = 1;
  cfg.moe.first_dense = 1;
  const Gpt m = gpt_create(cfg, GptShard{}, 1);
  for (const auto& n : names_of(m))
    EXPECT_FALSE(n.rfind("h.0.", 0) == 0 &&
                 (n.find("router") != std::string::npos || n.find("expert") != std::string::npos))
        << n;
  EXPECT_EQ(m.tensor("h.0.fcw").rows, 64);
  EXPECT_EQ(m.tensor("h.1.router").rows, 4);
  check_finite_differences(cfg, 41);
}

// Router weights 0: every token's probabilities tie at 1/E, so (ties to the lower index) every
// token picks experts 0 then 1 with weights 1/2. N = 16 tokens, top 2 of 4, capacity factor f:
// capacity ceil(f · 16 · 2 / 4) = ceil(8f); expert 0 takes the first `cap` tokens' first choices,
// expert 1 the first `cap` second choices: dropped = 2 · (16 - cap).
TEST(MoeModel, DroppedTokensOnAHandBuiltRouting) {
  for (const double f : {0.5, 1.0, 1.5, 2.0, 0.0}) {
    GptConfig cfg = tiny_moe(false, f);
    cfg.moe.shared_experts = 0;
    Gpt m = gpt_create(cfg, GptShard{}, 5);
    std::fill_n(m.moe[0].router, 4 * 16, 0.0f);
    const auto in = fd::tokens(kB * kT, cfg.vocab, 6), tg = fd::tokens(kB * kT, cfg.vocab, 7);
    auto acts = gpt_activations(m, kB, kT);
    std::vector<int64_t> dropped, routed;
    double aux = -1;
    GptHooks hooks;
    hooks.on_routing = [&](int layer, const model::moe::Routing& r, double a) {
      EXPECT_EQ(layer, 0);
      dropped.push_back(r.dropped);
      routed = r.routed;
      aux = a;
    };
    gpt_forward(m, acts, in.data(), tg.data(), hooks);
    const int64_t N = kB * kT;
    const int64_t cap = f > 0 ? static_cast<int64_t>(std::ceil(8 * f)) : N;
    ASSERT_EQ(dropped.size(), 1u);
    EXPECT_EQ(dropped[0], 2 * std::max<int64_t>(0, N - cap)) << "factor " << f;
    EXPECT_EQ(routed, (std::vector<int64_t>{N, N, 0, 0}));
    // Switch aux loss: coef · E · Σ f_e P_e = 0.05 · 4 · (1/2 · 1/4 + 1/2 · 1/4) = 0.05.
    EXPECT_NEAR(aux, 0.05, 1e-7);
    // The routed output: the mean of experts 0 and 1 for a kept token, nothing for a dropped one.
    const MoeBlockState& st = acts.moe[0];
    const int C = 16;
    for (int64_t t = 0; t < N; ++t) {
      const bool kept = t < cap;
      EXPECT_EQ(st.send_row[std::size_t(2 * t)] >= 0, kept);
      double norm = 0;
      for (int c = 0; c < C; ++c) norm += std::abs(acts.blocks[0].fcproj[t * C + c]);
      if (kept) {
        EXPECT_GT(norm, 0) << t;
      } else {
        EXPECT_EQ(norm, 0) << t;
      }
    }
    EXPECT_EQ(static_cast<int64_t>(st.send.size()), (2 * N - dropped[0]) * C);
  }
}

// tp 2: each rank's slice of the whole model, the block's sums over tp done by hand between two
// shards stepped in lockstep on two threads would need a barrier; instead the slices' partials are
// checked against the whole model's: Σ_tp fcproj = the whole fcproj, on a routing with drops.
TEST(MoeModel, TensorParallelSlicesSumToTheWholeBlock) {
  const GptConfig cfg = tiny_moe(true, 1.0);
  const Gpt whole = gpt_create(cfg, GptShard{}, 9);
  const auto in = fd::tokens(kB * kT, cfg.vocab, 10), tg = fd::tokens(kB * kT, cfg.vocab, 11);
  auto wa = gpt_activations(whole, kB, kT);
  gpt_forward(whole, wa, in.data(), tg.data());
  std::vector<double> sum(std::size_t(kB) * kT * 16, 0.0);
  for (int r = 0; r < 2; ++r) {
    GptShard sh;
    sh.tp_size = 2;
    sh.tp_rank = r;
    Gpt part = gpt_create(cfg, sh, 9);
    auto pa = gpt_activations(part, kB, kT);
    // Only block 0's FFN: its input (ln2) is the whole model's, replicated over tp.
    std::copy(wa.blocks[0].ln2, wa.blocks[0].ln2 + sum.size(), pa.blocks[0].ln2);
    moe_ffn_forward(part, pa, 0, GptHooks{});
    EXPECT_EQ(pa.moe[0].routing.expert, wa.moe[0].routing.expert);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += pa.blocks[0].fcproj[i];
  }
  double worst = 0;
  for (std::size_t i = 0; i < sum.size(); ++i)
    worst = std::max(worst, std::abs(sum[i] - wa.blocks[0].fcproj[i]));
  EXPECT_LT(worst, 1e-5);
}

TEST(MoeModel, BadShardsAreInputErrors) {
  GptConfig c = tiny_moe(false, 0);
  GptShard sh;
  sh.ep_size = 3;  // does not divide 4 experts
  EXPECT_THROW(gpt_create(c, sh, 1), InputError);
  sh.ep_size = 1;
  sh.tp_size = 2;
  c.moe.expert_ffn_hidden = 25;  // expert width not divisible by tp
  EXPECT_THROW(gpt_create(c, sh, 1), InputError);
}

Scenario moe_scenario() {
  Scenario s;
  s.model.layers = 2;
  s.model.d_model = 16;
  s.model.heads = 2;
  s.model.vocab = 32;
  s.model.seq = 8;
  s.model.moe.experts = 4;
  s.model.moe.top_k = 2;
  s.model.moe.every = 1;
  s.model.moe.capacity_factor = 1.0;
  s.training.steps = 2;
  s.training.global_batch = 4;
  s.training.micro_batch = 2;
  s.runtime.threads = 1;
  return s;
}

// One process: the step's counters (tokens per expert before the drop sum to N · top_k per block
// and micro-batch) and the MoE spans in model/moe.hpp's order, no all-to-all without ep.
TEST(MoeTraining, CountersAndSpansOfAStep) {
  const Scenario s = moe_scenario();
  check_supported(s);
  const std::string path =
      ::testing::TempDir() + "orrery_moe_step_" + std::to_string(::getpid()) + ".db";
  StepResult r;
  {
    traces::TraceWriter writer(path);
    profiler::Recorder rec(&writer, 0);
    auto local = make_local_communicator();
    Trainer t(s, *local, &rec);
    t.prepare();
    r = t.step();
    rec.flush();
    writer.close();
  }
  const traces::Trace tr = traces::load_trace(path);
  std::remove(path.c_str());
  EXPECT_GT(r.aux_loss, 0);
  std::map<std::string, double> last, first;
  for (const auto& c : tr.counters) {
    last[tr.strings.str(c.name)] = c.value;
    first.emplace(tr.strings.str(c.name), c.value);
  }
  // mem.activations includes the MoE blocks' state once a forward has sized it: at least the
  // router probabilities and the dispatched rows of both blocks (N = 16 tokens, E 4, C 16).
  EXPECT_GE(last.at("mem.activations") - first.at("mem.activations"),
            2.0 * (16 * 4 + 16 * 16) * sizeof(float));
  for (int l = 0; l < 2; ++l) {
    double tokens = 0;
    for (int e = 0; e < 4; ++e) tokens += last.at(model::moe::moe_tokens_counter(l, e));
    EXPECT_EQ(tokens, 2.0 * (2 * 8) * 2) << l;  // 2 micro-batches of 16 tokens, top 2
    EXPECT_GE(last.at(model::moe::moe_dropped_counter(l)), 0.0);
  }
  std::vector<std::string> names;
  for (const auto& sp : tr.spans) {
    if (sp.step == 0 && sp.micro_batch == 0 && sp.layer == 1 && sp.kind != traces::SpanKind::Phase)
      names.push_back(tr.name_of(sp));
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"fwd.block", "moe.router", "moe.experts", "moe.gated_sum",
                                      "fwd.block", "bwd.block", "moe.gated_sum.bwd",
                                      "moe.experts.bwd", "moe.router.bwd", "bwd.block"}));
}

// Selective recomputation reruns only the attention core: an MoE model's losses and parameters
// are bit-identical to those without it.
TEST(MoeTraining, SelectiveRecomputationIsBitIdentical) {
  std::vector<std::vector<float>> params;
  std::vector<std::vector<float>> losses;
  for (const char* rc : {"none", "selective"}) {
    Scenario s = moe_scenario();
    s.training.recompute = rc;
    check_supported(s);
    auto local = make_local_communicator();
    Trainer t(s, *local, nullptr);
    t.prepare();
    losses.emplace_back();
    for (int i = 0; i < s.training.steps; ++i) losses.back().push_back(t.step().loss);
    params.push_back(t.parameters());
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(params[0], params[1]);
}

TEST(MoeTraining, RefusalsNameTheKey) {
  Scenario s = moe_scenario();
  s.parallel.dp = 2;
  s.parallel.zero = 1;
  EXPECT_NO_THROW(check_supported(s));  // ep 1: the experts are sharded as the dense tensors
  s.parallel.ep = 2;
  s.parallel.zero = 2;
  EXPECT_NO_THROW(check_supported(s));  // ep 2: the experts sharded over their edp group
  s.parallel.zero = 3;
  EXPECT_NO_THROW(check_supported(s));  // ZeRO 3: the experts' segments over their edp group
  s.checkpoint.every = 2;
  EXPECT_NO_THROW(check_supported(s));  // checkpoints in global expert coordinates
  s.checkpoint.every = 0;
  s.parallel.zero = 0;
  s.parallel.ep = 2;
  s.parallel.grad_compression = "int8";
  EXPECT_NO_THROW(check_supported(s));  // ZeRO 0: DDP's dense buckets compressed
  s.parallel.ep = 1;
  s.parallel.zero = 1;
  try {
    check_supported(s);
    FAIL() << "compression with MoE accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.grad_compression"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace orrery::runtime
