// libFuzzer harness: scenario YAML (common/src/scenario.cpp). Input: YAML text; lines "#set k=v" are
// also applied as --set overrides. Expected: a Scenario or an orrery::InputError. Invariant: a
// scenario that parses serialises (to_yaml) to text that parses back to the same scenario.
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "orrery/common/error.hpp"
#include "orrery/common/scenario.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = orrery::fuzz::as_text(data, size);
  const auto overrides = orrery::fuzz::set_directives(text);
  orrery::Scenario s;
  try {
    s = orrery::parse_scenario(text, "fuzz.yaml", overrides);
  } catch (const orrery::InputError&) {
    return 0;
  }
  orrery::validate_layout(s);  // parse_scenario checked it: must not throw now
  const std::string yaml = orrery::to_yaml(s);
  orrery::Scenario back;
  try {
    back = orrery::parse_scenario(yaml, "roundtrip.yaml");
  } catch (const orrery::InputError& e) {
    orrery::fuzz::fail(std::string("to_yaml output does not parse back: ") + e.what() + "\n" + yaml);
  }
  if (orrery::to_yaml(back) != yaml) orrery::fuzz::fail("to_yaml round trip changed the scenario:\n" + yaml);
  return 0;
}
