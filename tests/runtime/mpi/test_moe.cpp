// Mixture of experts with expert parallelism under mpirun (model/moe.hpp): ep 2 and 4 against ep 1
// on the same data (dp fixed, so every rank routes the same micro-batches with the same capacity and
// aux loss), with pipeline and tensor parallelism, against a serial run, and the all-to-all spans'
// bytes against the closed form. Cases run where their dp·tp·pp equals the world size (the suite
// runs with 2 and 4 ranks).
//
// Tolerances (as test_parallel.cpp): the loss curve within 1e-5 relative, parameters after 3 AdamW
// steps max|Δ| / max|p| < 1e-4. ep changes only where an expert's rows are computed (the same rows
// in another GEMM) and the experts' gradient reduction (averaged over edp and divided by ep instead
// of averaged over dp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mpi_env.hpp"
#include "orrery/model/moe.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/tensor_parallel.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime {
namespace {

using testing::world;

struct Layers {
  int dp = 1, ep = 1, tp = 1, pp = 1;
  int zero = 0;
};

// 4 blocks of C 32, MoE FFNs in blocks 0 and 2 (every 2): 4 experts of width 48, top 2, one shared
// expert; `swiglu`: Llama-style experts without biases. 2 micro-batches per step (4 with pp).
Scenario moe_tiny(const Layers& l, bool swiglu, double capacity, double aux) {
  Scenario s;
  s.name = "moe-test";
  s.model.layers = 4;
  s.model.d_model = 32;
  s.model.heads = 4;
  s.model.vocab = 64;
  s.model.seq = 16;
  s.model.moe.experts = 4;
  s.model.moe.top_k = 2;
  s.model.moe.every = 2;
  s.model.moe.expert_ffn_hidden = 48;
  s.model.moe.shared_experts = 1;
  s.model.moe.capacity_factor = capacity;
  s.model.moe.aux_loss_coef = aux;
  if (swiglu) {
    s.model.activation = "swiglu";
    s.model.bias = false;
  }
  s.training.steps = 3;
  s.training.global_batch = 8;
  s.training.micro_batch = 8 / (l.dp * (l.pp > 1 ? 4 : 2));
  s.training.seed = 42;
  s.training.lr = 1e-3;
  s.parallel.dp = l.dp;
  s.parallel.ep = l.ep;
  s.parallel.tp = l.tp;
  s.parallel.pp = l.pp;
  s.parallel.zero = l.zero;
  s.parallel.schedule = "1f1b";
  s.parallel.bucket_mb = 0.01;
  s.runtime.threads = 1;
  return s;
}

struct Result {
  std::vector<float> loss, aux;
  std::vector<float> params;
  std::vector<float> grads;          // the last step's averaged gradients (before its AdamW update)
  std::unique_ptr<Trainer> trainer;  // kept for its model's layout (and a reference's values)
  const Gpt& model() const { return trainer->model(); }
  const Layout& layout() const { return trainer->layout(); }
};

Result train(const Scenario& s, Communicator& comm) {
  check_supported(s);
  Result r;
  r.trainer = std::make_unique<Trainer>(s, comm, nullptr);
  r.trainer->prepare();
  for (int i = 0; i < s.training.steps; ++i) {
    const StepResult st = r.trainer->step();
    r.loss.push_back(st.loss);
    r.aux.push_back(static_cast<float>(st.aux_loss));
  }
  r.params = r.trainer->parameters();
  const auto& g = r.trainer->model().grads;
  r.grads.assign(g.begin(), g.end());
  return r;
}

// max |Δ| / max |p| of every tensor `got` holds against the same-named tensor of `want` (its tp
// slice when want holds the whole tensor and got a slice), over the world.
double parameter_error(const Result& got, const std::vector<float>& got_values,
                       const Gpt& want_model, const std::vector<float>& want, bool slice) {
  double max_diff = 0, max_ref = 0;
  for (const auto& t : got.model().tensors) {
    std::vector<float> ref;
    if (slice) {
      ref = tp_slice_of_full(want_model, t, got.layout().tp_rank, got.layout().tp);
    } else {
      const ParamTensor& w = want_model.tensor(t.name);
      EXPECT_EQ(w.count, t.count) << t.name;
      ref.assign(want.begin() + std::ptrdiff_t(w.offset),
                 want.begin() + std::ptrdiff_t(w.offset + w.count));
    }
    for (size_t i = 0; i < t.count; ++i) {
      max_diff = std::max(max_diff, std::abs(double(got_values[t.offset + i]) - ref[i]));
      max_ref = std::max(max_ref, std::abs(double(ref[i])));
    }
  }
  double err = max_diff / max_ref;
  world().all_reduce(&err, 1, DType::F64, ReduceOp::Max).wait();
  return err;
}

void expect_same_curve(const std::vector<float>& got, const std::vector<float>& want,
                       const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]) + 1e-9) << what << " step " << i;
  }
}

struct EpCase {
  const char* name;
  Layers par;  // ep > 1
  bool swiglu;
  double capacity;
  const char* compression = "none";  // parallel.grad_compression (DDP's dense buckets only)
};

class EpEquivalence : public ::testing::TestWithParam<EpCase> {};

// The same layout with ep 1: the same loss and aux curves on every rank, the same parameters.
TEST_P(EpEquivalence, SameAsEp1) {
  const EpCase c = GetParam();
  const Layers& l = c.par;
  if (l.dp * l.tp * l.pp != world().size()) GTEST_SKIP() << "needs " << l.dp * l.tp * l.pp;
  Scenario s = moe_tiny(l, c.swiglu, c.capacity, 0.01);
  s.parallel.grad_compression = c.compression;
  const Result par = train(s, world());
  Layers one = l;
  one.ep = 1;
  Scenario s1 = moe_tiny(one, c.swiglu, c.capacity, 0.01);
  s1.parallel.grad_compression = c.compression;
  const Result ref = train(s1, world());
  expect_same_curve(par.loss, ref.loss, "loss");
  expect_same_curve(par.aux, ref.aux, "aux loss");
  EXPECT_GT(ref.aux.back(), 0.0f);
  const double err = parameter_error(par, par.params, ref.model(), ref.params, false);
  // The last step's gradients too: AdamW's normalised update hides a gradient off by a factor.
  const double gerr = parameter_error(par, par.grads, ref.model(), ref.grads, false);
  if (world().rank() == 0) {
    std::printf(
        "  %-24s loss %.6f (ep1 %.6f) aux %.6f  max relative parameter error %.3g, "
        "gradient error %.3g\n",
        c.name, par.loss.back(), ref.loss.back(), par.aux.back(), err, gerr);
  }
  EXPECT_LT(err, 1e-4) << c.name;
  // int8 rounds each gradient to 1/127 of its block's max: inputs that differ by an ulp can land
  // a quantum apart (observed 4.5e-4), so there the bound is that quantum.
  const bool int8 = std::string(c.compression) == "int8";
  EXPECT_LT(gerr, int8 ? 1.0 / 127 : 1e-4) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Moe, EpEquivalence,
    ::testing::Values(EpCase{"dp2_ep2", {2, 2, 1, 1}, false, 1.25},
                      EpCase{"dp2_ep2_swiglu_dropless", {2, 2, 1, 1}, true, 0.0},
                      EpCase{"dp4_ep2", {4, 2, 1, 1}, false, 1.25},
                      EpCase{"dp4_ep4", {4, 4, 1, 1}, false, 1.25},
                      EpCase{"dp4_ep4_swiglu", {4, 4, 1, 1}, true, 1.0},
                      EpCase{"dp2_ep2_pp2", {2, 2, 1, 2}, false, 1.25},
                      EpCase{"dp2_ep2_tp2", {2, 2, 2, 1}, true, 1.25},
                      EpCase{"dp2_ep2_int8", {2, 2, 1, 1}, false, 1.25, "int8"},
                      EpCase{"dp4_ep2_powersgd", {4, 2, 1, 1}, false, 1.25, "powersgd"}),
    [](const ::testing::TestParamInfo<EpCase>& i) { return std::string(i.param.name); });

class ZeroEquivalence : public ::testing::TestWithParam<EpCase> {};

// ZeRO 1/2/3 with MoE against ZeRO 0 on the same layout: ep 1 (the experts replicated over dp and
// sharded with the dense tensors) and ep > 1 (the experts' shards over their edp group; ZeRO 3
// gathers them per block over edp, dp4_ep4 with an edp group of one). Not bit-identical: ZeRO 2/3
// reduce-scatter every micro-batch's gradients and sum the shards, ZeRO 0 sums the micro-batches
// first and all-reduces once, so the tolerances of the file's header apply.
TEST_P(ZeroEquivalence, SameAsZero0) {
  const EpCase c = GetParam();
  const Layers& l = c.par;
  if (l.dp * l.tp * l.pp != world().size()) GTEST_SKIP() << "needs " << l.dp * l.tp * l.pp;
  const Result par = train(moe_tiny(l, c.swiglu, c.capacity, 0.01), world());
  Layers z0 = l;
  z0.zero = 0;
  const Result ref = train(moe_tiny(z0, c.swiglu, c.capacity, 0.01), world());
  expect_same_curve(par.loss, ref.loss, "loss");
  expect_same_curve(par.aux, ref.aux, "aux loss");
  const double err = parameter_error(par, par.params, ref.model(), ref.params, false);
  if (world().rank() == 0) {
    std::printf("  %-24s loss %.6f (zero 0 %.6f)  max relative parameter error %.3g\n", c.name,
                par.loss.back(), ref.loss.back(), err);
  }
  EXPECT_LT(err, 1e-4) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Moe, ZeroEquivalence,
    ::testing::Values(EpCase{"dp2_zero1", {2, 1, 1, 1, 1}, false, 1.25},
                      EpCase{"dp2_zero2_swiglu", {2, 1, 1, 1, 2}, true, 1.25},
                      EpCase{"dp4_zero1", {4, 1, 1, 1, 1}, false, 1.25},
                      EpCase{"dp2_pp2_zero2", {2, 1, 1, 2, 2}, false, 1.25},
                      EpCase{"dp2_ep2_zero1", {2, 2, 1, 1, 1}, false, 1.25},
                      EpCase{"dp2_ep2_zero2_swiglu", {2, 2, 1, 1, 2}, true, 1.25},
                      EpCase{"dp4_ep2_zero1", {4, 2, 1, 1, 1}, false, 1.25},
                      EpCase{"dp4_ep2_zero2", {4, 2, 1, 1, 2}, false, 1.25},
                      EpCase{"dp2_ep2_pp2_zero1", {2, 2, 1, 2, 1}, false, 1.25},
                      // ZeRO 3: the dense segments over dp, each block's experts over edp
                      EpCase{"dp2_zero3", {2, 1, 1, 1, 3}, false, 1.25},
                      EpCase{"dp2_ep2_zero3", {2, 2, 1, 1, 3}, false, 1.25},
                      EpCase{"dp2_ep2_zero3_swiglu_dropless", {2, 2, 1, 1, 3}, true, 0.0},
                      EpCase{"dp4_ep2_zero3", {4, 2, 1, 1, 3}, false, 1.25},
                      EpCase{"dp4_ep4_zero3", {4, 4, 1, 1, 3}, true, 1.25},
                      EpCase{"dp2_ep2_pp2_zero3", {2, 2, 1, 2, 3}, false, 1.25},
                      EpCase{"dp2_ep2_tp2_zero3", {2, 2, 2, 1, 3}, true, 1.25}),
    [](const ::testing::TestParamInfo<EpCase>& i) { return std::string(i.param.name); });

// NVMe offload (zero.offload_optimizer nvme, runtime offload.hpp) with MoE: AdamW streamed through
// the rank's file chunk by chunk is elementwise, so the run equals the one without offload bit for
// bit: the experts' moments after the dense shard's in the file (ZeRO 1/2, ep > 1), ZeRO 3's expert
// segments with the rest, and with zero.offload_params their shards read from the file before each
// gather over edp.
struct OffloadCase {
  const char* name;
  Layers par;
  const char* params;  // zero.offload_params
};
class OffloadEquivalence : public ::testing::TestWithParam<OffloadCase> {};

TEST_P(OffloadEquivalence, BitIdenticalToTheRunWithoutOffload) {
  const OffloadCase c = GetParam();
  const Layers& l = c.par;
  if (l.dp * l.tp * l.pp != world().size()) GTEST_SKIP() << "needs " << l.dp * l.tp * l.pp;
  const Scenario s = moe_tiny(l, false, 1.25, 0.01);
  const Result want = train(s, world());
  Scenario o = s;
  o.zero.offload_optimizer = "nvme";
  o.zero.offload_params = c.params;
  // One directory for the job (the parent mpirun's pid): the ranks' files are rank<r> in it.
  const std::string dir =
      ::testing::TempDir() + "orrery_moe_offload_" + std::to_string(::getppid());
  std::filesystem::create_directories(dir);
  o.zero.nvme_path = dir;
  {
    const Result got = train(o, world());
    EXPECT_EQ(got.loss, want.loss) << c.name;
    EXPECT_EQ(got.aux, want.aux) << c.name;
    ASSERT_EQ(got.params.size(), want.params.size());
    EXPECT_EQ(0, std::memcmp(got.params.data(), want.params.data(), want.params.size() * 4))
        << c.name;
  }
  world().barrier().wait();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
  world().barrier().wait();
}

INSTANTIATE_TEST_SUITE_P(
    Moe, OffloadEquivalence,
    ::testing::Values(OffloadCase{"dp2_ep2_zero0", {2, 2, 1, 1, 0}, "none"},
                      OffloadCase{"dp2_zero1", {2, 1, 1, 1, 1}, "none"},
                      OffloadCase{"dp2_ep2_zero2", {2, 2, 1, 1, 2}, "none"},
                      OffloadCase{"dp2_ep2_zero3", {2, 2, 1, 1, 3}, "none"},
                      OffloadCase{"dp2_ep2_zero3_params", {2, 2, 1, 1, 3}, "nvme"},
                      OffloadCase{"dp4_ep2_zero1", {4, 2, 1, 1, 1}, "none"},
                      OffloadCase{"dp4_ep2_zero3_params", {4, 2, 1, 1, 3}, "nvme"}),
    [](const ::testing::TestParamInfo<OffloadCase>& i) { return std::string(i.param.name); });

class SerialEquivalence : public ::testing::TestWithParam<EpCase> {};

// Against one process with the same global batch in the same micro-batch grouping (each dp times
// larger). The aux loss and the capacity are per micro-batch on a rank, so they would differ from
// the serial run's larger micro-batches: this comparison is dropless with aux_loss_coef 0, unless
// dp = 1 (tp alone), where the micro-batches are the same.
TEST_P(SerialEquivalence, SameAsSerial) {
  const EpCase c = GetParam();
  const Layers& l = c.par;
  if (l.dp * l.tp * l.pp != world().size()) GTEST_SKIP() << "needs " << l.dp * l.tp * l.pp;
  const double aux = l.dp == 1 ? 0.01 : 0.0;
  const Scenario s = moe_tiny(l, c.swiglu, c.capacity, aux);
  const Result par = train(s, world());
  Scenario ss = moe_tiny(Layers{}, c.swiglu, c.capacity, aux);
  ss.training.micro_batch = s.training.micro_batch * l.dp;
  auto local = make_local_communicator();
  const Result ser = train(ss, *local);
  std::vector<float> loss = par.loss;  // each dp rank's own data: averaged over dp
  world().all_reduce(loss.data(), loss.size(), DType::F32, ReduceOp::Sum).wait();
  for (float& x : loss) x /= float(world().size());  // every rank reports its dp replica's loss
  expect_same_curve(loss, ser.loss, "loss");
  const double err = parameter_error(par, par.params, ser.model(), ser.params, true);
  if (world().rank() == 0) {
    std::printf("  %-24s loss %.6f (serial %.6f)  max relative parameter error %.3g\n", c.name,
                loss.back(), ser.loss.back(), err);
  }
  EXPECT_LT(err, 1e-4) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Moe, SerialEquivalence,
                         ::testing::Values(EpCase{"tp2_with_drops", {1, 1, 2, 1}, true, 1.0},
                                           EpCase{"dp2_ep2_dropless", {2, 2, 1, 1}, false, 0.0},
                                           EpCase{"dp2_ep2_pp2_dropless", {2, 2, 1, 2}, false, 0.0},
                                           EpCase{"dp2_ep2_tp2_dropless", {2, 2, 2, 1}, true, 0.0},
                                           EpCase{"dp4_ep4_dropless", {4, 4, 1, 1}, false, 0.0}),
                         [](const ::testing::TestParamInfo<EpCase>& i) {
                           return std::string(i.param.name);
                         });

// The all-to-all spans of a profiled dp = ep = world run (model/moe.hpp): stream comm.ep, op
// all_to_all, on the ep group; moe.dispatch's bytes = this rank's kept assignments · C · 4, so
// dropless exactly N · top_k · C · 4 per micro-batch and block, with drops (over the step)
// (M · N · top_k − the moe.dropped counter) · C · 4; moe.combine.bwd sends what moe.dispatch sent,
// moe.combine and moe.dispatch.bwd what the rank received, the same total over the group.
TEST(MoeTrace, AllToAllBytesAreTheClosedForm) {
  const int n = world().size(), r = world().rank();
  for (const double capacity : {0.0, 1.0}) {
    const Scenario s = moe_tiny(Layers{n, n, 1, 1}, false, capacity, 0.01);
    const std::string path = ::testing::TempDir() + "orrery_moe_trace_" +
                             std::to_string(::getppid()) + "_rank" + std::to_string(r) + ".db";
    {
      traces::TraceWriter writer(path);
      profiler::Recorder rec(&writer, r);
      world().set_recorder(&rec);
      Trainer t(s, world(), &rec);
      t.prepare();
      t.step();
      world().synchronize();
      world().set_recorder(nullptr);
      rec.flush();
      writer.close();
    }
    const traces::Trace tr = traces::load_trace(path);
    std::remove(path.c_str());
    const int64_t M = 2, N = int64_t(s.training.micro_batch) * s.model.seq, K = 2, C = 32;
    std::map<std::string, double> counters;
    for (const auto& c : tr.counters) counters[tr.strings.str(c.name)] = c.value;
    std::map<std::string, int64_t> bytes;  // per span name, step 0
    std::map<std::string, int> count;
    for (const auto& sp : tr.spans) {
      const std::string& name = tr.name_of(sp);
      if (sp.step != 0 || name.rfind("moe.", 0) != 0 || sp.kind != traces::SpanKind::Collective)
        continue;
      EXPECT_EQ(sp.stream, 5) << name;  // comm.ep
      EXPECT_EQ(sp.op, traces::CollOp::AllToAll) << name;
      bytes[name] += sp.bytes;
      ++count[name];
      if (capacity == 0.0 && name == "moe.dispatch") {
        EXPECT_EQ(sp.bytes, N * K * C * 4);
      }
    }
    for (const char* name : {"moe.dispatch", "moe.combine", "moe.combine.bwd", "moe.dispatch.bwd"})
      EXPECT_EQ(count[name], int(M) * 2) << name;  // 2 micro-batches · 2 MoE blocks
    const double dropped = counters.at(model::moe::moe_dropped_counter(0)) +
                           counters.at(model::moe::moe_dropped_counter(2));
    if (capacity == 0.0) {
      EXPECT_EQ(dropped, 0.0);
    }
    EXPECT_EQ(double(bytes["moe.dispatch"]), (2.0 * M * N * K - dropped) * C * 4);
    EXPECT_EQ(bytes["moe.combine.bwd"], bytes["moe.dispatch"]);
    EXPECT_EQ(bytes["moe.dispatch.bwd"], bytes["moe.combine"]);
    int64_t totals[2] = {bytes["moe.dispatch"], bytes["moe.combine"]};
    world().all_reduce(totals, 2, DType::I64, ReduceOp::Sum).wait();
    EXPECT_EQ(totals[0], totals[1]);
    int edp = 0, tp_gate = 0;
    for (const auto& sp : tr.spans) {
      edp += sp.step == 0 && tr.name_of(sp) == "edp.all_reduce";
      tp_gate += tr.name_of(sp) == "tp.moe_gate_all_reduce";
    }
    EXPECT_EQ(edp, 0);  // dp = ep: every edp group is one rank
    EXPECT_EQ(tp_gate, 0);
  }
}

// Router weights 0 (every token ties, so picks experts 0 and 1, both on ep rank 0): ep rank 1's
// experts receive no rows, yet it joins every all-to-all (with zero rows) and nothing hangs; the
// block's outputs and the dense gradients equal the whole model's on the same tokens, ep rank 0's
// experts' gradients are the sum of both ranks' whole-model expert gradients, ep rank 1's are 0.
TEST(MoeEp, ARankWhoseExpertsGetNoTokensJoinsEveryAllToAll) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const int r = world().rank();
  const GptConfig cfg = gpt_config(moe_tiny(Layers{2, 2, 1, 1}, false, 0.0, 0.01).model);
  GptShard sh;
  sh.ep_size = 2;
  sh.ep_rank = r;
  Gpt m = gpt_create(cfg, sh, 42);
  Gpt whole = gpt_create(cfg, GptShard{}, 42);
  for (Gpt* g : {&m, &whole}) {
    for (int l : {0, 2}) std::fill_n(g->moe[std::size_t(l)].router, 4 * 32, 0.0f);
  }
  const int B = 2, T = 16;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; ++i) {
    in[std::size_t(i)] = (7 * i + 13 * r) % 64;
    tg[std::size_t(i)] = (5 * i + 3 + r) % 64;
  }
  GptHooks hooks;
  int calls = 0;
  hooks.ep_all_to_all = [&](const char* name, int layer, const float* send, const int64_t* sc,
                            std::size_t groups, float* recv, int64_t* rc, std::size_t cap) {
    ++calls;
    world()
        .all_to_all_v(send, sc, groups, recv, rc, cap, DType::F32, OpLabel{name, 0, 0, layer})
        .wait();
  };
  auto acts = gpt_activations(m, B, T), wacts = gpt_activations(whole, B, T);
  auto scratch = gpt_grad_scratch(m, B, T), wscratch = gpt_grad_scratch(whole, B, T);
  gpt_zero_grad(m);
  gpt_zero_grad(whole);
  const float loss = gpt_forward(m, acts, in.data(), tg.data(), hooks);
  const float wloss = gpt_forward(whole, wacts, in.data(), tg.data());
  EXPECT_NEAR(loss, wloss, 1e-6);
  int64_t received = 0;
  for (int64_t c : acts.moe[0].recv_counts) received += c;
  EXPECT_EQ(received, r == 0 ? 2 * 2 * B * T : 0);  // both ranks' tokens, two choices each
  gpt_backward(m, acts, scratch, 1.0f, hooks);
  gpt_backward(whole, wacts, wscratch, 1.0f);
  EXPECT_EQ(calls, 2 * 4);  // 2 MoE blocks x dispatch, combine and their backward
  std::vector<float> wg(whole.grads.begin(), whole.grads.end());
  std::vector<float> wsum = wg;
  world().all_reduce(wsum.data(), wsum.size(), DType::F32, ReduceOp::Sum).wait();
  double worst = 0, ref = 0;
  for (const auto& t : m.tensors) {
    const ParamTensor& w = whole.tensor(t.name);
    const std::vector<float>& want = t.expert ? wsum : wg;
    for (std::size_t i = 0; i < t.count; ++i) {
      worst = std::max(worst, std::abs(double(m.grads[t.offset + i]) - want[w.offset + i]));
      ref = std::max(ref, std::abs(double(want[w.offset + i])));
      if (t.expert && r == 1) ASSERT_EQ(m.grads[t.offset + i], 0.0f) << t.name;
    }
  }
  EXPECT_LT(worst / ref, 1e-5);
}

}  // namespace
}  // namespace orrery::runtime
