// The charts tab (see charts_view.hpp).
#include "orrery/gui/widgets/charts_view.hpp"

#include <QBarSet>
#include <QCategoryAxis>
#include <QChart>
#include <QChartView>
#include <QComboBox>
#include <QEvent>
#include <QFileInfo>
#include <QFontMetrics>
#include <QGraphicsTextItem>
#include <QHBoxLayout>
#include <QLabel>
#include <QLegend>
#include <QLegendMarker>
#include <QLineSeries>
#include <QLogValueAxis>
#include <QScatterSeries>
#include <QSplitter>
#include <QStackedBarSeries>
#include <QVBoxLayout>
#include <QValueAxis>
#include <cmath>
#include <map>
#include <set>

#include "orrery/gui/palette.hpp"

namespace orrery::gui {

ChartsView::ChartsView(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(2, 2, 2, 2);
  auto* bar = new QHBoxLayout();
  bar->addWidget(new QLabel(tr("Breakdown of"), this));
  step_combo_ = new QComboBox(this);
  step_combo_->setMinimumWidth(160);
  bar->addWidget(step_combo_);
  breakdown_note_ = new QLabel(this);
  breakdown_note_->setMinimumWidth(1);
  breakdown_note_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  bar->addWidget(breakdown_note_, 1);
  layout->addLayout(bar);
  auto* split = new QSplitter(Qt::Horizontal, this);
  breakdown_view_ = new QChartView(split);
  breakdown_view_->setRenderHint(QPainter::Antialiasing);
  // The scaling chart, with a line under it naming the GPU counts the sweep could not place.
  auto* scaling_box = new QWidget(split);
  auto* scaling_layout = new QVBoxLayout(scaling_box);
  scaling_layout->setContentsMargins(0, 0, 0, 0);
  scaling_view_ = new QChartView(scaling_box);
  scaling_view_->setRenderHint(QPainter::Antialiasing);
  scaling_layout->addWidget(scaling_view_, 1);
  scaling_note_ = new QLabel(scaling_box);
  scaling_note_->setWordWrap(true);
  scaling_note_->hide();
  scaling_layout->addWidget(scaling_note_);
  split->addWidget(breakdown_view_);
  split->addWidget(scaling_box);
  split->setSizes({600, 500});
  layout->addWidget(split, 1);
  connect(step_combo_, &QComboBox::currentIndexChanged, this, [this] { rebuild_breakdown(); });
  breakdown_view_->installEventFilter(this);
  rebuild_breakdown();
  rebuild_scaling();
}

void ChartsView::set_breakdown(const TraceDocument* doc,
                               std::shared_ptr<const profiler::Metrics> m) {
  if (doc == doc_ && m == metrics_) return;
  doc_ = doc;
  metrics_ = std::move(m);
  per_step_ =
      (doc_ && metrics_) ? step_breakdowns(*metrics_, doc_->trace) : std::vector<StepBreakdown>{};
  std::set<int32_t> steps;
  for (const auto& b : per_step_) steps.insert(b.step);
  step_combo_->blockSignals(true);
  step_combo_->clear();
  step_combo_->addItem(tr("mean over steps"), -1);
  for (int32_t s : steps) step_combo_->addItem(tr("step %1").arg(s), s);
  step_combo_->blockSignals(false);
  rebuild_breakdown();
}

void ChartsView::rebuild_breakdown() {
  rank_axis_ = nullptr;
  rank_labels_.clear();
  auto* chart = new QChart();
  chart->setAnimationOptions(QChart::NoAnimation);
  const int step = step_combo_->currentIndex() >= 0 ? step_combo_->currentData().toInt() : -1;
  std::vector<StepBreakdown> rows;
  if (step < 0) {
    rows = mean_per_rank(per_step_);
  } else {
    for (const auto& b : per_step_) {
      if (b.step == step) rows.push_back(b);
    }
  }
  if (!doc_) {
    chart->setTitle(tr("Per-step breakdown: open a trace"));
    breakdown_note_->clear();
  } else if (!metrics_) {
    chart->setTitle(tr("Per-step breakdown: computing metrics..."));
  } else if (rows.empty()) {
    chart->setTitle(tr("Per-step breakdown: the trace has no steps"));
  } else {
    chart->setTitle(tr("Per-step breakdown per rank (%1)")
                        .arg(step < 0 ? tr("mean over steps") : tr("step %1").arg(step)));
    auto* series = new QStackedBarSeries();
    struct SetDef {
      const char* name;
      QColor color;
      int64_t StepBreakdown::*field;
    };
    const SetDef defs[] = {
        {"compute", palette::kBreakdownCompute, &StepBreakdown::compute_ns},
        {"exposed comm", palette::kBreakdownExposedComm, &StepBreakdown::exposed_comm_ns},
        {"bubble", palette::kBreakdownBubble, &StepBreakdown::bubble_ns},
        {"idle", palette::kBreakdownIdle, &StepBreakdown::idle_ns}};
    double max_ms = 0;
    std::vector<double> totals(rows.size(), 0);
    for (const auto& d : defs) {
      auto* set = new QBarSet(tr(d.name));
      set->setColor(d.color);
      set->setBorderColor(palette::bar_border(d.color));
      for (size_t i = 0; i < rows.size(); ++i) {
        const double ms = static_cast<double>(rows[i].*d.field) / 1e6;
        *set << ms;
        totals[i] += ms;
      }
      series->append(set);
    }
    for (double t : totals) max_ms = std::max(max_ms, t);
    chart->addSeries(series);
    // One bar per rank at x = 0, 1, ...; labelled every k-th so that no label is elided at 64
    // ranks and more (a category axis labels every bar and shrinks each label to "...").
    rank_labels_.clear();
    for (const auto& r : rows) rank_labels_ << QString::number(r.rank);
    auto* ax = new QCategoryAxis();
    ax->setLabelsPosition(QCategoryAxis::AxisLabelsPositionOnValue);
    ax->setRange(-0.5, static_cast<double>(rows.size()) - 0.5);
    ax->setTitleText(tr("rank"));
    rank_axis_ = ax;
    auto* ay = new QValueAxis();
    ay->setTitleText(tr("time per step (ms)"));
    ay->setRange(0, max_ms > 0 ? max_ms * 1.08 : 1);
    ay->applyNiceNumbers();
    chart->addAxis(ax, Qt::AlignBottom);
    chart->addAxis(ay, Qt::AlignLeft);
    series->attachAxis(ax);
    series->attachAxis(ay);
    chart->legend()->setAlignment(Qt::AlignBottom);
    breakdown_note_->setText(
        tr("  %1: %2 ranks, %3 steps%4")
            .arg(QFileInfo(QString::fromStdString(doc_->path)).fileName())
            .arg(metrics_->ranks.size())
            .arg(metrics_->steps.size())
            .arg(doc_->trace.meta.pp > 1
                     ? tr("; idle inside a step of a pipelined run is the bubble")
                     : QString()));
  }
  auto* old = breakdown_view_->chart();
  breakdown_view_->setChart(chart);
  delete old;
  relabel_ranks();
}

void ChartsView::set_sweep(std::vector<SweepPoint> points, const QString& source,
                           std::vector<SweepUnplaced> unplaced) {
  sweep_ = std::move(points);
  sweep_source_ = source;
  unplaced_ = std::move(unplaced);
  QStringList parts;
  for (const auto& u : unplaced_) {
    parts << (u.note.empty() ? tr("%1 GPUs").arg(u.gpus)
                             : tr("%1 GPUs (%2)").arg(u.gpus).arg(QString::fromStdString(u.note)));
  }
  scaling_note_->setText(parts.isEmpty() ? QString() : tr("Not placed: %1").arg(parts.join("; ")));
  scaling_note_->setVisible(!parts.isEmpty());
  rebuild_scaling();
}

QString ChartsView::scaling_note() const { return scaling_note_->text(); }

void ChartsView::rebuild_scaling() {
  auto* chart = new QChart();
  chart->setAnimationOptions(QChart::NoAnimation);
  if (sweep_.empty()) {
    chart->setTitle(tr("Scaling: open a sweep CSV"));
  } else {
    chart->setTitle(tr("Scaling (%1)").arg(QFileInfo(sweep_source_).fileName()));
    auto* tps = new QLineSeries();
    tps->setName(tr("tokens/s"));
    auto* tps_pts = new QScatterSeries();
    tps_pts->setMarkerSize(8);
    auto* eff = new QLineSeries();
    eff->setName(tr("efficiency"));
    auto* eff_pts = new QScatterSeries();
    eff_pts->setMarkerSize(8);
    double max_tps = 0, max_eff = 1;
    int min_g = sweep_.front().gpus, max_g = sweep_.front().gpus;
    for (const auto& p : sweep_) {
      tps->append(p.gpus, p.tokens_per_s);
      tps_pts->append(p.gpus, p.tokens_per_s);
      eff->append(p.gpus, p.efficiency);
      eff_pts->append(p.gpus, p.efficiency);
      max_tps = std::max(max_tps, p.tokens_per_s);
      max_eff = std::max(max_eff, p.efficiency);
      min_g = std::min(min_g, p.gpus);
      max_g = std::max(max_g, p.gpus);
    }
    tps->setColor(palette::kTokensPerS);
    tps_pts->setColor(palette::kTokensPerS);
    eff->setColor(palette::kEfficiency);
    eff_pts->setColor(palette::kEfficiency);
    for (auto* s : {static_cast<QXYSeries*>(tps), static_cast<QXYSeries*>(tps_pts),
                    static_cast<QXYSeries*>(eff), static_cast<QXYSeries*>(eff_pts)}) {
      chart->addSeries(s);
    }
    auto* ax = new QLogValueAxis();
    ax->setBase(2);
    ax->setLabelFormat("%d");
    ax->setTitleText(tr("GPUs"));
    ax->setRange(std::max(1, min_g) / 1.3, max_g * 1.3);
    auto* ay = new QValueAxis();
    ay->setTitleText(tr("tokens/s"));
    ay->setRange(0, max_tps * 1.1);
    ay->applyNiceNumbers();
    ay->setLabelFormat("%.3g");
    auto* ae = new QValueAxis();
    ae->setTitleText(tr("efficiency"));
    // Ticks every 0.2 (1.0 = linear scaling) up to the next step above the best point.
    const double top = std::max(1.2, std::ceil(max_eff * 5.0 + 0.01) / 5.0);
    ae->setRange(0, top);
    ae->setTickCount(static_cast<int>(std::lround(top / 0.2)) + 1);
    ae->setLabelFormat("%.1f");
    ae->setLabelsColor(palette::kEfficiency);
    chart->addAxis(ax, Qt::AlignBottom);
    chart->addAxis(ay, Qt::AlignLeft);
    chart->addAxis(ae, Qt::AlignRight);
    for (auto* s : {static_cast<QXYSeries*>(tps), static_cast<QXYSeries*>(tps_pts)}) {
      s->attachAxis(ax);
      s->attachAxis(ay);
    }
    for (auto* s : {static_cast<QXYSeries*>(eff), static_cast<QXYSeries*>(eff_pts)}) {
      s->attachAxis(ax);
      s->attachAxis(ae);
    }
    chart->legend()->setAlignment(Qt::AlignBottom);
    // The scatter series only mark the points; keep them out of the legend.
    for (auto* m : chart->legend()->markers(tps_pts)) m->setVisible(false);
    for (auto* m : chart->legend()->markers(eff_pts)) m->setVisible(false);
  }
  auto* old = scaling_view_->chart();
  scaling_view_->setChart(chart);
  delete old;
}

std::vector<double> ChartsView::breakdown_values(const QString& set_name) const {
  std::vector<double> out;
  for (auto* s : breakdown_view_->chart()->series()) {
    auto* bars = qobject_cast<QStackedBarSeries*>(s);
    if (!bars) continue;
    for (auto* set : bars->barSets()) {
      if (set->label() != set_name) continue;
      for (int i = 0; i < set->count(); ++i) out.push_back(set->at(i));
    }
  }
  return out;
}

int ChartsView::breakdown_categories() const {
  for (auto* s : breakdown_view_->chart()->series()) {
    if (auto* bars = qobject_cast<QStackedBarSeries*>(s); bars && !bars->barSets().isEmpty()) {
      return static_cast<int>(bars->barSets().front()->count());
    }
  }
  return 0;
}

}  // namespace orrery::gui

namespace orrery::gui {

int ChartsView::scaling_points() const {
  for (auto* s : scaling_view_->chart()->series()) {
    if (auto* line = qobject_cast<QLineSeries*>(s); line && line->name() == tr("tokens/s"))
      return static_cast<int>(line->count());
  }
  return 0;
}

}  // namespace orrery::gui

namespace orrery::gui {

int ChartsView::rank_label_step(int count, double width_px, double label_px) {
  if (count <= 0) return 1;
  // Labels need their own width plus a gap; the step is the smallest "nice" one that fits them.
  const double slot_px = std::max(1.0, label_px * 1.5);
  const int fit = std::max(1, static_cast<int>(width_px / slot_px));
  static const int kSteps[] = {1,  2,  4,   5,   8,   10,  16,  20,  25,  32,
                               50, 64, 100, 128, 200, 250, 256, 500, 512, 1000};
  for (int k : kSteps) {
    if ((count + k - 1) / k <= fit) return k;
  }
  return (count + fit - 1) / fit;
}

void ChartsView::relabel_ranks() {
  if (!rank_axis_) return;
  for (const QString& l : rank_axis_->categoriesLabels()) rank_axis_->remove(l);
  const QFontMetrics fm(rank_axis_->labelsFont());
  int label_px = 0;
  for (const QString& l : rank_labels_) label_px = std::max(label_px, fm.horizontalAdvance(l));
  // The plot is the view less the value axis and the margins, about 90 px.
  const double width = breakdown_view_->width() - 90.0;
  rank_step_ = rank_label_step(static_cast<int>(rank_labels_.size()), width, label_px);
  for (int i = 0; i < rank_labels_.size(); i += rank_step_) rank_axis_->append(rank_labels_[i], i);
}

bool ChartsView::eventFilter(QObject* watched, QEvent* e) {
  if (watched == breakdown_view_ && e->type() == QEvent::Resize) relabel_ranks();
  return QWidget::eventFilter(watched, e);
}

QStringList ChartsView::breakdown_axis_texts() const {
  QStringList out;
  for (auto* item : breakdown_view_->scene()->items()) {
    if (auto* text = dynamic_cast<QGraphicsTextItem*>(item); text && text->isVisible())
      out << text->toPlainText();
  }
  return out;
}

}  // namespace orrery::gui
