// Compare: two traces one above the other (a real run and its simulated twin, or two runs) with
// one shared time axis, the second shifted so that a chosen step starts where the first one's does,
// a table of per-step differences and one of per-op-name differences (largest first).
#pragma once

#include <QWidget>
#include <memory>

#include "orrery/gui/document.hpp"
#include "orrery/gui/models.hpp"

class QLabel;
class QSpinBox;
class QSplitter;
class QTableView;

namespace orrery::gui {

class TimelineView;

class CompareView : public QWidget {
  Q_OBJECT
 public:
  explicit CompareView(QWidget* parent = nullptr);
  // Metrics may be null while they are computed; call again when they arrive.
  void set_documents(std::shared_ptr<TraceDocument> a, std::shared_ptr<const profiler::Metrics> ma,
                     std::shared_ptr<TraceDocument> b, std::shared_ptr<const profiler::Metrics> mb);
  // Back to "Open two traces to compare them." (fewer than two traces open).
  void clear();
  TimelineView* view_a() const { return a_; }
  TimelineView* view_b() const { return b_; }
  const StepDiffModel* diff_model() const { return &diff_model_; }
  // Per op name, time in A and B, largest difference first; a click on a row jumps to the op.
  const OpDiffModel* op_model() const { return &op_model_; }
  QTableView* op_table() const { return op_table_; }
  // Selects the op of that row in both panes (its first span in the aligned step, else its first
  // span) and frames both spans on the shared axis; false when neither trace has it.
  bool jump_to_op(int row);
  // The row of an op name in the op table, -1 when neither trace has it.
  int op_row(const QString& name) const;
  // Gives the tables more of the height (screenshots of the op table).
  void emphasize_tables();
  // Shifts B so that `step` starts where A's does; a step not in both traces leaves the shift and
  // says so (align_note). The step box offers the steps both traces have.
  void align_on_step(int step);
  QString align_note() const;

 private:
  void sync_from(TimelineView* src, TimelineView* dst);
  // The span of that name to jump to in a trace: the first in `step`, else the first; -1 if none.
  static int64_t find_op(const traces::Trace& t, const std::string& name, int32_t step);

  TimelineView* a_ = nullptr;
  TimelineView* b_ = nullptr;
  QLabel* a_label_ = nullptr;
  QLabel* b_label_ = nullptr;
  QSpinBox* align_step_ = nullptr;
  QLabel* align_note_ = nullptr;
  QTableView* table_ = nullptr;
  StepDiffModel diff_model_;
  QTableView* op_table_ = nullptr;
  QSplitter* split_ = nullptr;
  OpDiffModel op_model_;
  std::shared_ptr<const profiler::Metrics> ma_, mb_;
  bool syncing_ = false;
};

}  // namespace orrery::gui
