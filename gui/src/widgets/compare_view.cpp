// The compare view (see compare_view.hpp).
#include "orrery/gui/widgets/compare_view.hpp"

#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QSpinBox>
#include <QSplitter>
#include <QTableView>
#include <QVBoxLayout>
#include <algorithm>

#include "orrery/gui/palette.hpp"
#include "orrery/gui/widgets/timeline_view.hpp"

namespace orrery::gui {

CompareView::CompareView(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(2, 2, 2, 2);
  auto* bar = new QHBoxLayout();
  bar->addWidget(new QLabel(tr("Align on step"), this));
  align_step_ = new QSpinBox(this);
  align_step_->setRange(0, 1'000'000);
  bar->addWidget(align_step_);
  align_note_ = new QLabel(this);
  align_note_->setStyleSheet(
      QStringLiteral("QLabel { color: %1; }").arg(palette::kEfficiency.name()));
  bar->addWidget(align_note_);
  auto* hint = new QLabel(
      tr("  B is shifted so that this step starts with A's; zoom and pan move both."), this);
  hint->setMinimumWidth(1);
  hint->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  bar->addWidget(hint, 1);
  bar->addStretch(1);
  layout->addLayout(bar);

  auto* split = new QSplitter(Qt::Vertical, this);
  auto make_half = [&](QLabel*& label, TimelineView*& view) {
    auto* w = new QWidget(split);
    auto* l = new QVBoxLayout(w);
    l->setContentsMargins(0, 0, 0, 0);
    l->setSpacing(1);
    label = new QLabel(tr("Open two traces to compare them."), w);
    label->setMinimumWidth(1);
    label->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
    label->setStyleSheet(
        QStringLiteral("QLabel { background: %1; padding: 3px; font-weight: bold; }")
            .arg(palette::kCompareTitle.name()));
    l->addWidget(label);
    view = new TimelineView(w);
    // Half a window each: the spans, without the counter tracks (the timeline tab has them).
    view->set_counters_visible(false);
    l->addWidget(view, 1);
    split->addWidget(w);
  };
  make_half(a_label_, a_);
  make_half(b_label_, b_);
  table_ = new QTableView(split);
  table_->setModel(&diff_model_);
  table_->verticalHeader()->hide();
  table_->verticalHeader()->setDefaultSectionSize(20);
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  table_->setAlternatingRowColors(true);
  op_table_ = new QTableView(split);
  op_table_->setObjectName("opDiffTable");
  op_table_->setModel(&op_model_);
  op_table_->verticalHeader()->hide();
  op_table_->verticalHeader()->setDefaultSectionSize(20);
  op_table_->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  op_table_->horizontalHeader()->setSectionResizeMode(OpDiffModel::kName,
                                                      QHeaderView::ResizeToContents);
  op_table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  op_table_->setAlternatingRowColors(true);
  op_table_->setToolTip(
      tr("Per op name: total time over ranks and steps in A and B, the largest "
         "difference first. Click a row to see the op in both panes."));
  connect(op_table_, &QTableView::clicked, this,
          [this](const QModelIndex& i) { jump_to_op(i.row()); });
  auto* tables = new QSplitter(Qt::Horizontal, split);
  tables->addWidget(table_);
  tables->addWidget(op_table_);
  tables->setSizes({380, 620});
  split->addWidget(tables);
  split->setSizes({400, 400, 220});
  split_ = split;
  layout->addWidget(split, 1);

  connect(a_, &TimelineView::mappingChanged, this, [this] { sync_from(a_, b_); });
  connect(b_, &TimelineView::mappingChanged, this, [this] { sync_from(b_, a_); });
  connect(align_step_, &QSpinBox::valueChanged, this, &CompareView::align_on_step);
}

void CompareView::sync_from(TimelineView* src, TimelineView* dst) {
  if (syncing_) return;
  syncing_ = true;
  dst->set_mapping(src->mapping());
  syncing_ = false;
}

void CompareView::set_documents(std::shared_ptr<TraceDocument> a,
                                std::shared_ptr<const profiler::Metrics> ma,
                                std::shared_ptr<TraceDocument> b,
                                std::shared_ptr<const profiler::Metrics> mb) {
  const bool same = a_->document() == a && b_->document() == b;
  ma_ = std::move(ma);
  mb_ = std::move(mb);
  auto name = [](const std::shared_ptr<TraceDocument>& d) {
    return QFileInfo(QString::fromStdString(d->path)).fileName() + "  (" +
           QString::fromUtf8(traces::to_string(d->trace.meta.source).data()) + ")";
  };
  a_label_->setText(tr("A: %1").arg(name(a)));
  b_label_->setText(tr("B: %1").arg(name(b)));
  if (!same) {
    a_->set_document(a);
    b_->set_document(b);
  }
  if (!same) op_model_.set_diffs(diff_ops(a->trace, b->trace));
  if (ma_ && mb_) {
    diff_model_.set_diffs(diff_steps(*ma_, *mb_), "A", "B");
    int first = -1, last = -1;
    for (const auto& s : ma_->steps) {
      if (step_start_ns(*mb_, s.step) == INT64_MIN) continue;
      if (first < 0) first = s.step;
      last = std::max(last, s.step);
    }
    if (first >= 0) {
      align_step_->blockSignals(true);
      align_step_->setRange(first, last);
      align_step_->blockSignals(false);
    }
    if (!same || align_step_->value() == 0) {
      if (first >= 0) {
        align_step_->blockSignals(true);
        align_step_->setValue(first);
        align_step_->blockSignals(false);
      }
    }
    align_on_step(align_step_->value());
  } else {
    diff_model_.set_diffs({}, "A", "B");
  }
  if (!same) {
    a_->fit_all();
  }
}

QString CompareView::align_note() const { return align_note_->text(); }

void CompareView::clear() {
  align_note_->clear();
  ma_.reset();
  mb_.reset();
  a_label_->setText(tr("Open two traces to compare them."));
  b_label_->setText(tr("Open two traces to compare them."));
  a_->set_document(nullptr);
  b_->set_document(nullptr);
  diff_model_.set_diffs({}, "A", "B");
  op_model_.set_diffs({});
}

void CompareView::align_on_step(int step) {
  if (!ma_ || !mb_) return;
  const int64_t sa = step_start_ns(*ma_, step);
  const int64_t sb = step_start_ns(*mb_, step);
  if (sa == INT64_MIN || sb == INT64_MIN) {
    align_note_->setText(tr("step %1 is not in both traces (steps %2 to %3 are)")
                             .arg(step)
                             .arg(align_step_->minimum())
                             .arg(align_step_->maximum()));
    return;
  }
  align_note_->clear();
  b_->set_shift_ns(sa - sb);
  sync_from(a_, b_);
}

int CompareView::op_row(const QString& name) const {
  const auto& rows = op_model_.diffs();
  for (size_t r = 0; r < rows.size(); ++r) {
    if (QString::fromStdString(rows[r].name) == name) return static_cast<int>(r);
  }
  return -1;
}

void CompareView::emphasize_tables() {
  const int h = std::max(300, split_->height());
  split_->setSizes({h * 3 / 10, h * 3 / 10, h * 4 / 10});
}

int64_t CompareView::find_op(const traces::Trace& t, const std::string& name, int32_t step) {
  const traces::NameId id = t.strings.find(name);
  int64_t first = -1, in_step = -1;
  for (size_t i = 0; i < t.spans.size(); ++i) {
    const auto& s = t.spans[i];
    if (s.name != id) continue;
    auto earlier = [&](int64_t j) {
      return j < 0 || s.start_ns < t.spans[static_cast<size_t>(j)].start_ns;
    };
    if (earlier(first)) first = static_cast<int64_t>(i);
    if (s.step == step && earlier(in_step)) in_step = static_cast<int64_t>(i);
  }
  return in_step >= 0 ? in_step : first;
}

bool CompareView::jump_to_op(int row) {
  const auto& rows = op_model_.diffs();
  if (row < 0 || row >= static_cast<int>(rows.size()) || !a_->document() || !b_->document())
    return false;
  const std::string& name = rows[static_cast<size_t>(row)].name;
  const int32_t step = align_step_->value();
  const int64_t ia = find_op(a_->document()->trace, name, step);
  const int64_t ib = find_op(b_->document()->trace, name, step);
  if (ia < 0 && ib < 0) return false;
  // Select (and scroll to) each pane's span, then frame both on the shared axis (view time).
  int64_t v0 = INT64_MAX, v1 = INT64_MIN;
  for (auto [view, i] : {std::pair{a_, ia}, std::pair{b_, ib}}) {
    view->select_span(i, i >= 0);
    if (i < 0) continue;
    const auto& s = view->document()->trace.spans[static_cast<size_t>(i)];
    v0 = std::min(v0, s.start_ns + view->shift_ns());
    v1 = std::max(v1, s.end_ns + view->shift_ns());
  }
  a_->zoom_to(v0 - a_->shift_ns(), v1 - a_->shift_ns());
  return true;
}

}  // namespace orrery::gui
