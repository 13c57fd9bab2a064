// RunLayout and RunFailure as JSON (meta_json.hpp).
#include "orrery/traces/meta_json.hpp"

namespace orrery::traces {

void to_json(nlohmann::json& j, const RunLayout& l) {
  j = {{"zero", l.zero},           {"micro_batches", l.micro_batches}, {"schedule", l.schedule},
       {"placement", l.placement}, {"recompute", l.recompute},         {"device", l.device},
       {"precision", l.precision}};
}

void from_json(const nlohmann::json& j, RunLayout& l) {
  j.at("zero").get_to(l.zero);
  j.at("micro_batches").get_to(l.micro_batches);
  j.at("schedule").get_to(l.schedule);
  j.at("placement").get_to(l.placement);
  j.at("recompute").get_to(l.recompute);
  j.at("device").get_to(l.device);
  j.at("precision").get_to(l.precision);
}

void to_json(nlohmann::json& j, const RunFailure& f) {
  j = {
      {"failed", f.failed}, {"lost_ranks", f.lost_ranks}, {"step", f.step}, {"message", f.message}};
}

void from_json(const nlohmann::json& j, RunFailure& f) {
  j.at("failed").get_to(f.failed);
  j.at("lost_ranks").get_to(f.lost_ranks);
  j.at("step").get_to(f.step);
  j.at("message").get_to(f.message);
}

}  // namespace orrery::traces
