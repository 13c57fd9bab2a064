// Max-min fair sharing of link capacities among flows, by progressive filling. Its own component so
// it can be tested on textbook examples.
//
// Problem: links l with capacity C_l; flows f, each crossing a set of links L_f and standing for w_f
// identical unit flows (weight; identical flows aggregated into one entry). Find unit rates r_f such
// that  sum_{f crosses l} w_f r_f <= C_l  for every l, and no r_f can grow without shrinking some
// r_g <= r_f (max-min fairness; weighted: a flow of weight w gets w times the share of a weight-1 flow).
//
// Progressive filling: raise every unfrozen unit rate together. A link saturates when its remaining
// capacity R_l divided by the unfrozen weight W_l crossing it is the smallest such share s = R_l / W_l
// over all links; every unfrozen flow crossing that link is frozen at r_f = s, and for each link l'
// those flows cross, R_l' -= w_f s and W_l' -= w_f. Repeat until every flow is frozen. Links are
// taken from a min-heap of shares (lazily updated); ties go to the lower link id, so the result is
// deterministic. Cost O((sum_f |L_f|) log L). A flow crossing no link gets rate +infinity.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace orrery::sim {

struct MaxMinFlow {
  const int32_t* links = nullptr;  // link ids (into the capacity array)
  int32_t num_links = 0;
  double weight = 1.0;  // number of identical unit flows this entry stands for (> 0)
};

class MaxMinSolver {
 public:
  // Writes the unit rate of each flow into rates (resized to flows.size()). capacity is indexed by
  // link id; only links crossed by `flows` are read.
  void solve(std::span<const double> capacity, std::span<const MaxMinFlow> flows,
             std::vector<double>& rates);

 private:
  // Scratch reused between calls (solving is hot in the flow-level model).
  std::vector<int32_t> link_slot_;  // link id -> compact index, -1 when untouched
  std::vector<int32_t> touched_;    // compact index -> link id
  std::vector<double> remaining_;
  std::vector<double> weight_;
  std::vector<uint32_t> version_;
  std::vector<int32_t> csr_offsets_;  // compact link -> flows crossing it
  std::vector<int32_t> csr_flows_;
  std::vector<uint8_t> frozen_;
  std::vector<int32_t> fill_;
  struct HeapEntry {
    double share;
    int32_t link;  // compact index; ties broken by it for determinism
    uint32_t version;
  };
  std::vector<HeapEntry> heap_;
};

// Convenience for tests and small problems: links given as vectors.
std::vector<double> max_min_rates(const std::vector<double>& capacity,
                                  const std::vector<std::vector<int32_t>>& flow_links,
                                  const std::vector<double>& weights = {});

}  // namespace orrery::sim
