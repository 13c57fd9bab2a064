// Max-min fair sharing by progressive filling (the maths is in maxmin.hpp).
#include "orrery/sim/maxmin.hpp"

#include <algorithm>
#include <limits>

namespace orrery::sim {

void MaxMinSolver::solve(std::span<const double> capacity, std::span<const MaxMinFlow> flows,
                         std::vector<double>& rates) {
  const size_t nf = flows.size();
  rates.assign(nf, std::numeric_limits<double>::infinity());
  if (link_slot_.size() < capacity.size()) link_slot_.resize(capacity.size(), -1);

  // Compact the links these flows cross, in order of first appearance.
  touched_.clear();
  for (const MaxMinFlow& f : flows) {
    for (int32_t i = 0; i < f.num_links; ++i) {
      const int32_t l = f.links[i];
      if (link_slot_[l] < 0) {
        link_slot_[l] = static_cast<int32_t>(touched_.size());
        touched_.push_back(l);
      }
    }
  }
  const size_t nl = touched_.size();
  remaining_.assign(nl, 0.0);
  weight_.assign(nl, 0.0);
  version_.assign(nl, 0);
  csr_offsets_.assign(nl + 1, 0);
  for (size_t k = 0; k < nl; ++k) remaining_[k] = capacity[touched_[k]];
  for (const MaxMinFlow& f : flows) {
    for (int32_t i = 0; i < f.num_links; ++i) {
      const int32_t k = link_slot_[f.links[i]];
      weight_[k] += f.weight;
      ++csr_offsets_[k + 1];
    }
  }
  for (size_t k = 0; k < nl; ++k) csr_offsets_[k + 1] += csr_offsets_[k];
  csr_flows_.resize(csr_offsets_[nl]);
  fill_.assign(csr_offsets_.begin(), csr_offsets_.end() - 1);
  for (size_t fi = 0; fi < nf; ++fi) {
    const MaxMinFlow& f = flows[fi];
    for (int32_t i = 0; i < f.num_links; ++i) {
      const int32_t k = link_slot_[f.links[i]];
      csr_flows_[fill_[k]++] = static_cast<int32_t>(fi);
    }
  }
  frozen_.assign(nf, 0);

  // A min-heap of link shares in a reused vector; ties go to the lower compact link index.
  const auto greater = [](const HeapEntry& a, const HeapEntry& b) {
    return a.share != b.share ? a.share > b.share : a.link > b.link;
  };
  auto& heap = heap_;
  heap.clear();
  const auto push = [&](const HeapEntry& e) {
    heap.push_back(e);
    std::push_heap(heap.begin(), heap.end(), greater);
  };
  for (size_t k = 0; k < nl; ++k) {
    if (weight_[k] > 0) push({remaining_[k] / weight_[k], static_cast<int32_t>(k), 0});
  }
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), greater);
    const HeapEntry e = heap.back();
    heap.pop_back();
    if (e.version != version_[e.link] || weight_[e.link] <= 0) continue;
    const double share = std::max(0.0, e.share);
    for (int32_t p = csr_offsets_[e.link]; p < csr_offsets_[e.link + 1]; ++p) {
      const int32_t fi = csr_flows_[p];
      if (frozen_[fi]) continue;
      frozen_[fi] = 1;
      rates[fi] = share;
      const MaxMinFlow& f = flows[fi];
      for (int32_t i = 0; i < f.num_links; ++i) {
        const int32_t k = link_slot_[f.links[i]];
        remaining_[k] = std::max(0.0, remaining_[k] - f.weight * share);
        weight_[k] -= f.weight;
        ++version_[k];
        if (k != e.link && weight_[k] > 1e-12) {
          push({remaining_[k] / weight_[k], k, version_[k]});
        } else if (weight_[k] <= 1e-12) {
          weight_[k] = 0;
        }
      }
    }
  }
  for (int32_t l : touched_) link_slot_[l] = -1;
}

std::vector<double> max_min_rates(const std::vector<double>& capacity,
                                  const std::vector<std::vector<int32_t>>& flow_links,
                                  const std::vector<double>& weights) {
  std::vector<MaxMinFlow> flows(flow_links.size());
  for (size_t i = 0; i < flow_links.size(); ++i) {
    flows[i].links = flow_links[i].data();
    flows[i].num_links = static_cast<int32_t>(flow_links[i].size());
    flows[i].weight = weights.empty() ? 1.0 : weights[i];
  }
  MaxMinSolver solver;
  std::vector<double> rates;
  solver.solve(capacity, flows, rates);
  return rates;
}

}  // namespace orrery::sim
