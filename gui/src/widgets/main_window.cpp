// The main window (see main_window.hpp).
#include "orrery/gui/widgets/main_window.hpp"

#include <QApplication>
#include <QCloseEvent>
#include <QComboBox>
#include <QDockWidget>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QPainter>
#include <QProgressBar>
#include <QScreen>
#include <QSettings>
#include <QShortcut>
#include <QSortFilterProxyModel>
#include <QSplitter>
#include <QStatusBar>
#include <QTabWidget>
#include <QTableView>
#include <QToolBar>
#include <QToolButton>
#include <QTreeView>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>
#include <algorithm>

#include "orrery/common/error.hpp"
#include "orrery/common/format.hpp"
#include "orrery/gui/palette.hpp"
#include "orrery/gui/widgets/charts_view.hpp"
#include "orrery/gui/widgets/compare_view.hpp"
#include "orrery/gui/widgets/experts_view.hpp"
#include "orrery/gui/widgets/timeline_view.hpp"

namespace orrery::gui {
namespace {

constexpr int kMaxRecent = 10;
const char* kRecentKey = "recentFiles";

// Result of a worker: the document, or the reason it could not be opened.
struct LoadResult {
  std::shared_ptr<TraceDocument> doc;
  QString error;
};

LoadResult load_job(const QString& path, const LoadOptions& o) {
  LoadResult r;
  try {
    r.doc = load_document(path.toStdString(), o);
  } catch (const std::exception& e) {
    r.error = QString::fromUtf8(e.what());
  }
  return r;
}

// A kind's swatch: filled with its colour when the kind is shown (the action's On state), an empty
// grey box when it is switched off (Off), so the legend says which kinds are drawn.
QIcon kind_icon(traces::SpanKind k) {
  QIcon icon;
  for (const bool on : {true, false}) {
    QPixmap pm(14, 14);
    pm.fill(Qt::transparent);
    QPainter p(&pm);
    if (on) p.fillRect(1, 1, 12, 12, palette::kind_color(k));
    p.setPen(on ? palette::kind_icon_border(k) : palette::kKindOff);
    p.drawRect(1, 1, 11, 11);
    p.end();
    icon.addPixmap(pm, QIcon::Normal, on ? QIcon::On : QIcon::Off);
  }
  return icon;
}

QTableView* make_table(QAbstractItemModel* m, QWidget* parent) {
  auto* t = new QTableView(parent);
  t->setModel(m);
  t->verticalHeader()->hide();
  t->verticalHeader()->setDefaultSectionSize(20);
  t->horizontalHeader()->setStretchLastSection(true);
  t->setSelectionBehavior(QAbstractItemView::SelectRows);
  t->setAlternatingRowColors(true);
  t->setWordWrap(false);
  return t;
}

}  // namespace

MainWindow::MainWindow(QWidget* parent) : QMainWindow(parent) {
  setWindowTitle(tr("Orrery"));
  setAcceptDrops(true);
  // 1600x1000, or 90 % of a smaller screen's free area.
  const QRect avail = screen() ? screen()->availableGeometry() : QRect(0, 0, 1600, 1000);
  resize(std::min(1600, avail.width() * 9 / 10), std::min(1000, avail.height() * 9 / 10));

  tabs_ = new QTabWidget(this);
  timeline_ = new TimelineView(tabs_);
  compare_ = new CompareView(tabs_);
  charts_ = new ChartsView(tabs_);
  experts_ = new ExpertsView(tabs_);
  tabs_->addTab(timeline_, tr("Timeline"));
  tabs_->addTab(compare_, tr("Compare"));
  tabs_->addTab(charts_, tr("Charts"));
  tabs_->addTab(experts_, tr("Experts"));
  setCentralWidget(tabs_);

  // The timeline and both compare panes fill the details and range panels, each with its trace.
  for (TimelineView* v : {timeline_, compare_->view_a(), compare_->view_b()}) {
    connect(v, &TimelineView::spanSelected, this,
            [this, v](qint64 span) { on_span_selected(v, span); });
    connect(v, &TimelineView::rangeSelected, this,
            [this, v](qint64 t0, qint64 t1) { on_range_selected(v, t0, t1); });
    connect(v, &TimelineView::rangeCleared, this, [this] {
      ++range_generation_;
      range_metrics_.clear();
      collectives_.set_collectives({});
      range_note_->setText(tr("Shift-drag on the timeline to select a range."));
    });
  }
  connect(&lanes_, &LaneTreeModel::visibilityChanged, this,
          [this] { timeline_->set_hidden_lanes(lanes_.hidden_lanes()); });
  // A zoomed trace's timeline loads spans as it zooms in: the search's matches among them framed.
  // Its span indices change with the window: a critical path on the previous one goes.
  connect(timeline_, &TimelineView::windowChanged, this, [this] {
    highlight_window_matches();
    if (critical_.rowCount() > 0) {
      critical_.set_path(nullptr, {});
      crit_box_->hide();
    }
  });

  build_menus();
  build_docks();

  status_label_ = new QLabel(tr("No trace open"), this);
  // Long paths must not set the window's minimum width.
  status_label_->setMinimumWidth(1);
  status_label_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  progress_ = new QProgressBar(this);
  progress_->setRange(0, 0);  // indeterminate: SQLite gives no progress, the bar says we are busy
  progress_->setMaximumWidth(200);
  progress_->setFormat(tr("loading"));
  progress_->hide();
  statusBar()->addWidget(status_label_, 1);
  statusBar()->addPermanentWidget(progress_);
}

MainWindow::~MainWindow() {
  if (file_search_cancel_) *file_search_cancel_ = true;
  for (auto* j : jobs_) j->waitForFinished();
}

void MainWindow::closeEvent(QCloseEvent* e) {
  if (file_search_cancel_) *file_search_cancel_ = true;
  for (auto* j : jobs_) j->waitForFinished();
  QMainWindow::closeEvent(e);
}

void MainWindow::build_menus() {
  auto* file = menuBar()->addMenu(tr("&File"));
  auto* open = file->addAction(tr("&Open..."), this, [this] {
    const QStringList paths = QFileDialog::getOpenFileNames(
        this, tr("Open trace"), QString(),
        tr("Orrery traces (*.db *.sqlite *.trace);;Sweep CSV (*.csv);;All files (*)"));
    if (!paths.isEmpty()) open_files(paths);
  });
  open->setShortcut(QKeySequence::Open);
  recent_menu_ = file->addMenu(tr("Open &Recent"));
  rebuild_recent_menu();
  file->addAction(tr("&Close"), this, &MainWindow::close_current_document)
      ->setShortcut(QKeySequence::Close);
  file->addSeparator();
  file->addAction(tr("Save &Screenshot..."), this, [this] {
    const QString path =
        QFileDialog::getSaveFileName(this, tr("Save screenshot"), "orrery.png", "PNG (*.png)");
    if (!path.isEmpty()) grab().save(path, "PNG");
  });
  file->addSeparator();
  auto* quit = file->addAction(tr("&Quit"), this, &QWidget::close);
  quit->setShortcut(QKeySequence::Quit);

  auto* view = menuBar()->addMenu(tr("&View"));
  // The navigation keys are window shortcuts, so they work without a click on the timeline; a
  // text field with the focus (the search box, the compare view's step) keeps its typed keys.
  auto nav = [this, view](const QString& text, QList<QKeySequence> keys) {
    const int key = keys.front()[0].key();
    auto* a = view->addAction(text, this, [this, key] {
      if (TimelineView* t = key_target()) t->navigate(key);
    });
    a->setShortcuts(keys);
    a->setShortcutContext(Qt::WindowShortcut);
    return a;
  };
  auto* fit = nav(tr("&Fit all"), {QKeySequence(Qt::Key_0), QKeySequence(Qt::Key_Home)});
  auto* zsel = nav(tr("&Zoom to selection"), {QKeySequence(Qt::Key_F)});
  nav(tr("Zoom &in"), {QKeySequence(Qt::Key_W)});
  nav(tr("Zoom &out"), {QKeySequence(Qt::Key_S)});
  nav(tr("Pan &left"), {QKeySequence(Qt::Key_A)});
  nav(tr("Pan &right"), {QKeySequence(Qt::Key_D)});
  view->addSeparator();
  auto* kinds = view->addMenu(tr("Span &kinds"));

  auto* tb = addToolBar(tr("Main"));
  tb->setObjectName("mainToolbar");
  tb->setMovable(false);
  tb->addAction(open);
  tb->addAction(fit);
  tb->addAction(zsel);
  build_navigation(view, tb);
  tb->addSeparator();
  trace_combo_ = new QComboBox(tb);
  trace_combo_->setMinimumWidth(200);
  trace_combo_->setToolTip(tr("The trace shown in the timeline"));
  tb->addWidget(trace_combo_);
  connect(trace_combo_, &QComboBox::activated, this, &MainWindow::set_current_document);
  group_combo_ = new QComboBox(tb);
  for (auto g : {GroupBy::Rank, GroupBy::DP, GroupBy::TP, GroupBy::PP}) {
    group_combo_->addItem(
        g == GroupBy::Rank ? tr("group: rank") : tr("group: %1 groups").arg(to_string(g)),
        static_cast<int>(g));
  }
  tb->addWidget(group_combo_);
  connect(group_combo_, &QComboBox::currentIndexChanged, this, [this](int i) {
    const auto by = static_cast<GroupBy>(group_combo_->itemData(i).toInt());
    timeline_->set_group_by(by);
    compare_->view_a()->set_group_by(by);
    compare_->view_b()->set_group_by(by);
    if (auto d = current_document()) lanes_.set_trace(timeline_->index(), d->trace.ranks, by);
    lanes_view_->expandToDepth(0);
  });
  tb->addSeparator();
  search_edit_ = new QLineEdit(tb);
  search_edit_->setPlaceholderText(tr("Search spans by name"));
  search_edit_->setClearButtonEnabled(true);
  search_edit_->setMinimumWidth(200);
  search_edit_->setMaximumWidth(280);
  tb->addWidget(search_edit_);
  connect(search_edit_, &QLineEdit::returnPressed, this, [this] {
    if (!has_search() || search_edit_->isModified()) {
      search(search_edit_->text());
      search_edit_->setModified(false);
      // A file's search runs in the background: its first hit is shown when it ends.
      file_jump_pending_ = file_search_running_;
    }
    search_next();
    // With a match shown, the keys go back to the timeline (W/S/A/D, F); with none, the box
    // keeps the focus so the query can be fixed.
    if (search_.size() || file_search_active()) timeline_->setFocus();
  });
  // Clearing the box (its clear button, or deleting the text) clears the search and its label.
  connect(search_edit_, &QLineEdit::textChanged, this, [this](const QString& text) {
    if (!text.isEmpty()) return;
    clear_search();
    search_label_->clear();
    timeline_->set_highlighted({});
  });
  tb->addAction(tr("Previous"), this, &MainWindow::search_previous)
      ->setShortcut(QKeySequence::FindPrevious);
  tb->addAction(tr("Next"), this, &MainWindow::search_next)->setShortcut(QKeySequence::FindNext);
  search_label_ = new QLabel(tb);
  search_label_->setMinimumWidth(90);
  tb->addWidget(search_label_);
  auto* find = new QShortcut(QKeySequence::Find, this);
  connect(find, &QShortcut::activated, this, [this] {
    search_edit_->setFocus();
    search_edit_->selectAll();
  });
  // Kind filters, coloured: they double as the legend (on their own row, so none hides behind the
  // toolbar's overflow button).
  addToolBarBreak();
  auto* kinds_tb = addToolBar(tr("Span kinds"));
  kinds_tb->setObjectName("kindsToolbar");
  kinds_tb->setMovable(false);
  kinds_tb->setToolButtonStyle(Qt::ToolButtonTextBesideIcon);
  kinds_tb->addWidget(new QLabel(tr("  Show: "), kinds_tb));
  for (int k = 0; k < traces::kSpanKindCount; ++k) {
    const auto kind = static_cast<traces::SpanKind>(k);
    auto* a = new QAction(kind_icon(kind), QString::fromUtf8(traces::to_string(kind).data()), this);
    a->setCheckable(true);
    a->setChecked(true);
    a->setToolTip(tr("Show %1 spans").arg(a->text()));
    connect(a, &QAction::toggled, this, [this, kind](bool on) { set_kind_visible(kind, on); });
    kinds->addAction(a);
    kinds_tb->addAction(a);
    kind_actions_[k] = a;
  }
}

void MainWindow::build_docks() {
  // Right: the selected span and the metrics of the selected range.
  auto* right = new QDockWidget(tr("Details"), this);
  right->setObjectName("detailsDock");
  auto* split = new QSplitter(Qt::Vertical, right);
  auto* sel_box = new QWidget(split);
  auto* sel_layout = new QVBoxLayout(sel_box);
  sel_layout->setContentsMargins(4, 4, 4, 4);
  auto* sel_title = new QLabel(tr("<b>Selected span</b>"), sel_box);
  sel_layout->addWidget(sel_title);
  details_view_ = make_table(&details_, sel_box);
  details_view_->setObjectName("detailsView");
  sel_layout->addWidget(details_view_);
  auto* range_box = new QWidget(split);
  auto* range_layout = new QVBoxLayout(range_box);
  range_layout->setContentsMargins(4, 4, 4, 4);
  range_layout->addWidget(
      new QLabel(tr("<b>Range metrics</b> (profiler::compute_metrics)"), range_box));
  range_note_ = new QLabel(tr("Shift-drag on the timeline to select a range."), range_box);
  range_note_->setWordWrap(true);
  range_layout->addWidget(range_note_);
  range_view_ = make_table(&range_metrics_, range_box);
  range_view_->setObjectName("rangeView");
  range_layout->addWidget(range_view_, 3);
  coll_view_ = make_table(&collectives_, range_box);
  coll_view_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  range_layout->addWidget(coll_view_, 2);
  // The range's spans by name, sortable by any column (raw numbers), largest time first.
  auto* names_proxy = new QSortFilterProxyModel(range_box);
  names_proxy->setSourceModel(&range_names_);
  names_proxy->setSortRole(Qt::UserRole);
  names_view_ = make_table(names_proxy, range_box);
  names_view_->setObjectName("rangeNamesView");
  names_view_->setSortingEnabled(true);
  names_view_->sortByColumn(RangeByNameModel::kTotal, Qt::DescendingOrder);
  range_layout->addWidget(names_view_, 3);
  // The critical path's links (P), shown while a path is drawn; a click selects the span.
  crit_box_ = new QWidget(split);
  auto* crit_layout = new QVBoxLayout(crit_box_);
  crit_layout->setContentsMargins(4, 4, 4, 4);
  crit_layout->addWidget(new QLabel(tr("<b>Critical path</b> (P)"), crit_box_));
  crit_view_ = make_table(&critical_, crit_box_);
  crit_view_->setObjectName("criticalPathView");
  crit_view_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  crit_layout->addWidget(crit_view_);
  crit_box_->hide();
  connect(crit_view_, &QTableView::clicked, this, [this](const QModelIndex& i) {
    TimelineView* t = key_target();
    if (!t) t = timeline_;
    t->select_span(critical_.index(i.row(), 0).data(Qt::UserRole).toLongLong(), true);
  });
  split->addWidget(sel_box);
  split->addWidget(range_box);
  split->addWidget(crit_box_);
  split->setSizes({380, 520, 300});
  right->setWidget(split);
  addDockWidget(Qt::RightDockWidgetArea, right);

  // Left: lanes with check boxes (filter by rank group).
  auto* left = new QDockWidget(tr("Lanes"), this);
  left->setObjectName("lanesDock");
  lanes_view_ = new QTreeView(left);
  lanes_view_->setModel(&lanes_);
  lanes_view_->setHeaderHidden(true);
  left->setWidget(lanes_view_);
  addDockWidget(Qt::LeftDockWidgetArea, left);
  resizeDocks({left, right}, {190, 420}, Qt::Horizontal);
  // A closed panel comes back from View > Panels (not only from a toolbar's context menu).
  for (QAction* a : menuBar()->actions()) {
    if (a->menu() && a->text() == tr("&View")) {
      QMenu* panels = a->menu()->addMenu(tr("&Panels"));
      panels->addAction(left->toggleViewAction());
      panels->addAction(right->toggleViewAction());
    }
  }
}

std::shared_ptr<TraceDocument> MainWindow::current_document() const {
  return current_ >= 0 && current_ < static_cast<int>(docs_.size())
             ? docs_[static_cast<size_t>(current_)]
             : nullptr;
}

void MainWindow::set_current_document(int i) {
  if (i < 0 || i >= static_cast<int>(docs_.size())) return;
  current_ = i;
  trace_combo_->setCurrentIndex(i);
  const auto& doc = docs_[static_cast<size_t>(i)];
  timeline_->set_document(doc);
  lanes_.set_trace(timeline_->index(), doc->trace.ranks, timeline_->group_by());
  lanes_view_->expandToDepth(0);
  details_.set_span(nullptr, -1, 0);
  ++range_generation_;  // a range computed on the previous trace is not shown on this one
  range_metrics_.clear();
  collectives_.set_collectives({});
  clear_search();
  search_label_->clear();
  if (!search_edit_->text().isEmpty()) search(search_edit_->text());
  setWindowTitle(tr("Orrery - %1").arg(trace_combo_->itemText(i)));
  if (tabs_->currentWidget() == timeline_) timeline_->setFocus();
  update_status();
  refresh_compare_and_charts();
}

void MainWindow::close_current_document() {
  if (current_ < 0 || current_ >= static_cast<int>(docs_.size())) return;
  metrics_.erase(docs_[static_cast<size_t>(current_)].get());
  docs_.erase(docs_.begin() + current_);
  refresh_trace_names();
  if (docs_.empty()) {
    current_ = -1;
    timeline_->set_document(nullptr);
    lanes_.set_trace(nullptr, {}, timeline_->group_by());
    details_.set_span(nullptr, -1, 0);
    ++range_generation_;
    range_metrics_.clear();
    collectives_.set_collectives({});
    clear_search();
    search_label_->clear();
    timeline_->set_highlighted({});
    setWindowTitle(tr("Orrery"));
    update_status();
    refresh_compare_and_charts();
    return;
  }
  set_current_document(std::min(current_, static_cast<int>(docs_.size()) - 1));
}

bool MainWindow::show_document(const QString& path) {
  const int i = find_document(path);
  if (i >= 0) set_current_document(i);
  return i >= 0;
}

int MainWindow::find_document(const QString& path) const {
  auto key = [](const QString& p) {
    const QFileInfo fi(p);
    const QString c = fi.canonicalFilePath();
    return c.isEmpty() ? fi.absoluteFilePath() : c;
  };
  const QString k = key(path);
  for (size_t i = 0; i < docs_.size(); ++i) {
    if (key(QString::fromStdString(docs_[i]->path)) == k) return static_cast<int>(i);
  }
  return -1;
}

void MainWindow::refresh_trace_names() {
  std::vector<std::string> paths;
  for (const auto& d : docs_)
    paths.push_back(QFileInfo(QString::fromStdString(d->path)).absoluteFilePath().toStdString());
  const auto names = distinct_names(paths);
  trace_combo_->clear();
  for (size_t i = 0; i < names.size(); ++i) {
    trace_combo_->addItem(QString::fromStdString(names[i]));
    trace_combo_->setItemData(static_cast<int>(i), QString::fromStdString(paths[i]),
                              Qt::ToolTipRole);
  }
  if (current_ >= 0 && current_ < trace_combo_->count()) trace_combo_->setCurrentIndex(current_);
}

TimelineView* MainWindow::key_target() const {
  // The timeline with the focus (a compare pane, say), else the shown tab's.
  for (QWidget* w = QApplication::focusWidget(); w; w = w->parentWidget()) {
    if (auto* t = qobject_cast<TimelineView*>(w)) return t->isVisible() ? t : nullptr;
  }
  if (tabs_->currentWidget() == timeline_) return timeline_;
  if (tabs_->currentWidget() == compare_) return compare_->view_a();
  return nullptr;
}

void MainWindow::update_status() {
  auto d = current_document();
  if (!d) {
    status_label_->setText(tr("No trace open"));
    return;
  }
  const auto& t = d->trace;
  const int64_t dur = d->index.end_ns() - d->index.start_ns();
  status_label_->setText(
      tr("%1   source %2   %3 ranks (dp %4, tp %5, pp %6)   %7 lanes   %8 spans   %9")
          .arg(QString::fromStdString(d->path))
          .arg(QString::fromUtf8(traces::to_string(t.meta.source).data()))
          .arg(t.meta.world_size)
          .arg(t.meta.dp)
          .arg(t.meta.tp)
          .arg(t.meta.pp)
          .arg(d->index.lanes().size())
          .arg(d->zoomed() ? static_cast<qulonglong>(d->zoom->span_count())
                           : static_cast<qulonglong>(t.spans.size()))
          .arg(QString::fromStdString(format_duration_ns(static_cast<double>(dur)))));
}

void MainWindow::update_loading() {
  progress_->setVisible(pending_loads_ > 0);
  // The empty timeline says a trace is on its way rather than "Open a trace".
  timeline_->set_empty_message(pending_loads_ == 0 ? QString()
                               : pending_loads_ == 1
                                   ? tr("Loading the trace...")
                                   : tr("Loading %1 traces...").arg(pending_loads_));
}

void MainWindow::open_files(const QStringList& paths) {
  for (const QString& path : paths) {
    if (path.endsWith(".csv", Qt::CaseInsensitive)) {
      add_sweep(path);
      continue;
    }
    if (const int open = find_document(path); open >= 0) {
      // Already open: show it, do not add a second, identical entry.
      set_current_document(open);
      add_recent(path);
      emit documentLoaded(path);
      continue;
    }
    ++pending_loads_;
    update_loading();
    status_label_->setText(tr("Loading %1 ...").arg(path));
    auto* w = new QFutureWatcher<LoadResult>(this);
    jobs_.push_back(w);
    connect(w, &QFutureWatcherBase::finished, this, [this, w, path] {
      jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), w), jobs_.end());
      const LoadResult r = w->result();
      w->deleteLater();
      --pending_loads_;
      update_loading();
      if (r.doc) {
        add_document(r.doc);
        add_recent(path);
        emit documentLoaded(path);
      } else {
        update_status();
        show_error(path, r.error);
        emit loadFailed(path, r.error);
      }
    });
    w->setFuture(QtConcurrent::run(load_job, path, load_options_));
  }
}

void MainWindow::open_files_now(const QStringList& paths) {
  for (const QString& path : paths) {
    if (path.endsWith(".csv", Qt::CaseInsensitive)) {
      std::vector<SweepUnplaced> unplaced;
      auto points = load_sweep_csv(path.toStdString(), &unplaced);
      charts_->set_sweep(std::move(points), path, std::move(unplaced));
      continue;
    }
    add_document(load_document(path.toStdString(), load_options_));
  }
}

void MainWindow::wait_for_metrics() {
  while (!jobs_.empty()) {
    auto* j = jobs_.front();
    j->waitForFinished();
    QCoreApplication::sendPostedEvents();
    QCoreApplication::processEvents();
    if (!jobs_.empty() && jobs_.front() == j)
      QCoreApplication::processEvents(QEventLoop::AllEvents, 50);
  }
}

void MainWindow::add_sweep(const QString& path) {
  try {
    std::vector<SweepUnplaced> unplaced;
    auto points = load_sweep_csv(path.toStdString(), &unplaced);
    charts_->set_sweep(std::move(points), path, std::move(unplaced));
    add_recent(path);
    tabs_->setCurrentWidget(charts_);
    emit documentLoaded(path);
  } catch (const std::exception& e) {
    show_error(path, QString::fromUtf8(e.what()));
    emit loadFailed(path, QString::fromUtf8(e.what()));
  }
}

void MainWindow::show_error(const QString& path, const QString& reason) {
  // Non-modal, so a batch of bad files does not stack event loops and tests can inspect it.
  if (last_error_) last_error_->deleteLater();
  last_error_ = new QMessageBox(QMessageBox::Critical, tr("Cannot open trace"),
                                tr("Could not open %1").arg(path), QMessageBox::Ok, this);
  last_error_->setInformativeText(reason);
  last_error_->setObjectName("loadErrorDialog");
  last_error_->setAttribute(Qt::WA_DeleteOnClose, false);
  last_error_->open();
}

void MainWindow::add_document(std::shared_ptr<TraceDocument> doc) {
  // Opened twice before the first load finished: keep the first.
  if (const int open = find_document(QString::fromStdString(doc->path)); open >= 0) {
    set_current_document(open);
    return;
  }
  docs_.push_back(doc);
  refresh_trace_names();
  start_metrics(doc);
  // The trace just opened is shown: in the timeline, the title, the status and the trace box.
  set_current_document(static_cast<int>(docs_.size()) - 1);
}

void MainWindow::start_metrics(const std::shared_ptr<TraceDocument>& doc) {
  auto* w = new QFutureWatcher<std::shared_ptr<const profiler::Metrics>>(this);
  jobs_.push_back(w);
  connect(w, &QFutureWatcherBase::finished, this, [this, w, doc] {
    jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), w), jobs_.end());
    auto m = w->result();
    const bool open = std::find(docs_.begin(), docs_.end(), doc) != docs_.end();
    if (m && open) metrics_[doc.get()] = m;  // none for a trace closed meanwhile
    w->deleteLater();
    refresh_compare_and_charts();
    emit metricsReady();
  });
  w->setFuture(QtConcurrent::run([doc]() -> std::shared_ptr<const profiler::Metrics> {
    try {
      // A zoomed trace is not in memory: its metrics stream the file's blocks.
      if (doc->zoomed())
        return std::make_shared<const profiler::Metrics>(
            profiler::compute_metrics_streamed(*doc->reader, doc->trace));
      return std::make_shared<const profiler::Metrics>(profiler::compute_metrics(doc->trace));
    } catch (const std::exception&) {
      return nullptr;  // charts stay empty; the timeline is still useful
    }
  }));
}

void MainWindow::refresh_compare_and_charts() {
  auto metrics_of =
      [this](const std::shared_ptr<TraceDocument>& d) -> std::shared_ptr<const profiler::Metrics> {
    auto it = metrics_.find(d.get());
    return it == metrics_.end() ? nullptr : it->second;
  };
  auto cur = current_document();
  charts_->set_breakdown(cur.get(), cur ? metrics_of(cur) : nullptr);
  experts_->set_document(cur.get());
  if (docs_.size() >= 2) {
    // A is the first trace opened, B the one in the timeline (the second while it shows the first):
    // open a real run, then its simulation, and compare shows real over simulated.
    auto a = docs_[0];
    auto b = cur && cur != a ? cur : docs_[1];
    compare_->set_documents(a, metrics_of(a), b, metrics_of(b));
  } else {
    compare_->clear();
  }
}

void MainWindow::show_tab(const QString& name) {
  if (name == "compare") {
    tabs_->setCurrentWidget(compare_);
  } else if (name == "charts") {
    tabs_->setCurrentWidget(charts_);
  } else if (name == "experts") {
    tabs_->setCurrentWidget(experts_);
  } else {
    tabs_->setCurrentWidget(timeline_);
  }
}

void MainWindow::on_span_selected(TimelineView* src, qint64 span) {
  // The spans the view shows: a zoomed trace's are those of its loaded window.
  const TraceDocument* d = src->document() ? &src->shown() : nullptr;
  details_.set_span(d ? &d->trace : nullptr, span, src->index() ? src->index()->start_ns() : 0,
                    d ? &d->flows : nullptr);
  details_view_->resizeColumnToContents(0);
}

void MainWindow::select_range(int64_t t0_ns, int64_t t1_ns) { timeline_->set_range(t0_ns, t1_ns); }

void MainWindow::on_range_selected(TimelineView* src, qint64 t0, qint64 t1) {
  auto d = src->document();
  if (!d) return;
  const uint64_t gen = ++range_generation_;
  range_note_->setText(tr("Computing..."));
  auto* w = new QFutureWatcher<std::shared_ptr<const profiler::Metrics>>(this);
  jobs_.push_back(w);
  const KindMask kinds = src->kind_mask();
  connect(w, &QFutureWatcherBase::finished, this, [this, w, gen, t0, t1, d, kinds] {
    jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), w), jobs_.end());
    auto m = w->result();
    w->deleteLater();
    if (gen != range_generation_) return;  // a newer range replaced this one
    if (!m) {
      range_note_->setText(tr("The metrics could not be computed for this range."));
      return;
    }
    range_metrics_.set_metrics(*m, t0, t1, d->index.start_ns());
    range_names_.set_rows(range_by_name(d->trace, t0, t1, kinds));
    names_view_->resizeColumnToContents(0);
    collectives_.set_collectives(m->collectives);
    range_view_->resizeColumnToContents(0);
    range_note_->setText(
        tr("Over %1 of all ranks; press F to zoom to it, Esc to clear.")
            .arg(QString::fromStdString(format_duration_ns(static_cast<double>(t1 - t0)))));
    emit rangeMetricsReady();
  });
  w->setFuture(QtConcurrent::run([d, t0, t1]() -> std::shared_ptr<const profiler::Metrics> {
    try {
      profiler::MetricsOptions opt;
      opt.window_start_ns = t0;
      opt.window_end_ns = t1;
      if (d->zoomed()) {
        // Not in memory: the range's spans when they are few (about 150 bytes each), else the
        // whole file streamed.
        const double share =
            static_cast<double>(t1 - t0) /
            static_cast<double>(std::max<int64_t>(1, d->index.end_ns() - d->index.start_ns()));
        if (share * static_cast<double>(d->zoom->span_count()) <= 2e6) {
          return std::make_shared<const profiler::Metrics>(
              profiler::compute_metrics(load_window(*d, t0, t1)->trace, opt));
        }
        return std::make_shared<const profiler::Metrics>(
            profiler::compute_metrics_streamed(*d->reader, d->trace, opt));
      }
      return std::make_shared<const profiler::Metrics>(profiler::compute_metrics(d->trace, opt));
    } catch (const std::exception&) {
      return nullptr;
    }
  }));
}

void MainWindow::set_kind_visible(traces::SpanKind k, bool visible) {
  KindMask m = timeline_->kind_mask();
  m = visible ? (m | kind_bit(k)) : (m & ~kind_bit(k));
  auto* a = kind_actions_[static_cast<int>(k)];
  if (a && a->isChecked() != visible) {
    a->setChecked(visible);  // re-enters through toggled
    return;
  }
  timeline_->set_kind_mask(m);
  if (auto d = current_document())
    lanes_.set_trace(timeline_->index(), d->trace.ranks, timeline_->group_by());
  lanes_view_->expandToDepth(0);
  if (has_search() && !search_edit_->text().isEmpty()) search(search_edit_->text());
}

void MainWindow::set_group_by(GroupBy by) {
  const int i = group_combo_->findData(static_cast<int>(by));
  if (i >= 0) group_combo_->setCurrentIndex(i);  // its handler regroups the timeline and the tree
}

QStringList MainWindow::recent_files() const {
  return QSettings().value(kRecentKey).toStringList();
}

void MainWindow::add_recent(const QString& path) {
  QSettings s;
  QStringList list = s.value(kRecentKey).toStringList();
  const QString abs = QFileInfo(path).absoluteFilePath();
  list.removeAll(abs);
  list.prepend(abs);
  while (list.size() > kMaxRecent) list.removeLast();
  s.setValue(kRecentKey, list);
  rebuild_recent_menu();
}

void MainWindow::rebuild_recent_menu() {
  recent_menu_->clear();
  const QStringList list = recent_files();
  for (const QString& p : list) {
    recent_menu_->addAction(p, this, [this, p] { open_files({p}); });
  }
  recent_menu_->setEnabled(!list.isEmpty());
  if (!list.isEmpty()) {
    recent_menu_->addSeparator();
    recent_menu_->addAction(tr("Clear"), this, [this] {
      QSettings().remove(kRecentKey);
      rebuild_recent_menu();
    });
  }
}

void MainWindow::dragEnterEvent(QDragEnterEvent* e) {
  if (e->mimeData()->hasUrls()) e->acceptProposedAction();
}

void MainWindow::dropEvent(QDropEvent* e) {
  QStringList paths;
  for (const QUrl& u : e->mimeData()->urls()) {
    if (u.isLocalFile()) paths << u.toLocalFile();
  }
  if (!paths.isEmpty()) {
    open_files(paths);
    e->acceptProposedAction();
  }
}

}  // namespace orrery::gui
