// The event engine's ordering and the max-min fair-sharing solver on textbook examples.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/sim/engine.hpp"
#include "orrery/sim/maxmin.hpp"

using namespace orrery::sim;

TEST(Engine, OrdersByTimeThenSequence) {
  Engine e;
  std::vector<int> order;
  e.schedule_at(20, [&] { order.push_back(3); });
  e.schedule_at(10, [&] { order.push_back(1); });
  e.schedule_at(10, [&] { order.push_back(2); });  // same time: after the first scheduled at 10
  e.schedule_at(5, [&] {
    order.push_back(0);
    e.schedule_at(10, [&] { order.push_back(22); });  // scheduled later, runs after both 10s
  });
  EXPECT_EQ(e.run(), 20);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 22, 3}));
  EXPECT_EQ(e.events_processed(), 5u);
}

TEST(Engine, RejectsThePast) {
  Engine e;
  e.schedule_at(10, [] {});
  e.run();
  EXPECT_THROW(e.schedule_at(5, [] {}), orrery::InternalError);
}

namespace {
// A model that fires at fixed times, recording the engine time.
class Ticker : public Model {
 public:
  explicit Ticker(std::vector<TimeNs> times) : times_(std::move(times)) {}
  TimeNs next_event(TimeNs) const override { return i_ < times_.size() ? times_[i_] : kNever; }
  void advance(TimeNs now) override {
    seen.push_back(now);
    ++i_;
  }
  std::vector<TimeNs> seen;

 private:
  std::vector<TimeNs> times_;
  size_t i_ = 0;
};
}  // namespace

TEST(Engine, ModelsAdvanceBeforeCallbacksAtEqualTimes) {
  Engine e;
  Ticker t({5, 10});
  e.add_model(&t);
  std::vector<TimeNs> cb;
  e.schedule_at(10, [&] {
    cb.push_back(e.now());
    EXPECT_EQ(t.seen.size(), 2u);
  });
  EXPECT_EQ(e.run(), 10);
  EXPECT_EQ(t.seen, (std::vector<TimeNs>{5, 10}));
  EXPECT_EQ(cb, (std::vector<TimeNs>{10}));
}

TEST(Engine, RunUntilStopsAndReportsPending) {
  Engine e;
  int fired = 0;
  e.schedule_at(10, [&] { ++fired; });
  e.schedule_at(30, [&] { ++fired; });
  EXPECT_TRUE(e.run_until(20));
  EXPECT_EQ(e.now(), 20);
  EXPECT_EQ(fired, 1);
  EXPECT_FALSE(e.run_until(100));
  EXPECT_EQ(fired, 2);
}

TEST(MaxMin, TwoFlowsOnOneLinkGetHalfEach) {
  const auto r = max_min_rates({10.0}, {{0}, {0}});
  EXPECT_DOUBLE_EQ(r[0], 5.0);
  EXPECT_DOUBLE_EQ(r[1], 5.0);
}

TEST(MaxMin, TextbookLinearNetwork) {
  // Bertsekas & Gallager's linear network: one long flow over links 0..2, one short flow per link,
  // all capacities 1: every flow gets 1/2.
  const auto r = max_min_rates({1, 1, 1}, {{0, 1, 2}, {0}, {1}, {2}});
  for (double x : r) EXPECT_DOUBLE_EQ(x, 0.5);
}

TEST(MaxMin, BottleneckFreesCapacityElsewhere) {
  // Link 0 (cap 10): flows a, b. Link 1 (cap 4): flows b, c. Link 1 saturates first at 2 each;
  // a then takes what b leaves on link 0: 8.
  const auto r = max_min_rates({10, 4}, {{0}, {0, 1}, {1}});
  EXPECT_DOUBLE_EQ(r[0], 8.0);
  EXPECT_DOUBLE_EQ(r[1], 2.0);
  EXPECT_DOUBLE_EQ(r[2], 2.0);
}

TEST(MaxMin, ThreeLevels) {
  // Link 0 cap 3 shared by f0,f1,f2; link 1 cap 1 by f1 only... f1 limited to 1, f0 and f2 split 2.
  // Link 2 cap 0.5 carries f2 alone: f2 = 0.5, so f0 = 3 - 1 - 0.5 = 1.5.
  const auto r = max_min_rates({3, 1, 0.5}, {{0}, {0, 1}, {0, 2}});
  EXPECT_DOUBLE_EQ(r[2], 0.5);
  EXPECT_DOUBLE_EQ(r[1], 1.0);
  EXPECT_DOUBLE_EQ(r[0], 1.5);
}

TEST(MaxMin, WeightsCountAsIdenticalFlows) {
  // A weight-3 entry is three unit flows: with one other flow on a link of 8 each unit gets 2.
  const auto r = max_min_rates({8}, {{0}, {0}}, {3.0, 1.0});
  EXPECT_DOUBLE_EQ(r[0], 2.0);
  EXPECT_DOUBLE_EQ(r[1], 2.0);
  // Same answer as four separate flows.
  const auto s = max_min_rates({8}, {{0}, {0}, {0}, {0}});
  EXPECT_DOUBLE_EQ(s[0], r[0]);
}

TEST(MaxMin, FlowWithoutLinksIsUnbounded) {
  const auto r = max_min_rates({1}, {{}, {0}});
  EXPECT_TRUE(std::isinf(r[0]));
  EXPECT_DOUBLE_EQ(r[1], 1.0);
}

TEST(MaxMin, SolverReusesScratchAcrossCalls) {
  MaxMinSolver s;
  std::vector<double> cap = {4, 6};
  std::vector<int32_t> a = {0}, b = {0, 1}, c = {1};
  std::vector<MaxMinFlow> flows = {{a.data(), 1, 1}, {b.data(), 2, 1}, {c.data(), 1, 1}};
  std::vector<double> r1, r2;
  s.solve(cap, flows, r1);
  s.solve(cap, flows, r2);
  EXPECT_EQ(r1, r2);
  EXPECT_DOUBLE_EQ(r1[0], 2.0);
  EXPECT_DOUBLE_EQ(r1[1], 2.0);
  EXPECT_DOUBLE_EQ(r1[2], 4.0);
}
