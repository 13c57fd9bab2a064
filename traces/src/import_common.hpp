// What the Kineto and nsys importers share (private to traces/): the draft a format reader fills
// (spans in absolute ns with the host time they were issued at, communicators by key) and
// finish_import(), which applies the common rules of import.hpp: steps, communicators, sequence
// numbers, rebasing, metadata. Also the name parsers both formats need.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "orrery/traces/import.hpp"
#include "orrery/traces/kernel_work.hpp"
#include "orrery/traces/trace.hpp"

namespace orrery::traces::detail {

struct DraftSpan {
  Span span;              // rank, stream, kind, name, times (absolute ns), bytes, op
  int64_t issue_ns = 0;   // host time it was issued at: the step it belongs to
  int32_t comm_key = -1;  // index into Draft::comms, -1: the default "world" communicator
  int32_t work = -1;      // index into Draft::works: the kernel's share of its op's work
};

struct DraftComm {
  std::string key;             // process group name / id, unique in the job
  std::string name;            // shown name
  std::vector<int32_t> ranks;  // members when the input says, else filled from users
  int32_t size = 0;            // group size when the input says
};

struct Draft {
  ImportFormat format = ImportFormat::Kineto;
  std::vector<std::string> files;
  Trace trace;  // meta, ranks, streams, strings, counters (absolute ns) filled by the reader
  std::vector<DraftSpan> spans;
  std::vector<DraftComm> comms;
  std::map<std::string, int32_t> comm_index;
  int32_t world_size = 0;                 // 0: the number of ranks
  std::optional<int64_t> unix_origin_ns;  // Unix time of absolute 0, when known
  int64_t skipped_events = 0;
  std::vector<KernelWork>
      works;  // kernel work (kernel_work.hpp); positions filled by finish_import
  std::vector<std::string> devices;  // GPU names the files record (Kineto deviceProperties)

  int32_t comm(const std::string& key);  // index of the communicator with that key (added)
};

// Applies the common rules and returns the finished trace (spans sorted, rebased to 0).
Trace finish_import(Draft&& d);

// "ProfilerStep#N", "step N", "step#N", "step_N" -> N; "step" -> -1; anything else: nullopt.
std::optional<int32_t> parse_step_name(std::string_view name);

// An NCCL kernel's operation from its name ("ncclKernel_AllReduce_RING_LL_Sum_float",
// "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(...)", "ncclDevKernel_SendRecv(...)").
// nullopt when the name does not start with ncclKernel / ncclDevKernel; CollOp::None for an
// NCCL kernel whose operation the name does not tell (ncclDevKernel_Generic).
std::optional<CollOp> nccl_kernel_op(std::string_view name);
// A PyTorch collective name ("allreduce", "_allgather_base", "reduce_scatter_tensor_coalesced",
// "gloo:all_reduce" after the prefix, "send") -> op; None when unknown.
CollOp torch_collective_op(std::string_view name);
// Bytes per element of a c10 ScalarType name ("Float", "BFloat16", "Long", also "float32",
// "bf16"); 0 when unknown.
int64_t dtype_bytes(std::string_view dtype);
// Collective (or P2P for send/recv) kind of an op.
SpanKind kind_of_op(CollOp op);

}  // namespace orrery::traces::detail
