// Importers of other profilers' traces into Orrery's trace model: PyTorch Kineto (the Chrome-trace
// JSON of torch.profiler) and NVIDIA Nsight Systems (the SQLite file of `nsys export --type sqlite`).
// `orrery import kineto|nsys FILE... --out TRACE` calls import_to_file(); the functions below are
// pure (files in, Trace out), so tests and fuzzers can call them directly. Every problem with an
// input (not JSON, not SQLite, a required key, table or column missing, a value of the wrong type)
// is an InputError naming the file and what was expected; nothing asserts or crashes on malformed
// input.
//
// Common rules (both formats)
// - Several FILEs are several ranks of one job in one trace, in one time base: every timestamp is
//   converted to int64 ns and rebased so that the earliest imported event of all files is 0
//   (meta.start_time_unix_ns keeps the original earliest time when it is a Unix time). Files
//   without a common clock (PyTorch's legacy exporter counts from each process's profiler start;
//   nsys files without TARGET_INFO_SESSION_START_TIME count from each session's start) keep their
//   own origins, so the ranks' timelines are not aligned with each other.
// - Per rank, device streams come first (stream 0, 1, ... by device then stream number), then the
//   host threads. Device work is Compute, Collective, P2P or Memcpy; host work never is (it is
//   Other or Phase), so `orrery report` does not count a CPU launch and its GPU kernel twice. A
//   rank without any device work (a CPU-only run) is the exception: see Kineto below.
// - Kernels whose name starts with ncclKernel_ or ncclDevKernel_ are Collective, or P2P for
//   SendRecv/Send/Recv kernels; the op comes from the kernel name (AllReduce, ReduceScatter,
//   AllGather, Broadcast, Reduce, AllToAll; SendRecv counts as send) unless the event's arguments
//   say better (op None for a name that does not tell, such as ncclDevKernel_Generic).
// - Steps: a host range named "ProfilerStep#N" (Kineto's, and PyTorch's under nsys with NVTX), or
//   "step N" / "step#N" / "step_N" / "step" (Orrery's own NVTX phases) becomes a Phase span named
//   "step" with step = N (for a bare "step": its ordinal on the rank). Every other span of that
//   rank is tagged with the step whose range contains the moment it was issued: its launch on the
//   host (through the correlation id) for device work, its start for host work. The writer's steps
//   table is built from those tags. The step spans themselves are host ranges: a step's last
//   kernels may still run on the device after its host range ended.
// - Collectives are numbered per (communicator, rank) in start order: seq = 0, 1, ...; the same
//   seq on different ranks of a communicator is the same operation (NCCL issues them in order).
// - meta.source = Import; meta.extra_json = {"import": {"format", "files": [...]}}.
//
// Kineto (Chrome trace JSON, torch.profiler export_chrome_trace / tensorboard_trace_handler)
// - The top level is {"traceEvents": [...], ...}; a file without "traceEvents" is an InputError.
//   ts and dur are microseconds, possibly fractional: they are read from the JSON text as decimals
//   and converted to ns exactly (ts 12.3456 -> 12346 ns: rounded half away from zero).
// - rank = distributedInfo.rank when the file has it, else the file's position on the command line;
//   two files claiming the same rank are an InputError. meta.world_size = distributedInfo.world_size
//   (else the number of files).
// - "X" events by cat:
//     kernel                      device stream  Compute (NCCL: Collective / P2P)
//     gpu_memcpy, gpu_memset      device stream  Memcpy (bytes from args "bytes" when given)
//     gpu_user_annotation         device stream  Phase
//     cpu_op, python_function     host thread    Other
//     user_annotation             host thread    Phase ("ProfilerStep#N": the step span)
//     cuda_runtime, cuda_driver   host thread    Other
//     anything else               skipped (counted in ImportSummary::skipped_events)
//   Device streams are (pid = device, tid = CUDA stream); their names are the "thread_name"
//   metadata of the file ("stream 7"), else "stream <tid>" (with "device <pid> " in front when the
//   file has several devices). Host threads are named "thread <tid>" or their thread_name.
// - record_param_comms cpu_ops carry the collective's arguments: "Collective name", "In msg nelems",
//   "Out msg nelems", "dtype", "Process Group Name", "Group size", "Process Group Ranks". An NCCL
//   kernel takes them from its own args when present, else from the record_param_comms with the
//   same "External id". bytes = max(in, out) nelems × the dtype's size: nccl-tests' size (the
//   all-gather output, the reduce-scatter input, the all-reduce buffer).
// - Communicators: one per distinct "Process Group Name" across files (id in order of first
//   appearance), members from "Process Group Ranks" when given, else every rank that used it; kind
//   World when it spans all world_size ranks, else Other. Collectives without a group name go to a
//   communicator "world" of all ranks.
// - CPU-only ranks (no kernel, memcpy or memset event in the file): the host work is the work, so a
//   cpu_op inside which no other cpu_op of its thread starts (a leaf: what ran, not what called
//   it) is Compute; other cpu_ops stay Other. Leaves never overlap, so their summed time is also
//   their merged time. The collectives are the communication backend's own ops when the file has
//   them ("gloo:all_reduce" on gloo's threads: they carry the transfer time; the k-th of an op
//   takes the arguments of the k-th record_param_comms of that op), else the record_param_comms
//   ops; Collective, or P2P for send/recv. c10d:: calls are Other.
// - Files without categories (PyTorch's legacy, non-Kineto exporter: a top-level array of events)
//   are read as all cpu_op on a CPU-only rank.
// - "[memory]" instant events become counters "mem.cpu" / "mem.cuda" (args "Device Type" 0 / 1)
//   with value args "Total Allocated" in bytes.
// - Kernel work (kernel_work.hpp): a compute kernel whose launching cpu_op (its "External id", or
//   its launch's) recorded "Input Dims" (record_shapes=True) and is a GEMM, fused attention or
//   memory-bound op of kernel_work.hpp's rules carries its share of the op's flops and bytes, and
//   a row in extra_json "kernel_work"; "deviceProperties" names go to extra_json
//   "import"."devices".
//
// Nsight Systems (SQLite export)
// - Required: table StringIds(id, value) and CUPTI_ACTIVITY_KIND_KERNEL(start, end, deviceId,
//   streamId, globalPid, and shortName or demangledName). Optional, used when present:
//   CUPTI_ACTIVITY_KIND_MEMCPY / _MEMSET (start, end, deviceId, streamId, globalPid, bytes),
//   NVTX_EVENTS (start, end, eventType, text or textId, globalTid), CUPTI_ACTIVITY_KIND_RUNTIME
//   (start, correlationId, globalTid: for the step of device work), ThreadNames (nameId,
//   globalTid), TARGET_INFO_SESSION_START_TIME (utcEpochNs: aligns several files). A required
//   table or column that is missing is an InputError naming both; rows without a start or end, or
//   ending before they start, are skipped and counted.
// - Times are ns already. Ranks: each process (globalPid; a globalTid's process is
//   globalTid with its low 24 bits cleared) with kernels is a rank, ordered by file, then by its
//   lowest deviceId, then by pid; RankInfo.device = "cuda:<that deviceId>". Device streams are
//   named "stream <streamId>".
// - An nsys export has no byte counts or process groups for NCCL kernels: their bytes are 0 and
//   they all go to the communicator "world".
// - NVTX push/pop and start/end ranges (eventType 59, 60) with an end are Phase spans on the host
//   thread's stream (named from ThreadNames, else "thread <tid>"); marks and other event types are
//   not imported.
// - Kernel work (kernel_work.hpp): PyTorch's emit_nvtx(record_shapes=True) ranges ("aten::mm,
//   seq = 3, sizes = [[64, 128], [128, 32]]") give the GEMM and attention work of the kernels
//   launched inside them (the innermost such range open on the launching thread at the launch);
//   TARGET_INFO_GPU's names go to extra_json "import"."devices".
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "orrery/traces/span.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::traces {

class TraceWriter;

enum class ImportFormat { Kineto, Nsys, Chakra };  // Chakra: traces/chakra.hpp
std::string_view to_string(ImportFormat f);
// "kineto" / "nsys" / "chakra"; InputError otherwise.
ImportFormat import_format_from_string(std::string_view s);

// What an import produced, for the CLI's summary and the tests.
struct ImportSummary {
  ImportFormat format = ImportFormat::Kineto;
  std::vector<std::string> files;
  int32_t ranks = 0;
  int64_t spans = 0;
  std::array<int64_t, kSpanKindCount> spans_by_kind{};  // indexed by SpanKind
  int64_t counters = 0;
  std::vector<int32_t> steps;  // distinct step ids found (sorted)
  int64_t collectives = 0;     // Collective + P2P spans
  int32_t communicators = 0;
  int64_t skipped_events = 0;  // events of a kind the importer does not map
};

// Reads Kineto JSON files (one per rank) into one trace. Throws InputError for malformed input.
Trace import_kineto(const std::vector<std::string>& files);
// The same from JSON texts already in memory; names[i] stands for the file in messages (fuzzing).
Trace import_kineto_texts(const std::vector<std::string_view>& texts,
                          const std::vector<std::string>& names);
// Reads nsys SQLite exports (one or more processes each) into one trace. Throws InputError.
Trace import_nsys(const std::vector<std::string>& files);

// Counts of an imported trace.
ImportSummary summarize_import(const Trace& t, ImportFormat format,
                               const std::vector<std::string>& files);

// Appends an (imported) in-memory trace to an open writer: meta, ranks, streams, communicators,
// strings, spans, counters. The caller close()s the writer.
void write_to(const Trace& t, TraceWriter& out);
// Import + write: the files are read, the trace is written next to `out_path` and renamed into
// place, so a failed import leaves no file that looks whole.
ImportSummary import_to_file(ImportFormat format, const std::vector<std::string>& files,
                             const std::string& out_path);

}  // namespace orrery::traces
