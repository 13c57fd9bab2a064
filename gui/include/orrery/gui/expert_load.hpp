// The router's load step by step, for the Experts tab: tokens per expert of every mixture-of-experts
// block from the counters moe.tokens[l=L,e=E] and moe.dropped[l=L] (model/moe.hpp). The runtime
// writes one sample per rank and step, summed over the step's micro-batches, so the k-th sample of a
// (rank, counter) track is step k. Tokens are summed over ranks, as `orrery report` sums them
// (profiler/moe_metrics.hpp): with tp > 1 every tp rank counts the same tokens, so counts grow by tp
// and every ratio is unchanged. Over all steps the ratios equal the report's.
#pragma once

#include <string>
#include <vector>

#include "orrery/gui/counter_tracks.hpp"

namespace orrery::gui {

class ExpertLoad {
 public:
  static constexpr int kAllSteps = -1;

  bool empty() const { return layers_.empty(); }
  const std::vector<int>& layers() const { return layers_; }  // the MoE blocks, ascending
  int blocks() const { return static_cast<int>(layers_.size()); }
  int experts(int block) const { return experts_[static_cast<size_t>(block)]; }
  int max_experts() const;
  int steps() const { return steps_; }  // the most samples any track has
  int ranks() const { return ranks_; }  // ranks with MoE counters

  // Per step (0-based) or over all steps (kAllSteps); block is an index into layers().
  double tokens(int step, int block, int expert) const;
  double dropped(int step, int block) const;
  double total(int step, int block) const;
  double mean(int step, int block) const;       // total / the block's experts
  double imbalance(int step, int block) const;  // max / mean over the experts, 0 without tokens
  double share(int step, int block, int expert) const;  // tokens / mean, 0 without tokens
  double dropped_fraction(int step, int block) const;   // dropped / total, 0 without tokens

  // The step and block with the largest max / mean (steps_ > 0), for the summary line.
  struct Worst {
    int step = 0, block = 0;
    double imbalance = 0;
  };
  Worst worst() const;

 private:
  friend ExpertLoad expert_load(const std::vector<CounterTrack>& tracks);
  size_t at(int step, int block) const;  // row of (step, block); step kAllSteps is the last row
  std::vector<int> layers_;
  std::vector<int> experts_;  // per block: the highest expert index seen + 1
  int steps_ = 0, ranks_ = 0, width_ = 0;
  std::vector<double> tokens_;   // [(step or steps_) * blocks + block] * width_ + expert
  std::vector<double> dropped_;  // [(step or steps_) * blocks + block]
};

// Reads the MoE counters of a trace's counter tracks (counter_tracks()); empty when it has none.
ExpertLoad expert_load(const std::vector<CounterTrack>& tracks);

// "moe.tokens[l=3,e=5]" -> layer 3, expert 5; "moe.dropped[l=3]" -> layer 3, expert -1.
bool parse_moe_counter(const std::string& name, int& layer, int& expert);

}  // namespace orrery::gui
