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

}  // namespace orrery::model
