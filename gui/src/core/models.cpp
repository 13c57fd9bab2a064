// The panels' item models (see models.hpp).
#include "orrery/gui/models.hpp"

#include <algorithm>
#include <cstdio>

#include "orrery/common/format.hpp"

namespace orrery::gui {
namespace {

QString q(const std::string& s) { return QString::fromStdString(s); }

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string flops_text(double f) {
  const char* units[] = {"", "K", "M", "G", "T", "P", "E"};
  int u = 0;
  while (f >= 1000 && u < 6) {
    f /= 1000;
    ++u;
  }
  return fixed(f, u ? 2 : 0) + " " + units[u] + "FLOP";
}

}  // namespace

double span_busbw_gbps(const traces::Trace& t, const traces::Span& s) {
  if (s.kind != traces::SpanKind::Collective && s.kind != traces::SpanKind::P2P) return 0;
  const int64_t dur = s.duration_ns();
  if (dur <= 0 || s.bytes <= 0) return 0;
  int n = t.meta.world_size;
  if (const auto* c = t.comm(s.comm); c && !c->ranks.empty()) n = static_cast<int>(c->ranks.size());
  const auto op = s.op != traces::CollOp::None      ? s.op
                  : s.kind == traces::SpanKind::P2P ? traces::CollOp::Send
                                                    : traces::CollOp::AllReduce;
  // bytes per ns is GB/s (decimal).
  return static_cast<double>(s.bytes) / static_cast<double>(dur) * traces::busbw_factor(op, n);
}

std::vector<std::pair<std::string, std::string>> span_attributes(const traces::Trace& t,
                                                                 uint32_t span, int64_t zero_ns,
                                                                 bool brief) {
  std::vector<std::pair<std::string, std::string>> out;
  if (span >= t.spans.size()) return out;
  const auto& s = t.spans[span];
  std::string stream = std::to_string(s.stream);
  for (const auto& si : t.streams) {
    if (si.rank == s.rank && si.stream == s.stream && !si.name.empty()) {
      stream += " (" + si.name + ")";
      break;
    }
  }
  out.emplace_back("Name", t.name_of(s));
  if (!brief) out.emplace_back("Kind", std::string(traces::to_string(s.kind)));
  out.emplace_back("Rank", std::to_string(s.rank));
  out.emplace_back("Stream", stream);
  out.emplace_back("Start", format_duration_ns(static_cast<double>(s.start_ns - zero_ns)));
  if (!brief) out.emplace_back("End", format_duration_ns(static_cast<double>(s.end_ns - zero_ns)));
  out.emplace_back("Duration", format_duration_ns(static_cast<double>(s.duration_ns())));
  if (!brief || s.bytes)
    out.emplace_back("Bytes", s.bytes ? format_bytes(static_cast<double>(s.bytes)) + " (" +
                                            std::to_string(s.bytes) + ")"
                                      : "-");
  const double busbw = span_busbw_gbps(t, s);
  if (!brief || busbw > 0) out.emplace_back("busbw", busbw > 0 ? fixed(busbw, 2) + " GB/s" : "-");
  if (!brief || s.flops > 0) out.emplace_back("FLOPs", s.flops > 0 ? flops_text(s.flops) : "-");
  if (!brief || s.step >= 0) out.emplace_back("Step", s.step >= 0 ? std::to_string(s.step) : "-");
  if (!brief || s.micro_batch >= 0) {
    out.emplace_back("Micro-batch", s.micro_batch >= 0 ? std::to_string(s.micro_batch) : "-");
  }
  if (brief) return out;
  if (s.flops > 0 && s.duration_ns() > 0) {
    out.emplace_back("Achieved",
                     fixed(s.flops / static_cast<double>(s.duration_ns()), 2) + " GFLOP/s");
  }
  out.emplace_back("Layer", s.layer >= 0 ? std::to_string(s.layer) : "-");
  out.emplace_back("Op", std::string(traces::to_string(s.op)));
  std::string comm = "-";
  if (s.comm >= 0) {
    comm = std::to_string(s.comm);
    if (const auto* c = t.comm(s.comm))
      comm += " " + c->name + " (" + std::to_string(c->ranks.size()) +
              (c->ranks.size() == 1 ? " rank)" : " ranks)");
  }
  out.emplace_back("Communicator", comm);
  out.emplace_back("Peer", s.peer >= 0 ? std::to_string(s.peer) : "-");
  out.emplace_back("Sequence", s.seq >= 0 ? std::to_string(s.seq) : "-");
  if (s.bytes > 0 && s.duration_ns() > 0) {
    out.emplace_back(
        "algbw",
        fixed(static_cast<double>(s.bytes) / static_cast<double>(s.duration_ns()), 2) + " GB/s");
  }
  out.emplace_back("Start (ns)", std::to_string(s.start_ns));
  out.emplace_back("End (ns)", std::to_string(s.end_ns));
  out.emplace_back("Span index", std::to_string(span));
  return out;
}

// --- KeyValueModel

int KeyValueModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}
int KeyValueModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : 2; }

QVariant KeyValueModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= static_cast<int>(rows_.size())) return {};
  if (role != Qt::DisplayRole && role != Qt::ToolTipRole) return {};
  const auto& r = rows_[static_cast<size_t>(index.row())];
  return index.column() == 0 ? r.first : r.second;
}

QVariant KeyValueModel::headerData(int section, Qt::Orientation o, int role) const {
  if (role != Qt::DisplayRole || o != Qt::Horizontal) return {};
  return section == 0 ? QStringLiteral("Attribute") : QStringLiteral("Value");
}

void KeyValueModel::set_rows(std::vector<std::pair<QString, QString>> rows) {
  beginResetModel();
  rows_ = std::move(rows);
  endResetModel();
}

QString KeyValueModel::value(const QString& key) const {
  for (const auto& r : rows_) {
    if (r.first == key) return r.second;
  }
  return {};
}

std::vector<std::pair<std::string, std::string>> flow_attributes(const traces::Trace& t,
                                                                 const FlowInfo& f) {
  std::vector<std::pair<std::string, std::string>> out;
  if (f.kind == FlowKind::None || f.members.empty()) return out;
  auto dur = [](int64_t ns) { return format_duration_ns(static_cast<double>(ns)); };
  if (f.kind == FlowKind::P2P) {
    const auto& s = t.spans[f.send];
    const auto& r = t.spans[f.recv];
    out.emplace_back(
        "Flow", "send rank " + std::to_string(s.rank) + " -> recv rank " + std::to_string(r.rank));
    // A receive posted before its send waits for it; a send posted first waits for the receive.
    const int64_t d = r.start_ns - s.start_ns;
    out.emplace_back("Start skew", d >= 0 ? "recv " + dur(d) + " after send"
                                          : "recv " + dur(-d) + " before send");
  } else {
    const auto& first = t.spans[f.members.front().span];
    std::string what = t.name_of(first) + ": " + std::to_string(f.members.size()) + " ranks";
    if (const auto* c = t.comm(f.comm)) what += ", " + c->name;
    what += ", seq " + std::to_string(f.seq);
    out.emplace_back("Flow", what);
    out.emplace_back("Start skew", dur(f.spread_ns));
    out.emplace_back("Last to arrive", "rank " + std::to_string(f.last_rank));
  }
  constexpr size_t kMaxMembers = 64;
  for (size_t i = 0; i < f.members.size() && i < kMaxMembers; ++i) {
    const auto& m = f.members[i];
    out.emplace_back("  rank " + std::to_string(m.rank),
                     "+" + dur(m.skew_ns) + ", waited " + dur(m.wait_ns));
  }
  if (f.members.size() > kMaxMembers) {
    out.emplace_back("  ...", std::to_string(f.members.size() - kMaxMembers) + " more ranks");
  }
  return out;
}

void SpanDetailsModel::set_span(const traces::Trace* t, int64_t span, int64_t zero_ns,
                                const FlowIndex* flows) {
  span_ = (t && span >= 0 && static_cast<size_t>(span) < t->spans.size()) ? span : -1;
  std::vector<std::pair<QString, QString>> rows;
  if (span_ >= 0) {
    for (auto& [k, v] : span_attributes(*t, static_cast<uint32_t>(span_), zero_ns))
      rows.emplace_back(q(k), q(v));
    if (flows) {
      for (auto& [k, v] : flow_attributes(*t, flows->flow_of(*t, static_cast<uint32_t>(span_))))
        rows.emplace_back(q(k), q(v));
    }
  }
  set_rows(std::move(rows));
}

void RangeMetricsModel::set_metrics(const profiler::Metrics& m, int64_t t0_ns, int64_t t1_ns,
                                    int64_t zero_ns) {
  std::vector<std::pair<QString, QString>> rows;
  auto dur = [](int64_t ns) { return q(format_duration_ns(static_cast<double>(ns))); };
  const auto& tb = m.total;
  const double n_ranks = m.ranks.empty() ? 1.0 : static_cast<double>(m.ranks.size());
  rows.emplace_back("Range", dur(t0_ns - zero_ns) + " .. " + dur(t1_ns - zero_ns));
  rows.emplace_back("Range length", dur(t1_ns - t0_ns));
  rows.emplace_back("Ranks", QString::number(m.ranks.size()));
  rows.emplace_back("Spans", QString::number(m.span_count));
  rows.emplace_back("Comm/comp ratio", q(fixed(tb.comm_comp_ratio(), 3)));
  rows.emplace_back("Overlap %", q(fixed(tb.overlap_pct(), 1)) + " %");
  rows.emplace_back("Exposed comm (mean/rank)",
                    dur(static_cast<int64_t>(static_cast<double>(tb.exposed_comm_ns) / n_ranks)));
  rows.emplace_back("Compute (mean/rank)",
                    dur(static_cast<int64_t>(static_cast<double>(tb.compute_ns) / n_ranks)));
  rows.emplace_back("Communication (mean/rank)",
                    dur(static_cast<int64_t>(static_cast<double>(tb.comm_ns) / n_ranks)));
  rows.emplace_back("Memcpy (mean/rank)",
                    dur(static_cast<int64_t>(static_cast<double>(tb.memcpy_ns) / n_ranks)));
  rows.emplace_back("Idle (mean/rank)",
                    dur(static_cast<int64_t>(static_cast<double>(tb.idle_ns) / n_ranks)));
  if (!m.steps.empty()) {
    rows.emplace_back("Steps", QString::number(m.steps.size()));
    rows.emplace_back("Step time p50", dur(static_cast<int64_t>(m.step_p50_ns)));
  }
  if (m.tokens_per_s > 0) rows.emplace_back("Tokens/s", q(fixed(m.tokens_per_s, 0)));
  if (m.mfu > 0) rows.emplace_back("MFU", q(fixed(100 * m.mfu, 1)) + " %");
  if (m.bubble_pct > 0) rows.emplace_back("Bubble", q(fixed(m.bubble_pct, 1)) + " %");
  for (const auto& c : m.collectives) {
    rows.emplace_back("busbw " + q(c.op) + " " + q(c.comm_name),
                      q(fixed(c.busbw_gbps, 2)) + " GB/s");
  }
  set_rows(std::move(rows));
}

// --- CollectiveModel

int CollectiveModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}
int CollectiveModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColumnCount;
}

QVariant CollectiveModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= static_cast<int>(rows_.size())) return {};
  const auto& c = rows_[static_cast<size_t>(index.row())];
  if (role == Qt::UserRole) {
    switch (index.column()) {
      case kCalls:
        return QVariant::fromValue<qlonglong>(c.count);
      case kBytes:
        return QVariant::fromValue<qlonglong>(c.bytes);
      case kTime:
        return QVariant::fromValue<qlonglong>(c.time_ns);
      case kAlgbw:
        return c.algbw_gbps;
      case kBusbw:
        return c.busbw_gbps;
      default:
        break;
    }
  }
  if (role == Qt::TextAlignmentRole && index.column() >= kRanks) {
    return QVariant::fromValue(Qt::AlignRight | Qt::AlignVCenter);
  }
  if (role != Qt::DisplayRole) return {};
  switch (index.column()) {
    case kOp:
      return q(c.op);
    case kComm:
      return q(c.comm_name.empty() ? std::to_string(c.comm) : c.comm_name);
    case kRanks:
      return c.comm_size;
    case kCalls:
      return QVariant::fromValue<qlonglong>(c.count);
    case kBytes:
      return q(format_bytes(static_cast<double>(c.bytes)));
    case kTime:
      return q(format_duration_ns(static_cast<double>(c.time_ns)));
    case kAlgbw:
      return q(fixed(c.algbw_gbps, 2));
    case kBusbw:
      return q(fixed(c.busbw_gbps, 2));
    default:
      return {};
  }
}

QVariant CollectiveModel::headerData(int section, Qt::Orientation o, int role) const {
  if (role != Qt::DisplayRole || o != Qt::Horizontal) return {};
  static const char* kNames[] = {"Op",    "Communicator", "Ranks",      "Calls",
                                 "Bytes", "Time",         "algbw GB/s", "busbw GB/s"};
  return section >= 0 && section < kColumnCount ? QString(kNames[section]) : QVariant();
}

void CollectiveModel::set_collectives(std::vector<profiler::CollectiveStats> c) {
  beginResetModel();
  rows_ = std::move(c);
  endResetModel();
}

// --- StepDiffModel

int StepDiffModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}
int StepDiffModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColumnCount;
}

QVariant StepDiffModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= static_cast<int>(rows_.size())) return {};
  const auto& d = rows_[static_cast<size_t>(index.row())];
  int64_t ns = 0;
  switch (index.column()) {
    case kStep:
      ns = d.step;
      break;
    case kA:
      ns = d.a_ns;
      break;
    case kB:
      ns = d.b_ns;
      break;
    case kDiff:
      ns = d.diff_ns();
      break;
    case kACompute:
      ns = d.a_compute_ns;
      break;
    case kBCompute:
      ns = d.b_compute_ns;
      break;
    case kAExposed:
      ns = d.a_exposed_ns;
      break;
    case kBExposed:
      ns = d.b_exposed_ns;
      break;
    default:
      break;
  }
  if (role == Qt::UserRole) {
    if (index.column() == kDiffPct) return d.diff_pct();
    return QVariant::fromValue<qlonglong>(ns);
  }
  if (role == Qt::TextAlignmentRole) return QVariant::fromValue(Qt::AlignRight | Qt::AlignVCenter);
  if (role != Qt::DisplayRole) return {};
  if (index.column() == kStep) return d.step;
  if (index.column() == kDiffPct)
    return q((d.diff_pct() >= 0 ? "+" : "") + fixed(d.diff_pct(), 1) + " %");
  if (index.column() == kDiff) {
    return q((ns >= 0 ? "+" : "-") + format_duration_ns(static_cast<double>(ns >= 0 ? ns : -ns)));
  }
  return q(format_duration_ns(static_cast<double>(ns)));
}

QVariant StepDiffModel::headerData(int section, Qt::Orientation o, int role) const {
  if (role != Qt::DisplayRole || o != Qt::Horizontal) return {};
  switch (section) {
    case kStep:
      return QStringLiteral("Step");
    case kA:
      return a_name_ + " step";
    case kB:
      return b_name_ + " step";
    case kDiff:
      return QStringLiteral("Δ");
    case kDiffPct:
      return QStringLiteral("Δ %");
    case kACompute:
      return a_name_ + " compute";
    case kBCompute:
      return b_name_ + " compute";
    case kAExposed:
      return a_name_ + " exp. comm";
    case kBExposed:
      return b_name_ + " exp. comm";
    default:
      return {};
  }
}

void StepDiffModel::set_diffs(std::vector<StepDiff> d, QString a_name, QString b_name) {
  beginResetModel();
  rows_ = std::move(d);
  a_name_ = std::move(a_name);
  b_name_ = std::move(b_name);
  endResetModel();
  emit headerDataChanged(Qt::Horizontal, 0, kColumnCount - 1);
}

// --- LaneTreeModel

void LaneTreeModel::set_trace(const TraceIndex* index, const std::vector<traces::RankInfo>& ranks,
                              GroupBy by) {
  beginResetModel();
  nodes_.clear();
  nodes_.push_back(Node{});  // root
  auto add = [&](int parent, Node n) {
    n.parent = parent;
    n.row = static_cast<int>(nodes_[static_cast<size_t>(parent)].children.size());
    nodes_.push_back(std::move(n));
    const int id = static_cast<int>(nodes_.size()) - 1;
    nodes_[static_cast<size_t>(parent)].children.push_back(id);
    return id;
  };
  if (index) {
    const auto& lanes = index->lanes();
    for (const auto& g : group_ranks(*index, ranks, by)) {
      int gparent = 0;
      if (by != GroupBy::Rank) {
        Node gn;
        gn.kind = Node::Kind::Group;
        gn.label = q(g.label);
        gparent = add(0, gn);
      }
      for (int32_t r : g.ranks) {
        Node rn;
        rn.kind = Node::Kind::Rank;
        rn.rank = r;
        rn.label = QStringLiteral("rank %1").arg(r);
        const int rid = add(gparent, rn);
        for (const auto& l : lanes) {
          if (l.rank != r) continue;
          Node ln;
          ln.kind = Node::Kind::Lane;
          ln.rank = r;
          ln.stream = l.stream;
          ln.label = q(l.name);
          add(rid, ln);
        }
      }
    }
  }
  // Hidden lanes that no longer exist are forgotten.
  std::set<std::pair<int32_t, int32_t>> still;
  for (const auto& n : nodes_) {
    if (n.kind == Node::Kind::Lane && hidden_.count({n.rank, n.stream}))
      still.insert({n.rank, n.stream});
  }
  hidden_ = std::move(still);
  endResetModel();
}

QModelIndex LaneTreeModel::index_of(int node) const {
  if (node <= 0) return {};
  return createIndex(nodes_[static_cast<size_t>(node)].row, 0, static_cast<quintptr>(node));
}

QModelIndex LaneTreeModel::index(int row, int column, const QModelIndex& parent) const {
  if (nodes_.empty() || column != 0 || row < 0) return {};
  const int p = parent.isValid() ? static_cast<int>(parent.internalId()) : 0;
  if (parent.isValid() && parent.column() != 0) return {};
  const auto& ch = nodes_[static_cast<size_t>(p)].children;
  if (row >= static_cast<int>(ch.size())) return {};
  return createIndex(row, 0, static_cast<quintptr>(ch[static_cast<size_t>(row)]));
}

QModelIndex LaneTreeModel::parent(const QModelIndex& child) const {
  if (!child.isValid()) return {};
  const int p = nodes_[static_cast<size_t>(child.internalId())].parent;
  return index_of(p);
}

int LaneTreeModel::rowCount(const QModelIndex& parent) const {
  if (nodes_.empty()) return 0;
  if (parent.isValid() && parent.column() != 0) return 0;
  const int p = parent.isValid() ? static_cast<int>(parent.internalId()) : 0;
  return static_cast<int>(nodes_[static_cast<size_t>(p)].children.size());
}

int LaneTreeModel::columnCount(const QModelIndex&) const { return 1; }

Qt::CheckState LaneTreeModel::check_state(int node) const {
  const auto& n = nodes_[static_cast<size_t>(node)];
  if (n.kind == Node::Kind::Lane)
    return hidden_.count({n.rank, n.stream}) ? Qt::Unchecked : Qt::Checked;
  bool any_on = false, any_off = false;
  for (int c : n.children) {
    const auto s = check_state(c);
    if (s != Qt::Unchecked) any_on = true;
    if (s != Qt::Checked) any_off = true;
  }
  if (any_on && any_off) return Qt::PartiallyChecked;
  return any_on ? Qt::Checked : Qt::Unchecked;
}

QVariant LaneTreeModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid()) return {};
  const int id = static_cast<int>(index.internalId());
  const auto& n = nodes_[static_cast<size_t>(id)];
  if (role == Qt::DisplayRole) return n.label;
  if (role == Qt::CheckStateRole) return static_cast<int>(check_state(id));
  return {};
}

void LaneTreeModel::set_checked(int node, bool checked) {
  const auto& n = nodes_[static_cast<size_t>(node)];
  if (n.kind == Node::Kind::Lane) {
    if (checked) {
      hidden_.erase({n.rank, n.stream});
    } else {
      hidden_.insert({n.rank, n.stream});
    }
    return;
  }
  for (int c : n.children) set_checked(c, checked);
}

void LaneTreeModel::notify_subtree(int node) {
  if (node > 0) {
    const auto idx = index_of(node);
    emit dataChanged(idx, idx, {Qt::CheckStateRole});
  }
  for (int c : nodes_[static_cast<size_t>(node)].children) notify_subtree(c);
}

bool LaneTreeModel::setData(const QModelIndex& index, const QVariant& value, int role) {
  if (!index.isValid() || role != Qt::CheckStateRole) return false;
  const int id = static_cast<int>(index.internalId());
  set_checked(id, static_cast<Qt::CheckState>(value.toInt()) != Qt::Unchecked);
  notify_subtree(id);
  for (int p = nodes_[static_cast<size_t>(id)].parent; p > 0;
       p = nodes_[static_cast<size_t>(p)].parent) {
    const auto idx = index_of(p);
    emit dataChanged(idx, idx, {Qt::CheckStateRole});
  }
  emit visibilityChanged();
  return true;
}

Qt::ItemFlags LaneTreeModel::flags(const QModelIndex& index) const {
  if (!index.isValid()) return Qt::NoItemFlags;
  return Qt::ItemIsEnabled | Qt::ItemIsSelectable | Qt::ItemIsUserCheckable;
}

QVariant LaneTreeModel::headerData(int section, Qt::Orientation o, int role) const {
  if (role != Qt::DisplayRole || o != Qt::Horizontal || section != 0) return {};
  return QStringLiteral("Lanes");
}

}  // namespace orrery::gui

namespace orrery::gui {

std::vector<NameStats> range_by_name(const traces::Trace& t, int64_t t0_ns, int64_t t1_ns,
                                     KindMask kinds) {
  if (t1_ns < t0_ns) std::swap(t0_ns, t1_ns);
  std::vector<NameStats> by_id(t.strings.size());
  std::set<int32_t> ranks;
  for (const auto& r : t.ranks) ranks.insert(r.rank);
  for (const auto& s : t.spans) {
    ranks.insert(s.rank);
    if (!(kinds & kind_bit(s.kind))) continue;
    // Overlapping the range; a zero-length span inside it counts too (for no time).
    const bool overlaps = s.end_ns > t0_ns && s.start_ns < t1_ns;
    const bool instant = s.start_ns == s.end_ns && s.start_ns >= t0_ns && s.start_ns < t1_ns;
    if (!overlaps && !instant) continue;
    if (s.name >= by_id.size()) continue;
    const int64_t clipped = std::min(s.end_ns, t1_ns) - std::max(s.start_ns, t0_ns);
    auto& n = by_id[s.name];
    ++n.count;
    n.total_ns += std::max<int64_t>(0, clipped);
    n.max_ns = std::max(n.max_ns, clipped);
  }
  const double rank_time =
      static_cast<double>(t1_ns - t0_ns) * static_cast<double>(std::max<size_t>(1, ranks.size()));
  std::vector<NameStats> out;
  for (size_t i = 0; i < by_id.size(); ++i) {
    if (by_id[i].count == 0) continue;
    NameStats n = by_id[i];
    n.name = t.strings.str(static_cast<traces::NameId>(i));
    n.share = rank_time > 0 ? static_cast<double>(n.total_ns) / rank_time : 0;
    out.push_back(std::move(n));
  }
  std::stable_sort(out.begin(), out.end(), [](const NameStats& a, const NameStats& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
  });
  return out;
}

int RangeByNameModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}
int RangeByNameModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColumnCount;
}

QVariant RangeByNameModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= static_cast<int>(rows_.size())) return {};
  const auto& n = rows_[static_cast<size_t>(index.row())];
  auto dur = [](int64_t ns) { return q(format_duration_ns(static_cast<double>(ns))); };
  if (role == Qt::UserRole) {
    switch (index.column()) {
      case kName:
        return q(n.name);
      case kCount:
        return QVariant::fromValue<qlonglong>(n.count);
      case kTotal:
        return QVariant::fromValue<qlonglong>(n.total_ns);
      case kMean:
        return QVariant::fromValue<qlonglong>(n.mean_ns());
      case kMax:
        return QVariant::fromValue<qlonglong>(n.max_ns);
      case kShare:
        return n.share;
      default:
        return {};
    }
  }
  if (role == Qt::TextAlignmentRole && index.column() > kName) {
    return QVariant::fromValue(Qt::AlignRight | Qt::AlignVCenter);
  }
  if (role != Qt::DisplayRole) return {};
  switch (index.column()) {
    case kName:
      return q(n.name);
    case kCount:
      return QString::number(n.count);
    case kTotal:
      return dur(n.total_ns);
    case kMean:
      return dur(n.mean_ns());
    case kMax:
      return dur(n.max_ns);
    case kShare:
      return QStringLiteral("%1 %").arg(100.0 * n.share, 0, 'f', 1);
    default:
      return {};
  }
}

QVariant RangeByNameModel::headerData(int section, Qt::Orientation o, int role) const {
  if (o != Qt::Horizontal || role != Qt::DisplayRole) return {};
  static const char* const kNames[] = {"Name", "Count", "Total", "Mean", "Max", "Share"};
  return section >= 0 && section < kColumnCount ? QString(kNames[section]) : QVariant();
}

void RangeByNameModel::set_rows(std::vector<NameStats> rows) {
  beginResetModel();
  rows_ = std::move(rows);
  endResetModel();
}

}  // namespace orrery::gui

namespace orrery::gui {

int OpDiffModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}
int OpDiffModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColumnCount;
}

void OpDiffModel::set_diffs(std::vector<OpDiff> d) {
  beginResetModel();
  rows_ = std::move(d);
  endResetModel();
}

QVariant OpDiffModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= static_cast<int>(rows_.size())) return {};
  const auto& d = rows_[static_cast<size_t>(index.row())];
  const int c = index.column();
  if (c == kName) {
    if (role == Qt::DisplayRole || role == Qt::UserRole || role == Qt::ToolTipRole)
      return QString::fromStdString(d.name);
    return {};
  }
  int64_t v = 0;
  if (c == kA) v = d.a_ns;
  if (c == kB) v = d.b_ns;
  if (c == kDiff) v = d.diff_ns();
  if (c == kACount) v = d.a_count;
  if (c == kBCount) v = d.b_count;
  if (role == Qt::UserRole) {
    if (c == kRatio) return d.ratio();
    return QVariant::fromValue<qlonglong>(v);
  }
  if (role == Qt::TextAlignmentRole) return QVariant::fromValue(Qt::AlignRight | Qt::AlignVCenter);
  if (role != Qt::DisplayRole) return {};
  switch (c) {
    case kRatio:
      if (d.a_ns == 0) return d.b_ns == 0 ? QStringLiteral("-") : QStringLiteral("only in B");
      return QString::fromStdString(fixed(d.ratio(), 3)) + QStringLiteral(" x");
    case kDiff:
      return QString::fromStdString((v >= 0 ? "+" : "-") +
                                    format_duration_ns(static_cast<double>(v >= 0 ? v : -v)));
    case kACount:
    case kBCount:
      return QString::number(v);
    default:
      return QString::fromStdString(format_duration_ns(static_cast<double>(v)));
  }
}

QVariant OpDiffModel::headerData(int section, Qt::Orientation o, int role) const {
  if (role != Qt::DisplayRole || o != Qt::Horizontal) return {};
  static const char* kNames[] = {"Op",    "A per rank-step", "B per rank-step", "B - A",
                                 "B / A", "A spans",         "B spans"};
  return section >= 0 && section < kColumnCount ? QString::fromUtf8(kNames[section]) : QVariant();
}

}  // namespace orrery::gui

namespace orrery::gui {

int CriticalPathModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() || !trace_ ? 0 : static_cast<int>(path_.links.size());
}
int CriticalPathModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColumnCount;
}

void CriticalPathModel::set_path(const traces::Trace* t, CriticalPath path) {
  beginResetModel();
  trace_ = t;
  path_ = std::move(path);
  endResetModel();
}

QVariant CriticalPathModel::data(const QModelIndex& index, int role) const {
  if (!trace_ || !index.isValid() || index.row() >= rowCount()) return {};
  const auto& l = path_.links[static_cast<size_t>(index.row())];
  const auto& s = trace_->spans[l.span];
  const int64_t on = l.to_ns - l.from_ns, waited = l.from_ns - s.start_ns;
  if (role == Qt::UserRole) {
    switch (index.column()) {
      case kIndex:
        return QVariant::fromValue<qlonglong>(l.span);
      case kRank:
        return s.rank;
      case kOnPath:
        return QVariant::fromValue<qlonglong>(on);
      case kWaited:
        return QVariant::fromValue<qlonglong>(waited);
      default:
        break;
    }
  }
  if (role != Qt::DisplayRole) return {};
  switch (index.column()) {
    case kIndex:
      return index.row() + 1;
    case kRank:
      return s.rank;
    case kName:
      return QString::fromStdString(trace_->name_of(s));
    case kVia: {
      static const char* kViaNames[] = {"first", "stream order", "other stream", "last arrival",
                                        "its send"};
      return QString::fromUtf8(kViaNames[static_cast<int>(l.via)]);
    }
    case kOnPath:
      return QString::fromStdString(format_duration_ns(static_cast<double>(on)));
    case kWaited:
      return waited > 0 ? QString::fromStdString(format_duration_ns(static_cast<double>(waited)))
                        : QStringLiteral("-");
    default:
      return {};
  }
}

QVariant CriticalPathModel::headerData(int section, Qt::Orientation o, int role) const {
  if (role != Qt::DisplayRole || o != Qt::Horizontal) return {};
  static const char* kNames[] = {"#", "Rank", "Span", "After", "On path", "Waited"};
  return section >= 0 && section < kColumnCount ? QString::fromUtf8(kNames[section]) : QVariant();
}

}  // namespace orrery::gui
