// NVMe offload of ZeRO's state (issue 18; ZeRO-Infinity, Rajbhandari et al. 2021): the AdamW
// moments of the range a rank updates (and, under ZeRO 3 with zero.offload_params, its parameter
// shards) live in one file per rank under zero.nvme_path, not in memory.
//
// OffloadStore holds P planes of n floats in the file, plane j at byte offset j * n * 4 (moments:
// m, v; with parameters: m, v, p). One I/O thread serves it with pread / pwrite, FIFO, each request
// recorded as a Memcpy span "offload.read" / "offload.write" (bytes) on the stream "offload"
// (model/names.hpp). for_each_chunk streams a range through three chunk buffers: chunk i+1 is read
// while the caller works on chunk i and chunk i-1 is written behind, so memory holds 3 * P * chunk
// floats whatever n. The file is written in full (zeros) when it is created, so a disk too small
// fails then, not in the middle of a step; it is removed when the store goes.
//
// Errors name the file: a failed or short read or write (a full disk: ENOSPC, a file-size limit:
// EFBIG), and a file that vanished (unlinked, or replaced by another) since it was created, checked
// before every pass. They are InternalError: the run stops (launch.cpp: the failing rank aborts the
// job, its trace is salvaged).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "orrery/runtime/tensor.hpp"

namespace orrery::profiler {
class Recorder;
}

namespace orrery::runtime {

// Unlinks every offload file of this process still open: the failure paths that end the process
// without unwinding (MPI_Abort, SIGTERM from mpirun) call it, so nvme_path is left clean.
void remove_offload_files_for_exit() noexcept;

// One file of `bytes`, created (O_EXCL) under `dir` as "orrery-offload-<host>-<pid>-<tag>.bin",
// so concurrent ranks and jobs never share one; closed and unlinked on destruction.
class OffloadFile {
 public:
  OffloadFile(const std::string& dir, const std::string& tag, std::size_t bytes);
  ~OffloadFile();
  OffloadFile(const OffloadFile&) = delete;
  OffloadFile& operator=(const OffloadFile&) = delete;

  // The whole of [offset, offset + bytes), or InternalError naming the path.
  void read(void* dst, std::size_t bytes, uint64_t offset) const;
  void write(const void* src, std::size_t bytes, uint64_t offset) const;
  // InternalError when the path no longer names this file (removed, or replaced).
  void check_present() const;
  const std::string& path() const { return path_; }
  std::size_t size_bytes() const { return bytes_; }
  // Whether the file bypasses the page cache (O_DIRECT): set after creation where the filesystem
  // allows it; where it refuses (EINVAL: some network and FUSE filesystems, tmpfs before Linux 6.6)
  // the file stays buffered and one line on stderr says so. Direct I/O moves whole aligned blocks
  // (kDirectAlign): a request not aligned in address, offset or size goes through an aligned
  // bounce buffer, its partial edge blocks read first (a read-modify-write; the file's I/O is on
  // one thread at a time), so the file may end up to one block longer than size_bytes().
  bool direct() const { return direct_; }
  static constexpr std::size_t kDirectAlign = 4096;

 private:
  void buffered(bool why_einval) const;  // O_DIRECT off, with the message
  // Aligned transfers of the whole range (raw_read: false at the end of the file).
  bool raw_read(char* p, std::size_t bytes, uint64_t offset) const;
  void raw_write(const char* p, std::size_t bytes, uint64_t offset) const;
  char* bounce(std::size_t bytes) const;

  std::string path_;
  std::size_t bytes_ = 0;
  int fd_ = -1;
  uint64_t dev_ = 0, ino_ = 0;
  mutable bool direct_ = false;
  mutable std::unique_ptr<char, void (*)(void*)> bounce_{nullptr, std::free};
  mutable std::size_t bounce_bytes_ = 0;
};

class OffloadStore {
 public:
  // `planes` arrays of `n` floats, `chunk` floats per plane per I/O request (clamped to [1, n]).
  // `rec` may be null; spans go on names::kStreamOffload.
  OffloadStore(const std::string& dir, const std::string& tag, int planes, std::size_t n,
               std::size_t chunk, profiler::Recorder* rec);
  ~OffloadStore();
  OffloadStore(const OffloadStore&) = delete;
  OffloadStore& operator=(const OffloadStore&) = delete;

  // Calls fn(first, count, ptrs) for consecutive chunks of [begin, begin + count) in order, ptrs[j]
  // the chunk's elements of plane j (read ahead, written back after fn returns). `step` labels
  // the spans.
  using ChunkFn = std::function<void(std::size_t first, std::size_t count, float* const* ptrs)>;
  void for_each_chunk(std::size_t begin, std::size_t count, int32_t step, const ChunkFn& fn);

  // Asynchronous copies of [begin, begin + count) of one plane (the ZeRO 3 parameter read-ahead):
  // a ticket to wait() for; wait() rethrows the request's error. `dst` must stay valid until then.
  uint64_t read_async(int plane, std::size_t begin, std::size_t count, float* dst, int32_t step);
  void wait(uint64_t ticket);
  // Synchronous copies of a range of one plane (checkpoints, the initial state).
  void read(int plane, std::size_t begin, std::size_t count, float* dst, int32_t step);
  void write(int plane, std::size_t begin, std::size_t count, const float* src, int32_t step);
  // Waits for every request submitted so far, dropping their errors (an owner going away after a
  // failure: no request still writes into its memory).
  void drain() noexcept;

  const std::string& path() const { return file_.path(); }
  std::size_t file_bytes() const { return file_.size_bytes(); }
  std::size_t buffer_bytes() const { return buffers_.size_bytes(); }
  std::size_t elems() const { return n_; }
  int planes() const { return planes_; }
  std::size_t chunk_elems() const { return chunk_; }  // floats per plane per chunk

 private:
  struct Request {
    bool write = false;
    std::vector<std::pair<float*, uint64_t>> pieces;  // (memory, byte offset in the file)
    std::size_t piece_bytes = 0;
    int32_t step = -1;
    uint64_t ticket = 0;
  };
  uint64_t submit(Request r);
  void run_io();
  Request chunk_request(bool write, std::size_t slot, std::size_t first, std::size_t n,
                        int32_t step);

  OffloadFile file_;
  int planes_;
  std::size_t n_, chunk_;
  profiler::Recorder* rec_;
  FloatArray buffers_;  // (3, planes, chunk)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> queue_;
  uint64_t submitted_ = 0, completed_ = 0;
  std::vector<std::pair<uint64_t, std::exception_ptr>> errors_;  // by ticket, until waited for
  bool stop_ = false;
  std::thread io_;
};

}  // namespace orrery::runtime
