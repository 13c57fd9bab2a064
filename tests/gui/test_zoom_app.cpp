// The timeline on a trace opened through its zoom levels, offscreen: zoomed out it draws the
// levels (no spans loaded) with the same folded blocks' totals, zoomed in it loads the window's
// spans and draws them; a corrupt zoom chunk is shown as an error naming it, never drawn; the
// main window's status, charts and range metrics on such a trace.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <QElapsedTimer>
#include <QImage>
#include <QLabel>
#include <QLineEdit>
#include <QStatusBar>
#include <QTest>
#include <filesystem>

#include "orrery/gui/critical_path.hpp"
#include "orrery/gui/document.hpp"
#include "orrery/gui/file_search.hpp"
#include "orrery/gui/span_search.hpp"
#include "orrery/gui/widgets/main_window.hpp"
#include "orrery/gui/widgets/timeline_view.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/synth.hpp"

namespace orrery::gui {
namespace {

class ZoomTimeline : public ::testing::Test {
 protected:
  void SetUp() override {
    traces::SynthOptions o;
    o.ranks = 2;
    o.steps = 6;
    o.layers = 4;
    path_ = (std::filesystem::temp_directory_path() /
             ("orrery_gui_zoomapp_" + std::to_string(::getpid()) + ".db"))
                .string();
    std::filesystem::remove(path_);
    traces::write_trace(traces::synthesize(o), path_);
  }
  void TearDown() override { std::filesystem::remove(path_); }

  static QImage render(TimelineView& v) {
    QImage img(v.viewport()->size(), QImage::Format_ARGB32_Premultiplied);
    img.fill(0);
    v.viewport()->render(&img);
    return img;
  }
  std::string path_;
};

TEST_F(ZoomTimeline, ZoomedOutDrawsTheLevelsZoomedInTheSpans) {
  auto doc = load_document(path_, LoadOptions{0});
  ASSERT_TRUE(doc->zoomed());
  TimelineView v;
  v.resize(1200, 700);
  v.set_window_spans(50);  // zoomed out the view holds more: it draws the levels
  v.set_document(doc);
  v.fit_all();
  render(v);
  EXPECT_TRUE(v.zoom_error().isEmpty()) << v.zoom_error().toStdString();
  EXPECT_FALSE(v.window_loaded());
  EXPECT_GT(v.last_frame_items(), 0u);
  // Zoomed into a twentieth of the trace: about a twentieth of the spans, under 50 here.
  const int64_t t0 = doc->index.start_ns(), t1 = doc->index.end_ns();
  const int64_t len =
      std::max<int64_t>(1, (t1 - t0) * 40 / static_cast<int64_t>(doc->zoom->span_count()));
  const int64_t mid = t0 + (t1 - t0) / 2;
  v.zoom_to(mid - len / 2, mid + len / 2);
  render(v);
  ASSERT_TRUE(v.window_loaded());
  EXPECT_GT(v.last_frame_items(), 0u);
  const auto& w = v.shown().trace.spans;
  EXPECT_FALSE(w.empty());
  for (const auto& s : w) {  // every span of the window overlaps its three views
    EXPECT_LT(s.start_ns, v.visible_end_ns() + (v.visible_end_ns() - v.visible_start_ns()) + 2);
  }
  // Back out: the levels again.
  v.fit_all();
  render(v);
  EXPECT_FALSE(v.window_loaded());
}

TEST_F(ZoomTimeline, CorruptChunkIsShownAsAnError) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  // Every chunk's checksum off by one: whatever level the view picks is damaged.
  ASSERT_EQ(sqlite3_exec(db, "UPDATE zoom_chunks SET crc32c = (crc32c + 1) % 4294967296", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto doc = load_document(path_, LoadOptions{0});
  TimelineView v;
  v.resize(1200, 700);
  v.set_window_spans(0);
  v.set_document(doc);
  v.fit_all();
  render(v);
  const std::string e = v.zoom_error().toStdString();
  EXPECT_NE(e.find("corrupt zoom levels"), std::string::npos) << e;
  EXPECT_NE(e.find("checksum mismatch"), std::string::npos) << e;
  EXPECT_EQ(v.last_frame_items(), 0u);
}

// The main window on a trace opened through its zoom levels: the status bar counts every span,
// the charts' metrics (streamed from the file) and a range's metrics (its spans read) are
// compute_metrics' on the loaded trace.
TEST_F(ZoomTimeline, MainWindowOpensAZoomedTraceWithItsMetrics) {
  MainWindow win;
  win.set_load_options(LoadOptions{0});
  win.resize(1400, 900);
  win.show();
  int metrics = 0;
  auto c = QObject::connect(&win, &MainWindow::metricsReady, [&] { ++metrics; });
  win.open_files({QString::fromStdString(path_)});
  QElapsedTimer t;
  t.start();
  while (!(win.document_count() == 1 && metrics > 0) && t.elapsed() < 20000) QTest::qWait(5);
  QObject::disconnect(c);
  ASSERT_EQ(win.document_count(), 1);
  const auto doc = win.current_document();
  ASSERT_TRUE(doc->zoomed());
  const traces::Trace full = traces::load_trace(path_);
  bool counted = false;
  for (auto* l : win.statusBar()->findChildren<QLabel*>())
    counted = counted || l->text().contains(QString("%1 spans").arg(full.spans.size()));
  EXPECT_TRUE(counted);
  // A range over the middle third: its metrics from the range's spans.
  const int64_t lo = doc->index.start_ns(), hi = doc->index.end_ns();
  const int64_t t0 = lo + (hi - lo) / 3, t1 = hi - (hi - lo) / 3;
  int ready = 0;
  c = QObject::connect(&win, &MainWindow::rangeMetricsReady, [&] { ++ready; });
  win.timeline()->set_range(t0, t1);
  t.restart();
  while (ready == 0 && t.elapsed() < 20000) QTest::qWait(5);
  QObject::disconnect(c);
  ASSERT_GT(ready, 0);
  profiler::MetricsOptions mo;
  mo.window_start_ns = t0;
  mo.window_end_ns = t1;
  const auto m = profiler::compute_metrics(full, mo);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", m.total.comm_comp_ratio());
  EXPECT_EQ(win.range_model()->value("Comm/comp ratio").toStdString(), buf);
  std::snprintf(buf, sizeof buf, "%.1f %%", m.total.overlap_pct());
  EXPECT_EQ(win.range_model()->value("Overlap %").toStdString(), buf);
}

// Search on a zoomed trace covers the file, not the spans in memory (none while zoomed out): the
// count and total time of every match equal SpanSearch's over the fully loaded trace, and next /
// previous zoom the timeline to each hit in time order and select it among the loaded spans.
TEST_F(ZoomTimeline, SearchCoversTheWholeFile) {
  MainWindow win;
  win.set_load_options(LoadOptions{0});
  win.timeline()->set_window_spans(50);  // as a huge trace: fitted, the view holds too many
  win.resize(1400, 900);
  win.show();
  win.open_files({QString::fromStdString(path_)});
  QElapsedTimer t;
  t.start();
  while (win.document_count() != 1 && t.elapsed() < 20000) QTest::qWait(5);
  ASSERT_EQ(win.document_count(), 1);
  ASSERT_TRUE(win.current_document()->zoomed());
  ASSERT_FALSE(win.timeline()->window_loaded());  // zoomed out: no spans in memory
  const traces::Trace full = traces::load_trace(path_);
  SpanSearch want;
  want.run(full, "Layers.2.FORWARD");
  ASSERT_GT(want.size(), 2u);
  int64_t want_ns = 0;
  for (uint32_t m : want.matches()) want_ns += full.spans[m].duration_ns();

  int finished = 0;
  auto c = QObject::connect(&win, &MainWindow::searchFinished, [&] { ++finished; });
  win.search("Layers.2.FORWARD");
  EXPECT_TRUE(win.file_search_running());
  t.restart();
  while (finished == 0 && t.elapsed() < 20000) QTest::qWait(5);
  QObject::disconnect(c);
  ASSERT_EQ(finished, 1);
  const FileSearchResult& r = win.file_search();
  EXPECT_FALSE(r.cancelled);
  EXPECT_EQ(r.count, static_cast<int64_t>(want.size()));
  EXPECT_EQ(r.total_ns, want_ns);
  ASSERT_EQ(r.hits.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(is_hit(full.spans[want.matches()[i]], r.hits[i]));
  EXPECT_TRUE(win.search_status().contains(QString("%1 matches").arg(want.size())))
      << win.search_status().toStdString();

  // Next: the first hit, zoomed to and selected among the spans the timeline loaded.
  win.search_next();
  EXPECT_EQ(win.file_search_cursor(), 0);
  ASSERT_TRUE(win.timeline()->window_loaded());
  const int64_t sel = win.timeline()->selected_span();
  ASSERT_GE(sel, 0);
  EXPECT_TRUE(is_hit(win.timeline()->shown().trace.spans[static_cast<size_t>(sel)], r.hits[0]));
  EXPECT_TRUE(win.search_status().startsWith("1 / ")) << win.search_status().toStdString();
  // Previous from the first wraps to the last.
  win.search_previous();
  EXPECT_EQ(win.file_search_cursor(), static_cast<int64_t>(r.hits.size()) - 1);
  const int64_t last = win.timeline()->selected_span();
  ASSERT_GE(last, 0);
  EXPECT_TRUE(
      is_hit(win.timeline()->shown().trace.spans[static_cast<size_t>(last)], r.hits.back()));
  // Fit all shows the whole trace again, not the window of spans loaded for the last hit.
  win.timeline()->fit_all();
  EXPECT_LE(win.timeline()->visible_start_ns(), win.current_document()->index.start_ns());
  EXPECT_GE(win.timeline()->visible_end_ns(), win.current_document()->index.end_ns());

  // A query with no match says so.
  finished = 0;
  c = QObject::connect(&win, &MainWindow::searchFinished, [&] { ++finished; });
  win.search("no such span name");
  t.restart();
  while (finished == 0 && t.elapsed() < 20000) QTest::qWait(5);
  QObject::disconnect(c);
  EXPECT_EQ(win.file_search().count, 0);
  EXPECT_EQ(win.search_status(), "no match");
}

// On a zoomed trace the selected span's details and a step's critical path come from the spans the
// timeline loads (none are in memory zoomed out): the path equals the fully loaded trace's.
TEST_F(ZoomTimeline, DetailsAndCriticalPathOfAZoomedTrace) {
  MainWindow win;
  win.set_load_options(LoadOptions{0});
  win.timeline()->set_window_spans(50);
  win.resize(1400, 900);
  win.show();
  win.open_files({QString::fromStdString(path_)});
  QElapsedTimer t;
  t.start();
  while (win.document_count() != 1 && t.elapsed() < 20000) QTest::qWait(5);
  ASSERT_EQ(win.document_count(), 1);
  const auto doc = win.current_document();
  ASSERT_TRUE(doc->zoomed());
  const traces::Trace full = traces::load_trace(path_);
  ASSERT_GE(doc->steps.size(), 3u);
  const StepWindow step = doc->steps[2];
  const CriticalPath want = critical_path(full, step.step);
  ASSERT_FALSE(want.empty());
  // Zoomed out, centred on step 2: P zooms to the step, loads it, and draws its path.
  win.timeline()->zoom_to(step.start_ns - (step.end_ns - step.start_ns) * 20,
                          step.end_ns + (step.end_ns - step.start_ns) * 20);
  win.timeline()->ensure_window();
  ASSERT_FALSE(win.timeline()->window_loaded());
  win.timeline()->set_window_spans(100000);  // the step itself fits a window
  ASSERT_TRUE(win.toggle_critical_path());
  const CriticalPath& got = win.timeline()->critical_path_shown();
  EXPECT_EQ(got.step, step.step);
  EXPECT_EQ(got.links.size(), want.links.size());
  EXPECT_EQ(got.length_ns(), want.length_ns());
  EXPECT_EQ(got.wait_ns, want.wait_ns);
  EXPECT_EQ(win.critical_path_model()->rowCount(), static_cast<int>(want.links.size()));
  // Selecting a span of the window fills the details with its name.
  const auto& shown = win.timeline()->shown().trace;
  const int64_t last = static_cast<int64_t>(got.links.back().span);
  win.timeline()->select_span(last);
  EXPECT_EQ(win.details_model()->span(), last);
  EXPECT_EQ(win.details_model()->value("Name").toStdString(),
            shown.strings.str(shown.spans[static_cast<size_t>(last)].name));
  // Zoomed far away, the window changes: the path on the old one's spans goes.
  win.timeline()->zoom_to(doc->index.end_ns() - 1000, doc->index.end_ns());
  win.timeline()->ensure_window();
  EXPECT_TRUE(win.timeline()->critical_path_shown().empty());
  EXPECT_EQ(win.critical_path_model()->rowCount(), 0);
}

TEST(FileSearch, KeepsTheFirstHitsInTimeOrderAndCountsAll) {
  traces::SynthOptions o;
  o.ranks = 4;
  o.steps = 3;
  o.layers = 2;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("orrery_gui_filesearch_" + std::to_string(::getpid()) + ".db"))
                               .string();
  std::filesystem::remove(path);
  traces::write_trace(traces::synthesize(o), path);
  const traces::TraceReader reader(path);
  const traces::Trace full = reader.load_all();
  SpanSearch want;
  want.run(full, "backward", kind_bit(traces::SpanKind::Compute));
  ASSERT_GT(want.size(), 5u);
  const FileSearchResult r =
      search_file(reader, full.strings, "backward", kind_bit(traces::SpanKind::Compute), 5);
  EXPECT_EQ(r.count, static_cast<int64_t>(want.size()));
  ASSERT_EQ(r.hits.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_TRUE(is_hit(full.spans[want.matches()[i]], r.hits[i]));
  // Another kind only: no compute span is a collective.
  EXPECT_EQ(search_file(reader, full.strings, "backward", kind_bit(traces::SpanKind::Collective), 5)
                .count,
            0);
  // Cancelled before it starts: nothing counted, said so.
  std::atomic<bool> cancel{true};
  const FileSearchResult c = search_file(reader, full.strings, "backward", kAllKinds, 5, &cancel);
  EXPECT_TRUE(c.cancelled);
  EXPECT_EQ(c.count, 0);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace orrery::gui
