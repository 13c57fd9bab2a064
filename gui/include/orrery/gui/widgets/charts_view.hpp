// Charts (Qt Charts): the per-step breakdown of each rank as stacked bars (compute, exposed
// communication, bubble, idle), and scaling curves from a sweep CSV (tokens/s and efficiency
// against the GPU count).
#pragma once

#include <QStringList>
#include <QWidget>
#include <memory>
#include <vector>

#include "orrery/gui/document.hpp"
#include "orrery/gui/sweep_csv.hpp"

class QChartView;
class QCategoryAxis;
class QComboBox;
class QLabel;

namespace orrery::gui {

class ChartsView : public QWidget {
  Q_OBJECT
 public:
  explicit ChartsView(QWidget* parent = nullptr);
  // The trace whose breakdown is shown, and its metrics (null while they are being computed).
  void set_breakdown(const TraceDocument* doc, std::shared_ptr<const profiler::Metrics> m);
  // The sweep's points, and the GPU counts it could not place (named under the scaling chart).
  void set_sweep(std::vector<SweepPoint> points, const QString& source,
                 std::vector<SweepUnplaced> unplaced = {});
  // The line under the scaling chart: the GPU counts not placed and why, empty when none.
  QString scaling_note() const;
  // What the breakdown chart shows now (tests): bar values per set name, in ms.
  std::vector<double> breakdown_values(const QString& set_name) const;
  int breakdown_categories() const;
  // Points of the tokens/s curve now drawn (tests).
  int scaling_points() const;
  // The rank axis labels every k-th rank: the smallest of 1, 2, 4, 5, 8, 10, 16, ... for which
  // ceil(count / k) labels of label_px (plus half that as a gap) fit in width_px.
  static int rank_label_step(int count, double width_px, double label_px);
  int rank_step() const { return rank_step_; }
  // The texts drawn in the breakdown chart now (axis labels, titles; tests look for elided ones).
  QStringList breakdown_axis_texts() const;

 protected:
  bool eventFilter(QObject* watched, QEvent* e) override;

 private:
  void rebuild_breakdown();
  void rebuild_scaling();
  void relabel_ranks();  // the rank axis's labels for the chart's width now

  QChartView* breakdown_view_ = nullptr;
  QChartView* scaling_view_ = nullptr;
  QComboBox* step_combo_ = nullptr;
  QLabel* breakdown_note_ = nullptr;
  const TraceDocument* doc_ = nullptr;
  std::shared_ptr<const profiler::Metrics> metrics_;
  std::vector<StepBreakdown> per_step_;
  std::vector<SweepPoint> sweep_;
  QString sweep_source_;
  std::vector<SweepUnplaced> unplaced_;
  QLabel* scaling_note_ = nullptr;
  QCategoryAxis* rank_axis_ = nullptr;  // owned by the breakdown chart
  QStringList rank_labels_;
  int rank_step_ = 1;
};

}  // namespace orrery::gui
