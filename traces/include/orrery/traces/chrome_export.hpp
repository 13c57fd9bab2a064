// Chrome trace JSON (the Trace Event Format), which Perfetto UI and chrome://tracing open:
// pid = rank, tid = stream, complete ("X") events with ts/dur in microseconds, args with bytes,
// flops, communicator, step; process and thread names as metadata ("M") events; counters as "C".
#pragma once

#include <ostream>
#include <string>

#include "orrery/traces/store.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::traces {

void export_chrome_json(const Trace& t, std::ostream& out);
void export_chrome_json_file(const Trace& t, const std::string& path);
// The same from a trace file, streamed (stream_chunks.hpp): the same bytes as exporting its
// load_all(), with memory bounded by a window of spans and the file's counters.
void export_chrome_json(const TraceReader& r, std::ostream& out);
void export_chrome_json_file(const TraceReader& r, const std::string& path);

}  // namespace orrery::traces
