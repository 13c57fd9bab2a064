// The training workload: from a scenario, the graph of compute and communication ops that each rank
// executes in one or more training steps, with streams, dependencies, FLOPs, bytes and collectives;
// the same ops, names and order as the runtime's trainer, so simulated and real traces line up.
//
// Symmetry. Under Megatron tensor parallelism every tp rank of a stage runs the same ops on its
// slice, and every data-parallel replica runs the same ops on its own data; only the pipeline stage
// changes the program. So the workload holds ONE program per pipeline stage (StageProgram), shared
// by all dp × tp ranks of that stage. Ops name their communicator by role (tp, dp, the next or
// previous stage, the tied-embedding pair), and the executor resolves a role to the concrete group
// of the rank that runs it. Building GPT-3 175B on 16,384 GPUs therefore costs pp programs, not
// 16,384 graphs.
//
// Op names and order follow the runtime's trainer (see `names` below).
// Per step, per micro-batch, in the schedule's order (GPipe: all forwards, then all backwards;
// 1F1B: p-s-1 warm-up forwards on stage s, then one forward one backward, then the cool-down;
// interleaved: Megatron's interleaved 1F1B over the stage's model chunks, pipeline_schedule.hpp, each
// pass one chunk's, the embedding on stage 0's chunk 0, the head on the last stage's last chunk, and
// the last stage's chunk c sending to stage 0's chunk c+1 (gradients back); a chunk's DDP buckets
// with its backward of the last micro-batch, ZeRO 1/2 after chunk 0's backward):
//   forward:  [data] [recv act] fwd.embed? fwd.block per layer (tp > 1: piece, tp all-reduce, piece,
//             tp all-reduce, piece), fwd.head?, [send act]
//   backward: [recv grad] bwd.head? bwd.block per layer in reverse (tp > 1: three pieces around two
//             all-reduces), bwd.embed?, [send grad]
//   gradient sync on the last micro-batch: per DDP bucket (bucket_mb, last layers first) an
//   all-reduce, as soon as the backward op that produces the bucket's last gradient is done
//   (overlap: true), or after the whole backward (overlap: false); with pp the tied-embedding
//   all-reduce between the first and last stage after all passes; then the optimizer; with pp the
//   last stage's 4-byte loss broadcast over the pp group ("pp.loss").
//   ZeRO 1/2 instead (the runtime's zero.hpp): after the backward pass (ZeRO 1: the last micro-batch,
//   ZeRO 2: every one) the tied-embedding all-reduce (pp > 1) and ONE reduce-scatter of the whole
//   padded array, both blocking; after AdamW one all-gather of the whole array. With
//   zero.overlap_grad_reduce (Megatron's distributed optimizer): ZeRO's buckets (model/buckets.hpp
//   zero_buckets) each reduce-scattered as soon as its last gradient is ready, as DDP's (every
//   micro-batch under ZeRO 2), the bucket holding the tied wte after the tied-embedding
//   all-reduce; the next pass waits for all; after AdamW one all-gather per bucket in forward
//   order, which the step's end waits for, or with zero.overlap_param_gather the next step's first
//   forward op of each segment whose parameters lie in the bucket (the scenario's last step: its
//   end).
//   Mixture of experts (model/moe.hpp has the span order): an MoE block's forward is fwd.block
//   [Ln1 .. Ln2] (tp > 1: two pieces around the attention's tp all-reduce), moe.router,
//   moe.dispatch (all_to_all over the ep group on comm.ep, ep > 1), moe.experts, moe.combine
//   (ep > 1), moe.gated_sum, the tp all-reduce (tp > 1), fwd.block [MlpResidual]; its backward the
//   reverse (bwd.block [MlpResidual], moe.gated_sum.bwd, tp.moe_gate_all_reduce (tp > 1),
//   moe.combine.bwd, moe.experts.bwd, moe.dispatch.bwd, moe.router.bwd, tp all-reduce (tp > 1),
//   bwd.block [Ln2 .. Ln1], tp > 1: two pieces around the attention's tp all-reduce). On the
//   gradient-sync micro-batch the expert gradients go out over the edp group in buckets
//   ("edp.all_reduce", the DDP bucket rule over the MoE blocks' expert parameters, last blocks
//   first), each after the moe.experts.bwd that completes it (overlap) or after the backward; the
//   optimizer waits for them; ZeRO 1/2 shard the experts' optimizer over edp (dense: over dp).
//   ZeRO 3 with MoE blocks is refused (parallel.zero).
//   ZeRO 3: "zero.fetch_layer" all-gathers per segment (embedding and final LayerNorm once per step
//   before any pass; each block before its forward and its backward, the next one prefetched when
//   the current one is bound), "zero.reduce_scatter" per segment as its backward completes (the
//   embedding's after the pass, behind the tied-embedding all-reduce), the next pass waiting for all.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/model/grid.hpp"
#include "orrery/model/names.hpp"
#include "orrery/model/parameters.hpp"
#include "orrery/sim/cost_model.hpp"
#include "orrery/traces/span.hpp"

namespace orrery::sim {

// Streams of a rank: the model's (model/names.hpp), which the CPU runtime records under too. TP and
// DP collectives have their own streams (a TP all-reduce still blocks compute through its
// dependency); sends and receives of the pipeline have one each.
using model::names::kStreamCompute;
using model::names::kStreamCount;
// One queue more than the trace's streams, the simulator's own: NVMe offload on a device (workload
// below) runs its file reads and writes on the runtime's I/O thread while the CUDA copy stream runs
// the host-link copies, both recorded on the stream "offload". The executor runs the file's
// requests on this queue and writes their spans on kStreamOffload (trace_stream), as the runtime.
inline constexpr int kStreamOffloadIo = kStreamCount;
inline constexpr int kSimStreams = kStreamCount + 1;
// The trace stream of a queue: kStreamOffload for kStreamOffloadIo, else the queue itself.
inline constexpr int trace_stream(int queue) {
  return queue == kStreamOffloadIo ? model::names::kStreamOffload : queue;
}
using model::names::kStreamDp;
using model::names::kStreamEp;
using model::names::kStreamPpRecv;
using model::names::kStreamPpSend;
using model::names::kStreamTp;
using model::names::stream_name;  // "compute", "comm.dp", ...

// Op and phase names: the model's one table (model/names.hpp), which the runtime records its spans
// under. Compute "zero_grad" (once at the start of each step, 4 bytes written per gradient element
// held), "fwd.embed" (layer -1), "fwd.block" (layer l; with tp > 1 three pieces of that name split
// by the two tensor-parallel all-reduces, FLOPs attention / mlp / 0 as the runtime), "fwd.head"
// (layer L), "bwd.head", "bwd.block" (tp > 1: three pieces, FLOPs 2·mlp / 2·attention / 0),
// "bwd.embed", optimizer "adamw", data "data", DDP bucket all-reduces "ddp.all_reduce" (layer = the
// bucket's lowest layer), and the tp, pp and ZeRO collectives and transfers.
namespace names = ::orrery::model::names;

// The communicator of an op, by role relative to the rank that runs it.
enum class GroupRole : uint8_t {
  None = 0,
  TP,         // the rank's tensor-parallel group
  DP,         // the rank's data-parallel group
  PPNext,     // point-to-point with the next stage (same dp, tp)
  PPPrev,     // point-to-point with the previous stage
  Embedding,  // the first and the last stage (same dp, tp): tied embedding gradients
  EP,         // the rank's expert-parallel group: ep consecutive dp ranks (model/moe.hpp)
  EDP,        // its expert-data-parallel group: the dp ranks of the same ep rank
};

enum class PhaseKind : uint8_t { None = 0, Forward, Backward, Optimizer };

struct Op {
  uint32_t name = 0;  // index into Workload::names
  traces::SpanKind kind = traces::SpanKind::Compute;
  uint8_t stream = kStreamCompute;
  GroupRole group = GroupRole::None;
  PhaseKind phase = PhaseKind::None;
  traces::CollOp coll = traces::CollOp::None;
  int32_t step = -1;
  int32_t micro_batch = -1;
  int32_t layer = -1;
  int32_t seq = -1;   // sequence number within its communicator (ops of the rank on that group)
  int64_t bytes = 0;  // collectives: nccl-tests' size; p2p: the message; compute: memory traffic
  double flops = 0;   // model FLOPs (the runtime's counting)
  int64_t duration_ns =
      0;                   // compute: the cost model's time; communication: 0 (the network decides)
  uint32_t dep_begin = 0;  // deps: Program::deps[dep_begin, dep_begin + dep_count)
  uint32_t dep_count = 0;
};

// What every rank of one pipeline stage executes. Ops are in program order; each stream runs its
// ops in that order, and an op also waits for its deps (ops of the same rank, any stream). A pp
// send, as the runtime's MPI_Isend, frees its stream once posted; sends and receives match in
// issue order per direction.
struct StageProgram {
  int stage = 0;
  int layers = 0;  // blocks the stage holds (parallel.pp_layers, or layers / pp)
  std::vector<Op> ops;
  std::vector<uint32_t> deps;                                 // op indices
  std::array<std::vector<uint32_t>, kSimStreams> stream_ops;  // op indices per queue, in order
  int64_t param_count = 0;  // parameters held by one rank of this stage (tp slice, unsharded)
  // DDP buckets (ddp.hpp's rule): runs of whole segments in gradient-ready order (L, L-1, ...,
  // -1), a bucket closed before the segment that would take it past bucket_mb of gradients.
  std::vector<int64_t> bucket_params;  // parameters of each gradient bucket, in all-reduce order
  // Mixture of experts (model/moe.hpp): the local experts' parameters of this stage's MoE blocks
  // (tp slice; not in param_count, which holds the dense ones: attention, norms, router, shared
  // experts), reduced over the edp group in buckets of the same rule ("edp.all_reduce").
  int64_t expert_param_count = 0;
  std::vector<int64_t> expert_bucket_params;
};

// The rank grid (model/grid.hpp): dp × tp × pp ranks, placed fastest-varying first (scenario's
// parallel.placement, default "tp,dp,pp": tp neighbours on one node).
using Layout = model::RankGrid;

// A parameter tensor held by one rank of a stage, in memory order. Its segment (the runtime's unit
// of gradient readiness, model.hpp): -1 the embedding (wte, wpe, or the last stage's wte copy),
// l for block l, L for the final LayerNorm.
struct ParamTensor {
  std::string name;  // "h3.fc1.w"
  int64_t count = 0;
  int segment = -1;
};
// Model chunks per pipeline stage (model/parameters.hpp).
using model::chunks_per_stage;
// The stage's parameter tensors (model/parameters.hpp's table): wte and wpe (stage 0), the last
// stage's wte copy, its chunks' blocks in chunk order, the final LayerNorm (last stage).
// Dense tensors only: an MoE block's routed experts (ParamSpec::expert) are left out (moe_cost.hpp).
std::vector<ParamTensor> stage_parameters(const Scenario& s, int stage);

// Bytes per parameter, per gradient and of optimizer state per parameter, and per activation.
struct PrecisionConfig {
  std::string name = "fp32";  // fp32 | mixed
  int param_bytes = 4;
  int grad_bytes = 4;
  int optimizer_bytes = 8;  // Adam moments (mixed: + fp32 master copy = 12)
  int act_bytes = 4;
};
// "fp32" (4/4/8, activations 4) or "mixed" (bf16 parameters and gradients with fp32 master and
// moments: 2/2/12, activations 2), per ZeRO's paper; InputError otherwise.
PrecisionConfig precision_config(const std::string& name);

struct WorkloadOptions {
  int steps = 1;
  PrecisionConfig precision;
  // ranks sharing one node's NVMe bandwidth and host memory (zero.offload_optimizer nvme, host)
  int ranks_per_node = 1;
};

// NVMe offload (zero.offload_optimizer nvme; runtime offload.hpp), modelled as the runtime runs it:
// the optimizer state of the `params` elements a rank updates goes through the file in chunks of
// zero.offload_chunk_mb / 4 bytes elements (at most kMaxOffloadChunks, larger chunks beyond), on
// the stream "offload" in the I/O thread's order r0 r1 w0 r2 w1 ... (Memcpy ops "offload.read" /
// "offload.write", each bytes_per_param x its elements, time bytes / the rank's share of the
// node's NVMe bandwidth), AdamW in as many "adamw" pieces on the compute stream, piece i after
// read i, write i after piece i: the overlap of chunk i's update with the read of i+1 and the
// write of i-1 comes out of the executor.
// Ranges (every offload path): the runtime steps the optimizer one range after another
// (training_loop_impl.hpp optimizer_phase), each through its own pipeline: under ZeRO 3 each segment
// of the stage in memory order (the embedding, the blocks, the head, then each MoE block's experts
// over edp), rank 0's shard of each, ceil(n / dp) (ceil(n / edp)); under ZeRO 1/2 with MoE and
// ep > 1 the dense shard, then the experts' shard over edp; else one range (Ψ/N or Ψ). Each range
// has its own chunks (offload_chunks of its elements), and the next range's queue entries follow
// the previous range's on each stream.
inline constexpr int kMaxOffloadChunks = 64;
// State bytes through the file per updated element: the moments (8 fp32; mixed 12 with the fp32
// master copy), plus the parameters with zero.offload_params nvme (param_bytes).
double offload_bytes_per_param(const Scenario& s, const PrecisionConfig& p);
// Elements of each chunk of `params` (kMaxOffloadChunks at most).
std::vector<int64_t> offload_chunks(const Scenario& s, int64_t params);
// Time of moving `bytes` at `bytes_per_s` (ceil, ns).
int64_t offload_io_ns(double bytes, double bytes_per_s);

// ZeRO-Offload on a GPU (zero.offload_optimizer host; runtime offload_pipeline.hpp), modelled as
// the CUDA runtime runs it: per chunk of offload_chunks (the same chunks as nvme's) the gradients
// go down ("offload.d2h", Memcpy on the stream "offload", grad_bytes per element), the host steps
// AdamW ("offload.adamw", Optimizer on the compute stream, bytes 4 per element as the runtime's
// span, time kHostAdamWBytesPerParam x elements / the rank's share of the node's host_adamw
// bandwidth) and the parameters go up ("offload.h2d", param_bytes per element); each copy takes
// bytes / the rank's share of its host link. The copy stream runs in the host's issue order
//   D0 D1 U0 D2 U1 ... D(c-1) U(c-2) U(c-1)
// (offload_chunk_schedule), step i after download i and step i-1, upload i after step i: while the
// host steps chunk i the stream holds download i+1 and upload i-1, and the executor overlaps them.
// The GPU's own AdamW is then absent; the step waits for the last upload. At fp32 the copies carry
// the runtime's 4 bytes per element; at mixed precision 2 (ZeRO-Offload's 16-bit gradients down
// and parameters up).
bool host_offload(const Scenario& s);
// Ranks sharing one host link: min(host_link_shared_by, ranks on the node).
int host_link_sharers(const OffloadLinks& links, int ranks_per_node);
// The host step of `params` elements on one of `ranks_per_node` ranks (ceil, ns; 0 without a rate).
int64_t host_adamw_ns(double params, const OffloadLinks& links, int ranks_per_node);
// InputError when a scenario with zero.offload_optimizer host meets a profile without a host
// link or host AdamW rate (device cpu: its state is in host memory already), or one with
// zero.offload_optimizer nvme a profile with a host link but no host AdamW rate.
void check_host_offload(const Scenario& s, const HardwareProfile& p);

// NVMe offload on a device (zero.offload_optimizer nvme on a profile with a host link, the CUDA
// runtime's path; training_loop_impl.hpp offloaded_adamw, offload_pipeline.hpp, offload.hpp): the
// AdamW moments live in the file, the fp32 master weights in pinned host memory, and AdamW steps on
// the host. Per chunk i of a range (offload_chunks) the runtime's host thread waits for the file's
// read of chunk i, submits the read of i+1, queues the gradients' downloads (0 and 1 at the first
// chunk, i+1 after), waits for download i, steps chunk i and queues its upload, then submits the
// chunk's write. Modelled with those dependencies:
//   I/O queue (kStreamOffloadIo): R0 R1 W0 R2 W1 ... R(c-1) W(c-2) W(c-1)
//     "offload.read" / "offload.write", kDeviceNvmeBytesPerParam x elements each, time bytes / the
//     rank's share of the node's NVMe read / write bandwidth (as the CPU path's);
//   copy stream ("offload"): D0 D1 U0 D2 U1 ... U(c-1), "offload.d2h" / "offload.h2d" as host
//     offload's, D0 and D1 after read 0, D(i+1) after read i;
//   compute stream: "offload.adamw" i after download i and read i (host offload's time);
//   upload i and write i after step i.
// The range ends with its last upload (the compute stream waits for it) and its last write (the
// host waits for every write before it goes on). With zero.offload_params see
// device_offload_params.
bool device_nvme_offload(const Scenario& s, const OffloadLinks& links);
// Bytes through the file per element on a device: the two fp32 moments (the master weights stay
// in pinned host memory), at either precision.
inline constexpr double kDeviceNvmeBytesPerParam = 8.0;

// zero.offload_params nvme on a device (ZeRO 3 on a profile with a host link, the CUDA runtime's
// path: training_loop_impl.hpp z3_shard / z3_prefetch_shard / z3_release_staging, cuda/host_offload.hpp
// CudaShardStaging): ZeRO 3's parameter shards live in the file as fp32 (the third plane), so
//  - before each segment's zero.fetch_layer (every gather: the step's embedding and final norm,
//    each block's in the forward and again in the backward) its shard, ceil(n / dp) elements (an
//    MoE block's experts ceil(e / edp)), is read from the file ("offload.read" on the I/O queue,
//    kDeviceShardBytesPerParam x elements at the rank's share of the NVMe read bandwidth) into the
//    host staging of the gather's working buffer, then uploaded ("offload.h2d" on the stream
//    "offload", the same bytes at the rank's share of the host link) into its device staging, the
//    gather's send buffer: the gather after its upload. A staging slot (zero3_slot's four, 0/1
//    by block parity, 2 the embedding, 3 the final norm; 4/5 an MoE block's experts) takes its
//    next read after its last upload and its next upload after its last gather. The blocks'
//    shards are read one after next ahead (bound to block l, the read of l + 2 in the forward, l - 2
//    in the backward, into l's slot); a shard still held in its slot's host staging (the first two
//    gathers of a pass after the pass that staged them) is uploaded again without a read; the
//    experts' shard is read at each gather (not modelled where edp is one rank: the simulator has
//    no experts' gather there, and the runtime's read, upload and copy are left out). Nothing held
//    survives the optimizer (the file's shards are new). Both copy streams of the runtime (the
//    staging's and the optimizer's) are the simulator's queue "offload": their work never
//    overlaps, the step's first gather waits for the optimizer's end;
//  - the optimizer is the device's NVMe pipeline above with the parameters a third plane of the
//    file (device_nvme_file_bytes: 12 bytes per element read and written) and no upload after the
//    host step (the device holds no shard; the range ends with its last write).
bool device_offload_params(const Scenario& s, const OffloadLinks& links);
// The runtime's shards: fp32 in the file and in both stagings, at either precision.
inline constexpr double kDeviceShardBytesPerParam = 4.0;
// The device path's file bytes per updated element: the moments, plus the shards with
// zero.offload_params (8 or 12).
double device_nvme_file_bytes(const Scenario& s);

struct Workload {
  Scenario scenario;
  Layout layout;
  PrecisionConfig precision;
  int steps = 1;
  int micro_batches = 1;  // per step per data-parallel replica
  std::vector<StageProgram> stages;
  std::vector<std::string> names;   // op names
  double model_flops_per_step = 0;  // all ranks, the runtime's counting
  int64_t tokens_per_step = 0;

  const StageProgram& program_of_rank(int rank) const { return stages[layout.coord(rank).pp]; }
  size_t op_count() const;                     // over the stage programs
  uint32_t name_id(std::string_view n) const;  // UINT32_MAX when absent
};

// What one rank of each pipeline stage computes in one step, from its program (the mean over the
// workload's steps): the blocks it holds, the cost model's time and the model FLOPs of its compute
// and optimizer ops, and of those the blocks' (fwd.block, bwd.block, recompute.block,
// recompute.attention). `orrery sim` prints it, so a pipeline cut unevenly (parallel.pp_layers)
// shows which stage bounds the step.
struct StageCompute {
  int stage = 0;
  int layers = 0;
  double compute_ns = 0;
  double flops = 0;
  double block_flops = 0;
};
std::vector<StageCompute> stage_compute(const Workload& w);

// An upper bound of the ops of the largest stage program build_workload makes for `steps` steps, in
// closed form and in double (absurd scenarios overflow int64), without building anything: per
// step, micro-batches x (layers per stage x (2·(2·pieces − 1) + 3 with ZeRO 3) + 10) + layers per
// stage + 12, pieces = 3 with tp > 1 else 1; MoE blocks add 17 per layer and micro-batch and the
// expert buckets per step; offload (nvme or host) at most 5 per chunk (nvme on a device: read,
// download, host step, upload, write), at most kMaxOffloadChunks chunks per range, one range per
// ZeRO 3 segment (the stage's blocks, embedding and head, and its MoE blocks' experts), else 2. The simulator's memory check (sweep.hpp) uses it.
double workload_ops_bound(const Scenario& s, int steps);
// Fewer kv heads than tp ranks (each head replicated on tp / kv_heads ranks): the values of each
// block's "tp.kv_grad_all_reduce", kv_heads x 2 x head size x (d_model + 1 with biases); else 0.
int64_t kv_grad_values(const Scenario& s);
// Op ids, dependency offsets and sequence numbers are 32-bit: a stage program holds at most this.
inline constexpr int64_t kMaxStageOps = 2147483647;

// Builds the workload. `cost` times the compute ops. Throws InputError when the layout does not fit
// the model (validate_layout), the interleaved schedule cannot be built (pp < 2, layers not
// divisible by pp x virtual_stages, ZeRO 3) or the programs would exceed kMaxStageOps
// (workload_ops_bound).
Workload build_workload(const Scenario& s, const CostModel& cost, const WorkloadOptions& opt = {});

// The order of forward (+mb) and backward (-mb-1) passes of stage `stage` for the schedule, e.g.
// 1F1B p=4 m=8 stage 0: F0 F1 F2 F3 B0 F4 B1 ... The same function orders the runtime's passes.
std::vector<int> schedule_order(Schedule schedule, int stages, int stage, int micro_batches);

}  // namespace orrery::sim
