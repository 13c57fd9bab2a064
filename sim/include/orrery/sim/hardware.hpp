// Hardware profiles: how fast a device really runs each class of kernel, and how it communicates, on
// top of the datasheet peaks that the cluster file gives. One YAML file per profile
// (scenarios/hardware/<device>.yaml holds the default of each device preset; `orrery calibrate`
// writes calibrated ones measured from real traces). Every key is documented in scenarios/README.md
// and in the shipped files themselves.
//
//   name: H100-SXM-default
//   device: H100-SXM            # device preset the profile describes (informational check)
//   precision: bf16             # bf16 | fp16 | tf32 | fp32: which peak of the device the efficiencies refer to
//   peak_flops: 0               # optional: overrides the cluster device's peak (FLOP/s), 0 = keep
//   memory_bandwidth_gbps: 0    # optional: overrides the device's memory bandwidth (GB/s), 0 = keep
//   data_load_us: 20            # time of one micro-batch's data load on the rank
//   kernels:                    # per op class: roofline efficiencies and per-kernel launch overhead
//     gemm:        {flops_efficiency: 0.75, bandwidth_efficiency: 0.9, overhead_us: 4}
//     attention:   {...}
//     elementwise: {...}
//     layernorm:   {...}
//     softmax_loss: {...}
//     optimizer:   {...}
//   collectives:                # optional alpha-beta overrides of the network model, per op and scope
//     - {op: all_reduce, scope: intra_node, latency_us: 8, bus_bandwidth_gbps: 360}
//     - {op: all_reduce, ranks: 4, latency_us: 30, bus_bandwidth_gbps: 2}   # only for groups of 4
//     - {op: all_reduce, ranks: 2, ranks_on_node: 8, latency_us: 50, bus_bandwidth_gbps: 0.3,
//        table: [[4096, 51.7], [1048576, 1041.6]]}   # measured (bytes, us), interpolated
//   cluster:                    # optional (calibrated profiles): the machine the traces came from,
//     device: cpu               #   built by `orrery sim --hw PROFILE` when no --cluster is given
//     nodes: 1
//     ranks_per_node: 8         #   rank slots per node, on a crossbar
//     peak_flops: 1.1e10        #   FLOP/s of one rank slot; memory_bandwidth_gbps, memory_capacity_gb
//     link_gb_per_s: 3          #   rank-to-rank path (MPI over shared memory here), latency_us
//   sharing:                    # optional: ranks sharing the cores of a node (calibrate.hpp)
//     cores: 2
//     threads_per_rank: 1
//     contention_at_full: 1.1   #   a rank's compute slowdown when ranks x threads = cores, vs alone
//     oversubscription_exponent: 1.0   # beyond: slowdown = contention_at_full x (ranks x threads / cores)^e
//     comm_exponent: 1.0        #   collectives: (ranks x threads / cores)^e beyond the cores
//     comm_compute_weight: 2.5  #   a collective launched while k ranks of the node compute takes
//                               #   (1 + weight x k / cores) x its time (its progress thread loses the cores)
//     comm_thread_weight: 0.8   #   busy threads each collective in flight adds to the compute slowdown
//   attention_kernel: fused     # or unfused: the T x T scores through memory (cost_model.hpp)
//   gemm_shape:                 # optional (GPU presets): GEMM time by shape (GemmShapeModel)
//     sms: 132
//     tiles: [{m: 128, n: 256, relative: 1.0}, {m: 128, n: 128, relative: 0.75}, ...]
//     k_fixed: 32
//     max_split_k: 132
//     clock_mhz: 1830           #   the SM clock a main-loop iteration's latency is counted in
//     l2_bandwidth_gbps: 0      #   the SMs' shared L2 bandwidth (0: no operand-bytes term)
//     iteration_latency_cycles: 64   # a main-loop iteration's pipeline latency (calibrate fits it)
//     tile_k_bytes: 128         #   K depth of a main-loop iteration, in operand bytes
//     kernel_latency_cycles: 1000    # a GEMM kernel's prologue and epilogue latency, once per kernel
//   ops:                        # optional (calibrated profiles): measured lone-rank op times
//     - {name: fwd.block, batch: 8, seq: 128, d_model: 256, heads: 4, vocab: 8192, tp: 1, time_us: 24784}
//     - {name: adamw, params: 5.3e6, time_us: 29695}   #   the optimizer: by parameters held
//                               #   an op of the workload with a measured entry of the same name costs
//                               #   the nearest entry's time x the roofline ratio of the two shapes
//   compression:                # optional (calibrated CPU profiles): gradient compression's host
//     int8: {compress_ns: 1.9, decompress_ns: 0.8}   #   compute, ns per unit (HostComputeRates)
//     powersgd: {compress_ns: 0.4, decompress_ns: 1.1}
//   offload:                    # optional: ZeRO offload's links (OffloadLinks; absent: the preset's)
//     {host_link_gbps: 63, host_link_shared_by: 1, host_adamw_gbps: 614.4, nvme_read_gbps: 56,
//      nvme_write_gbps: 30.4}
//   rounding:                   # optional (calibrated CPU profiles): ns per element rounded by the
//     bf16: 0.7                 #   emulated 16-bit formats (runtime.precision on device cpu)
//     fp16: 3.2
//   machine:                    # the machine the profile was measured on (free-form strings)
//     host: ..., cpu: ..., gpus: ..., driver: ..., date: ..., source: ...
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "orrery/common/scenario.hpp"
#include "orrery/traces/span.hpp"

namespace orrery::sim {

// Classes of kernels with their own efficiency: dense matrix products, fused attention, elementwise
// maps (GELU, bias, residual, embedding gather/scatter), LayerNorm, softmax + cross-entropy, and
// the optimizer update.
enum class OpClass : uint8_t {
  Gemm = 0,
  Attention,
  Elementwise,
  LayerNorm,
  SoftmaxLoss,
  Optimizer
};
inline constexpr int kOpClassCount = 6;
std::string_view to_string(OpClass c);  // "gemm", "attention", ...

struct ClassCost {
  double flops_efficiency = 1.0;      // achieved / peak FLOP/s when compute-bound, (0, 1]
  double bandwidth_efficiency = 1.0;  // achieved / peak memory bandwidth when memory-bound, (0, 1]
  int64_t overhead_ns = 0;            // per kernel (launch, synchronisation, host work)
};

// Where a collective override applies: within one node, across nodes, or any group.
enum class CollectiveScope : uint8_t { Any = 0, IntraNode = 1, InterNode = 2 };

// An alpha-beta replacement for the network model's time of one collective op:
// time = latency + bytes · busbw_factor(op, n) / bus_bandwidth.
// With a `table` (measured by `orrery calibrate` from a commbench trace), the time is the table's
// piecewise-linear interpolation in bytes instead (below the smallest size: that size's time; beyond
// the largest: the last segment's slope), which follows protocol switches and cache effects that one
// alpha-beta line cannot. `ranks_on_node` > 0: measured while that many ranks shared the node (the
// crowding of the run: profile_for_ranks keeps, per op and group size, the entries of the run's own
// crowding when there are any).
struct CollectiveOverride {
  traces::CollOp op = traces::CollOp::AllReduce;
  CollectiveScope scope = CollectiveScope::Any;
  int ranks = 0;  // applies to groups of exactly this many ranks; 0 = any size
  int64_t latency_ns = 0;
  double bus_bandwidth_bytes_per_s = 0;
  int ranks_on_node = 0;                           // 0: any crowding
  std::vector<std::pair<int64_t, int64_t>> table;  // (bytes, ns), ascending bytes
  // The time of one operation moving `bytes` (nccl-tests' size) over `group_size` ranks.
  int64_t time_ns(int64_t bytes, int group_size) const;
};

// The machine a calibrated profile was measured on (the `cluster:` section); nodes == 0 when the
// profile does not describe one (the per-device defaults).
struct MachineDescription {
  std::string device = "cpu";  // device preset the rank slots are
  int nodes = 0;
  int ranks_per_node = 0;
  double peak_flops = 0;                    // per rank slot, FLOP/s (0: the preset's)
  double memory_bandwidth_bytes_per_s = 0;  // per rank slot (0: the preset's)
  int64_t memory_capacity_bytes = 0;        // per rank slot (0: the preset's)
  double link_bytes_per_s = 0;  // rank-to-rank bandwidth, per direction (0: the preset's)
  int64_t link_latency_ns = 0;
  std::string link;  // how ranks reach each other, in words
};

// Ranks sharing the cores of one node (the `sharing:` section; cores == 0: no sharing model). The
// law that uses these numbers is sim/core_sharing.hpp's compute_slowdown / comm_slowdown.
struct CoreSharing {
  int cores = 0;
  int threads_per_rank = 1;
  double contention_at_full = 1.0;
  double oversubscription_exponent = 1.0;
  double comm_exponent = 1.0;
  // A collective or transfer started while k ranks of its node are computing takes (1 + w · k / cores)
  // times its measured time: MPI progresses on a communication thread that sleeps between polls and
  // gets the cores only between the compute threads' time slices. Fitted from the overlapped
  // collectives of the calibration runs against the commbench tables; 0 = no stretch.
  double comm_compute_weight = 0.0;
  // Each collective or transfer in flight on the node counts as this many busy threads in the
  // compute slowdown (its MPI progress thread polls and copies on the same cores): fitted from the
  // calibration runs' compute with communication in flight against the same ops without; 0 = none.
  double comm_thread_weight = 0.0;
};

// How a GPU runs a matrix product (the `gemm_shape:` section; sms == 0: no shape model, every GEMM
// at its class's flat efficiency, as CPU profiles and older calibrated ones are). cuBLAS cuts the
// (M x N) output into tiles, one thread block each, and runs them in waves over the SMs (NVIDIA,
// "Matrix Multiplication Background User's Guide": tile quantisation, wave quantisation). Of the
// candidate tiles and split-K factors it picks the fastest for the shape. A tile's main loop runs
// K / tile_k iterations, after a prologue and before an epilogue worth `k_fixed` of K; each
// iteration takes the longer of the tile's MMAs at its SM's share of the peak (times `relative`)
// and the tile's operand bytes at its SM's share of the L2 bandwidth, plus a pipeline latency of
// `iteration_latency_cycles` at `clock_mhz`. A split-K product also writes and reads its fp32
// partial outputs once per split, through L2 (memory's bandwidth without an L2 figure). The class's flops_efficiency is then the ceiling a large,
// well-shaped GEMM reaches, scaling the whole kernel (gemm_shape_efficiency in cost_model.hpp).
// Alignment: the operands come in by loads as wide as their leading dimensions allow (the largest
// power of two dividing every dimension's bytes, up to 16: cuBLAS's and CUTLASS's 128-bit
// vectorised accesses), and the L2 term's rate scales with that width (gemm_load_bytes): an
// `align1` fp32 product loads 4 bytes at a time, at a quarter of the 16-byte rate. And every GEMM
// kernel pays `kernel_latency_cycles` once, its first tiles' prologue (the pipeline's first loads)
// and its last tiles' epilogue (the output's stores), which no other tile's work hides: the floor
// of a small product (CostModel::kernel_ns).
struct GemmTile {
  int m = 0, n = 0;       // output tile
  double relative = 1.0;  // its per-SM throughput against the best tile's, (0, 1]
};
struct GemmShapeModel {
  int sms = 0;                  // streaming multiprocessors (0: off)
  std::vector<GemmTile> tiles;  // candidates, best first
  double k_fixed = 0;           // a tile's fixed cost in units of K (prologue, epilogue)
  int max_split_k = 1;          // split-K factors cuBLAS may use when tiles < sms (1: never)
  double clock_hz = 0;          // SM clock the latency is counted in (0: no latency term)
  double l2_bytes_per_s = 0;    // L2 bandwidth shared by the SMs (0: no operand-bytes term)
  double iteration_latency_cycles = 0;  // a main-loop iteration's latency beyond its work
  int tile_k_bytes = 128;               // a main-loop iteration's depth of K, in operand bytes
  double kernel_latency_cycles = 0;     // a kernel's prologue and epilogue latency, once
  bool enabled() const { return sms > 0 && !tiles.empty(); }
};

// A compute op's measured time on one rank alone (the `ops:` section, written by `orrery calibrate`):
// the op named `name` (the runtime's and the workload's names: fwd.block, bwd.head, adamw, ...) at
// one shape. `piece`/`pieces`: a piece of a tensor-parallel block (pieces 3) or the whole op (1).
// CostModel::op_ns scales the nearest measured shape by the roofline ratio (cost_model.hpp).
struct MeasuredOp {
  std::string name;
  int piece = 0;
  int pieces = 1;
  int64_t batch = 0, seq = 0, d_model = 0, heads = 0, vocab = 0, tp = 1;
  double params = 0;  // adamw: parameters the rank updates
  int64_t time_ns = 0;
};

// Offload's links (the `offload:` section; issue 18 items 3 and 4), GB/s = 1e9 bytes/s: the host
// link (PCIe) of one GPU, per direction, shared by `host_link_shared_by` GPUs (a PCIe switch's one
// uplink: each of k GPUs copying at once gets 1/k); the host's memory bandwidth for ZeRO-Offload's
// AdamW step, per node, in bytes of state traffic (kHostAdamWBytesPerParam per parameter), shared
// by the node's ranks; and the NVMe bandwidth of one node, shared by its ranks (each of k ranks
// offloading at once gets 1/k). A profile without the section takes the device preset's
// (offload_defaults; sources in scenarios/hardware/README.md); `orrery calibrate` measures the NVMe
// pair from a run's offload.read / offload.write spans, the host link from offload.d2h /
// offload.h2d and the host AdamW from offload.adamw (or a CPU run's own adamw spans).
struct OffloadLinks {
  double host_link_bytes_per_s = 0;
  int host_link_shared_by = 1;
  double host_adamw_bytes_per_s = 0;
  double nvme_read_bytes_per_s = 0;
  double nvme_write_bytes_per_s = 0;
};
// Bytes of host memory traffic per parameter of the host's AdamW step (the runtime's adamw_update
// on fp32 arrays): master weight, both moments and the staged gradient read, the master weight
// and both moments written.
inline constexpr double kHostAdamWBytesPerParam = 28.0;
OffloadLinks offload_defaults(const std::string& device, bool is_gpu);

// Host compute the runtime does outside the model's kernels, measured (`orrery calibrate`) rather
// than estimated by the roofline; issue 18 item 4. A missing entry or a rate of 0: the roofline
// estimate of the workload's kernels for that op (cost_model.hpp).
//  - `compression:` per scheme (int8, topk, powersgd; runtime ddp_compression.cpp), the time of a
//    ddp.compress / ddp.decompress op per unit of its work, the units being:
//      int8      compress: gradient elements of the bucket; decompress: elements gathered (n x dp)
//      topk      compress: gradient elements of the bucket; decompress: gradient elements of the
//                bucket (its zero fill and scaling passes; the k x dp scatter-adds are few)
//      powersgd  compress: FLOPs of its products (P = M Q, Q = M^T P and the approximation P Q^T,
//                2 m n r each, and the orthonormalisation's 2 m r^2), the elementwise passes over
//                the matrix (residual, error feedback) folded into that rate; decompress: plain
//                (vector) entries copied back
//  - `rounding:` per emulated 16-bit format (bf16, fp16; runtime half.hpp), ns per element rounded
//    (ModelDims::emulated_16bit's passes over each GEMM's operands and output).
struct CompressionRate {
  double compress_ns = 0;    // per unit (0: not measured)
  double decompress_ns = 0;  // per unit (0: not measured)
};
struct HostComputeRates {
  std::map<std::string, CompressionRate> compression;  // by scheme: int8, topk, powersgd
  std::map<std::string, double> rounding_ns;           // by format: bf16, fp16
  bool empty() const { return compression.empty() && rounding_ns.empty(); }
};

struct HardwareProfile {
  std::string name;
  std::string path;                         // file it was read from ("" for built-in defaults)
  std::string device;                       // device preset name it describes
  Precision precision = Precision::FP32;    // bf16 | fp16 | tf32 | fp32
  double peak_flops = 0;                    // 0: the cluster device's peak for `precision`
  double memory_bandwidth_bytes_per_s = 0;  // 0: the cluster device's
  int64_t data_load_ns = 0;
  std::array<ClassCost, kOpClassCount> classes{};
  std::vector<CollectiveOverride> collectives;
  std::map<std::string, std::string> machine;  // the `machine:` section
  MachineDescription cluster;                  // the `cluster:` section
  CoreSharing sharing;                         // the `sharing:` section
  // `rank_jitter`: the relative spread (standard deviation) of one rank's compute time in a step
  // against the other ranks' in the same step (a shared machine gives its ranks unequal shares that
  // change over time). When every rank is simulated, the executor runs rank r's compute of step s
  // at (1 + rank_jitter · q) times its time, q the expected normal order statistics of the simulated
  // ranks, rotated by step: each step's slowest rank is as slow as the expected slowest of that many,
  // so a synchronising collective waits as long as it would on average. 0 = none. Fitted by
  // `orrery calibrate` from the multi-rank runs' per-step compute totals.
  double rank_jitter = 0;
  // `op_jitter`: the relative spread of one compute op's time from one run of it to the next,
  // independent between ops and ranks. When every rank is simulated, a collective whose members have
  // computed ops of times d since their last collective starts σ · E[max of n standard normals]
  // late, σ² = the members' mean of Σ (op_jitter · d)²: the expected wait for the last of n
  // independently late arrivals. 0 = none. Fitted by `orrery calibrate` from the multi-rank runs.
  double op_jitter = 0;
  // `comm_compute_share`: the share of the GPU's compute its own NCCL kernels take while a
  // collective or transfer of the rank runs alongside its compute (ExecutorOptions). NCCL runs one
  // CTA (thread block) per channel, each on an SM of its own (NCCL's documentation of
  // NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS), so channels / SMs is the SM share: 8 / 108 = 0.074 on
  // an A100 with the 8 channels of selene-a100.yaml. 0 = none (the default: no slowdown).
  double comm_compute_share = 0;
  // `moe_expert_shares`: the measured share of each expert of a mixture-of-experts model in the
  // routed assignments (expert e's fraction, e = 0 .. E-1), from the moe.tokens counters of real
  // traces (`orrery calibrate`); when it has the scenario's model.moe.experts entries the simulator
  // prices the experts by it instead of model.moe.router_skew (sim/moe_cost.hpp). Empty = none.
  std::vector<double> moe_expert_shares;
  std::vector<MeasuredOp> ops;  // the `ops:` section
  GemmShapeModel gemm_shape;    // the `gemm_shape:` section
  // `attention_kernel: fused` (default: FlashAttention-style, the class's roofline) or `unfused`
  // (two batched GEMMs and the T x T scores through memory, CostModel::unfused_attention_ns).
  bool attention_fused = true;
  OffloadLinks offload;   // the `offload:` section (or the preset's defaults)
  HostComputeRates host;  // the `compression:` and `rounding:` sections

  const ClassCost& cost(OpClass c) const { return classes[static_cast<int>(c)]; }
  // The override for `op` over a group that is (or is not) inside one node, or null. With
  // group_size > 0, an override for exactly that many ranks beats one for any size.
  const CollectiveOverride* find_override(traces::CollOp op, bool intra_node,
                                          int group_size = 0) const;
};

// Reads a profile file; throws InputError naming the file and key on unknown keys, wrong types,
// efficiencies outside (0, 1], negative times.
HardwareProfile load_hardware_profile(const std::string& path);
HardwareProfile parse_hardware_profile(const std::string& yaml_text, const std::string& origin);
std::string to_yaml(const HardwareProfile& p);

// Built-in uncalibrated defaults for a device preset (the same numbers as the shipped
// scenarios/hardware/<device>.yaml): GPUs use bf16, with GEMMs priced by shape under a measured
// ceiling on the A100, H100 and H200 presets (0.7 flat on other GPUs), CPUs fp32 with 0.5.
// `is_gpu` picks the family for names not known here.
HardwareProfile default_hardware_profile(const std::string& device, bool is_gpu);
// The GEMM shape model of a device preset (A100-SXM-80GB, H100-SXM, H200); off for others.
GemmShapeModel gemm_shape_model(const std::string& device);

}  // namespace orrery::sim
