// End to end, offscreen: open a generated trace in the main window, zoom and pan with synthetic
// wheel, mouse and key events, select a span and a range, search, filter, compare two runs, read
// the charts, open bad files, and save screenshots (the app's --screenshot mode included).
#include <gtest/gtest.h>

#include <QApplication>
#include <QComboBox>
#include <QDir>
#include <QDockWidget>
#include <QDropEvent>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QImage>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QProcess>
#include <QScreen>
#include <QScrollBar>
#include <QSettings>
#include <QSpinBox>
#include <QStatusBar>
#include <QTableView>
#include <QTest>
#include <QUrl>
#include <QWheelEvent>
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "orrery/common/format.hpp"
#include "orrery/gui/palette.hpp"
#include "orrery/gui/widgets/charts_view.hpp"
#include "orrery/gui/widgets/compare_view.hpp"
#include "orrery/gui/widgets/main_window.hpp"
#include "orrery/gui/widgets/timeline_view.hpp"
#include "orrery/traces/store.hpp"
#include "orrery/traces/synth.hpp"

using namespace orrery::gui;
namespace traces = orrery::traces;

namespace {

const QString kDir = ORRERY_GUI_TEST_DIR;

bool wait_for(const std::function<bool()>& pred, int timeout_ms = 30000) {
  QElapsedTimer t;
  t.start();
  while (!pred()) {
    if (t.elapsed() > timeout_ms) return false;
    QTest::qWait(5);
  }
  return true;
}

traces::SynthOptions small_opts() {
  traces::SynthOptions o;
  o.ranks = 4;
  o.steps = 3;
  o.layers = 4;
  return o;
}

QString write_synth(const QString& name, const traces::SynthOptions& o, int64_t shift_ns = 0) {
  auto t = traces::synthesize(o);
  for (auto& s : t.spans) {
    s.start_ns += shift_ns;
    s.end_ns += shift_ns;
  }
  const QString path = kDir + "/" + name;
  QFile::remove(path);
  traces::write_trace(t, path.toStdString());
  return path;
}

void send_mouse(QWidget* w, QEvent::Type type, QPoint pos, Qt::MouseButton button,
                Qt::MouseButtons buttons, Qt::KeyboardModifiers mods = Qt::NoModifier) {
  QMouseEvent e(type, QPointF(pos), QPointF(w->mapToGlobal(pos)), button, buttons, mods);
  QApplication::sendEvent(w, &e);
}

void send_wheel(QWidget* w, QPoint pos, int delta_y, Qt::KeyboardModifiers mods = Qt::NoModifier) {
  QWheelEvent e(QPointF(pos), QPointF(w->mapToGlobal(pos)), QPoint(), QPoint(0, delta_y),
                Qt::NoButton, mods, Qt::NoScrollPhase, false);
  QApplication::sendEvent(w, &e);
}

class GuiApp : public ::testing::Test {
 protected:
  void SetUp() override {
    QSettings().clear();
    win_ = std::make_unique<MainWindow>();
    win_->resize(1400, 900);
    win_->show();
    ASSERT_TRUE(QTest::qWaitForWindowExposed(win_.get()));
  }
  void TearDown() override { win_.reset(); }

  // Opens a file and waits until its document and its whole-trace metrics are there.
  void open(const QString& path) {
    const int before = win_->document_count();
    int metrics = 0;
    auto c = QObject::connect(win_.get(), &MainWindow::metricsReady, [&] { ++metrics; });
    win_->open_files({path});
    ASSERT_TRUE(wait_for([&] { return win_->document_count() > before && metrics > 0; }))
        << path.toStdString();
    QObject::disconnect(c);
    QTest::qWait(20);
  }

  std::unique_ptr<MainWindow> win_;
};

}  // namespace

TEST_F(GuiApp, OpensZoomsPansSelectsAndSavesAScreenshot) {
  const auto o = small_opts();
  const QString path = write_synth("e2e_a.db", o);
  open(path);
  TimelineView* tl = win_->timeline();
  QWidget* vp = tl->viewport();
  ASSERT_TRUE(tl->document());
  EXPECT_EQ(tl->document()->trace.spans.size(), size_t(traces::synth_span_count(o)));
  // A lane per rank and stream under a header per rank, then the rank's 4 counter tracks.
  EXPECT_EQ(tl->lane_layout().rows().size(), size_t(o.ranks * (4 + 4)));
  // Fit all on open: the whole trace is visible.
  EXPECT_LE(tl->visible_start_ns(), tl->index()->start_ns());
  EXPECT_GE(tl->visible_end_ns(), tl->index()->end_ns());
  EXPECT_EQ(win_->recent_files().value(0), QFileInfo(path).absoluteFilePath());

  // Ctrl+wheel zooms around the cursor (as in Perfetto): the time under it stays put.
  const int x = TimelineView::kLabelWidth + 300;
  const int64_t t_under = tl->mapping().t_floor(300);
  const double npp0 = tl->mapping().ns_per_px;
  send_wheel(vp, QPoint(x, 200), 240, Qt::ControlModifier);
  EXPECT_NEAR(tl->mapping().ns_per_px, npp0 / std::pow(1.0015, 240), npp0 * 1e-9);
  EXPECT_NEAR(static_cast<double>(tl->mapping().t_floor(300)), static_cast<double>(t_under), 1.0);

  // W zooms in by 1.25, S out; A and D pan by an eighth of the track.
  tl->setFocus();
  const double npp1 = tl->mapping().ns_per_px;
  QTest::keyClick(tl, Qt::Key_W);
  EXPECT_NEAR(tl->mapping().ns_per_px, npp1 / 1.25, npp1 * 1e-9);
  QTest::keyClick(tl, Qt::Key_S);
  EXPECT_NEAR(tl->mapping().ns_per_px, npp1, npp1 * 1e-9);
  const int64_t start0 = tl->visible_start_ns();
  QTest::keyClick(tl, Qt::Key_D);
  EXPECT_NEAR(static_cast<double>(tl->visible_start_ns() - start0), tl->track_width() / 8.0 * npp1,
              2.0);
  QTest::keyClick(tl, Qt::Key_A);
  EXPECT_NEAR(static_cast<double>(tl->visible_start_ns()), static_cast<double>(start0), 2.0);

  // Drag to pan: 100 px to the right shows 100 px worth of earlier time.
  const int64_t before_drag = tl->visible_start_ns();
  send_mouse(vp, QEvent::MouseButtonPress, QPoint(x, 300), Qt::LeftButton, Qt::LeftButton);
  send_mouse(vp, QEvent::MouseMove, QPoint(x + 50, 300), Qt::NoButton, Qt::LeftButton);
  send_mouse(vp, QEvent::MouseMove, QPoint(x + 100, 300), Qt::NoButton, Qt::LeftButton);
  send_mouse(vp, QEvent::MouseButtonRelease, QPoint(x + 100, 300), Qt::LeftButton, Qt::NoButton);
  EXPECT_NEAR(static_cast<double>(before_drag - tl->visible_start_ns()),
              100 * tl->mapping().ns_per_px, 2.0);
  EXPECT_EQ(tl->selected_span(), -1);  // a drag does not select

  // Zoom onto rank 1's backward of layer 2 in step 1 and click it.
  const auto& tr = tl->document()->trace;
  int64_t target = -1;
  for (size_t i = 0; i < tr.spans.size(); ++i) {
    const auto& s = tr.spans[i];
    if (s.rank == 1 && s.step == 1 && tr.name_of(s) == "layers.2.backward")
      target = static_cast<int64_t>(i);
  }
  ASSERT_GE(target, 0);
  const auto& ts = tr.spans[static_cast<size_t>(target)];
  tl->zoom_to(ts.start_ns - 3'000'000, ts.end_ns + 3'000'000);
  const QPoint p = tl->point_of_span(target);
  ASSERT_GE(p.x(), 0);
  EXPECT_EQ(tl->span_at_point(p), target);
  int hovered = -2;
  auto hc = QObject::connect(tl, &TimelineView::spanHovered,
                             [&](qint64 s) { hovered = static_cast<int>(s); });
  send_mouse(vp, QEvent::MouseMove, p, Qt::NoButton, Qt::NoButton);
  EXPECT_EQ(hovered, target);
  QObject::disconnect(hc);
  QTest::mouseClick(vp, Qt::LeftButton, Qt::NoModifier, p);
  EXPECT_EQ(tl->selected_span(), target);
  EXPECT_EQ(win_->details_model()->value("Name"), "layers.2.backward");
  EXPECT_EQ(win_->details_model()->value("Rank"), "1");
  EXPECT_EQ(win_->details_model()->value("Step"), "1");
  // F zooms to the selected span (with a 5 % margin each side).
  QTest::keyClick(tl, Qt::Key_F);
  EXPECT_NEAR(tl->mapping().ns_per_px, ts.duration_ns() * 1.1 / tl->track_width(), 1.0);

  QTest::qWait(20);
  const QImage img = win_->grab().toImage();
  EXPECT_EQ(img.width(), win_->width());
  ASSERT_TRUE(img.save(kDir + "/gui_e2e_selected.png"));
  EXPECT_TRUE(QFileInfo(kDir + "/gui_e2e_selected.png").size() > 1000);

  // A click on empty space clears the selection; Escape too.
  QTest::mouseClick(vp, Qt::LeftButton, Qt::NoModifier, QPoint(x, vp->height() - 2));
  EXPECT_EQ(tl->selected_span(), -1);
  EXPECT_EQ(win_->details_model()->rowCount(), 0);
}

// W/S/A/D, F and 0 work without a click on the timeline, wherever the focus is except in a text
// field; after a search (Enter in the box) the focus is back on the timeline, so the keys navigate
// instead of changing the query.
TEST_F(GuiApp, NavigationKeysWorkWithoutAClickAndAfterASearch) {
  open(write_synth("e2e_keys.db", small_opts()));
  ASSERT_TRUE(QTest::qWaitForWindowActive(win_.get()));
  TimelineView* tl = win_->timeline();
  // Keys as the keyboard sends them: to the focus widget, or to the window when there is none.
  auto press = [&](Qt::Key k, Qt::KeyboardModifiers mods = Qt::NoModifier) {
    QWidget* f = QApplication::focusWidget();
    QTest::keyClick(f ? f : win_.get(), k, mods);
  };
  auto check_keys = [&](const char* where) {
    SCOPED_TRACE(where);
    tl->fit_all();
    const double npp = tl->mapping().ns_per_px;
    press(Qt::Key_W);
    EXPECT_NEAR(tl->mapping().ns_per_px, npp / 1.25, npp * 1e-9);
    press(Qt::Key_S);
    EXPECT_NEAR(tl->mapping().ns_per_px, npp, npp * 1e-9);
    const int64_t start = tl->visible_start_ns();
    press(Qt::Key_D);
    EXPECT_NEAR(static_cast<double>(tl->visible_start_ns() - start), tl->track_width() / 8.0 * npp,
                2.0);
    press(Qt::Key_A);
    EXPECT_NEAR(static_cast<double>(tl->visible_start_ns()), static_cast<double>(start), 2.0);
    press(Qt::Key_W);
    press(Qt::Key_0);
    EXPECT_NEAR(tl->mapping().ns_per_px, npp, npp * 1e-9);
  };
  // As the window is after opening a trace, no click anywhere.
  check_keys("after open");
  // With the focus on a toolbar control (the trace selector), as after choosing a trace there.
  auto* combo = win_->findChild<QComboBox*>();
  ASSERT_TRUE(combo);
  combo->setFocus();
  ASSERT_EQ(QApplication::focusWidget(), combo);
  check_keys("focus on the trace selector");

  // Ctrl+F, type a query, Enter: the first match is selected and the focus is the timeline's.
  press(Qt::Key_F, Qt::ControlModifier);
  auto* edit = qobject_cast<QLineEdit*>(QApplication::focusWidget());
  ASSERT_TRUE(edit);
  // In the box, the letters are text, not navigation.
  const double npp = tl->mapping().ns_per_px;
  QTest::keyClicks(edit, "wasd");
  EXPECT_EQ(edit->text(), "wasd");
  EXPECT_EQ(tl->mapping().ns_per_px, npp);
  edit->clear();
  QTest::keyClicks(edit, "optimizer");
  press(Qt::Key_Return);
  ASSERT_GE(tl->selected_span(), 0);
  EXPECT_EQ(win_->details_model()->value("Name"), "optimizer");
  EXPECT_EQ(QApplication::focusWidget(), tl);
  const double npp_found = tl->mapping().ns_per_px;
  press(Qt::Key_W);
  EXPECT_NEAR(tl->mapping().ns_per_px, npp_found / 1.25, npp_found * 1e-9);
  EXPECT_EQ(edit->text(), "optimizer");  // the query is unchanged
  press(Qt::Key_F);  // zooms to the match: it fills the track less 5 % each side
  const auto& s = tl->document()->trace.spans[static_cast<size_t>(tl->selected_span())];
  EXPECT_NEAR(tl->mapping().ns_per_px, s.duration_ns() * 1.1 / tl->track_width(), 1.0);
}

// File > Open of a second trace shows it (timeline, title, status, trace box); the same file again
// gives no second entry and shows it; the box tells files of one name apart by their folders;
// File > Close closes the shown trace.
TEST_F(GuiApp, OpenShowsTheNewTraceOnceAndCloseClosesIt) {
  QDir(kDir).mkpath("run1");
  QDir(kDir).mkpath("run2");
  auto o2 = small_opts();
  o2.ranks = 2;
  const QString p1 = write_synth("run1/trace.db", small_opts());
  const QString p2 = write_synth("run2/trace.db", o2);
  QComboBox* box = nullptr;
  for (auto* c : win_->findChildren<QComboBox*>()) {
    if (c->toolTip() == "The trace shown in the timeline") box = c;
  }
  ASSERT_TRUE(box);
  auto status = [&] {
    for (auto* l : win_->statusBar()->findChildren<QLabel*>()) {
      if (l->text().contains("spans") || l->text().contains("No trace")) return l->text();
    }
    return QString();
  };
  TimelineView* tl = win_->timeline();
  open(p1);
  open(p2);
  ASSERT_EQ(win_->document_count(), 2);
  EXPECT_EQ(QString::fromStdString(tl->document()->path), p2);
  EXPECT_EQ(tl->document()->trace.meta.world_size, 2);
  EXPECT_EQ(win_->windowTitle(), "Orrery - run2/trace.db");
  EXPECT_TRUE(status().startsWith(p2 + " ")) << status().toStdString();
  ASSERT_EQ(box->count(), 2);
  EXPECT_EQ(box->itemText(0), "run1/trace.db");
  EXPECT_EQ(box->itemText(1), "run2/trace.db");
  EXPECT_EQ(box->currentIndex(), 1);

  // The first file again: no new entry, and it is shown.
  int loaded = 0;
  auto c = QObject::connect(win_.get(), &MainWindow::documentLoaded, [&] { ++loaded; });
  win_->open_files({p1});
  ASSERT_TRUE(wait_for([&] { return loaded > 0 && win_->document_count() >= 2; }));
  QTest::qWait(20);
  QObject::disconnect(c);
  EXPECT_EQ(win_->document_count(), 2);
  EXPECT_EQ(box->count(), 2);
  EXPECT_EQ(QString::fromStdString(tl->document()->path), p1);
  EXPECT_EQ(box->currentIndex(), 0);
  EXPECT_EQ(win_->windowTitle(), "Orrery - run1/trace.db");

  // File > Close: run1 goes, run2 is shown, named by its file name alone now.
  QAction* close = nullptr;
  for (auto* a : win_->findChildren<QAction*>()) {
    if (a->text() == "&Close") close = a;
  }
  ASSERT_TRUE(close);
  close->trigger();
  EXPECT_EQ(win_->document_count(), 1);
  ASSERT_TRUE(tl->document());
  EXPECT_EQ(QString::fromStdString(tl->document()->path), p2);
  EXPECT_EQ(box->count(), 1);
  EXPECT_EQ(box->itemText(0), "trace.db");
  EXPECT_EQ(win_->windowTitle(), "Orrery - trace.db");
  close->trigger();
  EXPECT_EQ(win_->document_count(), 0);
  EXPECT_FALSE(tl->document());
  EXPECT_EQ(box->count(), 0);
  EXPECT_EQ(win_->windowTitle(), "Orrery");
  EXPECT_EQ(status(), "No trace open");
  EXPECT_EQ(win_->compare()->view_a()->document(), nullptr);
}

// Zoom and pan stay on the trace: zoomed out at most to the fit-all view, and at most a quarter of
// the view past either end, by keys, the wheel, a drag, and a jump to a match at the trace start.
TEST_F(GuiApp, PanAndZoomStayOnTheTrace) {
  open(write_synth("e2e_bounds.db", small_opts()));
  TimelineView* tl = win_->timeline();
  QWidget* vp = tl->viewport();
  const int64_t lo = tl->index()->start_ns(), hi = tl->index()->end_ns();
  tl->fit_all();
  const double fit_npp = tl->mapping().ns_per_px;
  auto view_ns = [&] { return tl->mapping().ns_per_px * tl->track_width(); };
  auto within = [&](const char* what) {
    SCOPED_TRACE(what);
    EXPECT_LE(tl->mapping().ns_per_px, fit_npp * (1 + 1e-12));
    EXPECT_GE(static_cast<double>(tl->visible_start_ns()), lo - view_ns() / 4 - 1);
    EXPECT_LE(static_cast<double>(tl->visible_end_ns()), hi + view_ns() / 4 + 1);
  };
  for (int i = 0; i < 20; ++i) QTest::keyClick(tl, Qt::Key_S);
  EXPECT_DOUBLE_EQ(tl->mapping().ns_per_px, fit_npp);
  within("S x20");
  send_wheel(vp, QPoint(TimelineView::kLabelWidth + 10, 200), -2400, Qt::ControlModifier);
  within("wheel out");
  for (int i = 0; i < 30; ++i) QTest::keyClick(tl, Qt::Key_A);
  within("A x30");
  EXPECT_NEAR(static_cast<double>(tl->visible_start_ns()), lo - view_ns() / 4, 2.0);
  for (int i = 0; i < 10; ++i) QTest::keyClick(tl, Qt::Key_W);
  for (int i = 0; i < 200; ++i) QTest::keyClick(tl, Qt::Key_D);
  within("W x10, D x200");
  EXPECT_NEAR(static_cast<double>(tl->visible_end_ns()), hi + view_ns() / 4, 2.0);
  // A drag far to the left (later times) stops at the end too.
  const QPoint at(TimelineView::kLabelWidth + tl->track_width() - 10, 300);
  send_mouse(vp, QEvent::MouseButtonPress, at, Qt::LeftButton, Qt::LeftButton);
  send_mouse(vp, QEvent::MouseMove, at - QPoint(tl->track_width() - 20, 0), Qt::NoButton,
             Qt::LeftButton);
  send_mouse(vp, QEvent::MouseButtonRelease, at - QPoint(tl->track_width() - 20, 0), Qt::LeftButton,
             Qt::NoButton);
  within("drag");
  // Deep in, at the end: jump to the trace's first span (a search match would do the same).
  for (int i = 0; i < 30; ++i) QTest::keyClick(tl, Qt::Key_W);
  const auto& spans = tl->document()->trace.spans;
  size_t first = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].start_ns < spans[first].start_ns) first = i;
  }
  ASSERT_EQ(spans[first].start_ns, lo);
  tl->select_span(static_cast<int64_t>(first), true);
  within("jump to the first span");
  EXPECT_GE(tl->point_of_span(static_cast<int64_t>(first)).x(), 0);  // still shown
  // --zoom past the trace shows the bounded view.
  tl->zoom_to(lo - 100 * (hi - lo), hi + 100 * (hi - lo));
  within("zoom_to far past the ends");
}

// The window fits the screen by default; a closed panel comes back from View > Panels.
TEST_F(GuiApp, DefaultSizeFitsTheScreenAndClosedDocksComeBack) {
  MainWindow fresh;
  const QRect avail = fresh.screen()->availableGeometry();
  EXPECT_LE(fresh.width(), avail.width());
  EXPECT_LE(fresh.height(), avail.height());

  QMenu* view = nullptr;
  for (QAction* a : win_->menuBar()->actions()) {
    if (a->text() == "&View") view = a->menu();
  }
  ASSERT_TRUE(view);
  std::vector<QAction*> actions;
  std::function<void(QMenu*)> collect = [&](QMenu* m) {
    for (QAction* a : m->actions()) {
      actions.push_back(a);
      if (a->menu()) collect(a->menu());
    }
  };
  collect(view);
  const auto docks = win_->findChildren<QDockWidget*>();
  ASSERT_EQ(docks.size(), 2);
  for (QDockWidget* dock : docks) {
    SCOPED_TRACE(dock->windowTitle().toStdString());
    QAction* toggle = nullptr;
    for (QAction* a : actions) {
      if (a->text() == dock->windowTitle()) toggle = a;
    }
    ASSERT_TRUE(toggle);
    ASSERT_TRUE(dock->isVisible());
    dock->close();
    EXPECT_FALSE(dock->isVisible());
    EXPECT_FALSE(toggle->isChecked());
    toggle->trigger();
    EXPECT_TRUE(dock->isVisible());
  }
}

// The smaller ones: the search label is cleared with the query; a switched-off kind's swatch is an
// empty box, not its colour; the empty timeline says a trace is loading rather than "Open a trace".
TEST_F(GuiApp, SearchLabelKindSwatchAndLoadingMessage) {
  const QString path = write_synth("e2e_small.db", small_opts());
  EXPECT_TRUE(win_->timeline()->empty_message().startsWith("Open a trace"));
  int metrics = 0;
  auto c = QObject::connect(win_.get(), &MainWindow::metricsReady, [&] { ++metrics; });
  win_->open_files({path});
  // Until the worker's result is delivered (events processed), the trace is loading.
  EXPECT_EQ(win_->timeline()->empty_message(), "Loading the trace...");
  ASSERT_TRUE(wait_for([&] { return win_->document_count() == 1 && metrics > 0; }));
  QObject::disconnect(c);

  auto labels_saying = [&](const QString& text) {
    int n = 0;
    for (auto* l : win_->findChildren<QLabel*>()) n += l->text() == text;
    return n;
  };
  win_->search("no_such_span_name");
  EXPECT_EQ(labels_saying("no match"), 1);
  QLineEdit* edit = nullptr;
  for (auto* e : win_->findChildren<QLineEdit*>()) {
    if (e->placeholderText() == "Search spans by name") edit = e;
  }
  ASSERT_TRUE(edit);
  edit->clear();  // as its clear button does
  EXPECT_EQ(labels_saying("no match"), 0);
  EXPECT_EQ(win_->span_search().size(), 0u);

  QAction* phase = nullptr;
  for (auto* a : win_->findChildren<QAction*>()) {
    if (a->isCheckable() && a->text() == "phase") phase = a;
  }
  ASSERT_TRUE(phase);
  auto swatch_centre = [&] {
    const QIcon::State st = phase->isChecked() ? QIcon::On : QIcon::Off;
    return phase->icon().pixmap(QSize(14, 14), 1.0, QIcon::Normal, st).toImage().pixelColor(7, 7);
  };
  EXPECT_EQ(swatch_centre(), palette::kind_color(traces::SpanKind::Phase));
  win_->set_kind_visible(traces::SpanKind::Phase, false);
  EXPECT_FALSE(phase->isChecked());
  EXPECT_EQ(swatch_centre().alpha(), 0);  // an empty box
  win_->set_kind_visible(traces::SpanKind::Phase, true);
  EXPECT_EQ(swatch_centre(), palette::kind_color(traces::SpanKind::Phase));
}

TEST_F(GuiApp, RangeSelectionShowsTheLibraryMetrics) {
  const auto o = small_opts();
  open(write_synth("e2e_range.db", o));
  TimelineView* tl = win_->timeline();
  QWidget* vp = tl->viewport();
  const int x0 = TimelineView::kLabelWidth + 50,
            x1 = TimelineView::kLabelWidth + tl->track_width() - 50;
  int ready = 0;
  auto c = QObject::connect(win_.get(), &MainWindow::rangeMetricsReady, [&] { ++ready; });
  send_mouse(vp, QEvent::MouseButtonPress, QPoint(x0, 200), Qt::LeftButton, Qt::LeftButton,
             Qt::ShiftModifier);
  send_mouse(vp, QEvent::MouseMove, QPoint(x1, 220), Qt::NoButton, Qt::LeftButton,
             Qt::ShiftModifier);
  send_mouse(vp, QEvent::MouseButtonRelease, QPoint(x1, 220), Qt::LeftButton, Qt::NoButton,
             Qt::ShiftModifier);
  ASSERT_TRUE(tl->has_range());
  const auto [t0, t1] = tl->range();
  EXPECT_EQ(t0, tl->mapping().t_floor(50));
  EXPECT_EQ(t1, tl->mapping().t_floor(tl->track_width() - 50));
  ASSERT_TRUE(wait_for([&] { return ready > 0; }));
  QObject::disconnect(c);
  // The panel shows what profiler::compute_metrics says for that window.
  orrery::profiler::MetricsOptions mo;
  mo.window_start_ns = t0;
  mo.window_end_ns = t1;
  const auto m = orrery::profiler::compute_metrics(tl->document()->trace, mo);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f %%", m.total.overlap_pct());
  EXPECT_EQ(win_->range_model()->value("Overlap %").toStdString(), buf);
  std::snprintf(buf, sizeof buf, "%.3f", m.total.comm_comp_ratio());
  EXPECT_EQ(win_->range_model()->value("Comm/comp ratio").toStdString(), buf);
  EXPECT_EQ(win_->collective_model()->rowCount(), static_cast<int>(m.collectives.size()));
  EXPECT_GE(win_->collective_model()->rowCount(), 1);
  QTest::qWait(20);
  ASSERT_TRUE(win_->grab().save(kDir + "/gui_e2e_range.png"));
  QTest::keyClick(tl, Qt::Key_Escape);
  EXPECT_FALSE(tl->has_range());
  EXPECT_EQ(win_->range_model()->rowCount(), 0);
}

TEST_F(GuiApp, SearchFilterCollapseAndGroup) {
  const auto o = small_opts();
  open(write_synth("e2e_search.db", o));
  TimelineView* tl = win_->timeline();
  win_->search("optimizer");
  EXPECT_EQ(win_->span_search().size(), size_t(o.ranks * o.steps * 2));
  win_->search_next();
  const int64_t first = tl->selected_span();
  ASSERT_GE(first, 0);
  EXPECT_EQ(win_->details_model()->value("Name"), "optimizer");
  EXPECT_GE(tl->point_of_span(first).x(), 0);  // revealed: on screen
  win_->search_next();
  EXPECT_NE(tl->selected_span(), first);
  win_->search_previous();
  EXPECT_EQ(tl->selected_span(), first);

  // Hiding phases drops them from the lanes and from the search.
  const size_t all = tl->index()->span_count();
  win_->set_kind_visible(traces::SpanKind::Phase, false);
  EXPECT_EQ(tl->index()->span_count(), all - size_t(o.ranks * o.steps * 4));
  EXPECT_EQ(win_->span_search().size(), size_t(o.ranks * o.steps));
  win_->set_kind_visible(traces::SpanKind::Phase, true);
  EXPECT_EQ(tl->index()->span_count(), all);

  // A click on rank 1's header collapses its three lanes.
  const auto& rows = tl->lane_layout().rows();
  size_t hdr = 0;
  while (hdr < rows.size() && !(rows[hdr].kind == LayoutRow::Kind::Rank && rows[hdr].rank == 1))
    ++hdr;
  ASSERT_LT(hdr, rows.size());
  const int y = static_cast<int>(TimelineView::kAxisHeight - tl->verticalScrollBar()->value() +
                                 rows[hdr].y + 5);
  QTest::mouseClick(tl->viewport(), Qt::LeftButton, Qt::NoModifier, QPoint(30, y));
  EXPECT_EQ(tl->lane_layout().rows().size(), size_t(o.ranks * 8 - 7));  // 3 lanes, 4 counters

  // Unchecking a lane in the lanes tree hides it.
  auto* lanes = const_cast<LaneTreeModel*>(win_->lane_model());
  ASSERT_EQ(lanes->rowCount(), o.ranks);
  lanes->setData(lanes->index(0, 0, lanes->index(2, 0)), Qt::Unchecked, Qt::CheckStateRole);
  EXPECT_EQ(tl->lane_layout().rows().size(), size_t(o.ranks * 8 - 8));

  win_->set_group_by(GroupBy::DP);  // synth ranks are all dp: one dp group
  EXPECT_EQ(tl->group_by(), GroupBy::DP);
  EXPECT_EQ(tl->lane_layout().rows().front().kind, LayoutRow::Kind::Group);
  ASSERT_EQ(win_->lane_model()->rowCount(), 1);
  EXPECT_EQ(win_->lane_model()->index(0, 0).data().toString(), "dp[tp=0,pp=0]");
}

TEST_F(GuiApp, SweepCsvShowsScalingCurves) {
  const QString csv = kDir + "/e2e_sweep.csv";
  {
    QFile f(csv);
    ASSERT_TRUE(f.open(QIODevice::WriteOnly));
    f.write(
        "gpus,dp,tp,pp,zero,micro_batch,step_time_s,tokens_per_s,tflops_per_gpu,mfu,efficiency,"
        "peak_memory_bytes,fits,note\n"
        "8,8,1,1,0,4,0.5,65536,300,0.3,1,1e10,true,\"\"\n"
        "64,16,4,1,1,4,0.55,476626,280,0.28,0.909,1e10,true,\"\"\n"
        "512,128,4,1,1,4,0.6,3495253,260,0.26,0.833,1e10,true,\"\"\n"
        "1024,,,,,,,,,,,,false,\"no layout fits in memory\"\n");
  }
  QString loaded;
  auto c = QObject::connect(win_.get(), &MainWindow::documentLoaded,
                            [&](const QString& p) { loaded = p; });
  win_->open_files({csv});
  ASSERT_TRUE(wait_for([&] { return !loaded.isEmpty(); }));
  QObject::disconnect(c);
  EXPECT_EQ(win_->charts()->scaling_points(), 3);
  // The row the sweep could not place is named, not dropped.
  EXPECT_EQ(win_->charts()->scaling_note(), "Not placed: 1024 GPUs (no layout fits in memory)");
  EXPECT_EQ(win_->document_count(), 0);  // a sweep is not a trace
}

TEST_F(GuiApp, CompareAlignsByStepAndChartsShowTheBreakdown) {
  auto oa = small_opts();
  auto ob = small_opts();
  ob.backward_ns = 2'500'000;
  const auto ta = traces::synth_totals(oa), tb = traces::synth_totals(ob);
  open(write_synth("e2e_cmp_a.db", oa));
  open(write_synth("e2e_cmp_b.db", ob, 5'000'000));  // B's clock starts 5 ms later
  ASSERT_TRUE(wait_for([&] { return win_->compare()->diff_model()->rowCount() == oa.steps; }));
  const auto* dm = win_->compare()->diff_model();
  for (int r = 0; r < dm->rowCount(); ++r) {
    EXPECT_EQ(dm->index(r, StepDiffModel::kDiff).data(Qt::UserRole).toLongLong(),
              tb.step_ns - ta.step_ns);
  }
  // Aligned on the first step: B is drawn 5 ms earlier, and both views share the time axis.
  EXPECT_EQ(win_->compare()->view_b()->shift_ns(), -5'000'000);
  win_->show_tab("compare");
  QTest::qWait(20);
  win_->compare()->view_a()->zoom_by(2.0, 100);
  EXPECT_DOUBLE_EQ(win_->compare()->view_b()->mapping().ns_per_px,
                   win_->compare()->view_a()->mapping().ns_per_px);
  EXPECT_EQ(win_->compare()->view_b()->mapping().origin_ns,
            win_->compare()->view_a()->mapping().origin_ns);
  ASSERT_TRUE(win_->grab().save(kDir + "/gui_e2e_compare.png"));

  // The step box offers the steps both traces have; a step past them leaves the shift and says so.
  auto* spin = win_->compare()->findChild<QSpinBox*>();
  ASSERT_TRUE(spin);
  EXPECT_EQ(spin->minimum(), 0);
  EXPECT_EQ(spin->maximum(), oa.steps - 1);
  win_->compare()->align_on_step(99);
  EXPECT_EQ(win_->compare()->view_b()->shift_ns(), -5'000'000);
  EXPECT_TRUE(
      win_->compare()->align_note().startsWith("step 99 is not in both traces (steps 0 to 2"))
      << win_->compare()->align_note().toStdString();
  win_->compare()->align_on_step(1);
  EXPECT_TRUE(win_->compare()->align_note().isEmpty());

  // Compare follows the grouping.
  win_->set_group_by(GroupBy::DP);
  EXPECT_EQ(win_->compare()->view_a()->group_by(), GroupBy::DP);
  EXPECT_EQ(win_->compare()->view_b()->lane_layout().rows().front().kind, LayoutRow::Kind::Group);
  win_->set_group_by(GroupBy::Rank);

  // A click on a span in a compare pane fills the details with that pane's trace; a shift-drag
  // range there computes its metrics.
  TimelineView* vb = win_->compare()->view_b();
  const auto& trb = vb->document()->trace;
  int64_t target = -1;
  for (size_t i = 0; i < trb.spans.size(); ++i) {
    const auto& s = trb.spans[i];
    if (s.rank == 1 && s.step == 1 && trb.name_of(s) == "layers.2.backward")
      target = static_cast<int64_t>(i);
  }
  ASSERT_GE(target, 0);
  const auto& ts = trb.spans[static_cast<size_t>(target)];
  vb->zoom_to(ts.start_ns - 1'000'000, ts.end_ns + 1'000'000);
  QTest::qWait(20);
  const QPoint at = vb->point_of_span(target);
  ASSERT_GE(at.x(), 0);
  QTest::mouseClick(vb->viewport(), Qt::LeftButton, Qt::NoModifier, at);
  EXPECT_EQ(vb->selected_span(), target);
  EXPECT_EQ(win_->details_model()->value("Name"), "layers.2.backward");
  EXPECT_EQ(win_->details_model()->value("Duration"),
            QString::fromStdString(orrery::format_duration_ns(2'500'000)));
  int ready = 0;
  auto rc = QObject::connect(win_.get(), &MainWindow::rangeMetricsReady, [&] { ++ready; });
  vb->set_range(ts.start_ns, ts.end_ns);
  ASSERT_TRUE(wait_for([&] { return ready > 0; }));
  QObject::disconnect(rc);
  EXPECT_GT(win_->range_model()->rowCount(), 0);

  // Charts: the mean per-step breakdown of each rank, in ms, from the metrics, of the trace in the
  // timeline: B, opened last, then A once it is chosen in the trace box.
  win_->show_tab("charts");
  QTest::qWait(20);
  for (double v : win_->charts()->breakdown_values("compute"))
    EXPECT_NEAR(v, tb.compute_ns / 1e6, 1e-9);
  win_->set_current_document(0);
  QTest::qWait(20);
  EXPECT_EQ(win_->charts()->breakdown_categories(), oa.ranks);
  const auto compute = win_->charts()->breakdown_values("compute");
  ASSERT_EQ(compute.size(), size_t(oa.ranks));
  for (double v : compute) EXPECT_NEAR(v, ta.compute_ns / 1e6, 1e-9);
  const auto idle = win_->charts()->breakdown_values("idle");
  for (double v : idle) EXPECT_NEAR(v, ta.idle_ns / 1e6, 1e-9);
  ASSERT_TRUE(win_->grab().save(kDir + "/gui_e2e_charts.png"));
}

TEST_F(GuiApp, BadFilesGiveADialogNotACrash) {
  const QString bad = kDir + "/e2e_bad.db";
  {
    QFile f(bad);
    ASSERT_TRUE(f.open(QIODevice::WriteOnly));
    f.write("this is not a trace, nor any SQLite database at all; just text.\n");
  }
  QString reason;
  auto c = QObject::connect(win_.get(), &MainWindow::loadFailed,
                            [&](const QString&, const QString& r) { reason = r; });
  win_->open_files({bad});
  ASSERT_TRUE(wait_for([&] { return !reason.isEmpty(); }));
  ASSERT_TRUE(win_->last_error());
  EXPECT_TRUE(win_->last_error()->isVisible());
  EXPECT_EQ(win_->last_error()->informativeText(), reason);
  EXPECT_TRUE(reason.contains("e2e_bad.db")) << reason.toStdString();
  EXPECT_EQ(win_->document_count(), 0);
  reason.clear();
  win_->open_files({kDir + "/does_not_exist.db"});
  ASSERT_TRUE(wait_for([&] { return !reason.isEmpty(); }));
  EXPECT_TRUE(reason.contains("does_not_exist.db")) << reason.toStdString();
  QObject::disconnect(c);
  win_->last_error()->accept();  // the dialog is window-modal: the user closes it first
  // And the window still opens a good file afterwards, here by drag and drop.
  const QString good = write_synth("e2e_drop.db", small_opts());
  QMimeData mime;
  mime.setUrls({QUrl::fromLocalFile(good)});
  // As a drag does it: an enter event (the window accepts it and becomes the drop target), then the drop.
  QDragEnterEvent enter(QPoint(200, 200), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(win_.get(), &enter);
  EXPECT_TRUE(enter.isAccepted());
  QDropEvent drop(QPointF(200, 200), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(win_.get(), &drop);
  ASSERT_TRUE(wait_for([&] { return win_->document_count() == 1; }));
}

// Zoomed out, a folded block is coloured by the kind that covers most of its time (not by its first
// span's), shaded by its busy fraction, and its tooltip gives the count, busy fraction and kinds.
// One lane: 100 groups of a 10 ns "data" span then a 70 ns compute span, 100 ns apart.
TEST(GuiTimeline, FoldedBlockTakesTheKindThatCoversMostOfItsTime) {
  traces::Trace t;
  const auto load = t.strings.intern("load");
  const auto matmul = t.strings.intern("matmul");
  for (int g = 0; g < 100; ++g) {
    traces::Span d;
    d.kind = traces::SpanKind::Data;
    d.name = load;
    d.start_ns = 100 * g;
    d.end_ns = 100 * g + 10;
    traces::Span c = d;
    c.kind = traces::SpanKind::Compute;
    c.name = matmul;
    c.start_ns = 100 * g + 10;
    c.end_ns = 100 * g + 80;
    t.spans.push_back(d);
    t.spans.push_back(c);
  }
  t.sort_spans();
  TimelineView tl;
  tl.resize(TimelineView::kLabelWidth + 300 + tl.verticalScrollBar()->sizeHint().width(), 200);
  tl.show();
  ASSERT_TRUE(QTest::qWaitForWindowExposed(&tl));
  tl.set_document(make_document(std::move(t), "fold.db"));
  tl.fit_all();
  ASSERT_LT(70.0 / tl.mapping().ns_per_px, TimelineView::kFoldPx);  // every span folds
  // Rows: rank 0's header, then its lane; a point in the block, left of its "200 spans" label.
  const auto& rows = tl.lane_layout().rows();
  ASSERT_EQ(rows.size(), 2u);
  const int y =
      static_cast<int>(TimelineView::kAxisHeight + rows[1].y + LaneLayout::kRowHeight / 2);
  const QPoint p(TimelineView::kLabelWidth + static_cast<int>(tl.mapping().x_of(1'000)), y);
  const auto fold = tl.fold_at_point(p);
  ASSERT_TRUE(fold.has_value());
  EXPECT_EQ(fold->count, 200u);
  EXPECT_EQ(fold->dominant, traces::SpanKind::Compute);
  EXPECT_EQ(fold->busy_ns, 8'000);
  EXPECT_DOUBLE_EQ(fold->busy_fraction(), 8'000.0 / 9'980.0);
  EXPECT_EQ(tl.span_at_point(p), -1);

  const QImage img = tl.viewport()->grab().toImage();
  ASSERT_TRUE(img.save(kDir + "/gui_folded_block.png"));
  const QColor want =
      palette::folded_color(traces::SpanKind::Compute, 8'000.0 / 9'980.0, palette::kLaneEven);
  EXPECT_EQ(img.pixelColor(p).name().toStdString(), want.name().toStdString());
  EXPECT_NE(want.name(),
            palette::folded_color(traces::SpanKind::Data, 1.0, palette::kLaneEven).name());

  const QString tip = tl.tooltip_at(p);
  EXPECT_TRUE(tip.contains("200 spans")) << tip.toStdString();
  EXPECT_TRUE(tip.contains("80.2 %")) << tip.toStdString();  // 8000 / 9980 busy
  // Kinds, largest first, as shares of the busy time.
  EXPECT_TRUE(tip.contains("compute</b></td><td>7.00 us (87.5 %)")) << tip.toStdString();
  EXPECT_TRUE(tip.contains("data</b></td><td>1.00 us (12.5 %)")) << tip.toStdString();
  EXPECT_LT(tip.indexOf("compute"), tip.indexOf("data"));
}

// The range's length is drawn at the bottom of the range's band, not over the axis's tick labels:
// the axis looks the same with and without a range.
TEST(GuiTimeline, RangeLengthLeavesTheAxisTicksAlone) {
  TimelineView tl;
  tl.resize(900, 400);
  tl.show();
  ASSERT_TRUE(QTest::qWaitForWindowExposed(&tl));
  tl.set_document(make_document(traces::synthesize(small_opts()), "range.db"));
  const int64_t lo = tl.index()->start_ns(), hi = tl.index()->end_ns();
  auto axis = [&] {
    return tl.viewport()->grab().toImage().copy(0, 0, tl.viewport()->width(),
                                                TimelineView::kAxisHeight);
  };
  const QImage without = axis();
  tl.set_range(lo + (hi - lo) / 4, hi - (hi - lo) / 4);
  const QImage img = tl.viewport()->grab().toImage();
  ASSERT_TRUE(img.save(kDir + "/gui_range_length.png"));
  EXPECT_TRUE(axis() == without);
  // The box, centred on the range, 4 px above the bottom.
  const int cx = TimelineView::kLabelWidth + static_cast<int>(tl.mapping().x_of((lo + hi) / 2));
  const int y = tl.viewport()->height() - 4 - 2;
  EXPECT_EQ(img.pixelColor(cx - 30, y), palette::kAccent);
}

TEST(GuiCli, ScreenshotModeRendersAndExits) {
  const QString trace = write_synth("cli_shot.db", small_opts());
  const QString png = kDir + "/cli_shot.png";
  QFile::remove(png);
  QFile::remove(kDir + "/never.png");  // left by an earlier, failed run
  QProcess p;
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  env.insert("QT_QPA_PLATFORM", "offscreen");
  env.insert("XDG_CONFIG_HOME", kDir + "/xdg");
  p.setProcessEnvironment(env);
  p.start(ORRERY_GUI_BIN, {"--screenshot", png, "--size", "900x600", trace});
  ASSERT_TRUE(p.waitForFinished(60000));
  EXPECT_EQ(p.exitCode(), 0) << p.readAllStandardError().toStdString();
  const QImage img(png);
  EXPECT_EQ(img.width(), 900);
  EXPECT_EQ(img.height(), 600);

  // A bad file: the reason on stderr and exit status 2.
  QProcess bad;
  bad.setProcessEnvironment(env);
  bad.start(ORRERY_GUI_BIN, {"--screenshot", kDir + "/never.png", kDir + "/no_such_trace.db"});
  ASSERT_TRUE(bad.waitForFinished(60000));
  EXPECT_EQ(bad.exitCode(), 2);
  const QString err = QString::fromLocal8Bit(bad.readAllStandardError());
  EXPECT_TRUE(err.contains("no_such_trace.db")) << err.toStdString();
  EXPECT_FALSE(QFileInfo::exists(kDir + "/never.png"));

  // --range/--zoom offsets beyond +-1e17 ns are refused naming the option (any 64-bit value used
  // to overflow int64 in the view: a signed overflow under UBSan); at the bound the view still
  // renders, with no overflow.
  for (const QStringList& args : {QStringList{"--range", "0:9223372036854775807"},
                                  QStringList{"--zoom", "-9223372036854775808:9223372036854775807"},
                                  QStringList{"--zoom", "0:100000000000000001"}}) {
    QProcess far;
    far.setProcessEnvironment(env);
    far.start(ORRERY_GUI_BIN,
              QStringList{"--screenshot", kDir + "/never.png"} + args + QStringList{trace});
    ASSERT_TRUE(far.waitForFinished(60000));
    EXPECT_EQ(far.exitCode(), 2) << args.join(' ').toStdString();
    const QString far_err = QString::fromLocal8Bit(far.readAllStandardError());
    EXPECT_TRUE(far_err.contains(args[0] + ": expected T0:T1")) << far_err.toStdString();
    EXPECT_FALSE(QFileInfo::exists(kDir + "/never.png"));
  }
  // --group and --tab with an unknown value: exit 2 listing the choices.
  for (const QStringList& args : {QStringList{"--group", "ranks"}, QStringList{"--tab", "flows"}}) {
    QFile::remove(kDir + "/never.png");
    QProcess unknown;
    unknown.setProcessEnvironment(env);
    unknown.start(ORRERY_GUI_BIN,
                  QStringList{"--screenshot", kDir + "/never.png"} + args + QStringList{trace});
    ASSERT_TRUE(unknown.waitForFinished(60000));
    EXPECT_EQ(unknown.exitCode(), 2) << args.join(' ').toStdString();
    const QString unknown_err = QString::fromLocal8Bit(unknown.readAllStandardError());
    const QString want = args[0] == "--group"
                             ? "--group: expected rank, dp, tp or pp, got 'ranks'"
                             : "--tab: expected timeline, compare, charts or experts, got 'flows'";
    EXPECT_TRUE(unknown_err.contains(want)) << unknown_err.toStdString();
    EXPECT_FALSE(QFileInfo::exists(kDir + "/never.png"));
  }
  QProcess edge;
  edge.setProcessEnvironment(env);
  edge.start(ORRERY_GUI_BIN,
             {"--screenshot", png, "--size", "900x600", "--zoom",
              "-100000000000000000:100000000000000000", "--range", "0:100000000000000000", trace});
  ASSERT_TRUE(edge.waitForFinished(60000));
  EXPECT_EQ(edge.exitCode(), 0) << edge.readAllStandardError().toStdString();
}

namespace {

traces::SynthOptions straggler_opts() {
  traces::SynthOptions o = small_opts();
  o.steps = 2;
  o.straggler_rank = 2;
  o.straggler_delay_ns = 300'000;
  return o;
}

int64_t collective_on(const traces::Trace& t, int32_t rank, int64_t seq) {
  for (size_t i = 0; i < t.spans.size(); ++i) {
    const auto& s = t.spans[i];
    if (s.kind == traces::SpanKind::Collective && s.rank == rank && s.seq == seq)
      return static_cast<int64_t>(i);
  }
  return -1;
}

// How many pixels of colour c lie on the outline 1-2 px outside rect r (top and bottom edges).
int outline_pixels(const QImage& img, const QRectF& r, const QColor& c) {
  int n = 0;
  for (int x = static_cast<int>(r.left()) + 2; x < static_cast<int>(r.right()) - 2; ++x) {
    for (int y : {static_cast<int>(r.top()) - 2, static_cast<int>(r.top()) - 1,
                  static_cast<int>(r.bottom()) + 1, static_cast<int>(r.bottom())}) {
      if (x >= 0 && y >= 0 && x < img.width() && y < img.height() && img.pixelColor(x, y) == c) ++n;
    }
  }
  return n;
}

}  // namespace

// Selecting one member of a collective instance outlines the others (in the flow colour) and the
// details list every rank with its start skew: the straggler (rank 2) arrived 300 us after the
// others, which waited for it. Clicking another member selects it and keeps the same flow.
TEST_F(GuiApp, SelectingACollectiveShowsItsFlowAndTheStartSkew) {
  const QString path = write_synth("gui_flow_straggler.db", straggler_opts());
  open(path);
  TimelineView* tl = win_->timeline();
  const auto& t = tl->document()->trace;
  const int64_t s0 = collective_on(t, 0, 0);
  const int64_t s1 = collective_on(t, 1, 0);
  const int64_t s2 = collective_on(t, 2, 0);
  ASSERT_GE(s0, 0);
  tl->zoom_to(t.spans[static_cast<size_t>(s0)].start_ns - 500'000,
              t.spans[static_cast<size_t>(s2)].end_ns + 500'000);
  QApplication::processEvents();
  const auto r1 = tl->span_rect(s1);
  ASSERT_TRUE(r1.has_value());
  const QImage before = tl->viewport()->grab().toImage();
  EXPECT_EQ(outline_pixels(before, *r1, palette::kFlow), 0);

  tl->select_span(s0);
  QApplication::processEvents();
  EXPECT_EQ(tl->flow_members().size(), 4u);
  const QImage img = tl->viewport()->grab().toImage();
  ASSERT_TRUE(img.save(kDir + "/gui_flow_collective.png"));
  // Rank 1's member is outlined along its top and bottom edges.
  EXPECT_GE(outline_pixels(img, *tl->span_rect(s1), palette::kFlow),
            static_cast<int>(r1->width()) - 6);
  const auto* d = win_->details_model();
  EXPECT_EQ(d->value("Flow"), "all_reduce: 4 ranks, world, seq 0");
  EXPECT_EQ(d->value("Start skew"), QString::fromStdString(orrery::format_duration_ns(300'000)));
  EXPECT_EQ(d->value("Last to arrive"), "rank 2");
  EXPECT_EQ(d->value("  rank 0"),
            QString::fromStdString("+" + orrery::format_duration_ns(0) + ", waited " +
                                   orrery::format_duration_ns(300'000)));

  // A click on rank 1's member selects it; the flow and the details follow.
  const QPoint p1 = tl->point_of_span(s1);
  ASSERT_GE(p1.x(), 0);
  send_mouse(tl->viewport(), QEvent::MouseButtonPress, p1, Qt::LeftButton, Qt::LeftButton);
  send_mouse(tl->viewport(), QEvent::MouseButtonRelease, p1, Qt::LeftButton, Qt::NoButton);
  EXPECT_EQ(tl->selected_span(), s1);
  EXPECT_EQ(tl->flow_members().size(), 4u);
  EXPECT_EQ(d->value("Last to arrive"), "rank 2");
  EXPECT_EQ(d->value("Rank"), "1");
}

// A pipeline's send is linked to its receive on the next stage: the details say which ranks and
// the skew of the receive's start (0 in the generator, whose transfers are instantaneous).
TEST_F(GuiApp, SelectingASendShowsItsReceive) {
  traces::SynthOptions o = small_opts();
  o.pp = 2;
  o.steps = 1;
  const QString path = write_synth("gui_flow_p2p.db", o);
  open(path);
  TimelineView* tl = win_->timeline();
  const auto& t = tl->document()->trace;
  int64_t send = -1;
  for (size_t i = 0; i < t.spans.size(); ++i) {
    if (t.spans[i].op == traces::CollOp::Send && t.spans[i].rank == 0) {
      send = static_cast<int64_t>(i);
      break;
    }
  }
  ASSERT_GE(send, 0);
  tl->select_span(send, true);
  ASSERT_EQ(tl->flow_members().size(), 2u);
  const auto recv = tl->flow_members()[0] == static_cast<uint32_t>(send) ? tl->flow_members()[1]
                                                                         : tl->flow_members()[0];
  EXPECT_EQ(t.spans[recv].op, traces::CollOp::Recv);
  EXPECT_EQ(t.spans[recv].rank, 1);
  EXPECT_EQ(win_->details_model()->value("Flow"), "send rank 0 -> recv rank 1");
  EXPECT_EQ(win_->details_model()->value("Start skew"),
            QString::fromStdString("recv " + orrery::format_duration_ns(0) + " after send"));
}

// Counter tracks follow each rank's lanes, zoom with the timeline, draw their step function
// (the line at a known column sits at the value's height) and give the value under the mouse.
TEST(GuiTimeline, CounterTracksUnderEachRank) {
  traces::Trace t;
  const auto k = t.strings.intern("matmul");
  const auto mem = t.strings.intern("mem.activations");
  const auto loss = t.strings.intern("loss");
  for (int32_t r = 0; r < 2; ++r) {
    traces::Span s;
    s.rank = r;
    s.name = k;
    s.start_ns = 0;
    s.end_ns = 1'000;
    t.spans.push_back(s);
  }
  t.counters.push_back({0, mem, 0, 0});
  t.counters.push_back({0, mem, 400, 64 << 20});
  t.counters.push_back({0, mem, 700, 16 << 20});
  t.counters.push_back({1, loss, 0, 4.0});
  t.counters.push_back({1, loss, 500, 2.5});
  t.sort_spans();
  TimelineView tl;
  tl.resize(TimelineView::kLabelWidth + 500 + tl.verticalScrollBar()->sizeHint().width(), 400);
  tl.show();
  ASSERT_TRUE(QTest::qWaitForWindowExposed(&tl));
  tl.set_document(make_document(std::move(t), "counters.db"));
  tl.zoom_to(0, 1'000);
  // rank 0, its lane, its counter; rank 1, its lane, its counter.
  const auto& rows = tl.lane_layout().rows();
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[2].kind, LayoutRow::Kind::Counter);
  EXPECT_EQ(rows[2].label, "mem.activations");
  EXPECT_EQ(rows[5].kind, LayoutRow::Kind::Counter);
  EXPECT_EQ(rows[5].label, "loss");
  const auto& c0 = tl.document()->counters[0];
  const double y0 = TimelineView::kAxisHeight + rows[2].y;
  const QImage img = tl.viewport()->grab().toImage();
  ASSERT_TRUE(img.save(kDir + "/gui_counter_tracks.png"));
  // At t = 550 the value is 64 MiB (the maximum: the top of the chart), at t = 850 16 MiB.
  auto x_at = [&](int64_t ns) {
    return TimelineView::kLabelWidth + static_cast<int>(std::floor(tl.mapping().x_of(ns)));
  };
  const int y_top = static_cast<int>(TimelineView::counter_y(c0, 64 << 20, y0, rows[2].height));
  const int y_low = static_cast<int>(TimelineView::counter_y(c0, 16 << 20, y0, rows[2].height));
  EXPECT_LT(y_top, y_low);
  EXPECT_EQ(img.pixelColor(x_at(550), y_top), palette::kCounterLine);
  EXPECT_EQ(img.pixelColor(x_at(850), y_low), palette::kCounterLine);
  EXPECT_EQ(img.pixelColor(x_at(850), y_top), palette::kLaneOdd);  // above the line: background
  EXPECT_EQ(img.pixelColor(x_at(850), y_low + 3), palette::kCounterFill);  // below it: the area
  // Hover: the value in effect.
  const QPoint over_loss(x_at(600), static_cast<int>(TimelineView::kAxisHeight + rows[5].y + 10));
  const auto hit = tl.counter_at_point(over_loss);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->value, 2.5);
  EXPECT_TRUE(tl.tooltip_at(over_loss).contains("<b>loss</b></td><td>2.5<"))
      << tl.tooltip_at(over_loss).toStdString();
  const QPoint over_mem(x_at(550), y_top);
  EXPECT_TRUE(
      tl.tooltip_at(over_mem).contains(QString::fromStdString(orrery::format_bytes(64 << 20))));
  // Zooming moves the step with the timeline.
  tl.zoom_to(600, 1'000);
  const QImage zoomed = tl.viewport()->grab().toImage();
  EXPECT_EQ(zoomed.pixelColor(x_at(850), y_low), palette::kCounterLine);
  EXPECT_EQ(zoomed.pixelColor(x_at(650), y_top), palette::kCounterLine);
  // Switched off, the tracks go.
  tl.set_counters_visible(false);
  EXPECT_EQ(tl.lane_layout().rows().size(), 4u);
}

// A shift-drag-style range over the whole trace fills the by-name table: per layer forward, one
// span per rank and step of forward_ns; the table sorts by any column through its proxy.
TEST_F(GuiApp, RangeSelectionListsTheSpansByName) {
  const traces::SynthOptions o = small_opts();
  open(write_synth("gui_range_names.db", o));
  TimelineView* tl = win_->timeline();
  int ready = 0;
  auto c = QObject::connect(win_.get(), &MainWindow::rangeMetricsReady, [&] { ++ready; });
  win_->select_range(tl->index()->start_ns(), tl->index()->end_ns());
  ASSERT_TRUE(wait_for([&] { return ready > 0; }));
  QObject::disconnect(c);
  const auto& rows = win_->range_names_model()->rows();
  const NameStats* fwd = nullptr;
  for (const auto& r : rows)
    if (r.name == "layers.1.forward") fwd = &r;
  ASSERT_NE(fwd, nullptr);
  EXPECT_EQ(fwd->count, o.ranks * o.steps);
  EXPECT_EQ(fwd->total_ns, int64_t(o.ranks) * o.steps * o.forward_ns);
  EXPECT_EQ(fwd->max_ns, o.forward_ns);
  const double len = static_cast<double>(tl->index()->end_ns() - tl->index()->start_ns());
  EXPECT_DOUBLE_EQ(fwd->share, static_cast<double>(fwd->total_ns) / (len * o.ranks));
  // The view: largest total first ("step" phases cover every rank's whole run).
  QTableView* v = win_->range_names_view();
  EXPECT_EQ(v->model()->index(0, RangeByNameModel::kName).data().toString(), "step");
  // Sorted by count, ascending: a name with the fewest spans (one per rank and step) first.
  v->sortByColumn(RangeByNameModel::kCount, Qt::AscendingOrder);
  EXPECT_EQ(v->model()->index(0, RangeByNameModel::kCount).data(Qt::UserRole).toLongLong(),
            o.ranks * o.steps);
  v->sortByColumn(RangeByNameModel::kCount, Qt::DescendingOrder);
  // The all-reduces: layers / layers_per_bucket per rank and step.
  EXPECT_EQ(v->model()->index(0, RangeByNameModel::kName).data().toString(), "all_reduce");
  EXPECT_EQ(v->model()->index(0, RangeByNameModel::kCount).data(Qt::UserRole).toLongLong(),
            o.ranks * o.steps * (o.layers / o.layers_per_bucket));
}

// A search frames every match in the timeline and says how many there are and their total time.
TEST_F(GuiApp, SearchHighlightsEveryMatchWithCountAndTotal) {
  const traces::SynthOptions o = small_opts();
  open(write_synth("gui_search_hl.db", o));
  TimelineView* tl = win_->timeline();
  const auto& t = tl->document()->trace;
  win_->search("layers.1.forward");
  EXPECT_EQ(win_->search_status().toStdString(),
            std::to_string(o.ranks * o.steps) + " matches, " +
                orrery::format_duration_ns(static_cast<double>(o.ranks * o.steps * o.forward_ns)));
  // Zoomed on step 0's forward pass: rank 1's match is framed, its neighbour is not.
  int64_t m = -1, other = -1;
  for (size_t i = 0; i < t.spans.size(); ++i) {
    const auto& s = t.spans[i];
    if (s.rank == 1 && s.step == 0 && t.name_of(s) == "layers.1.forward")
      m = static_cast<int64_t>(i);
    if (s.rank == 1 && s.step == 0 && t.name_of(s) == "layers.2.forward")
      other = static_cast<int64_t>(i);
  }
  ASSERT_GE(m, 0);
  ASSERT_GE(other, 0);
  EXPECT_TRUE(tl->is_highlighted(static_cast<uint32_t>(m)));
  EXPECT_FALSE(tl->is_highlighted(static_cast<uint32_t>(other)));
  tl->zoom_to(t.spans[static_cast<size_t>(m)].start_ns - 2'000'000,
              t.spans[static_cast<size_t>(other)].end_ns + 2'000'000);
  QApplication::processEvents();
  const QImage img = tl->viewport()->grab().toImage();
  ASSERT_TRUE(img.save(kDir + "/gui_search_highlight.png"));
  const auto rm = tl->span_rect(m), ro = tl->span_rect(other);
  ASSERT_TRUE(rm && ro);
  const int cy = static_cast<int>(rm->center().y());
  EXPECT_EQ(img.pixelColor(static_cast<int>(rm->left()) + 1, cy), palette::kSearchHit);
  EXPECT_NE(img.pixelColor(static_cast<int>(ro->left()) + 1, cy), palette::kSearchHit);
  win_->search("");
  EXPECT_FALSE(tl->is_highlighted(static_cast<uint32_t>(m)));
  EXPECT_EQ(win_->search_status(), "");
}

// The breakdown chart of 64 ranks labels every k-th rank in full instead of 64 elided "..."
// labels: no text in the chart ends in an ellipsis, and the rank labels are 0, k, 2k, ...
TEST_F(GuiApp, ChartsLabelEveryKthRankAt64Ranks) {
  // The step: ceil(64 / k) labels of 14 px with 7 px gaps in 600 px (28 fit): k = 4.
  EXPECT_EQ(ChartsView::rank_label_step(64, 600, 14), 4);
  EXPECT_EQ(ChartsView::rank_label_step(4, 600, 7), 1);
  // 1024 ranks, 28 px labels in 500 px: 11 fit; 64 gives 16 labels, 100 gives 11.
  EXPECT_EQ(ChartsView::rank_label_step(1024, 500, 28), 100);

  auto o = small_opts();
  o.ranks = 64;
  o.steps = 2;
  o.layers = 2;
  o.layers_per_bucket = 1;
  open(write_synth("e2e_charts64.db", o));
  win_->show_tab("charts");
  QTest::qWait(50);
  ASSERT_EQ(win_->charts()->breakdown_categories(), 64);
  const int k = win_->charts()->rank_step();
  EXPECT_GT(k, 1);
  const QStringList texts = win_->charts()->breakdown_axis_texts();
  std::vector<int> ranks;
  for (const QString& t : texts) {
    EXPECT_FALSE(t.endsWith(QString::fromUtf8("\u2026")) || t.endsWith("...")) << t.toStdString();
    bool ok = false;
    const int v = t.toInt(&ok);
    if (ok) ranks.push_back(v);
  }
  std::sort(ranks.begin(), ranks.end());
  std::vector<int> want;
  for (int r = 0; r < 64; r += k) want.push_back(r);
  // The value axis's labels are numbers too: every expected rank label is there.
  for (int r : want) EXPECT_TRUE(std::count(ranks.begin(), ranks.end(), r) >= 1) << r;
  ASSERT_TRUE(win_->grab().save(kDir + "/gui_e2e_charts64.png"));
}

// Navigation without a prior click: G and a step number frame that step across ranks; M sets a
// marker at the centre (the mouse is off the track), ] and [ walk the markers, M on one removes
// it; ? shows the overlay of every key; the wheel scrolls the lanes and Ctrl+wheel zooms, swapped
// by View > Wheel zooms.
TEST_F(GuiApp, GoToStepMarkersShortcutOverlayAndWheel) {
  auto o = small_opts();
  o.ranks = 16;
  open(write_synth("e2e_nav.db", o));
  ASSERT_TRUE(QTest::qWaitForWindowActive(win_.get()));
  TimelineView* tl = win_->timeline();
  auto press = [&](Qt::Key k, Qt::KeyboardModifiers mods = Qt::NoModifier) {
    QWidget* f = QApplication::focusWidget();
    QTest::keyClick(f ? f : win_.get(), k, mods);
  };
  // Step 1's window across ranks, from the spans.
  const auto& tr = tl->document()->trace;
  int64_t s0 = INT64_MAX, s1 = INT64_MIN;
  for (const auto& s : tr.spans) {
    if (s.step != 1) continue;
    s0 = std::min(s0, s.start_ns);
    s1 = std::max(s1, s.end_ns);
  }
  press(Qt::Key_G);
  auto* box = win_->findChild<QSpinBox*>("goToStep");
  ASSERT_TRUE(box);
  ASSERT_EQ(QApplication::focusWidget(), box);
  QTest::keyClicks(box, "1");
  press(Qt::Key_Return);
  // zoom_to's margin: a twentieth of the window each side.
  const int64_t margin = (s1 - s0) / 20;
  EXPECT_NEAR(tl->mapping().ns_per_px,
              static_cast<double>(s1 - s0 + 2 * margin) / tl->track_width(), 1e-6);
  EXPECT_NEAR(static_cast<double>(tl->visible_start_ns()), static_cast<double>(s0 - margin), 1.0);
  EXPECT_EQ(tl->step_at_center(), 1);
  EXPECT_EQ(QApplication::focusWidget(), tl);
  // The step's band at the bottom of the axis, in step 1's (odd) shade, past its label; step 0's
  // and step 2's, in the even shade, in the margins either side.
  {
    const QImage axis = tl->viewport()->grab().toImage();
    const int yb = TimelineView::kAxisHeight - 3;
    auto x_at = [&](int64_t t) {
      return TimelineView::kLabelWidth + static_cast<int>(tl->mapping().x_of(t));
    };
    EXPECT_EQ(axis.pixelColor(x_at(s1) - 5, yb), palette::kStepBandOdd);
    EXPECT_EQ(axis.pixelColor(x_at(s0) - 5, yb), palette::kStepBandEven);
    EXPECT_EQ(axis.pixelColor(x_at(s1) + 5, yb), palette::kStepBandEven);
  }
  // A step the trace lacks leaves the view and says which steps there are.
  const double npp = tl->mapping().ns_per_px;
  press(Qt::Key_G);
  QTest::keyClicks(box, "9");
  press(Qt::Key_Return);
  EXPECT_EQ(tl->mapping().ns_per_px, npp);
  EXPECT_EQ(win_->statusBar()->currentMessage(), "step 9 is not in the trace (steps 0 to 2)");

  // Markers: at the centre, then an eighth of the track later.
  const int64_t m1 = tl->mapping().t_floor(tl->track_width() / 2.0);
  press(Qt::Key_M);
  ASSERT_EQ(tl->markers().size(), 1u);
  EXPECT_EQ(tl->markers().times()[0], m1);
  press(Qt::Key_D);
  const int64_t m2 = tl->mapping().t_floor(tl->track_width() / 2.0);
  press(Qt::Key_M);
  ASSERT_EQ(tl->markers().size(), 2u);
  EXPECT_EQ(tl->markers().times()[1], m2);
  auto centre = [&] { return static_cast<double>(tl->mapping().t_floor(tl->track_width() / 2.0)); };
  press(Qt::Key_BracketRight);  // none after m2: wraps to m1
  EXPECT_NEAR(centre(), static_cast<double>(m1), npp + 1);
  press(Qt::Key_BracketLeft);  // none before m1: wraps to m2
  EXPECT_NEAR(centre(), static_cast<double>(m2), npp + 1);
  press(Qt::Key_M);  // on m2: removes it
  ASSERT_EQ(tl->markers().size(), 1u);
  EXPECT_EQ(tl->markers().times()[0], m1);

  // The overlay lists every key of the menus and the wheel's gestures.
  press(Qt::Key_Question);
  EXPECT_TRUE(win_->shortcut_overlay_visible());
  std::map<QString, QString> keys;
  for (const auto& [k, what] : win_->shortcut_entries()) keys[what] = k;
  EXPECT_EQ(keys["Go to step"], "G");
  EXPECT_EQ(keys["Zoom in"], "W");
  EXPECT_EQ(keys["Next marker"], "]");
  EXPECT_EQ(keys["Keyboard shortcuts"], "?");
  EXPECT_EQ(keys["Zoom around the mouse"], "Ctrl+Wheel");
  ASSERT_TRUE(win_->grab().save(kDir + "/gui_e2e_shortcuts.png"));
  press(Qt::Key_Escape);
  EXPECT_FALSE(win_->shortcut_overlay_visible());
  press(Qt::Key_Question);
  EXPECT_TRUE(win_->shortcut_overlay_visible());
  press(Qt::Key_Question);
  EXPECT_FALSE(win_->shortcut_overlay_visible());

  // The wheel: scrolls by half its angle (120 px for 240), Ctrl+wheel zooms.
  QWidget* vp = tl->viewport();
  const QPoint at(TimelineView::kLabelWidth + 300, 300);
  auto* vbar = tl->verticalScrollBar();
  ASSERT_GE(vbar->maximum(), 240);
  vbar->setValue(0);
  const double npp2 = tl->mapping().ns_per_px;
  send_wheel(vp, at, -240);
  EXPECT_EQ(vbar->value(), 120);
  EXPECT_EQ(tl->mapping().ns_per_px, npp2);
  send_wheel(vp, at, 240, Qt::ControlModifier);
  EXPECT_NEAR(tl->mapping().ns_per_px, npp2 / std::pow(1.0015, 240), npp2 * 1e-9);
  EXPECT_EQ(vbar->value(), 120);
  // Swapped: the wheel zooms and Ctrl+wheel scrolls, in the compare panes too, and it is kept.
  win_->wheel_zooms_action()->trigger();
  EXPECT_TRUE(win_->compare()->view_b()->wheel_zooms());
  EXPECT_TRUE(QSettings().value("timeline/wheelZooms").toBool());
  const double npp3 = tl->mapping().ns_per_px;
  send_wheel(vp, at, -240);
  EXPECT_NEAR(tl->mapping().ns_per_px, npp3 * std::pow(1.0015, 240), npp3 * 1e-9);
  send_wheel(vp, at, 240, Qt::ControlModifier);
  EXPECT_EQ(vbar->value(), 0);
}

// Compare's per-op table: the synth's closed forms (a layer's backward is 2 ms in A and 2.5 ms in
// B, once per rank and step); a click on its row selects that op in step 0
// (the aligned step) in both panes and frames both.
TEST_F(GuiApp, CompareOpTableJumpsToTheOpInBothPanes) {
  auto oa = small_opts();
  auto ob = small_opts();
  ob.backward_ns = 2'500'000;
  open(write_synth("e2e_ops_a.db", oa));
  open(write_synth("e2e_ops_b.db", ob, 5'000'000));
  ASSERT_TRUE(wait_for([&] { return win_->compare()->op_model()->rowCount() > 0; }));
  win_->show_tab("compare");
  QTest::qWait(20);
  const auto* m = win_->compare()->op_model();
  int row = -1;
  for (int r = 0; r < m->rowCount(); ++r) {
    if (m->index(r, OpDiffModel::kName).data().toString() == "layers.2.backward") row = r;
  }
  ASSERT_GE(row, 0);
  EXPECT_EQ(m->index(row, OpDiffModel::kA).data(Qt::UserRole).toLongLong(), 2'000'000);
  EXPECT_EQ(m->index(row, OpDiffModel::kB).data(Qt::UserRole).toLongLong(), 2'500'000);
  EXPECT_EQ(m->index(row, OpDiffModel::kDiff).data(Qt::UserRole).toLongLong(), 500'000);
  EXPECT_DOUBLE_EQ(m->index(row, OpDiffModel::kRatio).data(Qt::UserRole).toDouble(), 1.25);
  // Largest |B - A| first.
  for (int r = 1; r < m->rowCount(); ++r) {
    EXPECT_GE(std::abs(m->index(r - 1, OpDiffModel::kDiff).data(Qt::UserRole).toLongLong()),
              std::abs(m->index(r, OpDiffModel::kDiff).data(Qt::UserRole).toLongLong()));
  }
  QTableView* table = win_->compare()->op_table();
  table->scrollTo(m->index(row, 0));
  const QRect cell = table->visualRect(m->index(row, OpDiffModel::kName));
  QTest::mouseClick(table->viewport(), Qt::LeftButton, Qt::NoModifier, cell.center());
  QTest::qWait(20);
  for (TimelineView* v : {win_->compare()->view_a(), win_->compare()->view_b()}) {
    const int64_t sel = v->selected_span();
    ASSERT_GE(sel, 0);
    const auto& s = v->document()->trace.spans[static_cast<size_t>(sel)];
    EXPECT_EQ(v->document()->trace.name_of(s), "layers.2.backward");
    EXPECT_EQ(s.step, 0);
    EXPECT_GE(v->point_of_span(sel).x(), 0);  // on screen
  }
  ASSERT_TRUE(win_->grab().save(kDir + "/gui_e2e_compare_ops.png"));
}

// P shows the critical path of the selected span's step: with rank 2 loading its data 300 us
// late, rank 2 arrives last at the all-reduces, so the path runs through rank 2 and ends at the
// step's end; its spans are outlined; P again hides it.
TEST_F(GuiApp, CriticalPathOfAStepOnDemand) {
  auto o = small_opts();
  o.steps = 2;
  o.straggler_rank = 2;
  o.straggler_delay_ns = 300'000;
  open(write_synth("e2e_critical.db", o));
  ASSERT_TRUE(QTest::qWaitForWindowActive(win_.get()));
  TimelineView* tl = win_->timeline();
  const auto& tr = tl->document()->trace;
  int64_t pick = -1;
  for (size_t i = 0; i < tr.spans.size(); ++i) {
    if (tr.spans[i].step == 1 && tr.spans[i].rank == 0 && tr.name_of(tr.spans[i]) == "optimizer")
      pick = static_cast<int64_t>(i);
  }
  ASSERT_GE(pick, 0);
  tl->select_span(pick);
  QWidget* f = QApplication::focusWidget();
  QTest::keyClick(f ? f : win_.get(), Qt::Key_P);
  const auto& shown = tl->critical_path_shown();
  ASSERT_FALSE(shown.empty());
  EXPECT_EQ(shown.step, 1);
  const auto want = critical_path(tr, 1);
  ASSERT_EQ(shown.links.size(), want.links.size());
  for (size_t k = 0; k < want.links.size(); ++k) EXPECT_EQ(shown.links[k].span, want.links[k].span);
  bool through_straggler = false;
  for (const auto& l : shown.links) through_straggler |= tr.spans[l.span].rank == 2;
  EXPECT_TRUE(through_straggler);
  EXPECT_EQ(shown.end_ns, find_step(tl->document()->steps, 1)->end_ns);
  EXPECT_TRUE(win_->statusBar()->currentMessage().startsWith("critical path of step 1: "))
      << win_->statusBar()->currentMessage().toStdString();
  // Its links are listed under the details; a click on one selects its span.
  const auto* cm = win_->critical_path_model();
  ASSERT_EQ(cm->rowCount(), static_cast<int>(want.links.size()));
  auto* cview = win_->findChild<QTableView*>("criticalPathView");
  ASSERT_TRUE(cview);
  EXPECT_TRUE(cview->isVisible());
  const QRect c0 = cview->visualRect(cm->index(0, CriticalPathModel::kName));
  QTest::mouseClick(cview->viewport(), Qt::LeftButton, Qt::NoModifier, c0.center());
  EXPECT_EQ(tl->selected_span(), static_cast<int64_t>(want.links.front().span));
  // The last span's outline, in the path's colour.
  tl->zoom_to(shown.start_ns, shown.end_ns);
  QTest::qWait(20);
  const auto r = tl->span_rect(shown.links.back().span);
  ASSERT_TRUE(r);
  const QImage img = tl->viewport()->grab().toImage();
  EXPECT_EQ(img.pixelColor(static_cast<int>(r->center().x()), static_cast<int>(r->top())),
            palette::kCriticalPath);
  ASSERT_TRUE(win_->grab().save(kDir + "/gui_e2e_critical_path.png"));
  f = QApplication::focusWidget();
  QTest::keyClick(f ? f : win_.get(), Qt::Key_P);
  EXPECT_TRUE(tl->critical_path_shown().empty());
  EXPECT_EQ(cm->rowCount(), 0);
  EXPECT_FALSE(cview->isVisible());
}

// The screenshot options that show one feature: a flow, a counter track, the compare op table and
// the critical path render and exit 0; an unknown counter or op exits 2 naming the option.
TEST(GuiCli, ScreenshotOptionsShowAFlowACounterAndTheOpTable) {
  const QString a = write_synth("cli_feat_a.db", small_opts());
  auto ob = small_opts();
  ob.backward_ns = 2'500'000;
  const QString b = write_synth("cli_feat_b.db", ob);
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  env.insert("QT_QPA_PLATFORM", "offscreen");
  env.insert("XDG_CONFIG_HOME", kDir + "/xdg");
  auto run = [&](const QStringList& args, int want_rc, const QString& want_err = {}) {
    const QString png = kDir + "/cli_feat.png";
    QFile::remove(png);
    QProcess p;
    p.setProcessEnvironment(env);
    p.start(ORRERY_GUI_BIN, QStringList{"--screenshot", png, "--size", "1000x700"} + args);
    ASSERT_TRUE(p.waitForFinished(60000));
    const QString err = QString::fromLocal8Bit(p.readAllStandardError());
    EXPECT_EQ(p.exitCode(), want_rc) << args.join(' ').toStdString() << ": " << err.toStdString();
    EXPECT_EQ(QFileInfo::exists(png), want_rc == 0) << args.join(' ').toStdString();
    if (!want_err.isEmpty()) {
      EXPECT_TRUE(err.contains(want_err)) << err.toStdString();
    }
  };
  run({"--flow", "all_reduce", a}, 0);
  run({"--step", "1", "--counter", "mem.activations", a}, 0);
  run({"--step", "1", "--critical-path", a}, 0);
  run({"--compare-op", "top", a, b}, 0);
  run({"--compare-op", "layers.2.backward", a, b}, 0);
  run({"--counter", "mem.nothing", a}, 2, "--counter: no counter track named 'mem.nothing'");
  run({"--compare-op", "nope", a, b}, 2, "--compare-op: no op named 'nope'");
  run({"--step", "9", a}, 2, "--step: no step '9'");
}
