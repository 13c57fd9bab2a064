// Single-process parts of the parallel strategies: pipeline schedule orders against the textbook
// sequences, the ZeRO partition and padded storage, and tensor-parallel slices of the full model
// (a tp shard created from the same seed holds exactly the slices tp_slice_of_full cuts).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/runtime/model.hpp"
#include "orrery/runtime/pipeline.hpp"
#include "orrery/runtime/tensor_parallel.hpp"
#include "orrery/runtime/zero.hpp"

namespace orrery::runtime {
namespace {

// "F0 F1 B0 ..." for an order, to compare with the papers' figures.
std::string text(const std::vector<int>& order) {
  std::string s;
  for (int p : order) {
    if (!s.empty()) s += ' ';
    s += p >= 0 ? "F" + std::to_string(p) : "B" + std::to_string(-p - 1);
  }
  return s;
}

TEST(PipelineOrder, GpipeIsAllForwardsThenAllBackwards) {
  EXPECT_EQ(text(pipeline_order(Schedule::GPipe, 4, 2, 4)), "F0 F1 F2 F3 B0 B1 B2 B3");
}

TEST(PipelineOrder, OneFOneBMatchesPipeDreamFlush) {
  // Narayanan et al. 2021, figure 4 (top): p = 4, m = 8.
  EXPECT_EQ(text(pipeline_order(Schedule::OneFOneB, 4, 0, 8)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(text(pipeline_order(Schedule::OneFOneB, 4, 1, 8)),
            "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(text(pipeline_order(Schedule::OneFOneB, 4, 2, 8)),
            "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(text(pipeline_order(Schedule::OneFOneB, 4, 3, 8)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // Fewer micro-batches than stages: the warm-up is cut at m.
  EXPECT_EQ(text(pipeline_order(Schedule::OneFOneB, 4, 0, 2)), "F0 F1 B0 B1");
  EXPECT_THROW(pipeline_order(Schedule::Interleaved, 4, 0, 8), InputError);
}

TEST(PipelineOrder, InFlightBoundsHold) {
  for (const Schedule sched : {Schedule::GPipe, Schedule::OneFOneB}) {
    for (int p : {2, 4}) {
      for (int m : {1, 3, 8}) {
        for (int s = 0; s < p; ++s) {
          int live = 0, peak = 0;
          std::set<int> fwd, bwd;
          for (int x : pipeline_order(sched, p, s, m)) {
            if (x >= 0) {
              fwd.insert(x);
              peak = std::max(peak, ++live);
            } else {
              EXPECT_TRUE(fwd.count(-x - 1)) << "backward before forward";
              bwd.insert(-x - 1);
              --live;
            }
          }
          EXPECT_EQ(static_cast<int>(fwd.size()), m);
          EXPECT_EQ(static_cast<int>(bwd.size()), m);
          EXPECT_EQ(peak, pipeline_in_flight(sched, p, s, m))
              << schedule_name(sched) << " p" << p << " s" << s << " m" << m;
        }
      }
    }
  }
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(4, 8), 3.0 / 11.0);
}

TEST(Zero, PartitionCoversTheArrayOnce) {
  const size_t n = 1003;
  for (int ranks : {1, 2, 3, 4}) {
    size_t covered = 0;
    for (int r = 0; r < ranks; ++r) {
      const ZeroPartition p = zero_partition(n, r, ranks);
      EXPECT_EQ(p.begin(), covered);
      covered += p.count();
      EXPECT_LT(p.padded() - n, static_cast<size_t>(ranks));  // padding below N elements
    }
    EXPECT_EQ(covered, n);
  }
}

TEST(Zero, PaddedStorageKeepsValuesAndPointers) {
  GptConfig cfg{2, 16, 2, 32, 8};
  Gpt m = gpt_create(cfg, GptShard{}, 7);
  const std::vector<float> before(m.params.begin(), m.params.end());
  const size_t off = m.tensor("h.1.fcw").offset;
  gpt_pad_storage(m, m.num_params() + 3);
  EXPECT_EQ(m.params.size(), before.size() + 3);
  EXPECT_EQ(std::vector<float>(m.params.begin(),
                               m.params.begin() + static_cast<std::ptrdiff_t>(before.size())),
            before);
  EXPECT_EQ(m.blocks[1].fcw, m.params.data() + off);
  EXPECT_EQ(m.dblocks[1].fcw, m.grads.data() + off);
  EXPECT_EQ(m.embed.wte, m.params.data() + m.tensor("wte").offset);
  EXPECT_EQ(m.head.lnfw, m.params.data() + m.tensor("lnfw").offset);
}

// ZeRO 3's segment table bound to a pointer set other than the layout model's own (what the device
// storage does with GpuGpt's pointers): every tensor's pointer lands at its offset within its
// segment's buffer, the layout model's pointers are untouched, null fields stay null.
TEST(Zero, Zero3SegmentsBindAnotherPointerSet) {
  const GptConfig cfg{2, 16, 2, 32, 8};
  for (int stage :
       {-1, 1}) {  // the whole model; the last of two pipeline stages (wte copy, no wpe)
    const GptShard shard = stage < 0 ? GptShard{} : GptShard::pipeline_stage(cfg, stage, 2);
    const Gpt m = gpt_create(cfg, shard, 7);
    EmbedParams e{}, de{};
    std::vector<BlockParams> b(m.blocks.size()), db(m.dblocks.size());
    HeadParams h{}, dh{};
    std::vector<Zero3Segment> segs = zero3_segments(m, 1, 3, GptPointers{e, de, b, db, h, dh});
    // The segments tile the flat array in order; the shards are consecutive.
    std::size_t covered = 0, shards = 0;
    for (const auto& sg : segs) {
      EXPECT_EQ(sg.range.offset, covered);
      EXPECT_EQ(sg.shard_offset, shards);
      EXPECT_EQ(sg.part.shard, (sg.range.count + 2) / 3);
      covered += sg.range.count;
      shards += sg.part.shard;
    }
    EXPECT_EQ(covered, m.num_params());
    std::vector<float> P(1 << 16), G(1 << 16);
    for (auto& sg : segs) {
      sg.bind(P.data(), G.data());
      for (const ParamTensor& t : m.tensors) {
        if (t.offset < sg.range.offset || t.offset >= sg.range.end()) continue;
        const float* want_p = P.data() + (t.offset - sg.range.offset);
        const float* want_g = G.data() + (t.offset - sg.range.offset);
        const float* got_p = nullptr;
        const float* got_g = nullptr;
        if (t.name == "wte") got_p = e.wte, got_g = de.wte;
        if (t.name == "wpe") got_p = e.wpe, got_g = de.wpe;
        if (t.name == "lnfb") got_p = h.lnfb, got_g = dh.lnfb;
        if (t.name == "h.1.fcw")
          got_p = b.at(static_cast<std::size_t>(1 - m.shard.layer_begin)).fcw,
          got_g = db.at(static_cast<std::size_t>(1 - m.shard.layer_begin)).fcw;
        if (got_p == nullptr) continue;
        EXPECT_EQ(got_p, want_p) << t.name << " stage " << stage;
        EXPECT_EQ(got_g, want_g) << t.name << " stage " << stage;
      }
    }
    EXPECT_EQ(m.embed.wte, m.params.data() + m.tensor("wte").offset)
        << "the layout model was rebound";
    if (stage == 1) {
      EXPECT_EQ(e.wpe, nullptr);  // a head-only stage holds no wpe
      EXPECT_NE(h.lnfw, nullptr);
      EXPECT_EQ(zero3_slot(1, cfg.n_layer, m.shard.layer_begin), 0);
    } else {
      EXPECT_NE(e.wpe, nullptr);
      EXPECT_EQ(zero3_slot(1, cfg.n_layer, 0), 1);
    }
    EXPECT_EQ(zero3_slot(kEmbedSegment, cfg.n_layer, m.shard.layer_begin), 2);
    EXPECT_EQ(zero3_slot(cfg.n_layer, cfg.n_layer, m.shard.layer_begin), 3);
  }
}

TEST(TensorParallel, ShardHoldsTheSlicesOfTheFullModel) {
  GptConfig cfg{2, 16, 4, 32, 8};
  Gpt full = gpt_create(cfg, GptShard{}, 11);
  // Biases are zero at initialisation: give every tensor distinct values so slicing is checked.
  for (size_t i = 0; i < full.params.size(); ++i) full.params[i] = static_cast<float>(i);
  for (int tp : {2, 4}) {
    for (int r = 0; r < tp; ++r) {
      GptShard sh;
      sh.tp_rank = r;
      sh.tp_size = tp;
      Gpt part = gpt_create(cfg, sh, 11);
      Gpt ref = gpt_create(cfg, GptShard{}, 11);
      for (const auto& t : part.tensors) {
        // Against the freshly initialised full model: the shard's own initial values.
        const std::vector<float> want = tp_slice_of_full(ref, t, r, tp);
        const std::vector<float> got(
            part.params.begin() + static_cast<std::ptrdiff_t>(t.offset),
            part.params.begin() + static_cast<std::ptrdiff_t>(t.offset + t.count));
        if (t.name.find("qkvb") == std::string::npos) {
          EXPECT_EQ(got, want) << t.name << " tp" << tp << " r" << r;
        }
        // Index-valued full model: every slice is a set of distinct indices, disjoint over ranks.
        const std::vector<float> idx = tp_slice_of_full(full, t, r, tp);
        EXPECT_EQ(idx.size(), t.count);
      }
    }
    // The slices of the split tensors partition the full tensor.
    for (const char* name :
         {"h.0.qkvw", "h.0.qkvb", "h.0.projw", "h.1.fcw", "h.1.fcb", "h.1.fcprojw"}) {
      std::set<float> seen;
      for (int r = 0; r < tp; ++r) {
        GptShard sh;
        sh.tp_rank = r;
        sh.tp_size = tp;
        Gpt part = gpt_create(cfg, sh, 11);
        for (float v : tp_slice_of_full(full, part.tensor(name), r, tp))
          EXPECT_TRUE(seen.insert(v).second) << name;
      }
      EXPECT_EQ(seen.size(), full.tensor(name).count) << name;
    }
  }
}

}  // namespace
}  // namespace orrery::runtime
