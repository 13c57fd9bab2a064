// The timeline widget: lanes per rank and stream, spans coloured by kind, a time axis, zoom and pan
// with the mouse and W/A/S/D keys (bounded to the trace, with a margin), hover details, click selection and shift-drag range selection.
//
// Painting asks the core's fold_row for each visible row, so the work per frame is bounded by the
// number of pixels, not of spans. The view's time ("view time") is the trace's time plus shift_ns,
// which the compare view uses to align a second run on the first one's steps.
#pragma once

#include <QAbstractScrollArea>
#include <QRectF>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "orrery/gui/critical_path.hpp"
#include "orrery/gui/document.hpp"
#include "orrery/gui/lane_layout.hpp"
#include "orrery/gui/navigation.hpp"
#include "orrery/gui/time_mapping.hpp"

class QPainter;

namespace orrery::gui {

class TimelineView : public QAbstractScrollArea {
  Q_OBJECT
 public:
  static constexpr int kLabelWidth = 170;     // lane names, left
  static constexpr int kAxisHeight = 42;      // time axis, top: ticks, then the steps' band
  static constexpr int kStepBandHeight = 14;  // the bottom of the axis: step numbers
  static constexpr double kFoldPx = 3;        // spans narrower than this fold (Tracy's MinVisSize)
  // A zoomed document (TraceDocument::zoomed) shows its spans, loaded for a window three views
  // wide, once the view holds about this many (counted from its zoom levels); zoomed further out
  // it draws its zoom levels.
  static constexpr int64_t kWindowSpans = 200'000;

  explicit TimelineView(QWidget* parent = nullptr);

  void set_document(std::shared_ptr<TraceDocument> doc);
  const std::shared_ptr<TraceDocument>& document() const { return doc_; }
  // What the view's span indices refer to: the loaded window of a zoomed document, else the
  // document itself.
  const TraceDocument& shown() const { return window_ ? *window_ : *doc_; }
  // The span count below which a zoomed document's view loads its window (tests lower it).
  void set_window_spans(int64_t spans) { window_spans_ = spans; }
  // Whether a zoomed document is drawn from its spans (a window is loaded) now.
  bool window_loaded() const { return window_ != nullptr; }
  // A zoomed document: loads (or drops) the spans around the view now, not at the next paint
  // (search jumps to a span, then selects it).
  void ensure_window();
  // The error a zoomed document's levels raised (a corrupt chunk), shown instead of the lanes.
  const QString& zoom_error() const { return zoom_error_; }
  const TraceIndex* index() const { return index_; }
  // What the view says when it has no trace: how to open one, or, while one loads, that it loads
  // (an empty text restores the default).
  void set_empty_message(const QString& text);
  const QString& empty_message() const { return empty_message_; }
  const LaneLayout& lane_layout() const { return layout_; }

  void set_kind_mask(KindMask kinds);
  KindMask kind_mask() const { return kinds_; }
  void set_group_by(GroupBy by);
  GroupBy group_by() const { return group_by_; }
  void set_hidden_lanes(const std::set<std::pair<int32_t, int32_t>>& hidden);
  void toggle_collapsed(const std::string& key);
  // Spans drawn with a highlight outline (search matches): one flag per span of the trace, empty
  // for none.
  void set_highlighted(std::vector<uint8_t> flags);
  bool is_highlighted(uint32_t span) const { return span < highlight_.size() && highlight_[span]; }
  // Counter tracks under each rank's lanes (on by default).
  void set_counters_visible(bool visible);
  bool counters_visible() const { return counters_visible_; }

  // The mapping of view time to x in the track area (x = 0 at its left edge).
  const TimeMapping& mapping() const { return map_; }
  void set_mapping(const TimeMapping& m);
  int64_t shift_ns() const { return shift_ns_; }
  void set_shift_ns(int64_t shift);
  int track_width() const;
  // The trace time under the left / right edge of the track area.
  int64_t visible_start_ns() const;
  int64_t visible_end_ns() const;

  void fit_all();
  void zoom_to(int64_t t0_ns, int64_t t1_ns);  // trace time, with a small margin
  void zoom_by(double factor, double anchor_x_track);
  void pan_by_px(double dx);
  // The navigation keys: W/S zoom in/out (around the mouse when it is over the track), A/D pan by
  // an eighth of the track, F zooms to the selection, 0 or Home fits all, Escape clears the range
  // and the selection. False for any other key. The main window's View actions call it, so the
  // keys work wherever the focus is (except in a text field).
  // M sets a marker at the mouse's time (the centre's when the mouse is off the track), or
  // removes the one within 4 px of it; ] and [ centre the view on the next / previous marker.
  bool navigate(int key);

  // Frames a step across ranks (its earliest start to its latest end); false when there is none.
  bool go_to_step(int32_t step);
  // The step under the track x of the view's centre, or -1.
  int32_t step_at_center() const;
  // Markers, in trace time.
  const Markers& markers() const { return markers_; }
  void add_marker(int64_t t_ns);
  void clear_markers();
  // Scrolls the lanes so that the first counter track of that name is near the top, under its
  // rank's lanes' last rows; false when there is none.
  bool scroll_to_counter(const std::string& name);
  // Selects the first span at or after the view's start whose name contains `text` and that has a
  // flow (a collective instance or a transfer), and frames the flow's members; -1 when none.
  int64_t show_flow(const QString& text);
  // Centres the view on a time (trace time), keeping the zoom.
  void center_on(int64_t t_ns);
  bool jump_to_marker(bool next);
  // The time a key-set marker goes to: under the mouse when it is over the track, else the centre.
  int64_t cursor_time_ns() const;
  // Perfetto's wheel (the default): the wheel scrolls the lanes, Ctrl+wheel zooms, Shift+wheel
  // pans. Swapped, the wheel zooms and Ctrl+wheel scrolls.
  void set_wheel_zooms(bool zooms) { wheel_zooms_ = zooms; }
  bool wheel_zooms() const { return wheel_zooms_; }

  // Selection (span index into the trace's spans, -1 for none). reveal: expand its rank, scroll it
  // into view and zoom so it is at least a few pixels wide.
  void select_span(int64_t span, bool reveal = false);
  int64_t selected_span() const { return selected_; }
  bool has_range() const { return has_range_; }
  std::pair<int64_t, int64_t> range() const { return {range_t0_, range_t1_}; }
  void set_range(int64_t t0_ns, int64_t t1_ns);  // trace time; emits rangeSelected
  void clear_range();
  void zoom_to_selection();  // the range, else the selected span

  // Centre of a span in viewport coordinates, or (-1, -1) when it is not on screen (tests click
  // there). The span under a viewport point, or -1 (folded blocks and gaps are -1).
  QPoint point_of_span(int64_t span) const;
  int64_t span_at_point(QPoint p) const;
  // The folded block under a viewport point (count, busy fraction, time per kind), or none.
  std::optional<FoldSummary> fold_at_point(QPoint p) const;
  // The counter track under a viewport point and its value there (the sample in effect), if any.
  struct CounterHit {
    const CounterTrack* track = nullptr;
    int64_t t_ns = 0;
    double value = 0;
  };
  std::optional<CounterHit> counter_at_point(QPoint p) const;
  // The y of a counter value in a track drawn at row top y with height h (tests read pixels there).
  static double counter_y(const CounterTrack& c, double v, double y, double h);
  // The hover tooltip at a viewport point (HTML): a span's attributes, a folded block's count,
  // busy fraction and kinds, or a counter's value; empty over nothing.
  QString tooltip_at(QPoint p) const;
  // The spans of the selected span's flow (itself included), empty when it is in none.
  const std::vector<uint32_t>& flow_members() const { return flow_; }
  // A span's rectangle in viewport coordinates (x not clipped to the track), or none when its
  // lane is hidden or collapsed.
  std::optional<QRectF> span_rect(int64_t span) const;
  // The critical path drawn over the lanes (an empty one hides it): its spans outlined, the part
  // of each on the path underlined, and links from each span to the next.
  void set_critical_path(CriticalPath path);
  const CriticalPath& critical_path_shown() const { return critical_; }
  // Draw items of the last paint (for the benchmark's report).
  size_t last_frame_items() const { return last_items_; }

 signals:
  void spanSelected(qint64 span);
  void rangeSelected(qint64 t0_ns, qint64 t1_ns);
  void rangeCleared();
  void markersChanged();
  void mappingChanged();
  void spanHovered(qint64 span);
  // A zoomed document's window of loaded spans was loaded or dropped (span indices changed).
  void windowChanged();

 protected:
  void paintEvent(QPaintEvent* e) override;
  void resizeEvent(QResizeEvent* e) override;
  void wheelEvent(QWheelEvent* e) override;
  void mousePressEvent(QMouseEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;
  void mouseReleaseEvent(QMouseEvent* e) override;
  void mouseDoubleClickEvent(QMouseEvent* e) override;
  void keyPressEvent(QKeyEvent* e) override;
  void leaveEvent(QEvent* e) override;
  void scrollContentsBy(int dx, int dy) override;
  bool viewportEvent(QEvent* e) override;

 private:
  void rebuild_index();
  // For a zoomed document: loads the spans of a window around the view when it holds few enough
  // (kWindowSpans), drops them when it holds more.
  void update_window();
  void relayout();
  void changed_mapping();
  TimeMapping trace_mapping() const;  // maps trace time (view time minus shift)
  double lane_top() const;            // viewport y of layout y = 0
  // Keeps zoom and pan on the trace: zoomed out at most to fit_all's view, and at most a quarter
  // of the view past either end. Compare's second view follows the first through set_mapping,
  // which is not bounded. True when the mapping changed.
  bool bound_view();
  void show_tooltip(QPoint pos, QPoint global);
  // The row and draw item under a viewport point, folded as painting folds it.
  std::optional<std::pair<const LaneRow*, DrawItem>> item_at_point(QPoint p) const;

  // Painting, one step per layer (paintEvent lists them back to front); colours from palette.hpp.
  struct Frame;
  Frame frame() const;
  void paint_empty(QPainter& p) const;
  size_t paint_rows(QPainter& p, const Frame& f) const;  // headers and lanes; returns items drawn
  void paint_header(QPainter& p, const Frame& f, const LayoutRow& lr, double y) const;
  // `items` is scratch space shared by the rows of a frame; returns the items drawn.
  size_t paint_lane(QPainter& p, const Frame& f, const LayoutRow& lr, double y, bool odd,
                    std::vector<DrawItem>& items) const;
  void paint_grid(QPainter& p, const Frame& f, double y, double height) const;
  size_t paint_lane_row(QPainter& p, const Frame& f, const LaneRow& row, double ry, double rh,
                        const QColor& bg, std::vector<DrawItem>& items) const;
  // A row of a zoomed document from its zoom levels.
  size_t paint_zoom_row(QPainter& p, const Frame& f, const Lane& lane, int row, double ry,
                        double rh, const QColor& bg) const;
  void paint_span(QPainter& p, const Frame& f, uint32_t id, const QRectF& r,
                  const QRectF& row_rect) const;
  void paint_folded(QPainter& p, const Frame& f, const FoldSummary& fold, const QColor& bg,
                    const QRectF& r, const QRectF& row_rect) const;
  void paint_lane_label(QPainter& p, const Frame& f, const LayoutRow& lr, double y) const;
  // A counter track: its step function folded into pixel columns, an area under a line, with
  // its largest value in the label column.
  void paint_counter(QPainter& p, const Frame& f, const LayoutRow& lr, double y, bool odd) const;
  void paint_label_border(QPainter& p, const Frame& f) const;
  void paint_selection(QPainter& p, const Frame& f) const;
  // The selected span's flow: the other members outlined, arrows from a send to its receive, or
  // from each member of a collective to the one that started last.
  void paint_flow(QPainter& p, const Frame& f) const;
  void paint_range(QPainter& p, const Frame& f) const;
  void paint_critical_path(QPainter& p, const Frame& f) const;
  void paint_axis(QPainter& p, const Frame& f) const;
  void paint_steps(QPainter& p, const Frame& f) const;    // the step numbers' band of the axis
  void paint_markers(QPainter& p, const Frame& f) const;  // lines across the lanes, flags above
  void paint_range_length(QPainter& p, const Frame& f) const;
  void paint_scale(QPainter& p) const;

  QString empty_message_;
  std::shared_ptr<TraceDocument> doc_;
  std::shared_ptr<TraceDocument> window_;  // a zoomed document's spans around the view
  int64_t window_t0_ = 0, window_t1_ = 0;
  int64_t window_spans_ = kWindowSpans;
  mutable QString zoom_error_;
  std::unique_ptr<TraceIndex> filtered_;  // when some kinds are hidden
  const TraceIndex* index_ = nullptr;
  KindMask kinds_ = kAllKinds;
  GroupBy group_by_ = GroupBy::Rank;
  std::set<std::pair<int32_t, int32_t>> hidden_;
  bool counters_visible_ = true;
  std::vector<uint8_t> highlight_;
  LaneLayout layout_;
  TimeMapping map_;
  int64_t shift_ns_ = 0;
  bool fitted_ = false;
  // The view range that fit_all / zoom_to asked for (view time), kept until the user zooms or pans,
  // so a view sized after it was set up (a hidden tab, a splitter) still shows that range.
  bool pinned_ = false;
  int64_t pinned_t0_ = 0, pinned_t1_ = 1;

  int64_t selected_ = -1;
  std::vector<uint32_t> flow_;  // the selected span's flow
  int64_t hovered_ = -1;
  bool has_range_ = false;
  int64_t range_t0_ = 0, range_t1_ = 0;

  enum class Drag { None, Pan, Range } drag_ = Drag::None;
  QPoint press_pos_;
  TimeMapping press_map_;
  int press_scroll_ = 0;
  bool moved_ = false;
  QPoint last_mouse_{-1, -1};
  size_t last_items_ = 0;
  Markers markers_;
  CriticalPath critical_;
  bool wheel_zooms_ = false;
};

}  // namespace orrery::gui
