// Slices of full-model tensors held by a tensor-parallel rank (see tensor_parallel.hpp).
#include "orrery/runtime/tensor_parallel.hpp"

#include <stdexcept>
#include <string>

namespace orrery::runtime {
namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

std::vector<float> tp_slice_of_full(const Gpt& full, const ParamTensor& local, int tp_rank, int tp_size) {
  const ParamTensor& f = full.tensor(local.name);
  const float* src = full.params.data() + f.offset;
  std::vector<float> out(local.count);
  const size_t C = static_cast<size_t>(full.config.n_embd);
  const size_t Cl = C / static_cast<size_t>(tp_size);
  const size_t F = 4 * C / static_cast<size_t>(tp_size);
  const size_t r0 = static_cast<size_t>(tp_rank);
  if (tp_size == 1 || f.count == local.count) {
    if (f.count != local.count) throw std::logic_error("tp_slice_of_full: size mismatch for " + local.name);
    std::copy(src, src + f.count, out.begin());
  } else if (ends_with(local.name, "qkvw") || ends_with(local.name, "qkvb")) {
    const size_t cols = ends_with(local.name, "qkvw") ? C : 1;
    for (size_t part = 0; part < 3; ++part)
      for (size_t r = 0; r < Cl; ++r)
        std::copy(src + (part * C + r0 * Cl + r) * cols, src + (part * C + r0 * Cl + r + 1) * cols,
                  out.begin() + static_cast<std::ptrdiff_t>((part * Cl + r) * cols));
  } else if (ends_with(local.name, "fcw") || ends_with(local.name, "fcb")) {
    const size_t cols = ends_with(local.name, "fcw") ? C : 1;
    std::copy(src + r0 * F * cols, src + (r0 + 1) * F * cols, out.begin());
  } else if (ends_with(local.name, "projw")) {  // projw (C, Cl of C) and fcprojw (C, F of 4C)
    const size_t lc = static_cast<size_t>(local.cols), fc = static_cast<size_t>(f.cols);
    for (size_t r = 0; r < C; ++r)
      std::copy(src + r * fc + r0 * lc, src + r * fc + (r0 + 1) * lc, out.begin() + static_cast<std::ptrdiff_t>(r * lc));
  } else {
    throw std::logic_error("tp_slice_of_full: no slicing rule for " + local.name);
  }
  return out;
}

}  // namespace orrery::runtime
