// The per-op activation table (activations.hpp).
#include "orrery/model/activations.hpp"

#include <algorithm>

namespace orrery::model {

std::vector<ActivationTerm> block_activation_terms(const BlockArch& arch, int heads, int d_model,
                                                   int seq, int tp) {
  const double a = heads, h = d_model, s = seq;
  const double r = double(std::max(arch.kv_heads, tp)) / a;
  const double f = double(arch.ffn_hidden) / h;
  const double u = arch.swiglu() ? 2.0 : 1.0, d = arch.swiglu() ? 0.0 : 1.0;
  const double as_h = a * s / h;
  return {
      {"ln1", 2.0, false, false},
      {"qkv", 2.0, false, false},
      {"attention", 2.0 + 4.0 * r, false, true},
      {"softmax", 2.0 * as_h, true, true},
      {"attn_dropout", 3.0 * d * as_h, true, true},
      {"proj", 2.0, false, true},
      {"proj_dropout", d, false, false},
      {"ln2", 2.0, false, false},
      {"fc1", 2.0, false, false},
      {"act", 2.0 * u * f, false, true},
      {"fc2", 2.0 * f, false, true},
      {"mlp_dropout", d, false, false},
  };
}

BlockActivations block_activations(const std::vector<ActivationTerm>& terms, int tp,
                                   bool sequence_parallel) {
  const double t = std::max(1, tp);
  BlockActivations b;
  for (const ActivationTerm& x : terms) {
    const double v = x.tp_split || sequence_parallel ? x.sbh / t : x.sbh;
    (x.core ? b.core : b.rest) += v;
  }
  return b;
}

}  // namespace orrery::model
