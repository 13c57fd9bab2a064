// The Experts tab, offscreen: the figures it shows for a hand-built MoE trace (moe_trace.hpp) in
// closed form, the step picker, the per-step chart, and the app's --tab experts screenshot.
#include <gtest/gtest.h>

#include <QFile>
#include <QFileInfo>
#include <QImage>
#include <QProcess>
#include <QTest>

#include "moe_trace.hpp"
#include "orrery/gui/palette.hpp"
#include "orrery/gui/widgets/experts_view.hpp"
#include "orrery/traces/store.hpp"

using namespace orrery::gui;

TEST(GuiExperts, ShowsTheLoadOfEveryBlockAndStep) {
  ExpertsView v;
  v.resize(1000, 700);
  v.show();
  ASSERT_TRUE(QTest::qWaitForWindowExposed(&v));
  EXPECT_EQ(v.summary(), "open a trace");
  auto doc = make_document(test::moe_trace(), "moe.db");
  v.set_document(doc.get());
  ASSERT_EQ(v.load().blocks(), 2);
  // Steps are named by the trace's step numbers (5 and 6), not by the samples' order.
  EXPECT_EQ(v.step_number(0), 5);
  EXPECT_EQ(v.step_number(1), 6);
  EXPECT_TRUE(v.summary().contains("2 MoE blocks x 4 experts on 2 ranks"))
      << v.summary().toStdString();
  EXPECT_TRUE(v.summary().contains("worst step: max/mean 4.00 (block 3, step 5)"))
      << v.summary().toStdString();
  // All steps: block 1 at 362 / 302, 12 of 1,208 dropped; block 3 at 4, 28 of 160 dropped.
  EXPECT_EQ(v.row_notes(), (QStringList{QString::fromUtf8("max/mean 1.20 · dropped 1.0 %"),
                                        QString::fromUtf8("max/mean 4.00 · dropped 17.5 %")}));
  EXPECT_EQ(v.cell_color(1, 0), palette::kLoadOver);
  EXPECT_EQ(v.cell_color(1, 2), palette::kLoadUnder);
  EXPECT_EQ(v.cell_color(0, 3), palette::load_color(362.0 / 302.0));
  EXPECT_TRUE(v.cell_tooltip(1, 0).contains("block 3, expert 0, all steps: 160 tokens"))
      << v.cell_tooltip(1, 0).toStdString();
  // Step 6 alone: 281 / 251, 11 of 1,004 dropped.
  v.set_step(1);
  EXPECT_EQ(v.step(), 1);
  EXPECT_EQ(v.row_notes().value(0), QString::fromUtf8("max/mean 1.12 · dropped 1.1 %"));
  EXPECT_EQ(v.cell_color(0, 0), palette::load_color(221.0 / 251.0));
  EXPECT_TRUE(v.cell_tooltip(0, 3).contains("step 6: 281 tokens"))
      << v.cell_tooltip(0, 3).toStdString();
  EXPECT_EQ(v.chart_series(), 2);  // a line per block
  const QImage img = v.grab().toImage();
  ASSERT_TRUE(img.save(QString(ORRERY_GUI_TEST_DIR) + "/gui_experts.png"));
  // Past eight blocks: the worst block's line and the mean over blocks.
  auto many = make_document(test::moe_trace(10), "moe10.db");
  v.set_document(many.get());
  EXPECT_EQ(v.load().blocks(), 10);
  EXPECT_EQ(v.step(), orrery::gui::ExpertLoad::kAllSteps);
  EXPECT_EQ(v.chart_series(), 2);
  EXPECT_EQ(v.row_notes().size(), 10);
  // A trace without MoE counters says so.
  orrery::traces::Trace plain;
  plain.counters.push_back({0, plain.strings.intern("mem.activations"), 0, 1.0});
  auto none = make_document(std::move(plain), "dense.db");
  v.set_document(none.get());
  EXPECT_TRUE(v.load().empty());
  EXPECT_TRUE(v.summary().contains("no moe.tokens counters")) << v.summary().toStdString();
  EXPECT_EQ(v.chart_series(), 0);
}

TEST(GuiExperts, ScreenshotOfTheExpertsTab) {
  const QString dir = ORRERY_GUI_TEST_DIR;
  const QString trace = dir + "/gui_experts_moe.db", png = dir + "/gui_experts_tab.png";
  QFile::remove(trace);
  QFile::remove(png);
  orrery::traces::write_trace(test::moe_trace(), trace.toStdString());
  QProcess p;
  p.start(ORRERY_GUI_BIN, {"--screenshot", png, "--size", "1200x800", "--tab", "experts", trace});
  ASSERT_TRUE(p.waitForFinished(60000));
  EXPECT_EQ(p.exitCode(), 0) << QString::fromLocal8Bit(p.readAllStandardError()).toStdString();
  const QImage img(png);
  ASSERT_FALSE(img.isNull());
  EXPECT_EQ(img.size(), QSize(1200, 800));
}
