// libFuzzer harness: the Kineto (torch.profiler Chrome-trace JSON) importer (traces/src/import_kineto.cpp).
// Input: JSON text; a line "//next-rank" splits it into the files of two ranks. Expected: a Trace or an
// orrery::InputError. An imported trace is summarised and its metrics computed, as
// `orrery import` + `orrery report` would.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_import_check.hpp"
#include "fuzz_util.hpp"
#include "orrery/common/error.hpp"
#include "orrery/traces/import.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = orrery::fuzz::as_text(data, size);
  std::vector<std::string_view> texts;
  std::vector<std::string> names;
  constexpr std::string_view kSplit = "\n//next-rank\n";
  const size_t cut = text.find(kSplit);
  if (cut == std::string::npos) {
    texts.emplace_back(text);
  } else {
    texts.emplace_back(std::string_view(text).substr(0, cut));
    texts.emplace_back(std::string_view(text).substr(cut + kSplit.size()));
  }
  for (size_t i = 0; i < texts.size(); ++i) names.push_back("rank" + std::to_string(i) + ".json");
  orrery::traces::Trace t;
  try {
    t = orrery::traces::import_kineto_texts(texts, names);
  } catch (const orrery::InputError&) {
    return 0;
  }
  orrery::fuzz::check_imported(t, orrery::traces::ImportFormat::Kineto, names);
  return 0;
}
