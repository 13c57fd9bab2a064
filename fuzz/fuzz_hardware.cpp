// libFuzzer harness: hardware-profile YAML (sim/src/hardware.cpp). Input: YAML text. Expected: a
// HardwareProfile or an orrery::InputError. Invariant: to_yaml of a parsed profile parses back.
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "orrery/common/error.hpp"
#include "orrery/sim/hardware.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = orrery::fuzz::as_text(data, size);
  orrery::sim::HardwareProfile p;
  try {
    p = orrery::sim::parse_hardware_profile(text, "fuzz.yaml");
  } catch (const orrery::InputError&) {
    return 0;
  }
  for (int op = 0; op <= static_cast<int>(orrery::traces::CollOp::Barrier); ++op) {
    for (bool intra : {false, true}) (void)p.find_override(static_cast<orrery::traces::CollOp>(op), intra, 8);
  }
  const std::string yaml = orrery::sim::to_yaml(p);
  try {
    (void)orrery::sim::parse_hardware_profile(yaml, "roundtrip.yaml");
  } catch (const orrery::InputError& e) {
    orrery::fuzz::fail(std::string("to_yaml output does not parse back: ") + e.what() + "\n" + yaml);
  }
  return 0;
}
