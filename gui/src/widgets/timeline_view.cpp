// The timeline widget (see timeline_view.hpp).
#include "orrery/gui/widgets/timeline_view.hpp"

#include <QHelpEvent>
#include <QKeyEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QScrollBar>
#include <QToolTip>
#include <QWheelEvent>
#include <algorithm>
#include <cmath>

#include "orrery/common/format.hpp"
#include "orrery/gui/models.hpp"
#include "orrery/gui/palette.hpp"
#include "orrery/gui/zoom_view.hpp"

namespace orrery::gui {
namespace {

// The disclosure triangle of a header at (x, centre y): pointing right when collapsed, else down.
QPolygonF disclosure_triangle(double tx, double cy, bool collapsed) {
  QPolygonF tri;
  if (collapsed) {
    tri << QPointF(tx, cy - 4) << QPointF(tx + 7, cy) << QPointF(tx, cy + 4);
  } else {
    tri << QPointF(tx - 1, cy - 3) << QPointF(tx + 7, cy - 3) << QPointF(tx + 3, cy + 3);
  }
  return tri;
}

}  // namespace

TimelineView::TimelineView(QWidget* parent) : QAbstractScrollArea(parent) {
  setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  setVerticalScrollBarPolicy(Qt::ScrollBarAsNeeded);
  viewport()->setMouseTracking(true);
  viewport()->setAttribute(Qt::WA_OpaquePaintEvent);
  setFocusPolicy(Qt::StrongFocus);
  setMinimumSize(240, 100);
  set_empty_message({});
}

void TimelineView::set_empty_message(const QString& text) {
  empty_message_ = text.isEmpty()
                       ? tr("Open a trace: File > Open, drag a file here, or orrery-gui TRACE")
                       : text;
  viewport()->update();
}

void TimelineView::set_document(std::shared_ptr<TraceDocument> doc) {
  critical_ = {};
  doc_ = std::move(doc);
  window_.reset();
  zoom_error_.clear();
  selected_ = -1;
  flow_.clear();
  highlight_.clear();
  hovered_ = -1;
  has_range_ = false;
  fitted_ = false;
  hidden_.clear();
  rebuild_index();
  fit_all();
}

void TimelineView::rebuild_index() {
  filtered_.reset();
  index_ = nullptr;
  if (!doc_) {
    relayout();
    return;
  }
  // A zoomed document draws its zoom levels on its own index (lanes without spans), or the spans
  // of the loaded window on the window's.
  const TraceDocument& base = window_ ? *window_ : *doc_;
  if (kinds_ == kAllKinds || (doc_->zoomed() && !window_)) {
    index_ = &base.index;
  } else {
    filtered_ = std::make_unique<TraceIndex>(base.trace, kinds_);
    if (doc_->zoomed()) filtered_->pad_rows(doc_->zoom->lanes());
    index_ = filtered_.get();
  }
  relayout();
}

void TimelineView::ensure_window() {
  try {
    update_window();
  } catch (const std::exception& e) {
    zoom_error_ = QString::fromStdString(e.what());
  }
}

void TimelineView::update_window() {
  if (!doc_ || !doc_->zoomed() || !zoom_error_.isEmpty()) return;
  const int64_t t0 = visible_start_ns(), t1 = visible_end_ns();
  const double duration =
      static_cast<double>(std::max<int64_t>(1, doc_->index.end_ns() - doc_->index.start_ns()));
  // Inside the loaded window, its own spans tell; otherwise the even spread of the spans first
  // and, near the threshold, the levels' counts (a burst of spans in a short view must not load
  // millions).
  double visible = 0;
  if (window_ && t0 >= window_t0_ && t1 <= window_t1_) {
    visible = static_cast<double>(window_->trace.spans.size()) * static_cast<double>(t1 - t0) /
              static_cast<double>(std::max<int64_t>(1, window_t1_ - window_t0_));
  } else {
    visible =
        static_cast<double>(doc_->zoom->span_count()) * static_cast<double>(t1 - t0) / duration;
    if (visible <= 20.0 * static_cast<double>(window_spans_))
      visible = static_cast<double>(doc_->zoom->spans_between(t0, t1));
  }
  if (visible > static_cast<double>(window_spans_)) {
    if (!window_) return;
    window_.reset();
  } else {
    if (window_ && t0 >= window_t0_ && t1 <= window_t1_) return;
    // A window three views wide, so that panning by less than a view reads nothing.
    window_t0_ = t0 - (t1 - t0);
    window_t1_ = t1 + (t1 - t0);
    window_ = load_window(*doc_, window_t0_, window_t1_);
  }
  // Span indices are the window's: what referred to the previous window's spans goes.
  selected_ = -1;
  flow_.clear();
  highlight_.clear();
  critical_ = CriticalPath{};
  hovered_ = -1;
  rebuild_index();
  emit windowChanged();
}

void TimelineView::relayout() {
  if (index_) {
    layout_.build(*index_, doc_->trace.ranks, group_by_, hidden_,
                  counters_visible_ ? &doc_->counters : nullptr);
  } else {
    layout_ = LaneLayout();
  }
  const int visible_h = std::max(0, viewport()->height() - kAxisHeight);
  verticalScrollBar()->setRange(
      0, std::max(0, static_cast<int>(std::ceil(layout_.total_height())) - visible_h));
  verticalScrollBar()->setPageStep(std::max(1, visible_h));
  verticalScrollBar()->setSingleStep(static_cast<int>(LaneLayout::kRowHeight));
  viewport()->update();
}

void TimelineView::set_kind_mask(KindMask kinds) {
  if (kinds == kinds_) return;
  kinds_ = kinds;
  if (selected_ >= 0 && doc_ &&
      !(kinds_ & kind_bit(shown().trace.spans[static_cast<size_t>(selected_)].kind))) {
    selected_ = -1;
    flow_.clear();
    emit spanSelected(-1);
  }
  rebuild_index();
}

void TimelineView::set_group_by(GroupBy by) {
  group_by_ = by;
  relayout();
}

void TimelineView::set_hidden_lanes(const std::set<std::pair<int32_t, int32_t>>& hidden) {
  hidden_ = hidden;
  relayout();
}

void TimelineView::set_highlighted(std::vector<uint8_t> flags) {
  highlight_ = std::move(flags);
  viewport()->update();
}

void TimelineView::set_counters_visible(bool visible) {
  if (visible == counters_visible_) return;
  counters_visible_ = visible;
  relayout();
}

void TimelineView::toggle_collapsed(const std::string& key) {
  layout_.toggle(key);
  relayout();
}

int TimelineView::track_width() const { return std::max(1, viewport()->width() - kLabelWidth); }

TimeMapping TimelineView::trace_mapping() const {
  TimeMapping m = map_;
  m.origin_ns -= shift_ns_;
  return m;
}

int64_t TimelineView::visible_start_ns() const { return trace_mapping().t_floor(0); }
int64_t TimelineView::visible_end_ns() const { return trace_mapping().t_ceil(track_width()); }

double TimelineView::lane_top() const { return kAxisHeight - verticalScrollBar()->value(); }

void TimelineView::changed_mapping() {
  viewport()->update();
  emit mappingChanged();
}

void TimelineView::set_mapping(const TimeMapping& m) {
  if (m.origin_ns == map_.origin_ns && m.origin_frac == map_.origin_frac &&
      m.ns_per_px == map_.ns_per_px)
    return;
  map_ = m;
  fitted_ = true;
  pinned_ = false;
  changed_mapping();
}

void TimelineView::set_shift_ns(int64_t shift) {
  shift_ns_ = shift;
  viewport()->update();
}

void TimelineView::fit_all() {
  if (!index_) return;
  const TraceIndex& extent = doc_ && doc_->zoomed() ? doc_->index : *index_;  // not the window's
  const int64_t t0 = extent.start_ns() + shift_ns_;
  const int64_t t1 = extent.end_ns() + shift_ns_;
  const int64_t margin = std::max<int64_t>(1, (t1 - t0) / 100);
  pinned_ = true;
  pinned_t0_ = t0 - margin;
  pinned_t1_ = t1 + margin;
  map_.fit(pinned_t0_, pinned_t1_, track_width());
  fitted_ = true;
  changed_mapping();
}

bool TimelineView::bound_view() {
  if (!index_) return false;
  const TimeMapping before = map_;
  const double w = track_width();
  // A zoomed document's window of loaded spans is not the trace's extent: its own index is.
  const TraceIndex& extent = doc_ && doc_->zoomed() ? doc_->index : *index_;
  const int64_t lo = extent.start_ns() + shift_ns_, hi = extent.end_ns() + shift_ns_;
  // Zoomed out at most to fit_all's view.
  const double len = static_cast<double>(hi - lo);
  const double max_npp =
      std::max(TimeMapping::kMinNsPerPx, (len + 2 * std::max(1.0, std::floor(len / 100))) / w);
  if (map_.ns_per_px > max_npp) map_.zoom(map_.ns_per_px / max_npp, w / 2);
  // Panned at most a quarter of the view past either end (the left end wins on a tie).
  const double margin = map_.ns_per_px * w / 4;
  const double past_end =
      static_cast<double>(map_.origin_ns - hi) + map_.origin_frac + map_.ns_per_px * w - margin;
  if (past_end > 0) map_.pan_px(past_end / map_.ns_per_px);
  const double before_start = static_cast<double>(lo - map_.origin_ns) - map_.origin_frac - margin;
  if (before_start > 0) map_.pan_px(-before_start / map_.ns_per_px);
  return map_.origin_ns != before.origin_ns || map_.origin_frac != before.origin_frac ||
         map_.ns_per_px != before.ns_per_px;
}

void TimelineView::zoom_to(int64_t t0_ns, int64_t t1_ns) {
  if (t1_ns <= t0_ns) t1_ns = t0_ns + 1;
  const int64_t margin = std::max<int64_t>(1, (t1_ns - t0_ns) / 20);
  pinned_ = true;
  pinned_t0_ = t0_ns + shift_ns_ - margin;
  pinned_t1_ = t1_ns + shift_ns_ + margin;
  map_.fit(pinned_t0_, pinned_t1_, track_width());
  if (bound_view()) {  // a range past the trace: pin what is shown instead
    pinned_t0_ = map_.t_floor(0);
    pinned_t1_ = map_.t_ceil(track_width());
  }
  fitted_ = true;
  changed_mapping();
}

void TimelineView::zoom_by(double factor, double anchor_x_track) {
  pinned_ = false;
  map_.zoom(factor, anchor_x_track);
  bound_view();
  changed_mapping();
}

void TimelineView::pan_by_px(double dx) {
  pinned_ = false;
  map_.pan_px(dx);
  bound_view();
  changed_mapping();
}

void TimelineView::select_span(int64_t span, bool reveal) {
  if (!doc_ || span < 0 || static_cast<size_t>(span) >= shown().trace.spans.size()) span = -1;
  selected_ = span;
  flow_ =
      span >= 0 ? shown().flows.members_of(static_cast<uint32_t>(span)) : std::vector<uint32_t>{};
  if (span >= 0 && reveal && index_) {
    const auto& s = shown().trace.spans[static_cast<size_t>(span)];
    // Make its lane visible: un-hide, expand its rank and group.
    const int lane = index_->lane_of(s.rank, s.stream);
    if (hidden_.erase({s.rank, s.stream})) relayout();
    if (layout_.row_of_lane(lane) < 0) {
      layout_.set_collapsed("r:" + std::to_string(s.rank), false);
      for (const auto& g : group_ranks(*index_, doc_->trace.ranks, group_by_)) {
        if (std::find(g.ranks.begin(), g.ranks.end(), s.rank) != g.ranks.end())
          layout_.set_collapsed("g:" + g.label, false);
      }
      relayout();
    }
    pinned_ = false;
    // Horizontally: keep the zoom when the span shows at least a few pixels wide, else zoom so it
    // fills a tenth of the track; centre it when it is off screen.
    const TimeMapping tm = trace_mapping();
    const double x0 = tm.x_of(s.start_ns), x1 = tm.x_of(s.end_ns);
    const double w = track_width();
    if (x1 - x0 < kFoldPx * 2) {
      const double dur = std::max<double>(1.0, static_cast<double>(s.duration_ns()));
      map_.ns_per_px =
          std::clamp(dur / (w / 10), TimeMapping::kMinNsPerPx, TimeMapping::kMaxNsPerPx);
      map_.origin_ns = s.start_ns + shift_ns_ - static_cast<int64_t>(w * 0.45 * map_.ns_per_px);
      map_.origin_frac = 0;
    } else if (x1 < 0 || x0 > w) {
      map_.pan_px(w / 2 - (x0 + x1) / 2);
    }
    // Vertically: scroll so its lane row is on screen.
    const int r = layout_.row_of_lane(lane);
    if (r >= 0) {
      const auto& lr = layout_.rows()[static_cast<size_t>(r)];
      const double row_y =
          lr.y + index_->row_of(static_cast<uint32_t>(span)) * LaneLayout::kRowHeight;
      const int vis_h = viewport()->height() - kAxisHeight;
      const int v = verticalScrollBar()->value();
      if (row_y < v || row_y + LaneLayout::kRowHeight > v + vis_h) {
        verticalScrollBar()->setValue(static_cast<int>(row_y - vis_h / 3.0));
      }
    }
    bound_view();
    changed_mapping();
  }
  viewport()->update();
  emit spanSelected(selected_);
}

void TimelineView::set_range(int64_t t0_ns, int64_t t1_ns) {
  if (t1_ns < t0_ns) std::swap(t0_ns, t1_ns);
  if (t1_ns == t0_ns) ++t1_ns;
  has_range_ = true;
  range_t0_ = t0_ns;
  range_t1_ = t1_ns;
  viewport()->update();
  emit rangeSelected(t0_ns, t1_ns);
}

void TimelineView::clear_range() {
  if (!has_range_) return;
  has_range_ = false;
  viewport()->update();
  emit rangeCleared();
}

void TimelineView::zoom_to_selection() {
  if (has_range_) {
    zoom_to(range_t0_, range_t1_);
  } else if (selected_ >= 0 && doc_) {
    const auto& s = shown().trace.spans[static_cast<size_t>(selected_)];
    zoom_to(s.start_ns, s.end_ns);
  }
}

QPoint TimelineView::point_of_span(int64_t span) const {
  if (!doc_ || !index_ || span < 0 || static_cast<size_t>(span) >= shown().trace.spans.size())
    return {-1, -1};
  const auto& s = shown().trace.spans[static_cast<size_t>(span)];
  const int row = index_->row_of(static_cast<uint32_t>(span));
  const int r = layout_.row_of_lane(index_->lane_of(s.rank, s.stream));
  if (row < 0 || r < 0) return {-1, -1};
  const TimeMapping tm = trace_mapping();
  const double x0 = std::max(0.0, tm.x_of(s.start_ns));
  const double x1 = std::min<double>(track_width(), tm.x_of(s.end_ns));
  if (x1 <= x0) return {-1, -1};
  const double y = lane_top() + layout_.rows()[static_cast<size_t>(r)].y +
                   row * LaneLayout::kRowHeight + LaneLayout::kRowHeight / 2;
  if (y < kAxisHeight || y >= viewport()->height()) return {-1, -1};
  return {kLabelWidth + static_cast<int>((x0 + x1) / 2), static_cast<int>(y)};
}

std::optional<std::pair<const LaneRow*, DrawItem>> TimelineView::item_at_point(QPoint p) const {
  if (!index_ || p.x() < kLabelWidth || p.y() < kAxisHeight) return std::nullopt;
  const int r = layout_.row_at(p.y() - lane_top());
  if (r < 0) return std::nullopt;
  const auto& lr = layout_.rows()[static_cast<size_t>(r)];
  if (lr.kind != LayoutRow::Kind::Lane) return std::nullopt;
  const auto& lane = index_->lanes()[static_cast<size_t>(lr.lane)];
  const int row = static_cast<int>((p.y() - lane_top() - lr.y) / LaneLayout::kRowHeight);
  if (row < 0 || row >= static_cast<int>(lane.rows.size())) return std::nullopt;
  // Fold the row exactly as painting does, and pick the item under x.
  const TimeMapping tm = trace_mapping();
  const double x = p.x() - kLabelWidth;
  const LaneRow& lrow = lane.rows[static_cast<size_t>(row)];
  std::vector<DrawItem> items;
  fold_row(lrow, tm, track_width(), kFoldPx, items);
  for (const auto& it : items) {
    const double x0 = tm.x_of(it.start_ns);
    const double x1 = std::max(x0 + 1, tm.x_of(it.end_ns));
    if (x >= x0 - 0.5 && x <= x1 + 0.5) return std::pair{&lrow, it};
  }
  return std::nullopt;
}

int64_t TimelineView::span_at_point(QPoint p) const {
  const auto hit = item_at_point(p);
  // A folded block is no span.
  if (!hit || hit->second.count != 1) return -1;
  return hit->first->span[hit->second.first];
}

std::optional<FoldSummary> TimelineView::fold_at_point(QPoint p) const {
  const auto hit = item_at_point(p);
  if (!hit || hit->second.count < 2) return std::nullopt;
  return summarize(*hit->first, hit->second);
}

QString TimelineView::tooltip_at(QPoint p) const {
  if (!doc_) return {};
  auto row = [](const QString& k, const QString& v) {
    return "<tr><td><b>" + k.toHtmlEscaped() + "</b></td><td>" + v.toHtmlEscaped() + "</td></tr>";
  };
  QString html;
  if (const auto c = counter_at_point(p)) {
    html += row(QString::fromStdString(c->track->name),
                QString::fromStdString(format_counter(c->track->name, c->value)));
    html += row(tr("Rank"), QString::number(c->track->rank));
    html += row(tr("At"), QString::fromStdString(format_duration_ns(
                              static_cast<double>(c->t_ns - index_->start_ns()))));
  } else if (const int64_t span = span_at_point(p); span >= 0) {
    for (auto& [k, v] :
         span_attributes(shown().trace, static_cast<uint32_t>(span), index_->start_ns(), true)) {
      html += row(QString::fromStdString(k), QString::fromStdString(v));
    }
  } else if (const auto f = fold_at_point(p)) {
    html += row(tr("Folded"), tr("%1 spans").arg(f->count));
    html += row(
        tr("Length"),
        QString::fromStdString(format_duration_ns(static_cast<double>(f->end_ns - f->start_ns))));
    html += row(tr("Busy"), QStringLiteral("%1 %").arg(100.0 * f->busy_fraction(), 0, 'f', 1));
    // The kinds by their time, largest first, as a share of the busy time.
    std::vector<int> kinds;
    for (int k = 0; k < traces::kSpanKindCount; ++k) {
      if (f->kind_ns[static_cast<size_t>(k)] > 0) kinds.push_back(k);
    }
    std::stable_sort(kinds.begin(), kinds.end(), [&](int a, int b) {
      return f->kind_ns[static_cast<size_t>(a)] > f->kind_ns[static_cast<size_t>(b)];
    });
    for (int k : kinds) {
      const auto ns = static_cast<double>(f->kind_ns[static_cast<size_t>(k)]);
      html +=
          row(QString::fromUtf8(traces::to_string(static_cast<traces::SpanKind>(k)).data()),
              QStringLiteral("%1 (%2 %)")
                  .arg(QString::fromStdString(format_duration_ns(ns)))
                  .arg(f->busy_ns ? 100.0 * ns / static_cast<double>(f->busy_ns) : 0.0, 0, 'f', 1));
    }
  }
  return html.isEmpty() ? QString() : "<table>" + html + "</table>";
}

void TimelineView::resizeEvent(QResizeEvent* e) {
  QAbstractScrollArea::resizeEvent(e);
  if (!fitted_) {
    fit_all();
  } else if (pinned_) {
    map_.fit(pinned_t0_, pinned_t1_, track_width());
    changed_mapping();
  } else if (bound_view()) {  // a wider track shows more: keep it within the bounds
    changed_mapping();
  }
  relayout();
}

void TimelineView::scrollContentsBy(int, int) { viewport()->update(); }

// What every paint step of a frame needs, worked out once per frame.
struct TimelineView::Frame {
  int width;  // of the viewport
  int height;
  int track_width;
  TimeMapping tm;  // trace time -> track x
  double top;      // viewport y of layout y = 0
  QFontMetrics fm;
  AxisTicks ticks;  // drawn as grid lines under the lanes and as labels in the axis
};

TimelineView::Frame TimelineView::frame() const {
  const int tw = track_width();
  return Frame{viewport()->width(),
               viewport()->height(),
               tw,
               trace_mapping(),
               lane_top(),
               QFontMetrics(font()),
               compute_ticks(map_, tw, index_->start_ns() + shift_ns_)};
}

// The layers, back to front: background, lanes and headers (with the grid and the spans), the label
// column's border, the selection, the range, then the axis over everything and the scale.
void TimelineView::paintEvent(QPaintEvent*) {
  QPainter p(viewport());
  p.fillRect(0, 0, viewport()->width(), viewport()->height(), palette::kBackground);
  last_items_ = 0;
  if (!index_) {
    paint_empty(p);
    return;
  }
  ensure_window();
  if (!zoom_error_.isEmpty()) {
    p.setPen(palette::kEmptyText);
    p.drawText(rect().adjusted(20, 0, -20, 0), Qt::AlignCenter | Qt::TextWordWrap, zoom_error_);
    return;
  }
  const Frame f = frame();
  p.save();
  p.setClipRect(0, kAxisHeight, f.width, f.height - kAxisHeight);
  try {
    last_items_ = paint_rows(p, f);
  } catch (const std::exception& e) {
    // A corrupt zoom chunk: say so instead of drawing anything from it.
    zoom_error_ = QString::fromStdString(e.what());
    p.restore();
    p.fillRect(0, 0, viewport()->width(), viewport()->height(), palette::kBackground);
    p.setPen(palette::kEmptyText);
    p.drawText(rect().adjusted(20, 0, -20, 0), Qt::AlignCenter | Qt::TextWordWrap, zoom_error_);
    return;
  }
  paint_label_border(p, f);
  paint_flow(p, f);
  paint_critical_path(p, f);
  paint_selection(p, f);
  paint_range(p, f);
  paint_range_length(p, f);
  paint_markers(p, f);
  p.restore();
  paint_axis(p, f);
  paint_scale(p);
}

void TimelineView::paint_empty(QPainter& p) const {
  p.setPen(palette::kEmptyText);
  p.drawText(rect(), Qt::AlignCenter, empty_message_);
}

size_t TimelineView::paint_rows(QPainter& p, const Frame& f) const {
  const auto& rows = layout_.rows();
  int first_row = layout_.row_at(std::max(0.0, kAxisHeight - f.top));
  if (first_row < 0) first_row = 0;
  std::vector<DrawItem> items;  // scratch for every row's fold, allocated once per frame
  size_t drawn = 0;
  int lane_parity = 0;  // lanes alternate their background from the first one under a header
  for (size_t ri = static_cast<size_t>(first_row); ri < rows.size(); ++ri) {
    const auto& lr = rows[ri];
    const double y = f.top + lr.y;
    if (y > f.height) break;
    if (lr.kind == LayoutRow::Kind::Counter) {
      paint_counter(p, f, lr, y, (lane_parity++ % 2) != 0);
      continue;
    }
    if (lr.kind != LayoutRow::Kind::Lane) {
      paint_header(p, f, lr, y);
      lane_parity = 0;
      continue;
    }
    drawn += paint_lane(p, f, lr, y, (lane_parity++ % 2) != 0, items);
  }
  return drawn;
}

void TimelineView::paint_header(QPainter& p, const Frame& f, const LayoutRow& lr, double y) const {
  const bool group = lr.kind == LayoutRow::Kind::Group;
  p.fillRect(QRectF(0, y, f.width, lr.height),
             group ? palette::kGroupHeader : palette::kRankHeader);
  p.setPen(palette::kBorder);
  p.drawLine(QPointF(0, y + lr.height - 0.5), QPointF(f.width, y + lr.height - 0.5));
  // Disclosure triangle, then the label.
  const double tx = 6 + lr.indent * 12;
  const double cy = y + lr.height / 2;
  p.setPen(Qt::NoPen);
  p.setBrush(palette::kDisclosure);
  p.drawPolygon(disclosure_triangle(tx, cy, lr.collapsed));
  QFont bold = font();
  bold.setBold(true);
  p.setFont(bold);
  p.setPen(palette::kHeaderText);
  p.drawText(QRectF(tx + 12, y, f.width - tx - 12, lr.height), Qt::AlignVCenter | Qt::AlignLeft,
             QString::fromStdString(lr.label));
  p.setFont(font());
}

size_t TimelineView::paint_lane(QPainter& p, const Frame& f, const LayoutRow& lr, double y,
                                bool odd, std::vector<DrawItem>& items) const {
  const auto& lane = index_->lanes()[static_cast<size_t>(lr.lane)];
  const QColor bg = odd ? palette::kLaneOdd : palette::kLaneEven;
  p.fillRect(QRectF(0, y, f.width, lr.height), bg);
  paint_grid(p, f, y, lr.height);
  p.save();
  const QRectF track_rect(kLabelWidth, y, f.track_width, lr.height);
  p.setClipRect(track_rect.intersected(
      QRectF(kLabelWidth, kAxisHeight, f.track_width, f.height - kAxisHeight)));
  size_t drawn = 0;
  try {
    for (size_t rowi = 0; rowi < lane.rows.size(); ++rowi) {
      const double ry = y + rowi * LaneLayout::kRowHeight + 1;
      const double rh = LaneLayout::kRowHeight - 2;
      if (ry > f.height || ry + rh < kAxisHeight) continue;
      if (doc_->zoomed() && !window_) {
        drawn += paint_zoom_row(p, f, lane, static_cast<int>(rowi), ry, rh, bg);
        continue;
      }
      drawn += paint_lane_row(p, f, lane.rows[rowi], ry, rh, bg, items);
    }
  } catch (...) {  // a corrupt zoom chunk: paintEvent reports it
    p.restore();
    throw;
  }
  p.restore();
  paint_lane_label(p, f, lr, y);
  return drawn;
}

void TimelineView::paint_grid(QPainter& p, const Frame& f, double y, double height) const {
  p.setPen(palette::kGrid);
  for (const auto& t : f.ticks.ticks) {
    const double x = kLabelWidth + t.x;
    p.drawLine(QPointF(x, y), QPointF(x, y + height));
  }
}

size_t TimelineView::paint_lane_row(QPainter& p, const Frame& f, const LaneRow& row, double ry,
                                    double rh, const QColor& bg,
                                    std::vector<DrawItem>& items) const {
  items.clear();
  fold_row(row, f.tm, f.track_width, kFoldPx, items);
  const QRectF row_rect(kLabelWidth, ry, f.track_width, rh);
  for (const auto& it : items) {
    double x0 = f.tm.x_of(it.start_ns);
    double x1 = f.tm.x_of(it.end_ns);
    x0 = std::max(x0, -2.0);
    x1 = std::min(x1, f.track_width + 2.0);
    const double w = std::max(1.0, x1 - x0);
    const QRectF r(kLabelWidth + x0, ry, w, rh);
    if (it.count == 1) {
      paint_span(p, f, row.span[it.first], r, row_rect);
    } else {
      paint_folded(p, f, summarize(row, it), bg, r, row_rect);
    }
  }
  return items.size();
}

size_t TimelineView::paint_zoom_row(QPainter& p, const Frame& f, const Lane& lane, int row,
                                    double ry, double rh, const QColor& bg) const {
  const traces::ZoomIndex& z = *doc_->zoom;
  const traces::ZoomGrid& g = z.grid();
  const int level = zoom_level_for(g, f.tm.ns_per_px);
  const int64_t b0 = g.bucket_of(level, f.tm.t_floor(0));
  const int64_t b1 = g.bucket_of(level, f.tm.t_ceil(f.track_width)) + 1;
  std::vector<ZoomItem> items;
  zoom_items(z.buckets(lane.rank, lane.stream, row, level, b0, b1), f.tm, kFoldPx, items);
  const QRectF row_rect(kLabelWidth, ry, f.track_width, rh);
  for (const auto& it : items) {
    const double x0 = std::max(f.tm.x_of(it.fold.start_ns), -2.0);
    const double x1 = std::min(f.tm.x_of(it.fold.end_ns), f.track_width + 2.0);
    const QRectF r(kLabelWidth + x0, ry, std::max(1.0, x1 - x0), rh);
    if (!it.solid) {
      paint_folded(p, f, it.fold, bg, r, row_rect);
      continue;
    }
    const QColor c = palette::span_color(it.fold.dominant, it.name);
    p.fillRect(r, c);
    if (r.width() < 24) continue;
    p.setPen(palette::text_on(c));
    const QRectF text_rect = r.adjusted(3, 0, -2, 0).intersected(row_rect);
    const QString name = QString::fromStdString(doc_->trace.strings.str(it.name));
    p.drawText(text_rect, Qt::AlignVCenter | Qt::AlignLeft,
               f.fm.elidedText(name, Qt::ElideRight, static_cast<int>(text_rect.width())));
  }
  return items.size();
}

void TimelineView::paint_span(QPainter& p, const Frame& f, uint32_t id, const QRectF& r,
                              const QRectF& row_rect) const {
  const traces::Span& s = shown().trace.spans[id];
  const QColor c = palette::span_color(s.kind, s.name);
  p.fillRect(r, c);
  if (is_highlighted(id)) {  // a search match: a 2 px frame inside the span
    const QRectF in = r.intersected(row_rect.adjusted(-2, 0, 2, 0));
    p.fillRect(QRectF(in.left(), in.top(), in.width(), 2), palette::kSearchHit);
    p.fillRect(QRectF(in.left(), in.bottom() - 2, in.width(), 2), palette::kSearchHit);
    if (in.width() > 4) {
      p.fillRect(QRectF(in.left(), in.top(), 2, in.height()), palette::kSearchHit);
      p.fillRect(QRectF(in.right() - 2, in.top(), 2, in.height()), palette::kSearchHit);
    }
  }
  if (r.width() < 24) return;
  p.setPen(palette::text_on(c));
  const QRectF text_rect = r.adjusted(3, 0, -2, 0).intersected(row_rect);
  const QString name = QString::fromStdString(shown().trace.name_of(s));
  p.drawText(text_rect, Qt::AlignVCenter | Qt::AlignLeft,
             f.fm.elidedText(name, Qt::ElideRight, static_cast<int>(text_rect.width())));
}

// A folded run: the colour of the kind with most of its time, shaded by its busy fraction, with a
// light line along its top (a pattern brush would cost more than the rest of the frame), and its
// count when it fits.
void TimelineView::paint_folded(QPainter& p, const Frame& f, const FoldSummary& fold,
                                const QColor& bg, const QRectF& r, const QRectF& row_rect) const {
  p.fillRect(r, palette::folded_color(fold.dominant, fold.busy_fraction(), bg));
  if (r.width() >= 4) {
    p.fillRect(QRectF(r.x(), r.y(), r.width(), 2), palette::folded_edge_color(fold.dominant));
  }
  if (r.width() < 36) return;
  p.setPen(palette::kFoldedText);
  const QRectF text_rect = r.intersected(row_rect);
  p.drawText(text_rect, Qt::AlignCenter,
             f.fm.elidedText(QStringLiteral("%1 spans").arg(fold.count), Qt::ElideRight,
                             static_cast<int>(text_rect.width())));
}

void TimelineView::paint_lane_label(QPainter& p, const Frame& f, const LayoutRow& lr,
                                    double y) const {
  const QRectF label_rect(0, y, kLabelWidth, lr.height);
  p.fillRect(label_rect, palette::kLaneLabel);
  p.setPen(palette::kLaneLabelText);
  p.drawText(label_rect.adjusted(8 + lr.indent * 12, 0, -4, 0), Qt::AlignVCenter | Qt::AlignLeft,
             f.fm.elidedText(QString::fromStdString(lr.label), Qt::ElideRight,
                             kLabelWidth - 12 - lr.indent * 12));
  p.setPen(palette::kLaneSeparator);
  p.drawLine(QPointF(0, y + lr.height - 0.5), QPointF(f.width, y + lr.height - 0.5));
}

double TimelineView::counter_y(const CounterTrack& c, double v, double y, double h) {
  // From 0 (or the track's minimum when it is negative) at the bottom to its maximum at the top.
  const double lo = std::min(0.0, c.min), hi = std::max(c.max, lo + 1e-300);
  const double frac = hi > lo ? (v - lo) / (hi - lo) : 0.0;
  return std::round(y + h - 3 - frac * (h - 7));
}

void TimelineView::paint_counter(QPainter& p, const Frame& f, const LayoutRow& lr, double y,
                                 bool odd) const {
  const auto& c = doc_->counters[static_cast<size_t>(lr.counter)];
  p.fillRect(QRectF(0, y, f.width, lr.height), odd ? palette::kLaneOdd : palette::kLaneEven);
  paint_grid(p, f, y, lr.height);
  std::vector<CounterColumn> cols;
  fold_counter(c, f.tm, f.track_width, index_->end_ns(), cols);
  p.save();
  p.setClipRect(
      QRectF(kLabelWidth, y, f.track_width, lr.height)
          .intersected(QRectF(kLabelWidth, kAxisHeight, f.track_width, f.height - kAxisHeight)));
  const double base = counter_y(c, std::min(0.0, c.min), y, lr.height);
  double prev = std::nan("");
  for (const auto& col : cols) {
    const double x = kLabelWidth + col.x;
    // The area under the step function, then its line: the column's span of values joined to the
    // previous column's last value, so steps read as vertical edges.
    const double y_hi = counter_y(c, col.hi, y, lr.height);
    const double y_lo = counter_y(c, col.lo, y, lr.height);
    if (base > y_lo) p.fillRect(QRectF(x, y_lo + 1, 1, base - y_lo), palette::kCounterFill);
    double top = y_hi, bottom = y_lo;
    if (!std::isnan(prev)) {
      top = std::min(top, prev);
      bottom = std::max(bottom, prev);
    }
    p.fillRect(QRectF(x, top, 1, bottom - top + 1), palette::kCounterLine);
    prev = counter_y(c, col.last, y, lr.height);
  }
  p.restore();
  // The label: the counter's name and its largest value.
  const QRectF label_rect(0, y, kLabelWidth, lr.height);
  p.fillRect(label_rect, palette::kLaneLabel);
  p.setPen(palette::kLaneLabelText);
  const QRectF text = label_rect.adjusted(8 + lr.indent * 12, 1, -4, -1);
  p.drawText(text, Qt::AlignTop | Qt::AlignLeft,
             f.fm.elidedText(QString::fromStdString(lr.label), Qt::ElideRight,
                             static_cast<int>(text.width())));
  p.setPen(palette::kScaleText);
  p.drawText(text, Qt::AlignBottom | Qt::AlignLeft,
             tr("max %1").arg(QString::fromStdString(format_counter(c.name, c.max))));
  p.setPen(palette::kLaneSeparator);
  p.drawLine(QPointF(0, y + lr.height - 0.5), QPointF(f.width, y + lr.height - 0.5));
}

std::optional<TimelineView::CounterHit> TimelineView::counter_at_point(QPoint p) const {
  if (!index_ || !doc_ || p.x() < kLabelWidth || p.y() < kAxisHeight) return std::nullopt;
  const int r = layout_.row_at(p.y() - lane_top());
  if (r < 0) return std::nullopt;
  const auto& lr = layout_.rows()[static_cast<size_t>(r)];
  if (lr.kind != LayoutRow::Kind::Counter) return std::nullopt;
  const auto& c = doc_->counters[static_cast<size_t>(lr.counter)];
  const int64_t t = trace_mapping().t_floor(p.x() - kLabelWidth);
  const auto v = counter_value_at(c, t);
  if (!v) return std::nullopt;
  return CounterHit{&c, t, *v};
}

void TimelineView::paint_label_border(QPainter& p, const Frame& f) const {
  p.setPen(palette::kBorder);
  p.drawLine(QPointF(kLabelWidth - 0.5, kAxisHeight), QPointF(kLabelWidth - 0.5, f.height));
}

// The selected span: a dark outline with a yellow halo around it, over whatever covers it.
void TimelineView::paint_selection(QPainter& p, const Frame& f) const {
  if (selected_ < 0) return;
  const auto& s = shown().trace.spans[static_cast<size_t>(selected_)];
  const int row = index_->row_of(static_cast<uint32_t>(selected_));
  const int r = layout_.row_of_lane(index_->lane_of(s.rank, s.stream));
  if (row < 0 || r < 0) return;
  const double y =
      f.top + layout_.rows()[static_cast<size_t>(r)].y + row * LaneLayout::kRowHeight + 1;
  const double x0 = std::max(-3.0, f.tm.x_of(s.start_ns));
  const double x1 = std::min(f.track_width + 3.0, f.tm.x_of(s.end_ns));
  p.setClipRect(kLabelWidth, kAxisHeight, f.track_width, f.height - kAxisHeight);
  p.setBrush(Qt::NoBrush);
  p.setPen(QPen(palette::kSelectionOutline, 2));
  p.drawRect(
      QRectF(kLabelWidth + x0 - 1, y - 1, std::max(2.0, x1 - x0) + 2, LaneLayout::kRowHeight));
  p.setPen(QPen(palette::kSelectionHalo, 1));
  p.drawRect(QRectF(kLabelWidth + x0 - 2.5, y - 2.5, std::max(2.0, x1 - x0) + 5,
                    LaneLayout::kRowHeight + 3));
}

void TimelineView::set_critical_path(CriticalPath path) {
  critical_ = std::move(path);
  viewport()->update();
}

void TimelineView::paint_critical_path(QPainter& p, const Frame& f) const {
  if (critical_.empty() || !doc_) return;
  p.save();
  p.setClipRect(kLabelWidth, kAxisHeight, f.track_width, f.height - kAxisHeight);
  p.setRenderHint(QPainter::Antialiasing, true);
  const double lo = kLabelWidth - 50.0, hi = kLabelWidth + f.track_width + 50.0;
  auto clampx = [&](double x) { return std::clamp(x, lo, hi); };
  bool has_prev = false;  // where the link before ended, when it is drawn
  QPointF prev;
  for (const auto& l : critical_.links) {
    const auto r = span_rect(l.span);
    if (!r) {
      has_prev = false;
      continue;
    }
    const double x0 = clampx(r->left()), x1 = clampx(r->right());
    const double on = clampx(kLabelWidth + f.tm.x_of(l.from_ns));
    p.setBrush(Qt::NoBrush);
    p.setPen(QPen(palette::kCriticalPath, 2));
    p.drawRect(QRectF(x0, r->top(), std::max(2.0, x1 - x0), r->height()));
    // The part on the path: a bar along the bottom of the span (the rest was a wait).
    p.fillRect(QRectF(on, r->bottom() - 3, std::max(2.0, x1 - on), 3), palette::kCriticalPath);
    const QPointF in(on, r->center().y());
    if (has_prev) {
      p.setPen(QPen(palette::kCriticalPath, 1.5, Qt::DashLine));
      p.drawLine(prev, in);
    }
    prev = QPointF(x1, r->center().y());
    has_prev = true;
  }
  p.restore();
}

std::optional<QRectF> TimelineView::span_rect(int64_t span) const {
  if (!doc_ || !index_ || span < 0 || static_cast<size_t>(span) >= shown().trace.spans.size())
    return std::nullopt;
  const auto& s = shown().trace.spans[static_cast<size_t>(span)];
  const int row = index_->row_of(static_cast<uint32_t>(span));
  const int r = layout_.row_of_lane(index_->lane_of(s.rank, s.stream));
  if (row < 0 || r < 0) return std::nullopt;
  const TimeMapping tm = trace_mapping();
  const double y =
      lane_top() + layout_.rows()[static_cast<size_t>(r)].y + row * LaneLayout::kRowHeight + 1;
  const double x0 = kLabelWidth + tm.x_of(s.start_ns);
  const double x1 = kLabelWidth + tm.x_of(s.end_ns);
  return QRectF(x0, y, std::max(1.0, x1 - x0), LaneLayout::kRowHeight - 2);
}

void TimelineView::paint_flow(QPainter& p, const Frame& f) const {
  if (flow_.size() < 2 || selected_ < 0) return;
  p.save();
  p.setClipRect(kLabelWidth, kAxisHeight, f.track_width, f.height - kAxisHeight);
  p.setRenderHint(QPainter::Antialiasing, true);
  const auto& spans = shown().trace.spans;
  // Rectangles clamped to a little past the track, so lines to far-off members stay finite.
  auto rect_of = [&](uint32_t id) -> std::optional<QRectF> {
    auto r = span_rect(id);
    if (!r) return r;
    const double lo = kLabelWidth - 1e5, hi = kLabelWidth + f.track_width + 1e5;
    const double x0 = std::clamp(r->left(), lo, hi), x1 = std::clamp(r->right(), lo, hi);
    return QRectF(x0, r->top(), std::max(1.0, x1 - x0), r->height());
  };
  auto arrow = [&](QPointF a, QPointF b) {
    p.setPen(QPen(palette::kFlow, 1.5));
    p.drawLine(a, b);
    const double dx = b.x() - a.x(), dy = b.y() - a.y();
    const double len = std::hypot(dx, dy);
    if (len < 1) return;
    const double ux = dx / len, uy = dy / len;
    QPolygonF head;
    head << b << QPointF(b.x() - 8 * ux + 4 * uy, b.y() - 8 * uy - 4 * ux)
         << QPointF(b.x() - 8 * ux - 4 * uy, b.y() - 8 * uy + 4 * ux);
    p.setPen(Qt::NoPen);
    p.setBrush(palette::kFlow);
    p.drawPolygon(head);
  };
  // The member that started last (the latest start, the first such in span order).
  uint32_t last = flow_.front();
  uint32_t send = flow_.front(), recv = flow_.back();
  const bool p2p = spans[flow_.front()].kind == traces::SpanKind::P2P;
  for (uint32_t id : flow_) {
    if (spans[id].start_ns > spans[last].start_ns) last = id;
    if (spans[id].op == traces::CollOp::Send) send = id;
    if (spans[id].op == traces::CollOp::Recv) recv = id;
  }
  if (p2p) {
    const auto a = rect_of(send), b = rect_of(recv);
    if (a && b) {
      arrow(QPointF(a->left(), a->center().y()), QPointF(b->right(), b->center().y()));
    }
  } else if (const auto target = rect_of(last)) {
    const QPointF to(target->left(), target->center().y());
    for (uint32_t id : flow_) {
      if (id == last) continue;
      if (const auto r = rect_of(id)) arrow(QPointF(r->left(), r->center().y()), to);
    }
  }
  p.setRenderHint(QPainter::Antialiasing, false);
  p.setBrush(Qt::NoBrush);
  p.setPen(QPen(palette::kFlow, 2));
  for (uint32_t id : flow_) {
    if (static_cast<int64_t>(id) == selected_) continue;
    if (const auto r = rect_of(id)) p.drawRect(r->adjusted(-1, -1, 1, 1));
  }
  p.restore();
}

// The selected range (or the one being dragged): a translucent band between two lines.
void TimelineView::paint_range(QPainter& p, const Frame& f) const {
  if (!has_range_ && drag_ != Drag::Range) return;
  const double x0 = std::max(-1.0, f.tm.x_of(range_t0_));
  const double x1 = std::min(f.track_width + 1.0, f.tm.x_of(range_t1_));
  p.setClipRect(kLabelWidth, kAxisHeight, f.track_width, f.height - kAxisHeight);
  if (x1 > x0) {
    p.fillRect(QRectF(kLabelWidth + x0, kAxisHeight, x1 - x0, f.height - kAxisHeight),
               palette::kRangeFill);
  }
  p.setPen(QPen(palette::kAccent, 1));
  p.drawLine(QPointF(kLabelWidth + x0, kAxisHeight), QPointF(kLabelWidth + x0, f.height));
  p.drawLine(QPointF(kLabelWidth + x1, kAxisHeight), QPointF(kLabelWidth + x1, f.height));
}

// The time axis: its band and the ticks with their labels.
void TimelineView::paint_axis(QPainter& p, const Frame& f) const {
  p.fillRect(0, 0, f.width, kAxisHeight, palette::kAxis);
  p.setPen(palette::kBorder);
  p.drawLine(QPointF(0, kAxisHeight - 0.5), QPointF(f.width, kAxisHeight - 0.5));
  p.save();
  p.setClipRect(kLabelWidth, 0, f.track_width, kAxisHeight);
  const int tick_bottom = kAxisHeight - kStepBandHeight;
  for (const auto& t : f.ticks.ticks) {
    const double x = kLabelWidth + t.x;
    p.setPen(palette::kTick);
    p.drawLine(QPointF(x, tick_bottom - 7), QPointF(x, tick_bottom - 1));
    p.setPen(palette::kTickText);
    p.drawText(QRectF(x + 3, 0, 200, tick_bottom - 4), Qt::AlignLeft | Qt::AlignVCenter,
               QString::fromStdString(t.label));
  }
  paint_steps(p, f);
  // The markers' flags: a small triangle pointing down at each marker's time.
  p.setRenderHint(QPainter::Antialiasing, true);
  for (int64_t t : markers_.times()) {
    const double x = kLabelWidth + f.tm.x_of(t);
    if (x < kLabelWidth - 6 || x > f.width + 6) continue;
    QPolygonF flag;
    flag << QPointF(x - 5, 0) << QPointF(x + 5, 0) << QPointF(x, 8);
    p.setPen(Qt::NoPen);
    p.setBrush(palette::kMarker);
    p.drawPolygon(flag);
  }
  p.restore();
}

// The bottom of the axis: each step's window as a band, alternately shaded, named "step N" at
// its start when there is room (the name shrinks to the number, then goes).
void TimelineView::paint_steps(QPainter& p, const Frame& f) const {
  if (!doc_) return;
  const double y = kAxisHeight - kStepBandHeight;
  const auto& steps = doc_->steps;
  // The first step that ends after the left edge.
  const int64_t left = f.tm.t_floor(0), right = f.tm.t_ceil(f.track_width);
  auto it = std::lower_bound(steps.begin(), steps.end(), left,
                             [](const StepWindow& w, int64_t t) { return w.end_ns < t; });
  const auto last = std::upper_bound(it, steps.end(), right,
                                     [](int64_t t, const StepWindow& w) { return t < w.start_ns; });
  // Steps under 3 px each (a whole long trace): one plain band, as a folded block would be; the
  // frame's cost stays bounded by the pixels, not by the thousands of steps.
  if (static_cast<double>(last - it) * 3 > f.track_width) {
    p.fillRect(QRectF(kLabelWidth, y, f.track_width, kStepBandHeight - 1), palette::kStepBandEven);
    return;
  }
  for (; it != last; ++it) {
    const double x0 = std::max(-1.0, f.tm.x_of(it->start_ns));
    const double x1 = std::min(f.track_width + 1.0, f.tm.x_of(it->end_ns));
    const QRectF band(kLabelWidth + x0, y, std::max(1.0, x1 - x0), kStepBandHeight - 1);
    p.fillRect(band, it->step % 2 ? palette::kStepBandOdd : palette::kStepBandEven);
    const QString full = tr("step %1").arg(it->step);
    const QString num = QString::number(it->step);
    const double room = band.width() - 4;
    const QString& text = f.fm.horizontalAdvance(full) <= room ? full : num;
    if (f.fm.horizontalAdvance(text) > room) continue;
    p.setPen(palette::kTickText);
    p.drawText(band.adjusted(3, 0, 0, 0), Qt::AlignLeft | Qt::AlignVCenter, text);
  }
}

// Markers: a dashed line across the lanes at each marker's time.
void TimelineView::paint_markers(QPainter& p, const Frame& f) const {
  if (markers_.size() == 0) return;
  p.setClipRect(kLabelWidth, kAxisHeight, f.track_width, f.height - kAxisHeight);
  p.setPen(QPen(palette::kMarker, 1, Qt::DashLine));
  for (int64_t t : markers_.times()) {
    const double x = kLabelWidth + f.tm.x_of(t);
    p.drawLine(QPointF(x, kAxisHeight), QPointF(x, f.height));
  }
}

bool TimelineView::go_to_step(int32_t step) {
  if (!doc_) return false;
  const auto w = find_step(doc_->steps, step);
  if (!w) return false;
  zoom_to(w->start_ns, w->end_ns);
  return true;
}

int32_t TimelineView::step_at_center() const {
  if (!doc_) return -1;
  const int64_t t = trace_mapping().t_floor(track_width() / 2.0);
  for (const auto& w : doc_->steps) {
    if (w.start_ns <= t && t < w.end_ns) return w.step;
  }
  return -1;
}

int64_t TimelineView::cursor_time_ns() const {
  double x = track_width() / 2.0;
  if (last_mouse_.x() >= kLabelWidth && underMouse()) x = last_mouse_.x() - kLabelWidth;
  return trace_mapping().t_floor(x);
}

void TimelineView::add_marker(int64_t t_ns) {
  if (markers_.add(t_ns)) {
    viewport()->update();
    emit markersChanged();
  }
}

void TimelineView::clear_markers() {
  markers_.clear();
  viewport()->update();
  emit markersChanged();
}

bool TimelineView::scroll_to_counter(const std::string& name) {
  if (!doc_) return false;
  for (const auto& r : layout_.rows()) {
    if (r.kind != LayoutRow::Kind::Counter || r.counter < 0) continue;
    if (doc_->counters[static_cast<size_t>(r.counter)].name != name) continue;
    verticalScrollBar()->setValue(
        static_cast<int>(std::max(0.0, r.y - 3 * LaneLayout::kRowHeight)));
    return true;
  }
  return false;
}

int64_t TimelineView::show_flow(const QString& text) {
  if (!doc_) return -1;
  const auto& spans = shown().trace.spans;
  const int64_t from = visible_start_ns();
  int64_t best = -1;
  for (size_t i = 0; i < spans.size(); ++i) {
    const auto& s = spans[i];
    if (s.start_ns < from || (best >= 0 && s.start_ns >= spans[static_cast<size_t>(best)].start_ns))
      continue;
    if (s.kind != traces::SpanKind::Collective && s.kind != traces::SpanKind::P2P) continue;
    if (!QString::fromStdString(shown().trace.name_of(s)).contains(text)) continue;
    if (shown().flows.members_of(static_cast<uint32_t>(i)).size() < 2) continue;
    best = static_cast<int64_t>(i);
  }
  if (best < 0) return -1;
  select_span(best, true);
  int64_t t0 = INT64_MAX, t1 = INT64_MIN;
  for (uint32_t m : flow_) {
    t0 = std::min(t0, spans[m].start_ns);
    t1 = std::max(t1, spans[m].end_ns);
  }
  zoom_to(t0, t1);
  return best;
}

void TimelineView::center_on(int64_t t_ns) {
  const double x = trace_mapping().x_of(t_ns);
  pan_by_px(track_width() / 2.0 - x);
}

bool TimelineView::jump_to_marker(bool next) {
  // From the centre of the view, so that repeated jumps walk the markers in order.
  const int64_t c = trace_mapping().t_floor(track_width() / 2.0);
  const auto t = next ? markers_.next_after(c) : markers_.previous_before(c);
  if (!t) return false;
  center_on(*t);
  return true;
}

// The range's length, in a box at the bottom of the range's band: in the axis band it covered the
// tick labels.
void TimelineView::paint_range_length(QPainter& p, const Frame& f) const {
  if (!has_range_) return;
  const double x0 = f.tm.x_of(range_t0_), x1 = f.tm.x_of(range_t1_);
  const QString len =
      QString::fromStdString(format_duration_ns(static_cast<double>(range_t1_ - range_t0_)));
  const double cx = kLabelWidth + (std::max(0.0, x0) + std::min<double>(f.track_width, x1)) / 2;
  const double h = kAxisHeight - 8;
  const QRectF box(cx - f.fm.horizontalAdvance(len) / 2.0 - 6, f.height - h - 4,
                   f.fm.horizontalAdvance(len) + 12, h);
  p.fillRect(box, palette::kAccent);
  p.setPen(palette::kTextOnAccent);
  p.drawText(box, Qt::AlignCenter, len);
}

// The corner above the lane names: the scale.
void TimelineView::paint_scale(QPainter& p) const {
  p.setPen(palette::kScaleText);
  p.drawText(QRectF(8, 0, kLabelWidth - 12, kAxisHeight), Qt::AlignVCenter | Qt::AlignLeft,
             QString::fromStdString(format_duration_ns(map_.ns_per_px * 100)) + tr(" / 100 px"));
}

void TimelineView::wheelEvent(QWheelEvent* e) {
  const QPoint delta = e->angleDelta();
  const bool ctrl = e->modifiers() & Qt::ControlModifier;
  if (e->modifiers() & Qt::ShiftModifier) {
    pan_by_px(delta.y() / 2.0);  // Shift+wheel pans, as in Perfetto
  } else if (delta.y() != 0 && ctrl != wheel_zooms_) {
    const double x = e->position().x() - kLabelWidth;
    zoom_by(std::pow(1.0015, delta.y()), std::clamp(x, 0.0, static_cast<double>(track_width())));
  } else if (delta.y() != 0) {
    verticalScrollBar()->setValue(verticalScrollBar()->value() - delta.y() / 2);
  }
  if (delta.x() != 0) pan_by_px(delta.x() / 2.0);
  e->accept();
}

void TimelineView::mousePressEvent(QMouseEvent* e) {
  setFocus();
  if (e->button() != Qt::LeftButton) return;
  const QPoint pos = e->position().toPoint();
  press_pos_ = pos;
  press_map_ = map_;
  press_scroll_ = verticalScrollBar()->value();
  moved_ = false;
  if (pos.y() >= kAxisHeight) {
    const int r = layout_.row_at(pos.y() - lane_top());
    if (r >= 0 &&
        (layout_.rows()[static_cast<size_t>(r)].kind == LayoutRow::Kind::Group ||
         layout_.rows()[static_cast<size_t>(r)].kind == LayoutRow::Kind::Rank) &&
        (pos.x() < kLabelWidth || e->modifiers() == Qt::NoModifier)) {
      // Headers collapse and expand on a click (anywhere on the header band).
      toggle_collapsed(layout_.rows()[static_cast<size_t>(r)].key);
      drag_ = Drag::None;
      return;
    }
  }
  if (pos.x() < kLabelWidth) {
    drag_ = Drag::None;
    return;
  }
  if (e->modifiers() & Qt::ShiftModifier) {
    drag_ = Drag::Range;
    const int64_t t = trace_mapping().t_floor(pos.x() - kLabelWidth);
    range_t0_ = range_t1_ = t;
  } else {
    drag_ = Drag::Pan;
  }
}

void TimelineView::mouseMoveEvent(QMouseEvent* e) {
  const QPoint pos = e->position().toPoint();
  last_mouse_ = pos;
  if (drag_ != Drag::None && (pos - press_pos_).manhattanLength() >= 3) moved_ = true;
  if (drag_ == Drag::Pan && moved_) {
    pinned_ = false;
    map_ = press_map_;
    map_.pan_px(pos.x() - press_pos_.x());
    bound_view();
    verticalScrollBar()->setValue(press_scroll_ - (pos.y() - press_pos_.y()));
    changed_mapping();
    return;
  }
  if (drag_ == Drag::Range) {
    const TimeMapping tm = trace_mapping();
    const int64_t a = tm.t_floor(press_pos_.x() - kLabelWidth);
    const int64_t b = tm.t_floor(std::clamp(pos.x() - kLabelWidth, 0, track_width()));
    range_t0_ = std::min(a, b);
    range_t1_ = std::max(a, b);
    viewport()->update();
    return;
  }
  const int64_t h = span_at_point(pos);
  if (h != hovered_) {
    hovered_ = h;
    emit spanHovered(h);
  }
  show_tooltip(pos, e->globalPosition().toPoint());
}

void TimelineView::show_tooltip(QPoint pos, QPoint global) {
  const QString html = tooltip_at(pos);
  if (html.isEmpty()) {
    QToolTip::hideText();
  } else {
    QToolTip::showText(global, html, viewport(), QRect(pos, QSize(1, 1)));
  }
}

bool TimelineView::viewportEvent(QEvent* e) {
  if (e->type() == QEvent::ToolTip) {
    auto* he = static_cast<QHelpEvent*>(e);
    hovered_ = span_at_point(he->pos());
    show_tooltip(he->pos(), he->globalPos());
    return true;
  }
  return QAbstractScrollArea::viewportEvent(e);
}

void TimelineView::mouseReleaseEvent(QMouseEvent* e) {
  if (e->button() != Qt::LeftButton) return;
  const Drag d = drag_;
  drag_ = Drag::None;
  const QPoint pos = e->position().toPoint();
  if (d == Drag::Range) {
    if (moved_) {
      set_range(range_t0_, range_t1_);
    } else {
      clear_range();
    }
    return;
  }
  if (d == Drag::Pan && !moved_) {
    // A click: select what is under it (a click on empty space clears the selection).
    select_span(span_at_point(pos));
  }
}

void TimelineView::mouseDoubleClickEvent(QMouseEvent* e) {
  const int64_t s = span_at_point(e->position().toPoint());
  if (s >= 0) {
    select_span(s);
    zoom_to_selection();
  }
}

bool TimelineView::navigate(int key) {
  const double w = track_width();
  // The anchor of keyboard zoom is the mouse when it is over the track, else the centre.
  double anchor = w / 2;
  if (last_mouse_.x() >= kLabelWidth && underMouse()) anchor = last_mouse_.x() - kLabelWidth;
  switch (key) {
    case Qt::Key_W:
      zoom_by(1.25, anchor);
      return true;
    case Qt::Key_S:
      zoom_by(1 / 1.25, anchor);
      return true;
    case Qt::Key_A:
      pan_by_px(w / 8);
      return true;
    case Qt::Key_D:
      pan_by_px(-w / 8);
      return true;
    case Qt::Key_F:
      zoom_to_selection();
      return true;
    case Qt::Key_0:
    case Qt::Key_Home:
      fit_all();
      return true;
    case Qt::Key_Escape:
      clear_range();
      select_span(-1);
      return true;
    case Qt::Key_M: {
      const int64_t t = cursor_time_ns();
      if (markers_.remove_near(t, static_cast<int64_t>(4 * map_.ns_per_px))) {
        viewport()->update();
        emit markersChanged();
      } else {
        add_marker(t);
      }
      return true;
    }
    case Qt::Key_BracketRight:
      jump_to_marker(true);
      return true;
    case Qt::Key_BracketLeft:
      jump_to_marker(false);
      return true;
    default:
      return false;
  }
}

void TimelineView::keyPressEvent(QKeyEvent* e) {
  if (!navigate(e->key())) {
    QAbstractScrollArea::keyPressEvent(e);
    return;
  }
  e->accept();
}

void TimelineView::leaveEvent(QEvent* e) {
  last_mouse_ = {-1, -1};
  if (hovered_ >= 0) {
    hovered_ = -1;
    emit spanHovered(-1);
  }
  QAbstractScrollArea::leaveEvent(e);
}

}  // namespace orrery::gui
