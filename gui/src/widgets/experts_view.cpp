// The Experts tab (see experts_view.hpp).
#include "orrery/gui/widgets/experts_view.hpp"

#include <QChart>
#include <QChartView>
#include <QComboBox>
#include <QHBoxLayout>
#include <QHelpEvent>
#include <QLabel>
#include <QLegend>
#include <QLineSeries>
#include <QPainter>
#include <QScrollArea>
#include <QSplitter>
#include <QToolTip>
#include <QVBoxLayout>
#include <QValueAxis>
#include <algorithm>
#include <cmath>

#include "orrery/gui/palette.hpp"

namespace orrery::gui {

namespace {
constexpr int kLabelPx = 72;     // "block 12" column
constexpr int kNotePx = 230;     // "max/mean 1.50 · dropped 2.0 %" column
constexpr int kHeaderPx = 20;    // expert numbers
constexpr int kRowPx = 22;       // a block
constexpr int kMinCellPx = 4;    // 256 experts still fit 1,300 px
constexpr int kMaxCellPx = 56;   // a few experts do not stretch across the screen
constexpr int kTextCellPx = 40;  // cells at least this wide print their tokens
constexpr int kMaxLines = 8;     // blocks drawn as their own line in the per-step chart

QString tokens_text(double v) {
  return v >= 1e6   ? QString::number(v / 1e6, 'f', 1) + "M"
         : v >= 1e4 ? QString::number(v / 1e3, 'f', 1) + "k"
                    : QString::number(v, 'f', 0);
}
}  // namespace

// The heat map: a row per MoE block, a cell per expert, the row's figures at its right.
class ExpertHeatMap : public QWidget {
 public:
  explicit ExpertHeatMap(const ExpertsView* view, QWidget* parent) : QWidget(parent), view_(view) {
    setMouseTracking(true);
  }
  void refresh() {
    const ExpertLoad& l = view_->load();
    setMinimumSize(kLabelPx + kNotePx + std::max(1, l.max_experts()) * kMinCellPx,
                   kHeaderPx + std::max(1, l.blocks()) * kRowPx + 4);
    update();
  }
  int cell_px() const {
    const int n = std::max(1, view_->load().max_experts());
    return std::clamp((width() - kLabelPx - kNotePx) / n, kMinCellPx, kMaxCellPx);
  }
  // The (block, expert) under a point, or false.
  bool hit(QPoint p, int& block, int& expert) const {
    const ExpertLoad& l = view_->load();
    if (p.x() < kLabelPx || p.y() < kHeaderPx) return false;
    block = (p.y() - kHeaderPx) / kRowPx;
    expert = (p.x() - kLabelPx) / cell_px();
    return block < l.blocks() && expert < l.experts(block);
  }

 protected:
  bool event(QEvent* e) override {
    if (e->type() == QEvent::ToolTip) {
      auto* he = static_cast<QHelpEvent*>(e);
      int b = 0, x = 0;
      if (hit(he->pos(), b, x))
        QToolTip::showText(he->globalPos(), view_->cell_tooltip(b, x), this);
      else
        QToolTip::hideText();
      return true;
    }
    return QWidget::event(e);
  }

  void paintEvent(QPaintEvent*) override {
    QPainter p(this);
    p.fillRect(rect(), palette::kBackground);
    const ExpertLoad& l = view_->load();
    if (l.empty()) return;
    const int cw = cell_px();
    const QFontMetrics fm(font());
    // Expert numbers over the columns, as many as fit.
    p.setPen(palette::kTickText);
    const int every = std::max(1, (fm.horizontalAdvance("0000") + cw - 1) / cw);
    for (int e = 0; e < l.max_experts(); e += every)
      p.drawText(QRect(kLabelPx + e * cw, 0, cw * every, kHeaderPx),
                 Qt::AlignLeft | Qt::AlignVCenter, QString::number(e));
    const QStringList notes = view_->row_notes();
    for (int b = 0; b < l.blocks(); ++b) {
      const int y = kHeaderPx + b * kRowPx;
      p.setPen(palette::kLaneLabelText);
      p.drawText(QRect(4, y, kLabelPx - 8, kRowPx), Qt::AlignLeft | Qt::AlignVCenter,
                 tr_block(l.layers()[static_cast<size_t>(b)]));
      for (int e = 0; e < l.experts(b); ++e) {
        const QRect cell(kLabelPx + e * cw, y + 1, cw - (cw > 6 ? 1 : 0), kRowPx - 2);
        p.fillRect(cell, view_->cell_color(b, e));
        if (cw >= kTextCellPx) {
          const double share = view_->load().share(view_->step(), b, e);
          p.setPen(share >= 1.6 || share <= 0.4 ? palette::kTextOnDark : palette::kTextOnLight);
          p.drawText(cell, Qt::AlignCenter, tokens_text(l.tokens(view_->step(), b, e)));
        }
      }
      p.setPen(palette::kHeaderText);
      p.drawText(QRect(kLabelPx + l.max_experts() * cw + 8, y, kNotePx - 8, kRowPx),
                 Qt::AlignLeft | Qt::AlignVCenter, notes.value(b));
    }
  }

 private:
  static QString tr_block(int layer) { return QStringLiteral("block %1").arg(layer); }
  const ExpertsView* view_;
};

ExpertsView::ExpertsView(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(2, 2, 2, 2);
  auto* bar = new QHBoxLayout();
  bar->addWidget(new QLabel(tr("Tokens per expert of"), this));
  step_combo_ = new QComboBox(this);
  step_combo_->setMinimumWidth(140);
  bar->addWidget(step_combo_);
  // The colour key; it may be cut short rather than widen the window.
  auto* key = new QLabel(tr("white: the block's mean; red: more tokens, full at twice the mean; "
                            "blue: fewer, full at none"),
                         this);
  key->setMinimumWidth(1);
  key->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  bar->addWidget(key, 1);
  layout->addLayout(bar);
  summary_ = new QLabel(this);
  summary_->setWordWrap(true);
  layout->addWidget(summary_);
  split_ = new QSplitter(Qt::Vertical, this);
  scroll_ = new QScrollArea(split_);
  scroll_->setWidgetResizable(true);
  map_ = new ExpertHeatMap(this, scroll_);
  scroll_->setWidget(map_);
  chart_view_ = new QChartView(split_);
  chart_view_->setRenderHint(QPainter::Antialiasing);
  split_->addWidget(scroll_);
  split_->addWidget(chart_view_);
  layout->addWidget(split_, 1);
  connect(step_combo_, &QComboBox::currentIndexChanged, this, [this] {
    step_ = step_combo_->currentIndex() >= 0 ? step_combo_->currentData().toInt()
                                             : ExpertLoad::kAllSteps;
    summary_->setText(summary());
    map_->update();
  });
  rebuild();
}

void ExpertsView::set_document(const TraceDocument* doc) {
  if (doc == doc_) return;
  doc_ = doc;
  load_ = doc ? expert_load(doc->counters) : ExpertLoad{};
  // Step index k is the k-th sample of a track: named by the step whose window holds the first
  // MoE track's k-th sample (the runtime writes it at the step's end), else by k.
  step_numbers_.clear();
  const CounterTrack* first = nullptr;
  if (doc) {
    for (const CounterTrack& c : doc->counters) {
      int layer = 0, expert = 0;
      if (parse_moe_counter(c.name, layer, expert) &&
          static_cast<int>(c.ts_ns.size()) == load_.steps()) {
        first = &c;
        break;
      }
    }
  }
  for (int k = 0; k < load_.steps(); ++k) {
    int number = k;
    if (first) {
      const int64_t ts = first->ts_ns[static_cast<size_t>(k)];
      for (const StepWindow& w : doc->steps)
        if (w.start_ns <= ts) number = w.step;
    }
    step_numbers_.push_back(number);
  }
  step_ = ExpertLoad::kAllSteps;
  rebuild();
}

void ExpertsView::set_step(int step) {
  const int i = step_combo_->findData(step);
  if (i >= 0) step_combo_->setCurrentIndex(i);
}

int ExpertsView::step_number(int step) const {
  return step >= 0 && step < static_cast<int>(step_numbers_.size())
             ? step_numbers_[static_cast<size_t>(step)]
             : step;
}

QString ExpertsView::summary() const {
  if (!doc_) return tr("open a trace");
  if (load_.empty())
    return tr("this trace has no moe.tokens counters (no mixture-of-experts blocks)");
  QString s = tr("%1 MoE blocks x %2 experts on %3 ranks (tokens routed before the capacity drop, "
                 "summed over ranks)")
                  .arg(load_.blocks())
                  .arg(load_.max_experts())
                  .arg(load_.ranks());
  if (step_ == ExpertLoad::kAllSteps && load_.steps() > 0) {
    const ExpertLoad::Worst w = load_.worst();
    s += tr("; worst step: max/mean %1 (block %2, step %3)")
             .arg(w.imbalance, 0, 'f', 2)
             .arg(load_.layers()[static_cast<size_t>(w.block)])
             .arg(step_number(w.step));
  }
  return s;
}

QStringList ExpertsView::row_notes() const {
  QStringList out;
  for (int b = 0; b < load_.blocks(); ++b)
    out << tr("max/mean %1 · dropped %2 %")
               .arg(load_.imbalance(step_, b), 0, 'f', 2)
               .arg(100.0 * load_.dropped_fraction(step_, b), 0, 'f', 1);
  return out;
}

QColor ExpertsView::cell_color(int block, int expert) const {
  return palette::load_color(load_.share(step_, block, expert));
}

QString ExpertsView::cell_tooltip(int block, int expert) const {
  const QString when =
      step_ == ExpertLoad::kAllSteps ? tr("all steps") : tr("step %1").arg(step_number(step_));
  return tr("block %1, expert %2, %3: %4 tokens (summed over ranks), %5 x the block's mean")
      .arg(load_.layers()[static_cast<size_t>(block)])
      .arg(expert)
      .arg(when)
      .arg(load_.tokens(step_, block, expert), 0, 'f', 0)
      .arg(load_.share(step_, block, expert), 0, 'f', 2);
}

int ExpertsView::chart_series() const {
  return chart_view_->chart() ? static_cast<int>(chart_view_->chart()->series().size()) : 0;
}

void ExpertsView::rebuild() {
  step_combo_->blockSignals(true);
  step_combo_->clear();
  step_combo_->addItem(tr("all steps"), ExpertLoad::kAllSteps);
  for (int k = 0; k < load_.steps(); ++k)
    step_combo_->addItem(tr("step %1").arg(step_number(k)), k);
  step_combo_->setCurrentIndex(0);
  step_combo_->blockSignals(false);
  summary_->setText(summary());
  map_->refresh();
  // The map takes the height of its rows (up to 60 %), the chart the rest.
  const int rows = kHeaderPx + std::max(1, load_.blocks()) * kRowPx + 8;
  const int total = std::max(400, split_->height());
  split_->setSizes({std::min(rows, total * 3 / 5), total - std::min(rows, total * 3 / 5)});
  rebuild_chart();
}

void ExpertsView::rebuild_chart() {
  auto* chart = new QChart();
  chart->setAnimationOptions(QChart::NoAnimation);
  if (load_.empty() || load_.steps() == 0) {
    chart->setTitle(doc_ ? tr("Router load per step: no MoE counters")
                         : tr("Router load per step"));
    set_chart(chart);
    return;
  }
  chart->setTitle(tr("Max / mean tokens per expert, per step (1 = even)"));
  std::vector<QLineSeries*> lines;
  auto add = [&](const QString& name) {
    auto* s = new QLineSeries();
    s->setName(name);
    lines.push_back(s);
    return s;
  };
  double top = 1.0;
  const int n = load_.blocks();
  if (n <= kMaxLines) {
    for (int b = 0; b < n; ++b) {
      QLineSeries* s = add(tr("block %1").arg(load_.layers()[static_cast<size_t>(b)]));
      for (int k = 0; k < load_.steps(); ++k) {
        s->append(step_number(k), load_.imbalance(k, b));
        top = std::max(top, load_.imbalance(k, b));
      }
    }
  } else {
    QLineSeries* worst = add(tr("worst block"));
    QLineSeries* mean = add(tr("mean over blocks"));
    for (int k = 0; k < load_.steps(); ++k) {
      double mx = 0, sum = 0;
      for (int b = 0; b < n; ++b) {
        mx = std::max(mx, load_.imbalance(k, b));
        sum += load_.imbalance(k, b);
      }
      worst->append(step_number(k), mx);
      mean->append(step_number(k), sum / n);
      top = std::max(top, mx);
    }
  }
  auto* x = new QValueAxis();
  x->setTitleText(tr("step"));
  x->setLabelFormat("%d");
  const int first = step_number(0), last = std::max(first + 1, step_number(load_.steps() - 1));
  x->setRange(first, last);
  x->setTickType(QValueAxis::TicksDynamic);  // whole steps: 1, 2, 5, 10, ... apart
  x->setTickAnchor(first);
  int every = 1;
  while ((last - first) / every > 10) every = every == 1 ? 2 : every == 2 ? 5 : every * 2;
  x->setTickInterval(every);
  auto* y = new QValueAxis();
  y->setTitleText(tr("max / mean"));
  y->setRange(0, std::ceil(top * 1.1 * 10) / 10);
  chart->addAxis(x, Qt::AlignBottom);
  chart->addAxis(y, Qt::AlignLeft);
  for (QLineSeries* s : lines) {
    chart->addSeries(s);
    s->attachAxis(x);
    s->attachAxis(y);
  }
  chart->legend()->setAlignment(Qt::AlignRight);
  set_chart(chart);
}

void ExpertsView::set_chart(QChart* chart) {
  QChart* old = chart_view_->chart();  // the view gives up the old chart without deleting it
  chart_view_->setChart(chart);
  delete old;
}

}  // namespace orrery::gui
