// The main window of orrery-gui: the timeline, compare and charts tabs, the side panels (selected
// span, range metrics, lanes), search, kind filters, File > Open / recent files / drag and drop,
// and loading off the GUI thread.
#pragma once

#include <QFutureWatcher>
#include <QMainWindow>
#include <QStringList>
#include <atomic>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "orrery/gui/document.hpp"
#include "orrery/gui/file_search.hpp"
#include "orrery/gui/models.hpp"
#include "orrery/gui/span_search.hpp"

class QAction;
class QComboBox;
class QLabel;
class QLineEdit;
class QMenu;
class QMessageBox;
class QProgressBar;
class QSpinBox;
class QToolBar;
class QTabWidget;
class QTableView;
class QTreeView;

namespace orrery::gui {

class ChartsView;
class ExpertsView;
class CompareView;
class TimelineView;

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit MainWindow(QWidget* parent = nullptr);
  ~MainWindow() override;

  // Opens traces (and sweep CSVs) on worker threads; errors show a dialog and leave the window as
  // it was. documentLoaded / loadFailed tell when each one is done.
  void open_files(const QStringList& paths);
  // How traces are opened from now on (tests open small ones through their zoom levels).
  void set_load_options(const LoadOptions& o) { load_options_ = o; }
  // The same, on the calling thread; throws InputError with the reader's message (screenshot mode).
  void open_files_now(const QStringList& paths);
  // Blocks until every metrics computation started so far is done (screenshot mode).
  void wait_for_metrics();

  int document_count() const { return static_cast<int>(docs_.size()); }
  std::shared_ptr<TraceDocument> current_document() const;
  void set_current_document(int i);
  // Shows the open trace at `path` in the timeline; false when it is not open.
  bool show_document(const QString& path);
  // File > Close: closes the trace in the timeline and shows the next one (or the one before).
  void close_current_document();
  void show_tab(const QString& name);  // "timeline", "compare", "charts"
  void search(const QString& text);
  void search_next();
  void search_previous();
  // Selects the first match that starts at or after t (trace time), wrapping; false when none.
  bool search_from(int64_t t_ns);
  void set_kind_visible(traces::SpanKind k, bool visible);
  // Groups the timeline's lanes and the lanes tree (as the toolbar's group selector does).
  void set_group_by(GroupBy by);
  // Selects a range on the timeline (trace time) and computes its metrics.
  void select_range(int64_t t0_ns, int64_t t1_ns);

  // Frames step N across ranks in the timeline the keys go to; false (and a status message with
  // the trace's steps) when there is no such step.
  bool go_to_step(int step);
  // The shortcut overlay ("?"): every key of the menus and the mouse's gestures, as (keys, what).
  std::vector<std::pair<QString, QString>> shortcut_entries() const;
  void toggle_shortcut_overlay();
  // P: shows the critical path of the step of the selected span (else of the step at the view's
  // centre) in the timeline the keys go to, with its length in the status bar; again hides it.
  // True when a path is shown now.
  bool toggle_critical_path();
  bool shortcut_overlay_visible() const;
  QAction* wheel_zooms_action() const { return wheel_action_; }
  // The links of the critical path shown (empty when none), listed under the details.
  const CriticalPathModel* critical_path_model() const { return &critical_; }

  TimelineView* timeline() const { return timeline_; }
  CompareView* compare() const { return compare_; }
  ChartsView* charts() const { return charts_; }
  ExpertsView* experts() const { return experts_; }
  const SpanDetailsModel* details_model() const { return &details_; }
  const RangeMetricsModel* range_model() const { return &range_metrics_; }
  const CollectiveModel* collective_model() const { return &collectives_; }
  // The selected range's spans by name, and the sortable view of it.
  const RangeByNameModel* range_names_model() const { return &range_names_; }
  QTableView* range_names_view() const { return names_view_; }
  QString search_status() const;
  const LaneTreeModel* lane_model() const { return &lanes_; }
  const SpanSearch& span_search() const { return search_; }
  // A zoomed trace's search over its file (file_search.hpp): running, then its result and the hit
  // shown (-1 before the first next()).
  bool file_search_running() const { return file_search_running_; }
  const FileSearchResult& file_search() const { return file_search_; }
  int64_t file_search_cursor() const { return file_cursor_; }
  QMessageBox* last_error() const { return last_error_; }
  QStringList recent_files() const;

 signals:
  void documentLoaded(const QString& path);
  void loadFailed(const QString& path, const QString& reason);
  void rangeMetricsReady();
  void metricsReady();
  void searchFinished();  // a zoomed trace's file search ended (not when cancelled)

 protected:
  void dragEnterEvent(QDragEnterEvent* e) override;
  void dropEvent(QDropEvent* e) override;
  void closeEvent(QCloseEvent* e) override;
  bool eventFilter(QObject* watched, QEvent* e) override;

 private:
  void build_menus();
  // Search (main_window_search.cpp).
  void clear_search();
  bool has_search() const;          // a search has matches or is running
  bool file_search_active() const;  // a zoomed trace's file search has hits to go to
  void start_file_search(const std::shared_ptr<TraceDocument>& d, const QString& text);
  void jump_to_file_hit(int64_t i);
  void highlight_window_matches();  // frames the matches among the timeline's loaded spans
  void build_docks();
  // Go to step, markers, the wheel's mode and the shortcut overlay (main_window_nav.cpp).
  void build_navigation(QMenu* view, QToolBar* tb);
  void rebuild_marker_menu();
  void add_document(std::shared_ptr<TraceDocument> doc);
  // Index of the open trace at `path` (compared as absolute, canonical paths), or -1.
  int find_document(const QString& path) const;
  // The trace box's entries: names that tell the open files apart, full paths as tooltips.
  void refresh_trace_names();
  void add_sweep(const QString& path);
  void show_error(const QString& path, const QString& reason);
  void add_recent(const QString& path);
  void rebuild_recent_menu();
  void start_metrics(const std::shared_ptr<TraceDocument>& doc);
  void refresh_compare_and_charts();
  // A span or range selected in `src` (the timeline or a compare pane), of src's trace.
  void on_span_selected(TimelineView* src, qint64 span);
  void on_range_selected(TimelineView* src, qint64 t0, qint64 t1);
  void update_status();
  // Where the navigation keys go: the focused timeline, else the current tab's (none on Charts).
  TimelineView* key_target() const;
  void update_loading();

  std::vector<std::shared_ptr<TraceDocument>> docs_;
  std::map<const TraceDocument*, std::shared_ptr<const profiler::Metrics>> metrics_;
  LoadOptions load_options_;
  int current_ = -1;
  int pending_loads_ = 0;
  uint64_t range_generation_ = 0;
  std::vector<QFutureWatcherBase*> jobs_;  // running workers, waited for on close

  QTabWidget* tabs_ = nullptr;
  TimelineView* timeline_ = nullptr;
  CompareView* compare_ = nullptr;
  ChartsView* charts_ = nullptr;
  ExpertsView* experts_ = nullptr;
  QComboBox* trace_combo_ = nullptr;
  QComboBox* group_combo_ = nullptr;
  QLineEdit* search_edit_ = nullptr;
  QLabel* search_label_ = nullptr;
  QLabel* status_label_ = nullptr;
  QProgressBar* progress_ = nullptr;
  QMenu* recent_menu_ = nullptr;
  QAction* kind_actions_[traces::kSpanKindCount] = {};
  QTableView* details_view_ = nullptr;
  QTableView* range_view_ = nullptr;
  QTableView* coll_view_ = nullptr;
  QTableView* names_view_ = nullptr;
  QTreeView* lanes_view_ = nullptr;
  QLabel* range_note_ = nullptr;
  QMessageBox* last_error_ = nullptr;
  QSpinBox* step_box_ = nullptr;
  QMenu* marker_list_ = nullptr;
  QAction* wheel_action_ = nullptr;
  QLabel* overlay_ = nullptr;
  QWidget* crit_box_ = nullptr;
  QTableView* crit_view_ = nullptr;

  SpanDetailsModel details_;
  RangeMetricsModel range_metrics_;
  CollectiveModel collectives_;
  RangeByNameModel range_names_;
  LaneTreeModel lanes_;
  CriticalPathModel critical_;
  SpanSearch search_;
  FileSearchResult file_search_;
  int64_t file_cursor_ = -1;
  bool file_search_running_ = false;
  bool file_jump_pending_ = false;  // show the first hit when the search ends (Enter pressed)
  uint64_t file_search_generation_ = 0;
  std::shared_ptr<std::atomic<bool>> file_search_cancel_;
};

}  // namespace orrery::gui
