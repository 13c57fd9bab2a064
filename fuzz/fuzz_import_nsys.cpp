// libFuzzer harness: the Nsight Systems importer (traces/src/import_nsys.cpp). Input: the bytes of an
// `nsys export --type sqlite` file, written to a scratch file and imported as `orrery import nsys`
// would. Expected: a Trace or an orrery::InputError (a damaged, foreign or incomplete file). The
// imported trace is checked for consistency and its metrics computed, as `orrery report` would.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_import_check.hpp"
#include "fuzz_util.hpp"
#include "orrery/common/error.hpp"
#include "orrery/traces/import.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static orrery::fuzz::ScratchFile file("orrery-fuzz-nsys", ".sqlite");
  const std::vector<std::string> files{file.write(data, size)};
  orrery::traces::Trace t;
  try {
    t = orrery::traces::import_nsys(files);
  } catch (const orrery::InputError&) {
    file.remove();
    return 0;
  }
  file.remove();
  orrery::fuzz::check_imported(t, orrery::traces::ImportFormat::Nsys, files);
  return 0;
}
