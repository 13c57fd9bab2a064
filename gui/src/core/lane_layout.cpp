// Grouping of ranks into dp/tp/pp groups and the vertical layout of headers and lanes.
#include "orrery/gui/lane_layout.hpp"

#include <algorithm>
#include <map>
#include <tuple>

namespace orrery::gui {

const char* to_string(GroupBy g) {
  switch (g) {
    case GroupBy::Rank:
      return "rank";
    case GroupBy::DP:
      return "dp";
    case GroupBy::TP:
      return "tp";
    case GroupBy::PP:
      return "pp";
  }
  return "rank";
}

std::vector<RankGroup> group_ranks(const TraceIndex& index,
                                   const std::vector<traces::RankInfo>& infos, GroupBy by) {
  std::vector<int32_t> ranks;
  for (const auto& l : index.lanes()) {
    if (ranks.empty() || ranks.back() != l.rank) ranks.push_back(l.rank);
  }
  std::vector<RankGroup> out;
  if (by == GroupBy::Rank) {
    out.push_back({"", ranks});
    return out;
  }
  std::map<int32_t, const traces::RankInfo*> info_of;
  for (const auto& r : infos) info_of[r.rank] = &r;
  // Key: the two coordinates the group shares, in (dp, tp, pp) order without the grouped one.
  std::map<std::tuple<int, int>, RankGroup> groups;
  for (int32_t r : ranks) {
    int dp = r, tp = 0, pp = 0;
    if (auto it = info_of.find(r); it != info_of.end()) {
      dp = it->second->dp;
      tp = it->second->tp;
      pp = it->second->pp;
    }
    std::tuple<int, int> key;
    std::string label;
    switch (by) {
      case GroupBy::DP:
        key = {tp, pp};
        label = "dp[tp=" + std::to_string(tp) + ",pp=" + std::to_string(pp) + "]";
        break;
      case GroupBy::TP:
        key = {dp, pp};
        label = "tp[dp=" + std::to_string(dp) + ",pp=" + std::to_string(pp) + "]";
        break;
      default:
        key = {dp, tp};
        label = "pp[dp=" + std::to_string(dp) + ",tp=" + std::to_string(tp) + "]";
        break;
    }
    auto& g = groups[key];
    g.label = label;
    g.ranks.push_back(r);
  }
  for (auto& [k, g] : groups) out.push_back(std::move(g));
  return out;
}

void LaneLayout::set_collapsed(const std::string& key, bool collapsed) {
  if (collapsed) {
    collapsed_.insert(key);
  } else {
    collapsed_.erase(key);
  }
}

void LaneLayout::build(const TraceIndex& index, const std::vector<traces::RankInfo>& infos,
                       GroupBy by, const std::set<std::pair<int32_t, int32_t>>& hidden_lanes,
                       const std::vector<CounterTrack>* counters) {
  rows_.clear();
  double y = 0;
  auto add = [&](LayoutRow r, double h) {
    r.y = y;
    r.height = h;
    y += h;
    rows_.push_back(std::move(r));
  };
  const auto& lanes = index.lanes();
  for (const auto& g : group_ranks(index, infos, by)) {
    const bool grouped = by != GroupBy::Rank;
    // A group or rank whose lanes are all hidden is left out entirely.
    auto visible_lanes_of = [&](int32_t rank) {
      std::vector<int> v;
      for (size_t i = 0; i < lanes.size(); ++i) {
        if (lanes[i].rank == rank && !hidden_lanes.count({rank, lanes[i].stream})) {
          v.push_back(static_cast<int>(i));
        }
      }
      return v;
    };
    std::vector<std::pair<int32_t, std::vector<int>>> members;
    for (int32_t r : g.ranks) {
      auto v = visible_lanes_of(r);
      if (!v.empty()) members.emplace_back(r, std::move(v));
    }
    if (members.empty()) continue;
    bool group_collapsed = false;
    if (grouped) {
      LayoutRow h;
      h.kind = LayoutRow::Kind::Group;
      h.key = "g:" + g.label;
      h.label = g.label + "  (" + std::to_string(g.ranks.size()) +
                (g.ranks.size() == 1 ? " rank)" : " ranks)");
      group_collapsed = h.collapsed = is_collapsed(h.key);
      add(std::move(h), kGroupHeight);
    }
    if (group_collapsed) continue;
    for (auto& [rank, lane_ids] : members) {
      LayoutRow h;
      h.kind = LayoutRow::Kind::Rank;
      h.key = "r:" + std::to_string(rank);
      h.rank = rank;
      h.indent = grouped ? 1 : 0;
      h.label = "rank " + std::to_string(rank);
      h.collapsed = is_collapsed(h.key);
      const bool rank_collapsed = h.collapsed;
      add(std::move(h), kRankHeight);
      if (rank_collapsed) continue;
      for (int li : lane_ids) {
        LayoutRow r;
        r.kind = LayoutRow::Kind::Lane;
        r.lane = li;
        r.rank = rank;
        r.indent = grouped ? 2 : 1;
        r.label = lanes[static_cast<size_t>(li)].name;
        add(std::move(r), lane_height(lanes[static_cast<size_t>(li)].rows.size()));
      }
      if (!counters) continue;
      // The tracks are sorted by rank: the first of this rank's, by binary search.
      auto it = std::lower_bound(counters->begin(), counters->end(), rank,
                                 [](const CounterTrack& c, int32_t r) { return c.rank < r; });
      for (; it != counters->end() && it->rank == rank; ++it) {
        LayoutRow r;
        r.kind = LayoutRow::Kind::Counter;
        r.counter = static_cast<int>(it - counters->begin());
        r.rank = rank;
        r.indent = grouped ? 2 : 1;
        r.label = it->name;
        add(std::move(r), kCounterHeight);
      }
    }
  }
  total_height_ = y;
}

int LaneLayout::row_at(double y) const {
  if (rows_.empty() || y < 0 || y >= total_height_) return -1;
  auto it = std::upper_bound(rows_.begin(), rows_.end(), y,
                             [](double v, const LayoutRow& r) { return v < r.y; });
  return static_cast<int>(it - rows_.begin()) - 1;
}

int LaneLayout::row_of_lane(int lane) const {
  for (size_t i = 0; i < rows_.size(); ++i) {
    if (rows_[i].kind == LayoutRow::Kind::Lane && rows_[i].lane == lane) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace orrery::gui
