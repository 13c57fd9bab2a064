// The typed run metadata (span.hpp: RunLayout, RunFailure) as JSON objects, written one way by
// every command that prints them (`orrery report --json`, `orrery info --json`) and by the Chakra
// export's metadata file, and read back by its import. nlohmann's to_json/from_json, so
// `j["layout"] = meta.layout` and `j.get<RunLayout>()` work.
//   layout:  {"zero", "micro_batches", "schedule", "placement", "recompute", "device", "precision"}
//   failure: {"failed", "lost_ranks", "step", "message"}
// from_json throws nlohmann's out_of_range for a missing key and type_error for a wrong type; the
// caller names the file.
#pragma once

#include <nlohmann/json.hpp>

#include "orrery/traces/span.hpp"

namespace orrery::traces {

void to_json(nlohmann::json& j, const RunLayout& l);
void from_json(const nlohmann::json& j, RunLayout& l);
void to_json(nlohmann::json& j, const RunFailure& f);
void from_json(const nlohmann::json& j, RunFailure& f);

}  // namespace orrery::traces
