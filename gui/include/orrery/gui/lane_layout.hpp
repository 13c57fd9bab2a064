// Vertical layout of the timeline: lanes grouped by rank, optionally under dp/tp/pp groups, with
// collapsible headers and hidden lanes. Plain data, so positions are tested without a widget.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "orrery/gui/counter_tracks.hpp"
#include "orrery/gui/trace_index.hpp"

namespace orrery::gui {

// How ranks are grouped: not at all (one header per rank), or by the communicator groups of the
// dp/tp/pp grid. A dp group is the ranks that share (tp, pp) and so all-reduce gradients together,
// labelled as the trace labels communicators: "dp[tp=0,pp=1]".
enum class GroupBy { Rank = 0, DP = 1, TP = 2, PP = 3 };
const char* to_string(GroupBy g);

struct RankGroup {
  std::string label;           // "dp[tp=0,pp=1]"; empty for GroupBy::Rank
  std::vector<int32_t> ranks;  // sorted
};

// Groups the ranks that have lanes in `index`; ranks without a RankInfo count as (dp=rank, 0, 0).
std::vector<RankGroup> group_ranks(const TraceIndex& index,
                                   const std::vector<traces::RankInfo>& infos, GroupBy by);

struct LayoutRow {
  enum class Kind { Group, Rank, Lane, Counter };
  Kind kind = Kind::Lane;
  std::string label;
  std::string key;   // collapse key: "g:<label>" or "r:<rank>"; empty for lanes
  int lane = -1;     // index into TraceIndex::lanes() for Kind::Lane
  int counter = -1;  // index into the counter tracks for Kind::Counter
  int32_t rank = -1;
  int indent = 0;  // nesting level, for the label column
  double y = 0;    // top, in pixels from the top of the lane area
  double height = 0;
  bool collapsed = false;
};

class LaneLayout {
 public:
  static constexpr double kGroupHeight = 22;
  static constexpr double kRankHeight = 20;
  static constexpr double kRowHeight = 18;      // one row of spans
  static constexpr double kLanePad = 4;         // below the last row of a lane
  static constexpr double kCounterHeight = 30;  // one counter track

  void build(const TraceIndex& index, const std::vector<traces::RankInfo>& infos, GroupBy by,
             const std::set<std::pair<int32_t, int32_t>>& hidden_lanes,
             const std::vector<CounterTrack>* counters = nullptr);
  const std::vector<LayoutRow>& rows() const { return rows_; }
  double total_height() const { return total_height_; }
  // Index of the row containing y, or -1.
  int row_at(double y) const;
  // With counters, each rank's tracks follow its lanes (a rank whose lanes are all hidden shows no
  // tracks either).
  // Row index of a lane, or -1 when it is hidden or collapsed.
  int row_of_lane(int lane) const;

  bool is_collapsed(const std::string& key) const { return collapsed_.count(key) != 0; }
  void set_collapsed(const std::string& key, bool collapsed);
  void toggle(const std::string& key) { set_collapsed(key, !is_collapsed(key)); }
  // Collapse keys survive a rebuild (the kind filter rebuilds the index).
  const std::set<std::string>& collapsed_keys() const { return collapsed_; }

  // Height of a lane with `rows` rows of spans (at least one, so an empty lane is visible).
  static double lane_height(size_t rows) {
    return static_cast<double>(rows < 1 ? 1 : rows) * kRowHeight + kLanePad;
  }

 private:
  std::vector<LayoutRow> rows_;
  double total_height_ = 0;
  std::set<std::string> collapsed_;
};

}  // namespace orrery::gui
