// libFuzzer harness: the Chakra execution-trace importer (traces/src/chakra/chakra.cpp). Input: the
// bytes of one rank's .et file, written to a scratch file named <prefix>.0.et and imported as
// `orrery import chakra` would. Expected: a Trace or an orrery::InputError (a truncated or damaged
// file, a bad length prefix, a dependency on a missing node, a file of an export whose other rank
// files are absent). The imported trace is checked for consistency and its metrics computed, as
// `orrery report` would.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_import_check.hpp"
#include "fuzz_util.hpp"
#include "orrery/common/error.hpp"
#include "orrery/traces/chakra.hpp"
#include "orrery/traces/import.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static orrery::fuzz::ScratchFile file("orrery-fuzz-chakra", ".0.et");
  const std::vector<std::string> files{file.write(data, size)};
  orrery::traces::Trace t;
  try {
    t = orrery::traces::import_chakra(files);
  } catch (const orrery::InputError&) {
    file.remove();
    return 0;
  }
  file.remove();
  orrery::fuzz::check_imported(t, orrery::traces::ImportFormat::Chakra, files);
  return 0;
}
