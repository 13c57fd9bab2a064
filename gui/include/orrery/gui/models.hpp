// Item models of the GUI's panels, in the widget-free core library so they are tested GUI-less
// (QAbstractItemModelTester): a span's attributes, the metrics of a time range, the collectives'
// bandwidths, the per-step differences of two runs, and the tree of rank groups, ranks and lanes
// with check boxes that filter the timeline.
#pragma once

#include <QAbstractItemModel>
#include <QAbstractTableModel>
#include <QString>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "orrery/gui/critical_path.hpp"
#include "orrery/gui/document.hpp"
#include "orrery/gui/lane_layout.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::gui {

// Every attribute of a span as (name, value) text, times relative to zero_ns. With brief, only
// those the hover tooltip shows (name, rank, stream, start, duration, bytes, busbw, FLOPs, step,
// micro-batch), leaving out attributes that are unset.
std::vector<std::pair<std::string, std::string>> span_attributes(const traces::Trace& t,
                                                                 uint32_t span, int64_t zero_ns,
                                                                 bool brief = false);
// The rows the details add for a span in a flow: what it is ("all_reduce: 4 ranks, seq 5" or
// "send rank 0 -> recv rank 1"), the start skew and the rank that arrived last, then per member
// (at most 64, by start) its start after the first one and how long it waited for the last one.
std::vector<std::pair<std::string, std::string>> flow_attributes(const traces::Trace& t,
                                                                 const FlowInfo& f);
// Bus bandwidth of one collective/p2p span in GB/s (nccl-tests' definition), 0 when not applicable.
double span_busbw_gbps(const traces::Trace& t, const traces::Span& s);

// A two-column (Attribute, Value) table.
class KeyValueModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  using QAbstractTableModel::QAbstractTableModel;
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;
  void set_rows(std::vector<std::pair<QString, QString>> rows);
  // The value of the first row named `key`, empty when none (tests and the status bar use it).
  QString value(const QString& key) const;

 private:
  std::vector<std::pair<QString, QString>> rows_;
};

// The selected span's attributes (the side panel).
class SpanDetailsModel : public KeyValueModel {
  Q_OBJECT
 public:
  using KeyValueModel::KeyValueModel;
  // span < 0 clears the panel. With flows, a span in a flow lists the flow's members too.
  void set_span(const traces::Trace* t, int64_t span, int64_t zero_ns,
                const FlowIndex* flows = nullptr);
  int64_t span() const { return span_; }

 private:
  int64_t span_ = -1;
};

// profiler::compute_metrics over a selected range, as a table: window, comm/comp ratio, overlap %,
// exposed communication, compute, communication, idle, MFU and tokens/s when known.
class RangeMetricsModel : public KeyValueModel {
  Q_OBJECT
 public:
  using KeyValueModel::KeyValueModel;
  void set_metrics(const profiler::Metrics& m, int64_t t0_ns, int64_t t1_ns, int64_t zero_ns);
  void clear() { set_rows({}); }
};

// Bandwidth per collective and communicator: op, communicator, ranks, calls, bytes, time, algbw,
// busbw.
class CollectiveModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  using QAbstractTableModel::QAbstractTableModel;
  enum Column { kOp, kComm, kRanks, kCalls, kBytes, kTime, kAlgbw, kBusbw, kColumnCount };
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;
  void set_collectives(std::vector<profiler::CollectiveStats> c);

 private:
  std::vector<profiler::CollectiveStats> rows_;
};

// The spans of a time range by name, as Perfetto's area selection: count, time inside the range
// (each span clipped to it), mean and largest clipped time, and share of the range's rank-time
// (time over range length x the trace's ranks). Spans of kinds not in `kinds` are left out; a
// span touching the range only at an end is not in it. Sorted by time, largest first.
struct NameStats {
  std::string name;
  int64_t count = 0;
  int64_t total_ns = 0;
  int64_t max_ns = 0;
  double share = 0;
  int64_t mean_ns() const { return count ? total_ns / count : 0; }
};
std::vector<NameStats> range_by_name(const traces::Trace& t, int64_t t0_ns, int64_t t1_ns,
                                     KindMask kinds = kAllKinds);

// range_by_name as a table; Qt::UserRole gives the raw number (sort role of a proxy).
class RangeByNameModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  using QAbstractTableModel::QAbstractTableModel;
  enum Column { kName, kCount, kTotal, kMean, kMax, kShare, kColumnCount };
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;
  void set_rows(std::vector<NameStats> rows);
  const std::vector<NameStats>& rows() const { return rows_; }

 private:
  std::vector<NameStats> rows_;
};

// Per-step differences of two runs (compare view). Display text is formatted; Qt::UserRole gives
// the raw number (ns or %), for sorting and tests.
class StepDiffModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  using QAbstractTableModel::QAbstractTableModel;
  enum Column {
    kStep,
    kA,
    kB,
    kDiff,
    kDiffPct,
    kACompute,
    kBCompute,
    kAExposed,
    kBExposed,
    kColumnCount
  };
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;
  void set_diffs(std::vector<StepDiff> d, QString a_name, QString b_name);
  const std::vector<StepDiff>& diffs() const { return rows_; }

 private:
  std::vector<StepDiff> rows_;
  QString a_name_ = "A", b_name_ = "B";
};

// Per op name, A against B (diff_ops): name, time per rank and step in A, in B, B - A, B / A and
// the span counts,
// in diff_ops' order (largest |B - A| first). Qt::UserRole: nanoseconds, the ratio as a double.
class OpDiffModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  using QAbstractTableModel::QAbstractTableModel;
  enum Column { kName, kA, kB, kDiff, kRatio, kACount, kBCount, kColumnCount };
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;
  void set_diffs(std::vector<OpDiff> d);
  const std::vector<OpDiff>& diffs() const { return rows_; }

 private:
  std::vector<OpDiff> rows_;
};

// The links of a critical path, in time order: rank, name, how it follows the one before (stream,
// other stream, last arrival, send), its time on the path and what it waited before. Qt::UserRole:
// the span index (column 0) or nanoseconds.
class CriticalPathModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  using QAbstractTableModel::QAbstractTableModel;
  enum Column { kIndex, kRank, kName, kVia, kOnPath, kWaited, kColumnCount };
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;
  // The trace must outlive the model's use of it (the document holds it).
  void set_path(const traces::Trace* t, CriticalPath path);
  const CriticalPath& path() const { return path_; }

 private:
  const traces::Trace* trace_ = nullptr;
  CriticalPath path_;
};

// Tree of (group →) rank → lane with check boxes; unchecking hides lanes in the timeline. Groups
// follow GroupBy (none for GroupBy::Rank). A group's or rank's check state is derived from its lanes
// (partially checked when mixed); setting it sets every lane below.
class LaneTreeModel : public QAbstractItemModel {
  Q_OBJECT
 public:
  using QAbstractItemModel::QAbstractItemModel;
  void set_trace(const TraceIndex* index, const std::vector<traces::RankInfo>& ranks, GroupBy by);
  QModelIndex index(int row, int column, const QModelIndex& parent = {}) const override;
  QModelIndex parent(const QModelIndex& child) const override;
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  bool setData(const QModelIndex& index, const QVariant& value, int role = Qt::EditRole) override;
  Qt::ItemFlags flags(const QModelIndex& index) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;

  const std::set<std::pair<int32_t, int32_t>>& hidden_lanes() const { return hidden_; }

 signals:
  void visibilityChanged();

 private:
  struct Node {
    enum class Kind { Root, Group, Rank, Lane } kind = Kind::Root;
    int parent = -1;
    int row = 0;
    std::vector<int> children;
    QString label;
    int32_t rank = -1, stream = -1;
  };
  Qt::CheckState check_state(int node) const;
  void set_checked(int node, bool checked);
  void notify_subtree(int node);
  QModelIndex index_of(int node) const;

  std::vector<Node> nodes_;
  std::set<std::pair<int32_t, int32_t>> hidden_;
};

}  // namespace orrery::gui
