// End to end on one process: the model learns the synthetic Markov chain (loss falls well below
// ln V, toward the chain's entropy rate), and a run is reproducible from its seed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "orrery/runtime/data.hpp"
#include "orrery/runtime/kernels.hpp"
#include "orrery/runtime/model.hpp"
#include "orrery/runtime/optimizer.hpp"

namespace orrery::runtime {
namespace {

struct Curve {
  std::vector<float> losses;
  double entropy_rate;
};

Curve train(int steps, float lr) {
  const GptConfig cfg{2, 32, 2, 32, 16};
  const int B = 8, T = 16;
  MarkovSource src(cfg.vocab, 3, 4096, 2, 4);
  DataLoader loader(src, T, B, 0, 1, 11);
  auto model = gpt_create(cfg, GptShard{}, 5);
  auto acts = gpt_activations(model, B, T);
  auto scratch = gpt_grad_scratch(model, B, T);
  AdamWConfig opt_cfg;
  opt_cfg.lr = lr;
  AdamW opt(0, model.num_params(), model.decay_ranges(), opt_cfg);
  Curve c{{}, src.entropy_rate()};
  Batch batch;
  for (int s = 0; s < steps; ++s) {
    loader.next_batch(batch);
    gpt_zero_grad(model);
    c.losses.push_back(gpt_forward(model, acts, batch.inputs.data(), batch.targets.data()));
    gpt_backward(model, acts, scratch);
    opt.step(model.params.data(), model.grads.data());
  }
  return c;
}

double mean_tail(const std::vector<float>& v, std::size_t n) {
  double s = 0.0;
  for (std::size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(n);
}

TEST(Training, LossFallsTowardTheEntropyFloor) {
  set_compute_threads(1);
  const auto c = train(150, 1e-2f);
  const double ln_v = std::log(32.0);
  const double last = mean_tail(c.losses, 10);
  std::printf("loss first %.4f, mean of last 10 %.4f, ln V %.4f, entropy floor %.4f\n", c.losses.front(), last,
              ln_v, c.entropy_rate);
  // Sparse successors (2..4 per token): the floor is far below ln V.
  EXPECT_LT(c.entropy_rate, 1.2);
  EXPECT_NEAR(c.losses.front(), ln_v, 0.15);
  EXPECT_LT(last, ln_v - 1.5) << "first " << c.losses.front() << " last " << last << " floor " << c.entropy_rate;
  EXPECT_LT(last, c.entropy_rate + 0.5) << "floor " << c.entropy_rate;
  EXPECT_GT(last, c.entropy_rate - 0.15) << "below the entropy floor: the data leak or the loss is wrong";
}

TEST(Training, RunsAreReproducible) {
  const auto a = train(5, 1e-3f), b = train(5, 1e-3f);
  EXPECT_EQ(a.losses, b.losses);
}

}  // namespace
}  // namespace orrery::runtime
