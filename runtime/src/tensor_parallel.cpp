// Slices of full-model tensors held by a tensor-parallel rank (see tensor_parallel.hpp).
#include "orrery/runtime/tensor_parallel.hpp"

#include <stdexcept>
#include <string>

namespace orrery::runtime {

// The table's slicing rule (ParamTensor::slice, model/parameters.hpp), the same one gpt_create's
// initialisation cuts by: bands of rows (or of a vector's entries), a block of rows, a block of
// columns, or the whole tensor.
std::vector<float> tp_slice_of_full(const Gpt& full, const ParamTensor& local, int tp_rank,
                                    int tp_size) {
  const ParamTensor& f = full.tensor(local.name);
  const float* src = full.params.data() + f.offset;
  std::vector<float> out(local.count);
  const size_t r0 = static_cast<size_t>(tp_rank);
  if (tp_size == 1 || local.slice == model::Slice::None) {
    if (f.count != local.count)
      throw std::logic_error("tp_slice_of_full: size mismatch for " + local.name);
    std::copy(src, src + f.count, out.begin());
    return out;
  }
  switch (local.slice) {
    case model::Slice::Bands: {
      // A matrix's bands are rows of `cols` values; a vector's are single values.
      const size_t unit = local.rows == 1 ? 1 : static_cast<size_t>(local.cols);
      size_t from = 0, to = 0;
      for (size_t k = 0; k < local.bands.size(); ++k) {
        const model::BandCut cut =
            model::band_cut(local.bands, local.band_shards, k, tp_size, tp_rank);
        const size_t first = static_cast<size_t>(cut.first), n = static_cast<size_t>(cut.rows);
        std::copy(src + (from + first) * unit, src + (from + first + n) * unit,
                  out.begin() + static_cast<std::ptrdiff_t>(to * unit));
        from += static_cast<size_t>(local.bands[k]);
        to += n;
      }
      break;
    }
    case model::Slice::Rows: {
      const size_t n = local.count;
      std::copy(src + r0 * n, src + (r0 + 1) * n, out.begin());
      break;
    }
    case model::Slice::Cols: {
      const size_t lc = static_cast<size_t>(local.cols), fc = static_cast<size_t>(f.cols);
      for (size_t r = 0; r < static_cast<size_t>(local.rows); ++r)
        std::copy(src + r * fc + r0 * lc, src + r * fc + (r0 + 1) * lc,
                  out.begin() + static_cast<std::ptrdiff_t>(r * lc));
      break;
    }
    case model::Slice::None:
      break;
  }
  return out;
}

}  // namespace orrery::runtime
