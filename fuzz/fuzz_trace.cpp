// libFuzzer harness: the SQLite trace reader (traces/src/store.cpp, span_block.cpp) and the metrics
// over what it reads (profiler/src/analysis/metrics.cpp). Input: the bytes of a trace file, written
// to a scratch file and opened as `orrery report` would. Expected: the reader's answers, or an
// orrery::InputError (the reader's documented error for a damaged or foreign file). Anything else,
// InternalError included, is a finding: a file on disk is the user's input.
//
// Schema 3 blocks carry a CRC32C, so nearly every mutation of a block's bytes stops at the checksum
// ("checksum mismatch"). Such an input is then read a second time with its checksums recomputed
// (reseal_block_checksums), so that the decoders and everything after them still see the mutated
// bytes: the first read fuzzes the checks, the second what is below them.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.hpp"
#include "orrery/common/error.hpp"
#include "orrery/profiler/metrics.hpp"
#include "orrery/traces/store.hpp"

namespace {

void read_everything(const std::string& path) {
  orrery::traces::TraceReader r(path);
  (void)r.complete();
  (void)r.meta();
  (void)r.ranks();
  (void)r.streams();
  (void)r.strings();
  (void)r.span_count();
  (void)r.counter_count();
  (void)r.time_range();
  (void)r.step_aggregates();
  (void)r.counters();
  const auto comms = r.communicators();
  if (!comms.empty()) (void)r.collectives_of(comms.front().id);
  for (const auto& b : r.stream_bounds()) {
    (void)r.spans_in_window(b.rank, b.stream, b.start_ns, b.end_ns);
    break;  // one window query is enough per input
  }
  const orrery::traces::Trace t = r.load_all(1);
  orrery::profiler::MetricsOptions opt;
  opt.threads = 1;
  opt.skip_steps = 1;
  (void)orrery::profiler::compute_metrics(t, opt);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static orrery::fuzz::ScratchFile file("orrery-fuzz-trace", ".db");
  const std::string& path = file.write(data, size);
  bool checksum_stop = false;
  try {
    read_everything(path);
  } catch (const orrery::InputError& e) {
    checksum_stop = std::string_view(e.what()).find("checksum mismatch") != std::string_view::npos;
  }
  if (checksum_stop) {
    try {
      orrery::traces::reseal_block_checksums(path);
      read_everything(path);
    } catch (const orrery::InputError&) {
    }
  }
  file.remove();
  return 0;
}
