// Sweep results for the scaling charts: the CSV that `orrery sweep --csv` writes.
//
// Accepted format: a header line naming the columns, comma-separated, in any order. Required:
// `gpus` (integer) and `tokens_per_s`. Optional: `efficiency` (a fraction, 1.0 = linear scaling;
// when absent it is computed against the smallest GPU count: (tps/gpus) / (tps0/gpus0)). Other
// columns are ignored (the note column may be quoted; it is the last one). A row whose tokens_per_s
// is empty (a GPU count the sweep could not place) is no point; it is reported in `unplaced`, with
// its note, unless another row places that GPU count. When several rows share a GPU count
// (a layout search), the fastest is kept. This is the header `orrery sweep --csv` writes:
//   gpus,dp,tp,pp,zero,micro_batch,step_time_s,tokens_per_s,tflops_per_gpu,mfu,efficiency,
//   peak_memory_bytes,fits,note
#pragma once

#include <string>
#include <vector>

namespace orrery::gui {

struct SweepPoint {
  int gpus = 0;
  double tokens_per_s = 0;
  double efficiency = 0;
};

// A GPU count the sweep could not place, and why (its note, empty when the CSV has none).
struct SweepUnplaced {
  int gpus = 0;
  std::string note;
};

// Parses CSV text; `source` names the file in error messages. Throws InputError. The GPU counts
// not placed go to *unplaced when given, in GPU order.
std::vector<SweepPoint> parse_sweep_csv(const std::string& text, const std::string& source,
                                        std::vector<SweepUnplaced>* unplaced = nullptr);
std::vector<SweepPoint> load_sweep_csv(const std::string& path,
                                       std::vector<SweepUnplaced>* unplaced = nullptr);

}  // namespace orrery::gui
