// Chakra execution traces (MLCommons' format, the workload input of ASTRA-sim): export of an
// Orrery trace, real or simulated, as one file per rank, and import of such files back into a
// trace that `orrery replay` and `orrery report` take. The schema is traces/proto/chakra_et.proto;
// the mapping, span by span, is in traces/README.md ("Chakra execution traces").
//
// Files: <prefix>.<rank>.et, a sequence of protobuf messages each preceded by its byte length as a
// varint: one GlobalMetadata, then one Node per span of that rank; beside them
// <prefix>.comm_groups.json, ASTRA-sim's communicator-group file ({"<pg_name>": [ranks]}).
//
// Dependencies (data_deps): the graph `orrery replay` rebuilds from a trace (sim/replay.hpp):
// each work span depends on its predecessor on its (rank, stream) and, when it waited for one, on
// the latest span of another stream of its rank that ended before it started. Phase spans are
// METADATA_NODEs without dependencies, so ASTRA-sim skips them.
//
// A round trip (export, import) gives back every span with every attribute, the streams,
// communicators, ranks, metadata and counters exactly: Orrery writes, beside the fields ASTRA-sim
// reads (durations in microseconds, comm_type, comm_size, comm_src/dst/tag, pg_name, num_ops), its
// own attributes (orrery.*) with the nanosecond times and the rest. Files written by other tools
// (without orrery.* attributes) import with what Chakra says: microsecond times, one compute and
// one communication stream per rank, a communicator per pg_name.
//
// Built without protobuf, export_chakra and import_chakra throw InputError saying so (exit 2).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "orrery/traces/trace.hpp"

namespace orrery::traces {

class TraceReader;  // store.hpp

// Whether this build reads and writes Chakra files (it was built with protobuf).
bool chakra_available();

// The dependencies of one span (indices into Trace::spans, -1 for none).
struct SpanDependencies {
  int64_t pred = -1;   // the span before it on its (rank, stream), in replay's stream order
  int64_t cross = -1;  // the span of another stream of its rank it waited for
};
// Per span of `t` (in t.spans order): the edges of sim/replay.hpp's graph. Phase spans have none,
// and no span depends on a Phase span. Does not need protobuf.
std::vector<SpanDependencies> span_dependencies(const Trace& t);
// The same over spans alone (indices into `spans`). The edges never leave a rank, so one rank's
// spans, in the trace's order, give that rank's edges.
std::vector<SpanDependencies> span_dependencies(std::span<const Span> spans);

struct ChakraExportSummary {
  std::vector<std::string> files;  // the .et files, by rank, then the comm-groups file
  int32_t ranks = 0;
  std::map<int32_t, int64_t> nodes_by_rank;  // rank -> nodes in its file
  int64_t nodes = 0;
  int64_t data_deps = 0;    // dependency edges written
  int64_t comm_nodes = 0;   // COMM_COLL, COMM_SEND and COMM_RECV nodes
  int64_t phase_nodes = 0;  // METADATA_NODEs (Phase spans)
};

// Writes <prefix>.<rank>.et for every rank that has spans (a simulated trace of one
// representative rank per stage has those ranks only) and <prefix>.comm_groups.json. Every file is
// written beside its target and renamed when all are whole. Throws InputError for an empty trace
// or an unwritable place.
ChakraExportSummary export_chakra(const Trace& t, const std::string& prefix);
// The same files from the trace file `reader` reads, streamed (`orrery export --format chakra`):
// one rank's spans and counters in memory at a time (with the header: meta, ranks, streams,
// communicators, strings), so memory is bounded by one rank's output, not the trace. The files
// are byte for byte those of export_chakra(reader.load_all(), prefix).
ChakraExportSummary export_chakra_file(const TraceReader& reader, const std::string& prefix);

// The .et files an import reads: each input is a file, or a prefix P naming P.0.et, P.1.et, ...
// (every P.<rank>.et in its folder). InputError when a prefix matches no file.
std::vector<std::string> chakra_input_files(const std::vector<std::string>& inputs);

// Reads the files into one trace (meta.source = Import; extra_json {"import": {"format":
// "chakra", "files", "source"}} plus the exported trace's own extras). Every problem is an
// InputError naming the file and the message: a length prefix that is not a varint or runs past
// the end, a message protobuf cannot parse, a node whose dependency names no node of its file, a
// duplicate id or rank, an attribute of the wrong type, microsecond fields that disagree with
// Orrery's nanosecond ones, a rank file the others name that is missing.
Trace import_chakra(const std::vector<std::string>& inputs);

// One file as Chakra has it, for tests and tools: the nodes in file order.
struct ChakraNodeInfo {
  uint64_t id = 0;
  std::string name;
  std::string exact_name;  // orrery.name when the span's name was not UTF-8, else name
  int32_t type = 0;        // ChakraProtoMsg::NodeType
  std::vector<uint64_t> data_deps;
  std::vector<uint64_t> ctrl_deps;
  uint64_t start_time_micros = 0;
  uint64_t duration_micros = 0;
  int64_t comm_type = -1;  // attributes, -1 / empty when absent
  int64_t comm_size = -1;
  int32_t comm_src = -1;
  int32_t comm_dst = -1;
  int32_t comm_tag = -1;
  std::string pg_name;
  int64_t num_ops = -1;
  bool is_cpu_op = true;     // Chakra's default when the attribute is absent
  int64_t duration_ns = -1;  // orrery.duration_ns
};
struct ChakraFileInfo {
  std::string path;
  std::string version;  // GlobalMetadata.version
  int32_t rank = -1;    // from the file name
  std::vector<ChakraNodeInfo> nodes;
};
ChakraFileInfo read_chakra_file(const std::string& path);

// Chakra's node types and collectives (the values of chakra_et.proto).
enum class ChakraNodeType : int32_t {
  Invalid = 0,
  Metadata = 1,
  MemLoad = 2,
  MemStore = 3,
  Comp = 4,
  CommSend = 5,
  CommRecv = 6,
  CommColl = 7,
};

}  // namespace orrery::traces
