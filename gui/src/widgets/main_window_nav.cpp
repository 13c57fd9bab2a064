// The main window's navigation: go to step N, markers, the shortcut overlay ("?") and the wheel's
// mode (see main_window.hpp).
#include <QAction>
#include <QApplication>
#include <QKeyEvent>
#include <QLabel>
#include <QMenu>
#include <QMenuBar>
#include <QSettings>
#include <QSignalBlocker>
#include <QSpinBox>
#include <QStatusBar>
#include <QTableView>
#include <QToolBar>
#include <functional>
#include <set>

#include "orrery/common/format.hpp"
#include "orrery/gui/widgets/compare_view.hpp"
#include "orrery/gui/widgets/main_window.hpp"
#include "orrery/gui/widgets/timeline_view.hpp"

namespace orrery::gui {
namespace {

const char* kWheelZoomsKey = "timeline/wheelZooms";

// Escapes text for the overlay's rich text.
QString esc(const QString& s) { return s.toHtmlEscaped(); }

}  // namespace

void MainWindow::build_navigation(QMenu* view, QToolBar* tb) {
  // Go to step N: G puts the focus in the toolbar's step box; Enter there frames the step across
  // ranks and gives the keys back to the timeline.
  view->addSeparator();
  step_box_ = new QSpinBox(tb);
  step_box_->setObjectName("goToStep");
  step_box_->setRange(0, 1'000'000);
  step_box_->setPrefix(tr("step "));
  step_box_->setToolTip(tr("Go to step (G, then the number and Enter)"));
  step_box_->setKeyboardTracking(false);
  tb->addWidget(step_box_);
  connect(step_box_, &QSpinBox::editingFinished, this, [this] {
    if (!step_box_->hasFocus()) return;  // focus lost without Enter: nothing to do
    go_to_step(step_box_->value());
    if (TimelineView* t = key_target()) t->setFocus();
  });
  auto* go = view->addAction(tr("&Go to step..."), this, [this] {
    step_box_->setFocus();
    step_box_->selectAll();
  });
  go->setShortcut(QKeySequence(Qt::Key_G));
  go->setShortcutContext(Qt::WindowShortcut);

  // Markers: on the timeline tab's view (a compare pane's come from its keys).
  QMenu* marks = view->addMenu(tr("&Markers"));
  auto key_action = [this, marks](const QString& text, int key) {
    auto* a = marks->addAction(text, this, [this, key] {
      if (TimelineView* t = key_target()) t->navigate(key);
    });
    a->setShortcut(QKeySequence(key));
    a->setShortcutContext(Qt::WindowShortcut);
  };
  key_action(tr("Set or remove a &marker at the cursor"), Qt::Key_M);
  key_action(tr("&Next marker"), Qt::Key_BracketRight);
  key_action(tr("&Previous marker"), Qt::Key_BracketLeft);
  marks
      ->addAction(tr("&Clear markers"), this,
                  [this] {
                    if (TimelineView* t = key_target()) t->clear_markers();
                  })
      ->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_M));
  marks->addSeparator();
  marker_list_ = marks->addMenu(tr("&Jump to"));
  connect(timeline_, &TimelineView::markersChanged, this, &MainWindow::rebuild_marker_menu);
  rebuild_marker_menu();

  // The wheel: scrolls (Perfetto's way, the default) or zooms; the other with Ctrl.
  wheel_action_ = view->addAction(tr("&Wheel zooms (Ctrl+wheel scrolls)"));
  wheel_action_->setCheckable(true);
  connect(wheel_action_, &QAction::toggled, this, [this](bool zooms) {
    for (TimelineView* v : {timeline_, compare_->view_a(), compare_->view_b()})
      v->set_wheel_zooms(zooms);
    QSettings().setValue(kWheelZoomsKey, zooms);
  });
  wheel_action_->setChecked(QSettings().value(kWheelZoomsKey, false).toBool());

  // The critical path of the step (of the selected span, else the one at the view's centre).
  auto* crit =
      view->addAction(tr("&Critical path of the step"), this, &MainWindow::toggle_critical_path);
  crit->setShortcut(QKeySequence(Qt::Key_P));
  crit->setShortcutContext(Qt::WindowShortcut);

  // The overlay that lists every key: "?" shows it, "?", Escape or a click hides it.
  overlay_ = new QLabel(this);
  overlay_->setObjectName("shortcutOverlay");
  overlay_->setTextFormat(Qt::RichText);
  overlay_->setAutoFillBackground(true);
  overlay_->setFrameShape(QFrame::Box);
  overlay_->setMargin(16);
  overlay_->setStyleSheet(
      "QLabel#shortcutOverlay { background: rgba(32, 33, 36, 235); color: "
      "white; border: 1px solid #5f6368; }");
  overlay_->hide();
  overlay_->installEventFilter(this);
  auto* help =
      view->addAction(tr("&Keyboard shortcuts"), this, &MainWindow::toggle_shortcut_overlay);
  help->setShortcut(QKeySequence(Qt::Key_Question));
  help->setShortcutContext(Qt::WindowShortcut);
}

bool MainWindow::go_to_step(int step) {
  TimelineView* t = key_target();
  if (!t) t = timeline_;
  if (t->go_to_step(step)) {
    statusBar()->clearMessage();
    const QSignalBlocker quiet(step_box_);
    step_box_->setValue(step);
    return true;
  }
  const auto d = t->document();
  QString why = tr("step %1 is not in the trace").arg(step);
  if (d && !d->steps.empty()) {
    why += tr(" (steps %1 to %2)").arg(d->steps.front().step).arg(d->steps.back().step);
  }
  statusBar()->showMessage(why, 5000);
  return false;
}

bool MainWindow::toggle_critical_path() {
  TimelineView* t = key_target();
  if (!t || !t->document()) return false;
  if (!t->critical_path_shown().empty()) {
    t->set_critical_path({});
    critical_.set_path(nullptr, {});
    crit_box_->hide();
    statusBar()->clearMessage();
    return false;
  }
  const auto& sel = t->shown().trace;  // a zoomed trace's selection is in its loaded window
  int32_t step = t->selected_span() >= 0 ? sel.spans[static_cast<size_t>(t->selected_span())].step
                                         : t->step_at_center();
  if (step < 0) step = t->step_at_center();
  if (t->document()->zoomed()) {
    // Its spans are in the file: zoomed to the step, the timeline loads all of them.
    const auto w = find_step(t->document()->steps, step);
    if (!w) {
      statusBar()->showMessage(tr("no step here: select a span of a step, or centre one"), 5000);
      return false;
    }
    t->zoom_to(w->start_ns, w->end_ns);
    t->ensure_window();
    if (!t->window_loaded()) {
      statusBar()->showMessage(
          tr("step %1 holds more spans than the timeline loads at once: its critical path needs "
             "them all")
              .arg(step),
          8000);
      return false;
    }
  }
  const auto& tr_ = t->shown().trace;
  CriticalPath path = critical_path(tr_, step);
  if (path.empty()) {
    statusBar()->showMessage(tr("no step here: select a span of a step, or centre one"), 5000);
    return false;
  }
  std::set<int32_t> ranks;
  for (const auto& l : path.links) ranks.insert(tr_.spans[l.span].rank);
  statusBar()->showMessage(
      tr("critical path of step %1: %2 spans on %3 ranks, %4 long; its collectives and receives "
         "waited %5")
          .arg(step)
          .arg(path.links.size())
          .arg(ranks.size())
          .arg(QString::fromStdString(format_duration_ns(static_cast<double>(path.length_ns()))))
          .arg(QString::fromStdString(format_duration_ns(static_cast<double>(path.wait_ns)))));
  critical_.set_path(&tr_, path);
  crit_box_->show();
  t->set_critical_path(std::move(path));
  return true;
}

void MainWindow::rebuild_marker_menu() {
  marker_list_->clear();
  const auto& times = timeline_->markers().times();
  marker_list_->setEnabled(!times.empty());
  const int64_t zero = timeline_->index() ? timeline_->index()->start_ns() : 0;
  for (size_t i = 0; i < times.size(); ++i) {
    const int64_t t = times[i];
    marker_list_->addAction(
        tr("marker %1 at %2")
            .arg(i + 1)
            .arg(QString::fromStdString(format_duration_ns(static_cast<double>(t - zero)))),
        this, [this, t] {
          show_tab("timeline");
          timeline_->center_on(t);
        });
  }
}

std::vector<std::pair<QString, QString>> MainWindow::shortcut_entries() const {
  std::vector<std::pair<QString, QString>> out;
  std::set<QString> seen;
  // Every menu's actions with a key, in menu order (submenus included).
  std::function<void(const QMenu*)> walk = [&](const QMenu* m) {
    for (QAction* a : m->actions()) {
      if (a->menu()) {
        walk(a->menu());
        continue;
      }
      if (a->shortcuts().isEmpty()) continue;
      QStringList keys;
      for (const auto& k : a->shortcuts()) keys << k.toString(QKeySequence::NativeText);
      const QString what = a->text().remove('&').remove("...");
      if (!seen.insert(keys.join(", ") + what).second) continue;
      out.emplace_back(keys.join(", "), what);
    }
  };
  for (QAction* a : menuBar()->actions()) {
    if (a->menu()) walk(a->menu());
  }
  out.emplace_back(QKeySequence(QKeySequence::Find).toString(QKeySequence::NativeText),
                   tr("Search spans by name"));
  out.emplace_back(tr("Enter, F3 / Shift+F3"), tr("Next / previous match"));
  out.emplace_back(tr("Escape"), tr("Clear the range and the selection"));
  const bool zooms = wheel_action_->isChecked();
  out.emplace_back(tr("Wheel"), zooms ? tr("Zoom around the mouse") : tr("Scroll the lanes"));
  out.emplace_back(tr("Ctrl+Wheel"), zooms ? tr("Scroll the lanes") : tr("Zoom around the mouse"));
  out.emplace_back(tr("Shift+Wheel, drag"), tr("Pan"));
  out.emplace_back(tr("Shift+drag"), tr("Select a range (its metrics and spans by name)"));
  out.emplace_back(tr("Click, double-click"), tr("Select a span, zoom to it"));
  return out;
}

void MainWindow::toggle_shortcut_overlay() {
  if (overlay_->isVisible()) {
    overlay_->hide();
    return;
  }
  QString html = tr("<h3>Keyboard and mouse</h3><table cellspacing='4'>");
  for (const auto& [keys, what] : shortcut_entries()) {
    html += QString("<tr><td><b>%1</b></td><td>&nbsp;&nbsp;%2</td></tr>").arg(esc(keys), esc(what));
  }
  html += tr("</table><p>Press ? or Escape to close.</p>");
  overlay_->setText(html);
  overlay_->adjustSize();
  overlay_->move((width() - overlay_->width()) / 2,
                 std::max(0, (height() - overlay_->height()) / 2));
  overlay_->raise();
  overlay_->show();
  overlay_->setFocus();
}

bool MainWindow::shortcut_overlay_visible() const { return overlay_->isVisible(); }

bool MainWindow::eventFilter(QObject* watched, QEvent* e) {
  if (watched == overlay_) {
    if (e->type() == QEvent::MouseButtonPress ||
        (e->type() == QEvent::KeyPress && static_cast<QKeyEvent*>(e)->key() == Qt::Key_Escape)) {
      overlay_->hide();
      return true;
    }
  }
  return QMainWindow::eventFilter(watched, e);
}

}  // namespace orrery::gui
