// Gradient compression as a DDP communication hook (issue 18 item 1; PyTorch's comm hooks are the
// model users know): with parallel.grad_compression = int8 | topk | powersgd, each DDP bucket's
// fp32 all-reduce on the dp group is replaced by the scheme's collectives once the step reaches
// compression.start_step (the steps before are uncompressed warm-up, as PowerSGD's
// start_powerSGD_iter). The kernels are compression.hpp's and run on the host: on the CPU over the
// gradients in place; on a device (GradStaging) over a host copy, a correctness-first hook as
// PyTorch's comm hooks can be: each bucket is downloaded into the host copy before it is compressed,
// the collectives go over the dp group's host communicator (MPI), and the average is uploaded
// after it is decompressed. The arithmetic is the CPU's, so a device run's averaged gradients are
// the CPU run's bit for bit; the price is PCIe traffic and host time (the copies are inside the
// "ddp.compress" / "ddp.decompress" spans), and a bucket's download waits for the compute stream,
// so the host stops queueing the backward while it compresses. On a device it runs with data
// parallelism only (launch.cpp says why).
//
// Error feedback is always on: per bucket a residual array (the bucket's size) keeps what a step
// could not send; the next step compresses e = g + residual, and sent + residual == e.
//
// Every scheme ends with bit-identical averaged gradients on every dp rank:
//  - int8: one all-gather (DType::U8) per bucket of each rank's [codes (n int8) | scales (one fp32
//    max-abs/127 per chunk of kInt8ChunkElems)], then every rank dequantises every rank's codes and
//    sums them in rank order in fp32, divided by dp. Why an all-gather and not an all-reduce: codes
//    quantised with different per-rank scales cannot be summed by MPI (nor an int8 sum without
//    overflow), and a reduce-scatter/all-gather in a wider type would cost >= 2 bytes an entry;
//    the all-gather sends each rank's n + 4n/256 bytes as they are, and because every rank sums
//    the same numbers in the same order the result is deterministic across ranks. Its cost grows
//    with dp: (dp-1)(n + 4n/256) bytes out of each rank against the ring all-reduce's
//    2(dp-1)/dp * 4n, so it pays while dp < ~8.
//  - topk: the k = topk_count(n, ratio) largest-magnitude entries of e per bucket, one all-gather
//    (DType::U8) of each rank's [k uint32 indices | k fp32 values]; every rank scatter-adds every
//    rank's pairs in rank order into zeros, divided by dp.
//  - powersgd (Vogels et al. 2019): per matrix-shaped gradient M (rows x cols > 1, and only where
//    r(rows + cols) < rows*cols) P = M Q, all-reduce P (mean), orthonormalise, Q = Mᵀ P,
//    all-reduce Q (mean), M ≈ P Qᵀ; Q warm-started from the previous step (initialised from a
//    fixed seed, the same on every rank). The bucket's other entries (biases, norms, small
//    matrices) go uncompressed in one fp32 all-reduce (mean) of their concatenation, residual 0.
//
// Trace: the collectives are named model::names kDpInt8AllGather / kDpTopkAllGather / kDpPowerSgdP
// / kDpPowerSgdQ / kDpPowerSgdVectors (step, micro-batch, layer = the bucket's lowest layer as
// "ddp.all_reduce"); their bytes are what the communicator sends (nccl-tests' size: an
// all-gather's total over the group, an all-reduce's buffer). The host work is Compute spans
// "ddp.compress" (bytes = the bucket's uncompressed fp32 bytes, so the report pairs it with the
// bucket's collectives by rank, step and layer for the ratio) and "ddp.decompress".
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "orrery/model/compression.hpp"
#include "orrery/runtime/comm.hpp"
#include "orrery/runtime/model.hpp"

namespace orrery::profiler {
class Recorder;
}

namespace orrery::runtime {

struct DdpBucket;

inline constexpr std::size_t kInt8ChunkElems = model::kInt8ChunkElems;

enum class CompressionScheme : int32_t { None = 0, Int8 = 1, TopK = 2, PowerSgd = 3 };
// "none" | "int8" | "topk" | "powersgd" (InputError naming parallel.grad_compression otherwise).
CompressionScheme compression_scheme_of(const std::string& name);

struct CompressionOptions {
  CompressionScheme scheme = CompressionScheme::None;
  int powersgd_rank = 4;     // compression.powersgd_rank
  double topk_ratio = 0.01;  // compression.topk_ratio
  int start_step = 0;        // compression.start_step
  bool keep_sent = false;    // tests: keep each bucket's own sent values of the last step
};

// A matrix-shaped gradient in the flat array (PowerSGD compresses these).
struct GradMatrix {
  std::size_t offset = 0;
  std::size_t rows = 0, cols = 0;
};
// The matrices of a model's parameter tensors (rows > 1 and cols > 1).
std::vector<GradMatrix> grad_matrices(const Gpt& model);

// Closed form: the bytes one rank contributes to a bucket's collectives under `opt` (int8:
// int8_payload_bytes; topk: topk_payload_bytes; powersgd: P and Q of each compressed matrix plus
// 4 bytes per other entry). `matrices` may hold matrices outside the bucket (ignored).
std::size_t compressed_bucket_bytes(const CompressionOptions& opt, const ParamRange& bucket,
                                    const std::vector<GradMatrix>& matrices);

// The device path: the gradients are not host memory. `download` / `upload` copy n floats between
// the host copy and the device array, synchronously (the backend's download / upload: the download
// after every queued kernel, so the bucket's gradients are complete).
struct GradStaging {
  std::function<void(float* host, const float* device, std::size_t n)> download;
  std::function<void(float* device, const float* host, std::size_t n)> upload;
};

class CompressionHook {
 public:
  // `grads`: the flat gradient array the buckets index, host memory unless `staging` (then the
  // device's, reached only through staging's copies); `dp`: a host communicator of size > 1;
  // `rec` may be null.
  CompressionHook(const CompressionOptions& opt, const std::vector<DdpBucket>& buckets,
                  const std::vector<GradMatrix>& matrices, float* grads, Communicator& dp,
                  profiler::Recorder* rec, const GradStaging* staging = nullptr);
  ~CompressionHook();
  CompressionHook(const CompressionHook&) = delete;
  CompressionHook& operator=(const CompressionHook&) = delete;

  const CompressionOptions& options() const { return opt_; }
  bool active(int32_t step) const { return step >= opt_.start_step; }

  // The bucket's gradients are complete: int8/topk compress them and start the all-gather;
  // powersgd runs the bucket's whole reduction (its all-reduces waited here).
  void issue(const DdpBucket& b, const OpLabel& label);
  // Waits for the pending all-gathers and writes each bucket's average into the gradients.
  void finish();

  // Per bucket index: the residual carried to the next step; this rank's own sent values of the
  // last compressed step (keep_sent only); the closed-form bytes this rank contributes.
  const std::vector<float>& residual(int bucket) const;
  const std::vector<float>& sent(int bucket) const;
  std::size_t payload_bytes(int bucket) const;
  // Checkpoints (checkpoint.hpp): the state a step carries to the next, as two arrays: every
  // bucket's residual in bucket order, and PowerSGD's Q of every compressed matrix in bucket and
  // memory order (empty for int8 and topk). set_state takes arrays of the same sizes.
  std::size_t residual_elems() const;
  std::size_t q_elems() const;
  void get_state(std::vector<float>& residuals, std::vector<float>& q) const;
  void set_state(const std::vector<float>& residuals, const std::vector<float>& q);
  // Host bytes held beyond the gradients (residuals, wire buffers, PowerSGD's Q; with staging
  // the host copy of the gradients too).
  std::size_t buffer_bytes() const;
  // Whether the gradients are a device's, reached through GradStaging's copies.
  bool staged() const { return device_grads_ != nullptr; }

 private:
  struct Bucket;
  void issue_int8(Bucket& st, const OpLabel& label);
  void issue_topk(Bucket& st, const OpLabel& label);
  void run_powersgd(Bucket& st, const OpLabel& label);
  void finish_gathered(Bucket& st);
  void span(const char* name, const Bucket& st, int64_t bytes, int64_t start_ns) const;
  void stage_in(const Bucket& st);   // staging: the bucket's device gradients into grads_
  void stage_out(const Bucket& st);  // staging: the bucket's result back to the device

  CompressionOptions opt_;
  float* grads_;  // host memory: the gradients themselves, or with staging host_grads_
  float* device_grads_ = nullptr;  // staging: the device's gradient array
  GradStaging staging_;
  std::vector<float> host_grads_;  // staging: (max bucket end) the host copy
  Communicator& dp_;
  profiler::Recorder* rec_;
  std::vector<Bucket> buckets_;
  std::vector<int> pending_;  // buckets whose all-gather is in flight, in issue order
  std::vector<float> scratch_;
};

}  // namespace orrery::runtime
