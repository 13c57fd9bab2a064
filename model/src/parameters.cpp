// The parameter tensor table (parameters.hpp).
#include "orrery/model/parameters.hpp"

#include <algorithm>
#include <cmath>

#include "orrery/common/error.hpp"

namespace orrery::model {

ModelShape model_shape(const Scenario& s) {
  return ModelShape{s.model.d_model, s.model.heads,  s.model.vocab,
                    s.model.seq,     s.model.layers, s.parallel.tp};
}

int chunks_per_stage(const Scenario& s) {
  return schedule_of(s.parallel) == Schedule::Interleaved ? std::max(1, s.parallel.virtual_stages)
                                                          : 1;
}

std::vector<int> stage_layer_counts(int layers, int pp, const std::vector<int>& pp_layers) {
  if (pp < 1) throw InputError("pipeline: " + std::to_string(pp) + " stages (expected >= 1)");
  if (pp_layers.empty()) {
    const int base = layers / pp, rem = layers % pp;
    std::vector<int> counts(static_cast<size_t>(pp), base);
    for (int i = 0; i < rem; ++i) ++counts[static_cast<size_t>(i)];
    return counts;
  }
  int64_t sum = 0;
  bool positive = true;
  for (int n : pp_layers) {
    sum += n;
    positive = positive && n >= 1;
  }
  if (static_cast<int>(pp_layers.size()) != pp || !positive || sum != layers) {
    throw InputError("key 'parallel.pp_layers': " + std::to_string(pp_layers.size()) +
                     " entries summing to " + std::to_string(sum) + " for " + std::to_string(pp) +
                     " stages of " + std::to_string(layers) +
                     " layers (expected one entry >= 1 per stage, summing to model.layers)");
  }
  return pp_layers;
}

std::vector<int> stage_layer_counts(const Scenario& s) {
  return stage_layer_counts(s.model.layers, s.parallel.pp, s.parallel.pp_layers);
}

std::pair<int, int> stage_layer_range(int layers, int pp, const std::vector<int>& pp_layers,
                                      int stage) {
  if (stage < 0 || stage >= pp) {
    throw InputError("pipeline: stage " + std::to_string(stage) + " of " + std::to_string(pp) +
                     " does not exist");
  }
  if (pp_layers.empty()) {  // in closed form: the simulator asks once per stage, pp up to 100,000
    const int base = layers / pp, rem = layers % pp;
    const int first = stage * base + std::min(stage, rem);
    return {first, first + base + (stage < rem ? 1 : 0)};
  }
  const std::vector<int> counts = stage_layer_counts(layers, pp, pp_layers);
  int first = 0;
  for (int i = 0; i < stage; ++i) first += counts[static_cast<size_t>(i)];
  return {first, first + counts[static_cast<size_t>(stage)]};
}

StageContents stage_contents(const Scenario& s, int stage) {
  const int pp = s.parallel.pp, chunks = chunks_per_stage(s);
  StageContents c;
  c.embed = stage == 0;
  c.head = stage == pp - 1;
  if (chunks == 1) {
    c.layers.push_back(stage_layer_range(s.model.layers, pp, s.parallel.pp_layers, stage));
    return c;
  }
  const int per_chunk = s.model.layers / (pp * chunks);
  for (int k = 0; k < chunks; ++k) {
    c.layers.emplace_back((k * pp + stage) * per_chunk, (k * pp + stage + 1) * per_chunk);
  }
  return c;
}

std::vector<ParamSpec> parameter_tensors(const ModelShape& m, const StageContents& stage) {
  const int C = m.d_model, Cl = (m.heads / m.tp) * (m.d_model / m.heads), F = 4 * m.d_model / m.tp;
  const float std_w = 0.02f;
  const float std_res = 0.02f / std::sqrt(2.0f * static_cast<float>(m.layers));
  std::vector<ParamSpec> specs;
  if (stage.embed || stage.head) {
    specs.push_back(
        {"wte", kEmbedSegment, m.vocab, C, m.vocab, C, Slice::None, Init::Normal, std_w});
  }
  if (stage.embed) {
    specs.push_back(
        {"wpe", kEmbedSegment, m.max_seq, C, m.max_seq, C, Slice::None, Init::Normal, std_w});
  }
  for (const auto& [first, last] : stage.layers) {
    for (int l = first; l < last; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      specs.push_back({p + "ln1w", l, 1, C, 1, C, Slice::None, Init::One, 0});
      specs.push_back({p + "ln1b", l, 1, C, 1, C, Slice::None, Init::Zero, 0});
      specs.push_back({p + "qkvw", l, 3 * Cl, C, 3 * C, C, Slice::QkvRows, Init::Normal, std_w});
      specs.push_back({p + "qkvb", l, 1, 3 * Cl, 1, 3 * C, Slice::None, Init::Zero, 0});
      specs.push_back({p + "projw", l, C, Cl, C, C, Slice::Cols, Init::Normal, std_res});
      specs.push_back({p + "projb", l, 1, C, 1, C, Slice::None, Init::Zero, 0});
      specs.push_back({p + "ln2w", l, 1, C, 1, C, Slice::None, Init::One, 0});
      specs.push_back({p + "ln2b", l, 1, C, 1, C, Slice::None, Init::Zero, 0});
      specs.push_back({p + "fcw", l, F, C, 4 * C, C, Slice::Rows, Init::Normal, std_w});
      specs.push_back({p + "fcb", l, 1, F, 1, 4 * C, Slice::None, Init::Zero, 0});
      specs.push_back({p + "fcprojw", l, C, F, C, 4 * C, Slice::Cols, Init::Normal, std_res});
      specs.push_back({p + "fcprojb", l, 1, C, 1, C, Slice::None, Init::Zero, 0});
    }
  }
  if (stage.head) {
    specs.push_back({"lnfw", m.layers, 1, C, 1, C, Slice::None, Init::One, 0});
    specs.push_back({"lnfb", m.layers, 1, C, 1, C, Slice::None, Init::Zero, 0});
  }
  return specs;
}

}  // namespace orrery::model
