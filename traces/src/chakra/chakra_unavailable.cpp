// Chakra execution traces in a build without protobuf (traces/chakra.hpp): every entry point says
// so, as bad input (exit 2), since the user asked for what this build cannot do.
#include "orrery/common/error.hpp"
#include "orrery/traces/chakra.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::traces {

namespace {

[[noreturn]] void unavailable() {
  throw InputError(
      "Chakra execution traces: this Orrery was built without protobuf (install protobuf-compiler "
      "and libprotobuf-dev, e.g. with scripts/setup, and configure again)");
}

}  // namespace

bool chakra_available() { return false; }
ChakraExportSummary export_chakra(const Trace&, const std::string&) { unavailable(); }
ChakraExportSummary export_chakra_file(const TraceReader&, const std::string&) { unavailable(); }
std::vector<std::string> chakra_input_files(const std::vector<std::string>&) { unavailable(); }
Trace import_chakra(const std::vector<std::string>&) { unavailable(); }
ChakraFileInfo read_chakra_file(const std::string&) { unavailable(); }

}  // namespace orrery::traces
