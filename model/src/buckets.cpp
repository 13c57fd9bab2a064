// The DDP bucket rule (buckets.hpp).
#include "orrery/model/buckets.hpp"

#include <algorithm>

namespace orrery::model {

std::vector<BucketPlan> ddp_buckets(std::span<const BucketSegment> ready_order, double cap_bytes,
                                    int bytes_per_element) {
  std::vector<BucketPlan> buckets;
  for (std::size_t i = 0; i < ready_order.size(); ++i) {
    const BucketSegment& sg = ready_order[i];
    if (sg.elements <= 0) continue;
    const bool open_new =
        buckets.empty() ||
        static_cast<double>(buckets.back().elements + sg.elements) * bytes_per_element > cap_bytes;
    if (open_new) buckets.push_back(BucketPlan{i, i, 0, sg.segment});
    BucketPlan& b = buckets.back();
    b.end = i + 1;
    b.elements += sg.elements;
    b.lowest_segment = std::min(b.lowest_segment, sg.segment);
  }
  return buckets;
}

std::vector<ZeroBucketPlan> zero_buckets(std::span<const BucketSegment> ready_order,
                                         double cap_bytes, int bytes_per_element, int ranks) {
  const int64_t N = ranks < 1 ? 1 : ranks;
  int64_t total = 0;
  for (const auto& sg : ready_order) total += sg.elements > 0 ? sg.elements : 0;
  const auto round_up = [N](int64_t x) { return (x + N - 1) / N * N; };
  std::vector<ZeroBucketPlan> out;
  int64_t top = round_up(total);  // the current bucket's end (exclusive), after the move
  int64_t nominal_top = total;    // its end before the move
  std::size_t carry_begin = 0;    // segments of emptied buckets, joining the next one
  bool carrying = false;
  int carry_lowest = 0;
  const auto plans = ddp_buckets(ready_order, cap_bytes, bytes_per_element);
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const BucketPlan& p = plans[i];
    const int64_t nominal_bottom = nominal_top - p.elements;
    // The last bucket (in ready order) starts at element 0, a multiple of N already.
    const int64_t bottom = i + 1 == plans.size() ? 0 : round_up(nominal_bottom);
    nominal_top = nominal_bottom;
    const std::size_t begin = carrying ? carry_begin : p.begin;
    const int lowest = carrying ? std::min(carry_lowest, p.lowest_segment) : p.lowest_segment;
    if (bottom >= top) {  // emptied: its segments ride with the next bucket
      carrying = true;
      carry_begin = begin;
      carry_lowest = lowest;
      continue;
    }
    carrying = false;
    ZeroBucketPlan z;
    z.begin = begin;
    z.end = p.end;
    z.lowest_segment = lowest;
    z.offset = bottom;
    z.elements = top - bottom;
    z.shard = z.elements / N;
    z.shard_offset = out.empty() ? 0 : out.back().shard_offset + out.back().shard;
    out.push_back(z);
    top = bottom;
  }
  return out;
}

std::vector<int> zero_buckets_overlapping(std::span<const ZeroBucketPlan> buckets, int64_t begin,
                                          int64_t count) {
  std::vector<int> out;
  if (count <= 0) return out;
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    const ZeroBucketPlan& b = buckets[i];
    if (b.offset < begin + count && begin < b.offset + b.elements) out.push_back(int(i));
  }
  return out;
}

}  // namespace orrery::model
