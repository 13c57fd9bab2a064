// ZeRO-Offload on a device (issue 18; Ren et al., "ZeRO-Offload", 2021): the fp32 master weights of
// the range a rank updates and their AdamW moments live in host memory (pinned arrays, or the
// moments in the NVMe offload file, offload.hpp), and AdamW steps there. Per chunk of the range
// (zero.offload_chunk_mb) the device's gradients are copied down into a staging buffer, the host
// steps the chunk with the CPU's adamw_update (optimizer.hpp) and the updated master chunk is copied
// up into the device's parameters. The copies run on a stream of their own, so chunk i+1's download
// and chunk i-1's upload overlap chunk i's host step.
//
// The device-independent part lives here, so the CPU tests check it: the schedule (which chunk is
// downloaded, stepped and uploaded when, in the host's issue order), the walk over it, and the host
// step. A device supplies the copies (OffloadTransfers; the CUDA backend's HostOffload).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "orrery/runtime/optimizer.hpp"
#include "orrery/runtime/tensor.hpp"

namespace orrery::profiler {
class Recorder;
}

namespace orrery::runtime {

class OffloadStore;

// Gradient staging buffers: chunk i downloads into buffer i % 2. Two suffice: chunk i+1's download
// is issued after chunk i-1's host step, the last reader of its buffer, has returned.
inline constexpr int kOffloadStagingBuffers = 2;

enum class OffloadOpKind : uint8_t {
  kDownload,  // the chunk's gradients, device to staging buffer (queued)
  kStep,      // AdamW on the host (waits for the chunk's download first)
  kUpload,    // the chunk's updated master weights, host to device parameters (queued)
};
struct OffloadOp {
  OffloadOpKind kind = OffloadOpKind::kStep;
  std::size_t chunk = 0;
  int buffer = -1;  // the staging buffer (downloads and steps), -1 for uploads
  bool operator==(const OffloadOp&) const = default;
};

// The host's issue order for `chunks` chunks, 3 * chunks operations:
//   D0, then for i = 0 .. chunks-1:  D(i+1) (when i+1 < chunks), S(i), U(i)
// i.e. D0 D1 S0 U0 D2 S1 U1 ... S(c-1) U(c-1). The copy stream runs the D and U in this order, so
// while the host runs S(i) it holds D(i+1) and U(i-1), queued before S(i).
std::vector<OffloadOp> offload_chunk_schedule(std::size_t chunks);

// What a device provides for the pipeline, over one range at a time: its gradients and parameters
// (device memory) and the master weights (host memory) of the range, element 0 each at the
// range's first element.
class OffloadTransfers {
 public:
  virtual ~OffloadTransfers() = default;
  // Queues the copy of gradients [first, first + n) into staging buffer `buffer`.
  virtual void download(std::size_t first, std::size_t n, int buffer) = 0;
  // Waits for the last download queued into `buffer`; its host memory.
  virtual const float* downloaded(int buffer) = 0;
  // Queues the copy of master weights [first, first + n) into the device's parameters.
  virtual void upload(std::size_t first, std::size_t n) = 0;
};

// Walks offload_chunk_schedule over a range of `count` elements in chunks of `chunk` (clamped to
// [1, count]): before_step(i) issues what precedes S(i) and returns chunk i's gradients,
// downloaded; after_step(i) issues what follows, up to S(i+1).
class OffloadPipeline {
 public:
  OffloadPipeline(OffloadTransfers& t, std::size_t count, std::size_t chunk);
  std::size_t chunks() const { return chunks_; }
  std::size_t first(std::size_t i) const { return i * chunk_; }
  std::size_t size(std::size_t i) const;
  const float* before_step(std::size_t i);
  void after_step(std::size_t i);

 private:
  void issue(const OffloadOp& op);

  OffloadTransfers& t_;
  std::size_t count_, chunk_, chunks_;
  std::vector<OffloadOp> schedule_;
  std::size_t pos_ = 0;  // the next operation of schedule_ to issue
};

// One range's AdamW through the pipeline: `count` elements whose master weights start at
// `master`, moments at element `moment_begin` of `m` / `v` (host arrays) or, when `store` is not
// null, of the store's planes 0 and 1 (streamed by for_each_chunk, whose chunks are then the
// pipeline's), flat offset `flat_offset` (the decay ranges' coordinates). A null `master` (ZeRO 3
// with zero.offload_params: the device holds no shard) takes the master weights from the store's
// plane 2, written back with the moments; the transfers then have no parameters to upload. Each
// chunk's host step is adamw_update on it, so the result is bit for bit the whole range's
// adamw_update (elementwise).
// Spans (rec may be null): "offload.adamw" per chunk, bytes 4 per element, step `label_step`.
struct OffloadRange {
  float* master = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  OffloadStore* store = nullptr;
  std::size_t moment_begin = 0, flat_offset = 0, count = 0;
};
void offload_adamw_range(OffloadTransfers& t, const OffloadRange& r, std::size_t chunk,
                         std::span<const ParamRange> decay, int64_t adam_step,
                         const AdamWConfig& cfg, profiler::Recorder* rec, int32_t label_step);

// ZeRO 3 with zero.offload_params on a device: the parameter shards live in the offload file
// (plane 2), and each gather's send buffer must be device memory. A device provides `slots()`
// staging slots (0-3: zero3_slot's working buffers; 4 and 5: an MoE block's experts of block
// buffers 0 and 1, when the model has experts), each a host buffer the file's read fills and a
// device buffer the gather reads, of the largest shard. The loop calls, per gather:
//   host(slot)          before the file's read into the slot: waits (host) for the slot's last
//                       upload, so the read never overwrites memory a copy still reads;
//   upload(slot, n)     after the read: queues the copy of n elements into the device buffer and
//                       orders the device's next work (the gather the loop issues next) after it;
//                       returns the device buffer;
//   released(slot)      after the slot's gather is waited for: the next upload into the slot's
//                       device buffer may run once the device's work queued so far is done.
class ShardStaging {
 public:
  virtual ~ShardStaging() = default;
  virtual int slots() const = 0;
  virtual float* host(int slot) = 0;
  // `step` and `layer` (the segment) label the copy's span.
  virtual const float* upload(int slot, std::size_t n, int32_t step, int layer) = 0;
  virtual void released(int slot) = 0;
  virtual std::size_t host_bytes() const = 0;    // the host buffers (pinned on CUDA)
  virtual std::size_t device_bytes() const = 0;  // the device buffers
};

}  // namespace orrery::runtime
