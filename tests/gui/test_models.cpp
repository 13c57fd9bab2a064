// The panels' item models, tested GUI-less under QAbstractItemModelTester, with values checked
// against the synthetic trace's closed forms; plus search and the sweep CSV.
#include <gtest/gtest.h>

#include <QAbstractItemModelTester>
#include <QString>
#include <cstdio>
#include <mutex>

#include "orrery/common/error.hpp"
#include "orrery/gui/document.hpp"
#include "orrery/gui/models.hpp"
#include "orrery/gui/span_search.hpp"
#include "orrery/gui/sweep_csv.hpp"
#include "orrery/traces/synth.hpp"

using namespace orrery::gui;
namespace traces = orrery::traces;

namespace {

// QAbstractItemModelTester reports through qWarning (category qt.modeltest) in Warning mode;
// count those so a broken model fails the test instead of aborting the binary.
std::mutex g_mu;
int g_model_failures = 0;
QtMessageHandler g_prev = nullptr;

void handler(QtMsgType type, const QMessageLogContext& ctx, const QString& msg) {
  if (ctx.category && QString(ctx.category).startsWith("qt.modeltest") && type >= QtWarningMsg) {
    std::lock_guard<std::mutex> lock(g_mu);
    ++g_model_failures;
    std::fprintf(stderr, "model tester: %s\n", msg.toLocal8Bit().constData());
    return;
  }
  if (g_prev) g_prev(type, ctx, msg);
}

class ModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_model_failures = 0;
    g_prev = qInstallMessageHandler(handler);
  }
  void TearDown() override {
    qInstallMessageHandler(g_prev);
    EXPECT_EQ(g_model_failures, 0) << "QAbstractItemModelTester reported problems";
  }
  static traces::SynthOptions opts() {
    traces::SynthOptions o;
    o.ranks = 4;
    o.steps = 3;
    o.layers = 4;
    return o;
  }
};

std::string fixed(double v, int d) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", d, v);
  return buf;
}

}  // namespace

TEST_F(ModelTest, SpanDetailsShowEveryAttributeAndBusbw) {
  traces::Trace t;
  t.meta.world_size = 4;
  traces::CommunicatorInfo c;
  c.id = 0;
  c.name = "world";
  c.ranks = {0, 1, 2, 3};
  t.comms.push_back(c);
  traces::Span s;
  s.rank = 2;
  s.stream = 1;
  s.kind = traces::SpanKind::Collective;
  s.op = traces::CollOp::AllReduce;
  s.name = t.strings.intern("all_reduce");
  s.start_ns = 5000;
  s.end_ns = 6000;
  s.bytes = 1 << 20;
  s.comm = 0;
  s.step = 3;
  s.seq = 9;
  t.spans.push_back(s);
  t.streams.push_back({2, 1, "comm"});

  SpanDetailsModel m;
  QAbstractItemModelTester tester(&m, QAbstractItemModelTester::FailureReportingMode::Warning);
  m.set_span(&t, 0, 1000);
  EXPECT_EQ(m.rowCount(), 21);
  EXPECT_EQ(m.value("Name"), "all_reduce");
  EXPECT_EQ(m.value("Kind"), "collective");
  EXPECT_EQ(m.value("Rank"), "2");
  EXPECT_EQ(m.value("Stream"), "1 (comm)");
  EXPECT_EQ(m.value("Step"), "3");
  EXPECT_EQ(m.value("Micro-batch"), "-");
  EXPECT_EQ(m.value("Sequence"), "9");
  EXPECT_EQ(m.value("Start (ns)"), "5000");
  // 1 MiB in 1 us = 1048.576 GB/s algbw; all-reduce over 4 ranks: x 2*3/4 = 1572.864 GB/s busbw.
  EXPECT_EQ(m.value("algbw"), "1048.58 GB/s");
  EXPECT_EQ(m.value("busbw"), "1572.86 GB/s");
  EXPECT_DOUBLE_EQ(span_busbw_gbps(t, t.spans[0]), 1048.576 * 1.5);
  // The tooltip's brief list leaves out what is unset.
  const auto brief = span_attributes(t, 0, 1000, true);
  ASSERT_EQ(brief.size(), 8u);  // name, rank, stream, start, duration, bytes, busbw, step
  EXPECT_EQ(brief[0].second, "all_reduce");
  m.set_span(&t, -1, 0);
  EXPECT_EQ(m.rowCount(), 0);
  m.set_span(&t, 5, 0);  // out of range: empty, no crash
  EXPECT_EQ(m.rowCount(), 0);
}

TEST_F(ModelTest, RangeMetricsAndCollectivesMatchTheClosedForms) {
  const auto o = opts();
  const auto tot = traces::synth_totals(o);
  auto doc = make_document(traces::synthesize(o));
  orrery::profiler::MetricsOptions mo;
  mo.window_start_ns = doc->index.start_ns();
  mo.window_end_ns = doc->index.end_ns();
  const auto m = orrery::profiler::compute_metrics(doc->trace, mo);

  RangeMetricsModel rm;
  QAbstractItemModelTester t1(&rm, QAbstractItemModelTester::FailureReportingMode::Warning);
  rm.set_metrics(m, mo.window_start_ns, mo.window_end_ns, doc->index.start_ns());
  EXPECT_EQ(rm.value("Ranks"), "4");
  EXPECT_EQ(rm.value("Overlap %").toStdString(),
            fixed(100.0 * tot.overlap_ns / tot.comm_ns, 1) + " %");
  EXPECT_EQ(rm.value("Comm/comp ratio").toStdString(),
            fixed(double(tot.comm_ns) / tot.compute_ns, 3));
  EXPECT_EQ(rm.value("Spans").toInt(), traces::synth_span_count(o));

  CollectiveModel cm;
  QAbstractItemModelTester t2(&cm, QAbstractItemModelTester::FailureReportingMode::Warning);
  cm.set_collectives(m.collectives);
  ASSERT_EQ(cm.rowCount(), 1);
  EXPECT_EQ(cm.index(0, CollectiveModel::kOp).data().toString(), "all_reduce");
  EXPECT_EQ(cm.index(0, CollectiveModel::kCalls).data(Qt::UserRole).toLongLong(),
            tot.allreduce_calls * o.steps * o.ranks);
  // busbw = algbw * 2(R-1)/R, algbw = grad_bytes_per_layer / comm_ns_per_layer.
  const double algbw = double(o.grad_bytes_per_layer) / double(o.comm_ns_per_layer);
  EXPECT_NEAR(cm.index(0, CollectiveModel::kBusbw).data(Qt::UserRole).toDouble(), algbw * 1.5,
              1e-6);
  rm.clear();
  EXPECT_EQ(rm.rowCount(), 0);
}

TEST_F(ModelTest, StepBreakdownMatchesTheClosedForms) {
  const auto o = opts();
  const auto tot = traces::synth_totals(o);
  auto doc = make_document(traces::synthesize(o));
  const auto m = orrery::profiler::compute_metrics(doc->trace);
  const auto per_step = step_breakdowns(m, doc->trace);
  ASSERT_EQ(per_step.size(), size_t(o.ranks * o.steps));
  for (const auto& b : per_step) {
    EXPECT_EQ(b.compute_ns, tot.compute_ns);
    EXPECT_EQ(b.exposed_comm_ns, tot.exposed_comm_ns);
    EXPECT_EQ(b.idle_ns, tot.idle_ns);
    EXPECT_EQ(b.bubble_ns, 0);
  }
  const auto means = mean_per_rank(per_step);
  ASSERT_EQ(means.size(), size_t(o.ranks));
  EXPECT_EQ(means[3].compute_ns, tot.compute_ns);
}

TEST_F(ModelTest, StepDiffsOfTwoRuns) {
  auto oa = opts();
  auto ob = opts();
  ob.backward_ns = 2'500'000;
  const auto ta = traces::synth_totals(oa), tb = traces::synth_totals(ob);
  const auto ma = orrery::profiler::compute_metrics(traces::synthesize(oa));
  const auto mb = orrery::profiler::compute_metrics(traces::synthesize(ob));
  StepDiffModel dm;
  QAbstractItemModelTester tester(&dm, QAbstractItemModelTester::FailureReportingMode::Warning);
  dm.set_diffs(diff_steps(ma, mb), "real", "sim");
  ASSERT_EQ(dm.rowCount(), oa.steps);
  for (int r = 0; r < dm.rowCount(); ++r) {
    EXPECT_EQ(dm.index(r, StepDiffModel::kA).data(Qt::UserRole).toLongLong(), ta.step_ns);
    EXPECT_EQ(dm.index(r, StepDiffModel::kB).data(Qt::UserRole).toLongLong(), tb.step_ns);
    EXPECT_EQ(dm.index(r, StepDiffModel::kDiff).data(Qt::UserRole).toLongLong(),
              tb.step_ns - ta.step_ns);
    EXPECT_EQ(dm.index(r, StepDiffModel::kBCompute).data(Qt::UserRole).toLongLong(), tb.compute_ns);
    EXPECT_NEAR(dm.index(r, StepDiffModel::kDiffPct).data(Qt::UserRole).toDouble(),
                100.0 * double(tb.step_ns - ta.step_ns) / double(ta.step_ns), 1e-9);
  }
  EXPECT_EQ(dm.headerData(StepDiffModel::kA, Qt::Horizontal).toString(), "real step");
  dm.set_diffs({}, "A", "B");
  EXPECT_EQ(dm.rowCount(), 0);
}

TEST_F(ModelTest, LaneTreeChecksFilterLanes) {
  auto o = opts();
  auto t = traces::synthesize(o);
  for (auto& r : t.ranks) {  // a 2 x 2 dp x tp grid
    r.dp = r.rank / 2;
    r.tp = r.rank % 2;
  }
  auto doc = make_document(std::move(t));
  LaneTreeModel m;
  QAbstractItemModelTester tester(&m, QAbstractItemModelTester::FailureReportingMode::Warning);
  m.set_trace(&doc->index, doc->trace.ranks, GroupBy::Rank);
  ASSERT_EQ(m.rowCount(), 4);
  const QModelIndex rank1 = m.index(1, 0);
  EXPECT_EQ(rank1.data().toString(), "rank 1");
  ASSERT_EQ(m.rowCount(rank1), 3);
  EXPECT_EQ(m.index(0, 0, rank1).data().toString(), "compute");
  EXPECT_EQ(rank1.data(Qt::CheckStateRole).toInt(), Qt::Checked);
  int changes = 0;
  QObject::connect(&m, &LaneTreeModel::visibilityChanged, [&] { ++changes; });
  EXPECT_TRUE(m.setData(rank1, Qt::Unchecked, Qt::CheckStateRole));
  EXPECT_EQ(changes, 1);
  EXPECT_EQ(m.hidden_lanes().size(), 3u);
  EXPECT_TRUE(m.hidden_lanes().count({1, 2}));
  EXPECT_TRUE(m.setData(m.index(2, 0, rank1), Qt::Checked, Qt::CheckStateRole));
  EXPECT_EQ(rank1.data(Qt::CheckStateRole).toInt(), Qt::PartiallyChecked);

  // Grouped by dp: groups are ranks sharing tp: {0, 2} and {1, 3}.
  m.set_trace(&doc->index, doc->trace.ranks, GroupBy::DP);
  ASSERT_EQ(m.rowCount(), 2);
  const QModelIndex g1 = m.index(1, 0);
  EXPECT_EQ(g1.data().toString(), "dp[tp=1,pp=0]");
  EXPECT_EQ(g1.data(Qt::CheckStateRole).toInt(),
            Qt::PartiallyChecked);  // rank 1 lanes still hidden
  EXPECT_TRUE(m.setData(g1, Qt::Checked, Qt::CheckStateRole));
  EXPECT_TRUE(m.hidden_lanes().empty());
  EXPECT_TRUE(m.setData(m.index(0, 0), Qt::Unchecked, Qt::CheckStateRole));
  EXPECT_EQ(m.hidden_lanes().size(), 6u);
  EXPECT_EQ(m.parent(m.index(0, 0, m.index(1, 0, g1))), m.index(1, 0, g1));
  m.set_trace(nullptr, {}, GroupBy::Rank);
  EXPECT_EQ(m.rowCount(), 0);
}

TEST(SpanSearch, FindsByNameInTimeOrderWithNextAndPrevious) {
  traces::SynthOptions o;
  o.ranks = 2;
  o.steps = 3;
  o.layers = 4;
  const auto t = traces::synthesize(o);
  SpanSearch s;
  s.run(t, "FORWARD");
  // L "layers.<i>.forward" compute spans plus one "forward" phase per rank and step.
  ASSERT_EQ(s.size(), size_t(o.ranks * o.steps * (o.layers + 1)));
  for (size_t i = 1; i < s.size(); ++i) {
    EXPECT_LE(t.spans[s.matches()[i - 1]].start_ns, t.spans[s.matches()[i]].start_ns);
  }
  EXPECT_EQ(s.current(), -1);
  EXPECT_EQ(s.next(), s.matches()[0]);
  EXPECT_EQ(s.next(), s.matches()[1]);
  EXPECT_EQ(s.previous(), s.matches()[0]);
  EXPECT_EQ(s.previous(), s.matches().back());  // wraps
  // The first match at or after a time: ranks start a step together, so take the first of equals.
  const int64_t mid = t.spans[s.matches()[5]].start_ns;
  const int64_t found = s.first_at_or_after(mid);
  EXPECT_EQ(t.spans[static_cast<size_t>(found)].start_ns, mid);
  EXPECT_LT(t.spans[s.matches()[static_cast<size_t>(s.current()) - 1]].start_ns, mid);
  s.run(t, "layers.3.forward", kAllKinds & ~kind_bit(traces::SpanKind::Compute));
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.next(), -1);
  s.run(t, "optimizer");
  EXPECT_EQ(s.size(), size_t(o.ranks * o.steps * 2));  // the optimizer span and its phase
}

// A GPU count the sweep could not place is reported with its note (which may hold commas), unless
// another layout places it.
TEST(SweepCsv, ReportsTheGpuCountsNotPlaced) {
  std::vector<SweepUnplaced> unplaced;
  const auto pts = parse_sweep_csv(
      "gpus,dp,tp,tokens_per_s,fits,note\n"
      "8,8,1,8000,true,\"\"\n"
      "16,16,1,,false,\"does not fit: 90 GiB > 80 GiB, even with zero 3\"\n"
      "32,32,1,,false,\"tp 1 too small\"\n"
      "32,8,4,30000,true,\"\"\n"  // 32 GPUs placed by another layout
      "64,64,1,,false,\n",
      "sweep.csv", &unplaced);
  ASSERT_EQ(pts.size(), 2u);
  ASSERT_EQ(unplaced.size(), 2u);
  EXPECT_EQ(unplaced[0].gpus, 16);
  EXPECT_EQ(unplaced[0].note, "does not fit: 90 GiB > 80 GiB, even with zero 3");
  EXPECT_EQ(unplaced[1].gpus, 64);
  EXPECT_EQ(unplaced[1].note, "");
}

TEST(SweepCsv, ParsesAndComputesEfficiency) {
  const auto pts = parse_sweep_csv(
      "scenario,gpus,tokens_per_s,step_ms\n"
      "a,8,8000,10\n"
      "a,16,15000,11\n"
      "b,16,14000,12\n"  // a slower layout at 16 GPUs: the faster one is kept
      "a,32,28000,12\n",
      "sweep.csv");
  ASSERT_EQ(pts.size(), 3u);
  EXPECT_EQ(pts[1].gpus, 16);
  EXPECT_DOUBLE_EQ(pts[1].tokens_per_s, 15000);
  EXPECT_DOUBLE_EQ(pts[0].efficiency, 1.0);
  EXPECT_DOUBLE_EQ(pts[1].efficiency, (15000.0 / 16) / (8000.0 / 8));
  EXPECT_DOUBLE_EQ(pts[2].efficiency, 0.875);
  const auto given = parse_sweep_csv("gpus,efficiency,tokens_per_s\n4,0.9,100\n", "x.csv");
  EXPECT_DOUBLE_EQ(given[0].efficiency, 0.9);
}

TEST(SweepCsv, ReadsWhatOrrerySweepWrites) {
  const auto pts = parse_sweep_csv(
      "gpus,dp,tp,pp,zero,micro_batch,step_time_s,tokens_per_s,tflops_per_gpu,mfu,efficiency,peak_"
      "memory_bytes,fits,"
      "note\n"
      "8,8,1,1,0,4,0.5,65536,300,0.3,1,1e10,true,\"\"\n"
      "16,,,,,,,,,,,,,\"no layout fits, sorry\"\n"
      "64,16,4,1,1,4,0.55,476626,280,0.28,0.909,1e10,true,\"\"\n",
      "sweep.csv");
  ASSERT_EQ(pts.size(), 2u);
  EXPECT_EQ(pts[1].gpus, 64);
  EXPECT_DOUBLE_EQ(pts[1].tokens_per_s, 476626);
  EXPECT_DOUBLE_EQ(pts[1].efficiency, 0.909);
}

TEST(SweepCsv, BadInputNamesTheFileAndLine) {
  try {
    parse_sweep_csv("gpus,tps\n1,2\n", "bad.csv");
    FAIL() << "expected InputError";
  } catch (const orrery::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.csv: line 1"), std::string::npos) << e.what();
  }
  try {
    parse_sweep_csv("gpus,tokens_per_s\n8,fast\n", "bad.csv");
    FAIL() << "expected InputError";
  } catch (const orrery::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'fast'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_sweep_csv("/nonexistent/sweep.csv"), orrery::InputError);
  EXPECT_THROW(parse_sweep_csv("gpus,tokens_per_s\n", "empty.csv"), orrery::InputError);
}

// The trace box's names: as few trailing components as tell the files apart.
TEST(DistinctNames, AsFewTrailingComponentsAsTellThePathsApart) {
  using V = std::vector<std::string>;
  EXPECT_EQ(distinct_names(V{"/data/a.db", "/data/b.db"}), (V{"a.db", "b.db"}));
  EXPECT_EQ(distinct_names(V{"/x/run1/trace.db", "/x/run2/trace.db", "/x/run2/other.db"}),
            (V{"run1/trace.db", "run2/trace.db", "other.db"}));
  EXPECT_EQ(distinct_names(V{"/r/a/same/t.db", "/r/b/same/t.db"}),
            (V{"a/same/t.db", "b/same/t.db"}));
  // A path that needs every component is shown whole.
  EXPECT_EQ(distinct_names(V{"/x/t.db", "/y/x/t.db"}), (V{"/x/t.db", "/y/x/t.db"}));
  EXPECT_EQ(distinct_names(V{"t.db"}), (V{"t.db"}));
  EXPECT_EQ(distinct_names(V{"/only/one.db"}), (V{"one.db"}));
  EXPECT_EQ(distinct_names(V{}), V{});
}
