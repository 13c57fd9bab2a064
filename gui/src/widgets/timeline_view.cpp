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

namespace orrery::gui {
namespace {

constexpr QRgb kKindRgb[traces::kSpanKindCount] = {
    0x4C8BF5,  // compute: blue
    0xE8710A,  // collective: orange
    0xA142F4,  // p2p: purple
    0x1E8E3E,  // memcpy: green
    0x9AA0A6,  // phase: grey
    0x12B5CB,  // data: teal
    0xF9AB00,  // optimizer: amber
    0x8D6E63,  // other: brown
};

// A little variation per name, so neighbouring spans of one kind stay distinguishable.
QColor span_color(traces::SpanKind k, traces::NameId name) {
  QColor c = kind_color(k);
  const int shift = static_cast<int>((name * 2654435761u) >> 28) - 8;  // -8 .. 7
  return shift >= 0 ? c.lighter(100 + shift * 3) : c.darker(100 - shift * 3);
}

bool dark_text_on(const QColor& c) { return c.lightness() > 150; }

}  // namespace

QColor kind_color(traces::SpanKind k) {
  const auto i = static_cast<int>(k);
  return QColor(kKindRgb[i >= 0 && i < traces::kSpanKindCount ? i : traces::kSpanKindCount - 1]);
}

TimelineView::TimelineView(QWidget* parent) : QAbstractScrollArea(parent) {
  setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  setVerticalScrollBarPolicy(Qt::ScrollBarAsNeeded);
  viewport()->setMouseTracking(true);
  viewport()->setAttribute(Qt::WA_OpaquePaintEvent);
  setFocusPolicy(Qt::StrongFocus);
  setMinimumSize(240, 100);
}

void TimelineView::set_document(std::shared_ptr<TraceDocument> doc) {
  doc_ = std::move(doc);
  selected_ = -1;
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
  if (kinds_ == kAllKinds) {
    index_ = &doc_->index;
  } else {
    filtered_ = std::make_unique<TraceIndex>(doc_->trace, kinds_);
    index_ = filtered_.get();
  }
  relayout();
}

void TimelineView::relayout() {
  if (index_) {
    layout_.build(*index_, doc_->trace.ranks, group_by_, hidden_);
  } else {
    layout_ = LaneLayout();
  }
  const int visible_h = std::max(0, viewport()->height() - kAxisHeight);
  verticalScrollBar()->setRange(0, std::max(0, static_cast<int>(std::ceil(layout_.total_height())) - visible_h));
  verticalScrollBar()->setPageStep(std::max(1, visible_h));
  verticalScrollBar()->setSingleStep(static_cast<int>(LaneLayout::kRowHeight));
  viewport()->update();
}

void TimelineView::set_kind_mask(KindMask kinds) {
  if (kinds == kinds_) return;
  kinds_ = kinds;
  if (selected_ >= 0 && doc_ && !(kinds_ & kind_bit(doc_->trace.spans[static_cast<size_t>(selected_)].kind))) {
    selected_ = -1;
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
  if (m.origin_ns == map_.origin_ns && m.origin_frac == map_.origin_frac && m.ns_per_px == map_.ns_per_px) return;
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
  const int64_t t0 = index_->start_ns() + shift_ns_;
  const int64_t t1 = index_->end_ns() + shift_ns_;
  const int64_t margin = std::max<int64_t>(1, (t1 - t0) / 100);
  pinned_ = true;
  pinned_t0_ = t0 - margin;
  pinned_t1_ = t1 + margin;
  map_.fit(pinned_t0_, pinned_t1_, track_width());
  fitted_ = true;
  changed_mapping();
}

void TimelineView::zoom_to(int64_t t0_ns, int64_t t1_ns) {
  if (t1_ns <= t0_ns) t1_ns = t0_ns + 1;
  const int64_t margin = std::max<int64_t>(1, (t1_ns - t0_ns) / 20);
  pinned_ = true;
  pinned_t0_ = t0_ns + shift_ns_ - margin;
  pinned_t1_ = t1_ns + shift_ns_ + margin;
  map_.fit(pinned_t0_, pinned_t1_, track_width());
  fitted_ = true;
  changed_mapping();
}

void TimelineView::zoom_by(double factor, double anchor_x_track) {
  pinned_ = false;
  map_.zoom(factor, anchor_x_track);
  changed_mapping();
}

void TimelineView::pan_by_px(double dx) {
  pinned_ = false;
  map_.pan_px(dx);
  changed_mapping();
}

void TimelineView::select_span(int64_t span, bool reveal) {
  if (!doc_ || span < 0 || static_cast<size_t>(span) >= doc_->trace.spans.size()) span = -1;
  selected_ = span;
  if (span >= 0 && reveal && index_) {
    const auto& s = doc_->trace.spans[static_cast<size_t>(span)];
    // Make its lane visible: un-hide, expand its rank and group.
    const int lane = index_->lane_of(s.rank, s.stream);
    if (hidden_.erase({s.rank, s.stream})) relayout();
    if (layout_.row_of_lane(lane) < 0) {
      layout_.set_collapsed("r:" + std::to_string(s.rank), false);
      for (const auto& g : group_ranks(*index_, doc_->trace.ranks, group_by_)) {
        if (std::find(g.ranks.begin(), g.ranks.end(), s.rank) != g.ranks.end()) layout_.set_collapsed("g:" + g.label, false);
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
      map_.ns_per_px = std::clamp(dur / (w / 10), TimeMapping::kMinNsPerPx, TimeMapping::kMaxNsPerPx);
      map_.origin_ns = s.start_ns + shift_ns_ - static_cast<int64_t>(w * 0.45 * map_.ns_per_px);
      map_.origin_frac = 0;
    } else if (x1 < 0 || x0 > w) {
      map_.pan_px(w / 2 - (x0 + x1) / 2);
    }
    // Vertically: scroll so its lane row is on screen.
    const int r = layout_.row_of_lane(lane);
    if (r >= 0) {
      const auto& lr = layout_.rows()[static_cast<size_t>(r)];
      const double row_y = lr.y + index_->row_of(static_cast<uint32_t>(span)) * LaneLayout::kRowHeight;
      const int vis_h = viewport()->height() - kAxisHeight;
      const int v = verticalScrollBar()->value();
      if (row_y < v || row_y + LaneLayout::kRowHeight > v + vis_h) {
        verticalScrollBar()->setValue(static_cast<int>(row_y - vis_h / 3.0));
      }
    }
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
    const auto& s = doc_->trace.spans[static_cast<size_t>(selected_)];
    zoom_to(s.start_ns, s.end_ns);
  }
}

QPoint TimelineView::point_of_span(int64_t span) const {
  if (!doc_ || !index_ || span < 0 || static_cast<size_t>(span) >= doc_->trace.spans.size()) return {-1, -1};
  const auto& s = doc_->trace.spans[static_cast<size_t>(span)];
  const int row = index_->row_of(static_cast<uint32_t>(span));
  const int r = layout_.row_of_lane(index_->lane_of(s.rank, s.stream));
  if (row < 0 || r < 0) return {-1, -1};
  const TimeMapping tm = trace_mapping();
  const double x0 = std::max(0.0, tm.x_of(s.start_ns));
  const double x1 = std::min<double>(track_width(), tm.x_of(s.end_ns));
  if (x1 <= x0) return {-1, -1};
  const double y = lane_top() + layout_.rows()[static_cast<size_t>(r)].y + row * LaneLayout::kRowHeight +
                   LaneLayout::kRowHeight / 2;
  if (y < kAxisHeight || y >= viewport()->height()) return {-1, -1};
  return {kLabelWidth + static_cast<int>((x0 + x1) / 2), static_cast<int>(y)};
}

int64_t TimelineView::span_at_point(QPoint p) const {
  if (!index_ || p.x() < kLabelWidth || p.y() < kAxisHeight) return -1;
  const int r = layout_.row_at(p.y() - lane_top());
  if (r < 0) return -1;
  const auto& lr = layout_.rows()[static_cast<size_t>(r)];
  if (lr.kind != LayoutRow::Kind::Lane) return -1;
  const auto& lane = index_->lanes()[static_cast<size_t>(lr.lane)];
  const int row = static_cast<int>((p.y() - lane_top() - lr.y) / LaneLayout::kRowHeight);
  if (row < 0 || row >= static_cast<int>(lane.rows.size())) return -1;
  // Fold the row exactly as painting does, and pick the item under x: a folded block is no span.
  const TimeMapping tm = trace_mapping();
  const double x = p.x() - kLabelWidth;
  std::vector<DrawItem> items;
  fold_row(lane.rows[static_cast<size_t>(row)], tm, track_width(), kFoldPx, items);
  for (const auto& it : items) {
    const double x0 = tm.x_of(it.start_ns);
    const double x1 = std::max(x0 + 1, tm.x_of(it.end_ns));
    if (x >= x0 - 0.5 && x <= x1 + 0.5) {
      return it.count == 1 ? lane.rows[static_cast<size_t>(row)].span[it.first] : -1;
    }
  }
  return -1;
}

void TimelineView::resizeEvent(QResizeEvent* e) {
  QAbstractScrollArea::resizeEvent(e);
  if (!fitted_) {
    fit_all();
  } else if (pinned_) {
    map_.fit(pinned_t0_, pinned_t1_, track_width());
    changed_mapping();
  }
  relayout();
}

void TimelineView::scrollContentsBy(int, int) { viewport()->update(); }

void TimelineView::paintEvent(QPaintEvent*) {
  QPainter p(viewport());
  const int W = viewport()->width();
  const int H = viewport()->height();
  const QPalette pal = palette();
  p.fillRect(0, 0, W, H, QColor(0xFAFAFA));
  last_items_ = 0;
  if (!index_) {
    p.setPen(QColor(0x606060));
    p.drawText(rect(), Qt::AlignCenter, tr("Open a trace: File > Open, drag a file here, or orrery-gui TRACE"));
    return;
  }
  const auto& trace = doc_->trace;
  const int tw = track_width();
  const TimeMapping tm = trace_mapping();
  const double top = lane_top();
  const QFontMetrics fm(font());
  const int text_h = fm.height();

  // Axis ticks (computed once, drawn as grid lines under the lanes and labels in the axis).
  const AxisTicks ticks = compute_ticks(map_, tw, index_->start_ns() + shift_ns_);

  // Lanes.
  p.save();
  p.setClipRect(0, kAxisHeight, W, H - kAxisHeight);
  std::vector<DrawItem> items;
  const auto& rows = layout_.rows();
  int first_row = layout_.row_at(std::max(0.0, kAxisHeight - top));
  if (first_row < 0) first_row = 0;
  int lane_parity = 0;
  for (size_t ri = static_cast<size_t>(first_row); ri < rows.size(); ++ri) {
    const auto& lr = rows[ri];
    const double y = top + lr.y;
    if (y > H) break;
    const QRectF label_rect(0, y, kLabelWidth, lr.height);
    const QRectF track_rect(kLabelWidth, y, tw, lr.height);
    if (lr.kind != LayoutRow::Kind::Lane) {
      const bool group = lr.kind == LayoutRow::Kind::Group;
      p.fillRect(QRectF(0, y, W, lr.height), group ? QColor(0xDDE3EA) : QColor(0xECEFF3));
      p.setPen(QColor(0xC5CCD6));
      p.drawLine(QPointF(0, y + lr.height - 0.5), QPointF(W, y + lr.height - 0.5));
      // Disclosure triangle, then the label.
      const double tx = 6 + lr.indent * 12;
      const double cy = y + lr.height / 2;
      QPolygonF tri;
      if (lr.collapsed) {
        tri << QPointF(tx, cy - 4) << QPointF(tx + 7, cy) << QPointF(tx, cy + 4);
      } else {
        tri << QPointF(tx - 1, cy - 3) << QPointF(tx + 7, cy - 3) << QPointF(tx + 3, cy + 3);
      }
      p.setPen(Qt::NoPen);
      p.setBrush(QColor(0x505860));
      p.drawPolygon(tri);
      QFont f = font();
      f.setBold(true);
      p.setFont(f);
      p.setPen(QColor(0x202428));
      p.drawText(QRectF(tx + 12, y, W - tx - 12, lr.height), Qt::AlignVCenter | Qt::AlignLeft,
                 QString::fromStdString(lr.label));
      p.setFont(font());
      lane_parity = 0;
      continue;
    }
    const auto& lane = index_->lanes()[static_cast<size_t>(lr.lane)];
    p.fillRect(QRectF(0, y, W, lr.height), (lane_parity++ % 2) ? QColor(0xF3F5F7) : QColor(0xFFFFFF));
    // Grid lines.
    p.setPen(QColor(0xE6E8EB));
    for (const auto& t : ticks.ticks) {
      const double x = kLabelWidth + t.x;
      p.drawLine(QPointF(x, y), QPointF(x, y + lr.height));
    }
    p.save();
    p.setClipRect(track_rect.intersected(QRectF(kLabelWidth, kAxisHeight, tw, H - kAxisHeight)));
    for (size_t rowi = 0; rowi < lane.rows.size(); ++rowi) {
      const auto& row = lane.rows[rowi];
      const double ry = y + rowi * LaneLayout::kRowHeight + 1;
      const double rh = LaneLayout::kRowHeight - 2;
      if (ry > H || ry + rh < kAxisHeight) continue;
      items.clear();
      fold_row(row, tm, tw, kFoldPx, items);
      last_items_ += items.size();
      for (const auto& it : items) {
        const auto& s = trace.spans[row.span[it.first]];
        double x0 = tm.x_of(it.start_ns);
        double x1 = tm.x_of(it.end_ns);
        x0 = std::max(x0, -2.0);
        x1 = std::min(x1, tw + 2.0);
        const double w = std::max(1.0, x1 - x0);
        const QRectF r(kLabelWidth + x0, ry, w, rh);
        if (it.count == 1) {
          const QColor c = span_color(s.kind, s.name);
          p.fillRect(r, c);
          if (w >= 24) {
            p.setPen(dark_text_on(c) ? QColor(0x101010) : QColor(0xFFFFFF));
            const QRectF tr = r.adjusted(3, 0, -2, 0).intersected(QRectF(kLabelWidth, ry, tw, rh));
            const QString name = QString::fromStdString(trace.name_of(s));
            p.drawText(tr, Qt::AlignVCenter | Qt::AlignLeft, fm.elidedText(name, Qt::ElideRight, static_cast<int>(tr.width())));
          }
        } else {
          // A folded run: the first span's colour, darker, with a light line along its top (a
          // pattern brush would cost more than the rest of the frame), and its count when it fits.
          const QColor c = kind_color(s.kind).darker(130);
          p.fillRect(r, c);
          if (w >= 4) p.fillRect(QRectF(r.x(), r.y(), r.width(), 2), kind_color(s.kind).lighter(130));
          if (w >= 36) {
            p.setPen(QColor(0xFFFFFF));
            const QRectF tr = r.intersected(QRectF(kLabelWidth, ry, tw, rh));
            p.drawText(tr, Qt::AlignCenter, fm.elidedText(QStringLiteral("%1 spans").arg(it.count), Qt::ElideRight, static_cast<int>(tr.width())));
          }
        }
      }
    }
    p.restore();
    // Lane label.
    p.fillRect(label_rect, QColor(0xF0F2F5));
    p.setPen(QColor(0x303438));
    p.drawText(label_rect.adjusted(8 + lr.indent * 12, 0, -4, 0), Qt::AlignVCenter | Qt::AlignLeft,
               fm.elidedText(QString::fromStdString(lr.label), Qt::ElideRight, kLabelWidth - 12 - lr.indent * 12));
    p.setPen(QColor(0xE0E3E7));
    p.drawLine(QPointF(0, y + lr.height - 0.5), QPointF(W, y + lr.height - 0.5));
  }
  // Label column border.
  p.setPen(QColor(0xC5CCD6));
  p.drawLine(QPointF(kLabelWidth - 0.5, kAxisHeight), QPointF(kLabelWidth - 0.5, H));

  // Selected span outline.
  if (selected_ >= 0) {
    const auto& s = trace.spans[static_cast<size_t>(selected_)];
    const int row = index_->row_of(static_cast<uint32_t>(selected_));
    const int r = layout_.row_of_lane(index_->lane_of(s.rank, s.stream));
    if (row >= 0 && r >= 0) {
      const double y = top + rows[static_cast<size_t>(r)].y + row * LaneLayout::kRowHeight + 1;
      const double x0 = std::max(-3.0, tm.x_of(s.start_ns));
      const double x1 = std::min(tw + 3.0, tm.x_of(s.end_ns));
      p.setClipRect(kLabelWidth, kAxisHeight, tw, H - kAxisHeight);
      p.setBrush(Qt::NoBrush);
      p.setPen(QPen(QColor(0x111111), 2));
      p.drawRect(QRectF(kLabelWidth + x0 - 1, y - 1, std::max(2.0, x1 - x0) + 2, LaneLayout::kRowHeight));
      p.setPen(QPen(QColor(0xFFEB3B), 1));
      p.drawRect(QRectF(kLabelWidth + x0 - 2.5, y - 2.5, std::max(2.0, x1 - x0) + 5, LaneLayout::kRowHeight + 3));
    }
  }
  // Range selection.
  if (has_range_ || drag_ == Drag::Range) {
    const double x0 = std::max(-1.0, tm.x_of(range_t0_));
    const double x1 = std::min(tw + 1.0, tm.x_of(range_t1_));
    p.setClipRect(kLabelWidth, kAxisHeight, tw, H - kAxisHeight);
    if (x1 > x0) {
      p.fillRect(QRectF(kLabelWidth + x0, kAxisHeight, x1 - x0, H - kAxisHeight), QColor(66, 133, 244, 40));
    }
    p.setPen(QPen(QColor(0x1A73E8), 1));
    p.drawLine(QPointF(kLabelWidth + x0, kAxisHeight), QPointF(kLabelWidth + x0, H));
    p.drawLine(QPointF(kLabelWidth + x1, kAxisHeight), QPointF(kLabelWidth + x1, H));
  }
  p.restore();

  // Axis.
  p.fillRect(0, 0, W, kAxisHeight, QColor(0xECEFF3));
  p.setPen(QColor(0xC5CCD6));
  p.drawLine(QPointF(0, kAxisHeight - 0.5), QPointF(W, kAxisHeight - 0.5));
  p.save();
  p.setClipRect(kLabelWidth, 0, tw, kAxisHeight);
  for (const auto& t : ticks.ticks) {
    const double x = kLabelWidth + t.x;
    p.setPen(QColor(0x7A828C));
    p.drawLine(QPointF(x, kAxisHeight - 7), QPointF(x, kAxisHeight - 1));
    p.setPen(QColor(0x202428));
    p.drawText(QRectF(x + 3, 0, 200, kAxisHeight - 4), Qt::AlignLeft | Qt::AlignVCenter, QString::fromStdString(t.label));
  }
  if (has_range_) {
    // The range's length above it, as Perfetto shows it.
    const double x0 = tm.x_of(range_t0_), x1 = tm.x_of(range_t1_);
    const QString len = QString::fromStdString(format_duration_ns(static_cast<double>(range_t1_ - range_t0_)));
    const double cx = kLabelWidth + (std::max(0.0, x0) + std::min<double>(tw, x1)) / 2;
    const QRectF box(cx - fm.horizontalAdvance(len) / 2.0 - 6, 3, fm.horizontalAdvance(len) + 12, kAxisHeight - 8);
    p.fillRect(box, QColor(0x1A73E8));
    p.setPen(Qt::white);
    p.drawText(box, Qt::AlignCenter, len);
  }
  p.restore();
  // Corner: the trace's span count and the scale.
  p.setPen(QColor(0x505860));
  p.drawText(QRectF(8, 0, kLabelWidth - 12, kAxisHeight), Qt::AlignVCenter | Qt::AlignLeft,
             QString::fromStdString(format_duration_ns(map_.ns_per_px * 100)) + tr(" / 100 px"));
  (void)pal;
  (void)text_h;
}

void TimelineView::wheelEvent(QWheelEvent* e) {
  const QPoint delta = e->angleDelta();
  if (e->modifiers() & Qt::ShiftModifier) {
    verticalScrollBar()->setValue(verticalScrollBar()->value() - delta.y() / 2);
  } else if (delta.y() != 0) {
    const double x = e->position().x() - kLabelWidth;
    zoom_by(std::pow(1.0015, delta.y()), std::clamp(x, 0.0, static_cast<double>(track_width())));
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
    if (r >= 0 && layout_.rows()[static_cast<size_t>(r)].kind != LayoutRow::Kind::Lane &&
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
    if (h < 0) QToolTip::hideText();
  }
  if (h >= 0) show_tooltip(pos, e->globalPosition().toPoint());
}

void TimelineView::show_tooltip(QPoint pos, QPoint global) {
  if (hovered_ < 0 || !doc_) return;
  QString html = "<table>";
  for (auto& [k, v] : span_attributes(doc_->trace, static_cast<uint32_t>(hovered_), index_->start_ns(), true)) {
    html += "<tr><td><b>" + QString::fromStdString(k).toHtmlEscaped() + "</b></td><td>" +
            QString::fromStdString(v).toHtmlEscaped() + "</td></tr>";
  }
  html += "</table>";
  QToolTip::showText(global, html, viewport(), QRect(pos, QSize(1, 1)));
}

bool TimelineView::viewportEvent(QEvent* e) {
  if (e->type() == QEvent::ToolTip) {
    auto* he = static_cast<QHelpEvent*>(e);
    const int64_t h = span_at_point(he->pos());
    hovered_ = h;
    if (h >= 0) {
      show_tooltip(he->pos(), he->globalPos());
    } else {
      QToolTip::hideText();
    }
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

void TimelineView::keyPressEvent(QKeyEvent* e) {
  const double w = track_width();
  // The anchor of keyboard zoom is the mouse when it is over the track, else the centre.
  double anchor = w / 2;
  if (last_mouse_.x() >= kLabelWidth && underMouse()) anchor = last_mouse_.x() - kLabelWidth;
  switch (e->key()) {
    case Qt::Key_W: zoom_by(1.25, anchor); break;
    case Qt::Key_S: zoom_by(1 / 1.25, anchor); break;
    case Qt::Key_A: pan_by_px(w / 8); break;
    case Qt::Key_D: pan_by_px(-w / 8); break;
    case Qt::Key_F: zoom_to_selection(); break;
    case Qt::Key_0:
    case Qt::Key_Home: fit_all(); break;
    case Qt::Key_Escape:
      clear_range();
      select_span(-1);
      break;
    default: QAbstractScrollArea::keyPressEvent(e); return;
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
