// Reading a trace file's spans without holding them all: stream by stream, in windows of start
// time, each window's spans in (rank, stream, start) order, so that concatenating the chunks gives
// the order TraceReader::load_all() sorts into. Memory is bounded by a window (about `chunk` spans
// and a block), not by the file. Used by merge_traces (and so export --format sqlite) and the
// Chrome export; its counter samples a rank at a time, likewise.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "orrery/traces/store.hpp"

namespace orrery::traces {

// Calls `fn` with each chunk (non-empty, spans in order; `fn` may modify or move them). Throws
// InputError naming the file when a stream yields fewer or more spans than its blocks record.
void for_each_span_chunk(const TraceReader& reader,
                         const std::function<void(std::vector<Span>&)>& fn,
                         int64_t chunk = int64_t{1} << 16);

// The ranks with counter samples, ascending (those of counters()).
std::vector<int32_t> counter_ranks(const TraceReader& reader);
// Calls `fn` with each rank's counter samples (ranks ascending, each rank's in counters()'s
// order: together counters()), read a rank at a time on a connection of its own.
void for_each_counter_rank(const TraceReader& reader,
                           const std::function<void(std::vector<CounterSample>&)>& fn);

}  // namespace orrery::traces
