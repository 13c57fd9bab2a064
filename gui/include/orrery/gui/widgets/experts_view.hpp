// The Experts tab: how evenly a mixture-of-experts router spread the tokens (issue 19), from the
// trace's moe.tokens and moe.dropped counters (expert_load.hpp). A heat map with a row per MoE
// block and a column per expert, each cell coloured by the expert's tokens over the block's mean
// (white even, red more, blue fewer), each row ending in its max / mean and dropped fraction; a step
// picker (all steps or one); and max / mean per step as lines (one per block up to eight blocks,
// else the worst block's and the mean over blocks).
#pragma once

#include <QString>
#include <QStringList>
#include <QWidget>
#include <vector>

#include "orrery/gui/document.hpp"
#include "orrery/gui/expert_load.hpp"

class QChart;
class QChartView;
class QComboBox;
class QLabel;
class QScrollArea;
class QSplitter;

namespace orrery::gui {

class ExpertHeatMap;

class ExpertsView : public QWidget {
  Q_OBJECT
 public:
  explicit ExpertsView(QWidget* parent = nullptr);
  // The document whose counters are shown (null: none).
  void set_document(const TraceDocument* doc);

  // What is shown now (tests).
  const ExpertLoad& load() const { return load_; }
  int step() const { return step_; }  // ExpertLoad::kAllSteps or a step index
  void set_step(int step);            // the picker follows
  int step_number(int step) const;    // the trace's step number of step index `step`
  QString summary() const;            // the line above the map
  QStringList row_notes() const;      // per block: "max/mean 1.50 · dropped 2.0 %"
  QColor cell_color(int block, int expert) const;
  QString cell_tooltip(int block, int expert) const;
  int chart_series() const;  // lines in the per-step chart

 private:
  void rebuild();
  void rebuild_chart();
  void set_chart(QChart* chart);

  const TraceDocument* doc_ = nullptr;
  ExpertLoad load_;
  std::vector<int> step_numbers_;  // per step index
  int step_ = ExpertLoad::kAllSteps;
  QLabel* summary_ = nullptr;
  QComboBox* step_combo_ = nullptr;
  QSplitter* split_ = nullptr;
  QScrollArea* scroll_ = nullptr;
  ExpertHeatMap* map_ = nullptr;
  QChartView* chart_view_ = nullptr;
};

}  // namespace orrery::gui
