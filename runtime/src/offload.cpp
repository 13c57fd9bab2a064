// The NVMe offload file and its I/O thread (offload.hpp).
#include "orrery/runtime/offload.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/model/names.hpp"
#include "orrery/profiler/recorder.hpp"

namespace orrery::runtime {

namespace {
std::string host_tag() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "host";
  std::string h(host);
  for (char& c : h) {
    if (c == '/' || c == ' ') c = '_';
  }
  return h;
}

std::mutex& live_mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<std::string>& live_files() {
  static std::vector<std::string> files;
  return files;
}
void set_live(const std::string& path, bool live) {
  std::lock_guard lock(live_mutex());
  auto& v = live_files();
  if (live) {
    v.push_back(path);
  } else {
    v.erase(std::remove(v.begin(), v.end(), path), v.end());
  }
}

[[noreturn]] void io_failed(const std::string& path, const char* what, int err) {
  std::string why = std::strerror(err);
  if (err == ENOSPC) why += " (the disk under zero.nvme_path is full)";
  if (err == EFBIG) why += " (a file-size limit, ulimit -f, is below the offload file's size)";
  throw InternalError("offload file '" + path + "': " + what + " failed: " + why);
}
}  // namespace

void remove_offload_files_for_exit() noexcept {
  std::unique_lock lock(live_mutex(), std::try_to_lock);  // never wait at exit
  if (!lock.owns_lock()) return;
  for (const auto& f : live_files()) ::unlink(f.c_str());
  live_files().clear();
}

OffloadFile::OffloadFile(const std::string& dir, const std::string& tag, std::size_t bytes)
    : bytes_(bytes) {
  path_ = (std::filesystem::path(dir) /
           ("orrery-offload-" + host_tag() + "-" + std::to_string(::getpid()) + "-" + tag + ".bin"))
              .string();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd_ < 0) io_failed(path_, "create", errno);
  set_live(path_, true);
  struct stat st {};
  ::fstat(fd_, &st);
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  // O_DIRECT after creation: a filesystem that refuses it leaves the descriptor as it was.
  const int flags = ::fcntl(fd_, F_GETFL);
  direct_ = flags >= 0 && ::fcntl(fd_, F_SETFL, flags | O_DIRECT) == 0;
  if (!direct_) buffered(errno == EINVAL);
}

void OffloadFile::buffered(bool why_einval) const {
  direct_ = false;
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0 && (flags & O_DIRECT) != 0) ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT);
  std::fprintf(stderr,
               "orrery: offload file '%s': %s; buffered I/O instead (the page cache holds a copy "
               "of the offloaded state)\n",
               path_.c_str(),
               why_einval ? "the filesystem refuses O_DIRECT" : "O_DIRECT could not be set");
}

char* OffloadFile::bounce(std::size_t bytes) const {
  if (bytes > bounce_bytes_) {
    void* p = std::aligned_alloc(kDirectAlign, bytes);
    if (p == nullptr) throw std::bad_alloc();
    bounce_.reset(static_cast<char*>(p));
    bounce_bytes_ = bytes;
  }
  return bounce_.get();
}

OffloadFile::~OffloadFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  set_live(path_, false);
  struct stat st {};
  // Only our own file: another one at the path (it vanished and was replaced) is left alone.
  if (::stat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_)
    ::unlink(path_.c_str());
}

bool OffloadFile::raw_read(char* p, std::size_t bytes, uint64_t offset) const {
  while (bytes > 0) {
    const ssize_t got = ::pread(fd_, p, bytes, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) io_failed(path_, "read", errno);
    if (got == 0) {
      std::memset(p, 0, bytes);  // past the end: what a later write extends the file by
      return false;
    }
    p += got;
    offset += static_cast<uint64_t>(got);
    bytes -= static_cast<std::size_t>(got);
  }
  return true;
}

void OffloadFile::raw_write(const char* p, std::size_t bytes, uint64_t offset) const {
  while (bytes > 0) {
    const ssize_t put = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) io_failed(path_, "write", put < 0 ? errno : ENOSPC);
    p += put;
    offset += static_cast<uint64_t>(put);
    bytes -= static_cast<std::size_t>(put);
  }
}

namespace {
bool aligned(const void* p, std::size_t bytes, uint64_t offset) {
  constexpr std::size_t a = OffloadFile::kDirectAlign;
  return reinterpret_cast<std::uintptr_t>(p) % a == 0 && bytes % a == 0 && offset % a == 0;
}
[[noreturn]] void ends_at(const std::string& path, uint64_t offset) {
  throw InternalError("offload file '" + path + "': read failed: the file ends before byte " +
                      std::to_string(offset) + " (truncated?)");
}
}  // namespace

void OffloadFile::read(void* dst, std::size_t bytes, uint64_t offset) const {
  auto* p = static_cast<char*>(dst);
  if (!direct_ || aligned(p, bytes, offset)) {
    if (!raw_read(p, bytes, offset)) ends_at(path_, offset + bytes);
    return;
  }
  // The aligned blocks around the range, through the bounce buffer.
  const uint64_t a0 = offset / kDirectAlign * kDirectAlign;
  const uint64_t a1 = (offset + bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  char* b = bounce(static_cast<std::size_t>(a1 - a0));
  if (!raw_read(b, static_cast<std::size_t>(a1 - a0), a0)) {
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || uint64_t(st.st_size) < offset + bytes)
      ends_at(path_, offset + bytes);
  }
  std::memcpy(p, b + (offset - a0), bytes);
}

void OffloadFile::write(const void* src, std::size_t bytes, uint64_t offset) const {
  const auto* p = static_cast<const char*>(src);
  if (!direct_ || aligned(p, bytes, offset)) return raw_write(p, bytes, offset);
  const uint64_t a0 = offset / kDirectAlign * kDirectAlign;
  const uint64_t a1 = (offset + bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  char* b = bounce(static_cast<std::size_t>(a1 - a0));
  // The partial edge blocks keep the bytes the file holds there (read-modify-write).
  if (offset != a0) raw_read(b, kDirectAlign, a0);
  const uint64_t last = a1 - kDirectAlign;
  if ((offset + bytes) % kDirectAlign != 0 && (last != a0 || offset == a0))
    raw_read(b + (last - a0), kDirectAlign, last);
  std::memcpy(b + (offset - a0), p, bytes);
  raw_write(b, static_cast<std::size_t>(a1 - a0), a0);
}

void OffloadFile::check_present() const {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0 || st.st_dev != dev_ || st.st_ino != ino_) {
    throw InternalError("offload file '" + path_ +
                        "' vanished (removed or replaced while the run was using it)");
  }
}

OffloadStore::OffloadStore(const std::string& dir, const std::string& tag, int planes,
                           std::size_t n, std::size_t chunk, profiler::Recorder* rec)
    : file_(dir, tag, static_cast<std::size_t>(planes) * n * sizeof(float)),
      planes_(planes),
      n_(n),
      chunk_(std::max<std::size_t>(1, std::min(chunk, n))),
      rec_(rec != nullptr && rec->enabled() ? rec : nullptr),
      buffers_(3 * static_cast<std::size_t>(planes) * chunk_) {
  if (rec_ != nullptr) {
    rec_->ensure_stream(model::names::kStreamOffload,
                        model::names::stream_name(model::names::kStreamOffload));
  }
  // The whole file written once (zeros: AdamW's initial moments), so its space is taken now.
  std::fill(buffers_.begin(), buffers_.end(), 0.0f);
  const std::size_t step_bytes = buffers_.size_bytes();
  for (std::size_t off = 0; off < file_.size_bytes(); off += step_bytes)
    file_.write(buffers_.data(), std::min(step_bytes, file_.size_bytes() - off), off);
  io_ = std::thread([this] { run_io(); });
}

OffloadStore::~OffloadStore() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (io_.joinable()) io_.join();
}

void OffloadStore::run_io() {
  profiler::Recorder::set_thread_stream(model::names::kStreamOffload);
  for (;;) {
    Request r;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_, everything done
      r = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr err;
    traces::Span s;
    if (rec_ != nullptr) {
      s.kind = traces::SpanKind::Memcpy;
      s.name = rec_->intern(r.write ? model::names::kOffloadWrite : model::names::kOffloadRead);
      s.stream = model::names::kStreamOffload;
      s.step = r.step;
      s.bytes = static_cast<int64_t>(r.piece_bytes * r.pieces.size());
      s.start_ns = profiler::steady_now_ns();
    }
    try {
      for (const auto& [mem, off] : r.pieces) {
        if (r.write)
          file_.write(mem, r.piece_bytes, off);
        else
          file_.read(mem, r.piece_bytes, off);
      }
    } catch (...) {
      err = std::current_exception();
    }
    if (rec_ != nullptr) {
      s.end_ns = profiler::steady_now_ns();
      rec_->record(s);
    }
    {
      std::lock_guard lock(mu_);
      if (err) errors_.emplace_back(r.ticket, err);
      completed_ = r.ticket;
    }
    cv_.notify_all();
  }
}

uint64_t OffloadStore::submit(Request r) {
  uint64_t t = 0;
  {
    std::lock_guard lock(mu_);
    t = ++submitted_;
    r.ticket = t;
    queue_.push_back(std::move(r));
  }
  cv_.notify_all();
  return t;
}

void OffloadStore::wait(uint64_t ticket) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return completed_ >= ticket; });
  for (auto it = errors_.begin(); it != errors_.end(); ++it) {
    if (it->first != ticket) continue;
    std::exception_ptr e = it->second;
    errors_.erase(it);
    std::rethrow_exception(e);
  }
}

void OffloadStore::drain() noexcept {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return completed_ >= submitted_; });
  errors_.clear();
}

OffloadStore::Request OffloadStore::chunk_request(bool write, std::size_t slot, std::size_t first,
                                                  std::size_t n, int32_t step) {
  Request r;
  r.write = write;
  r.step = step;
  r.piece_bytes = n * sizeof(float);
  for (int j = 0; j < planes_; ++j) {
    float* mem = buffers_.data() + (slot * static_cast<std::size_t>(planes_) + j) * chunk_;
    r.pieces.emplace_back(mem, (static_cast<uint64_t>(j) * n_ + first) * sizeof(float));
  }
  return r;
}

void OffloadStore::for_each_chunk(std::size_t begin, std::size_t count, int32_t step,
                                  const ChunkFn& fn) {
  if (count == 0) return;
  if (begin + count > n_) throw InternalError("offload: range beyond the store");
  file_.check_present();
  const std::size_t chunks = (count + chunk_ - 1) / chunk_;
  auto first_of = [&](std::size_t i) { return begin + i * chunk_; };
  auto size_of = [&](std::size_t i) { return std::min(chunk_, count - i * chunk_); };
  std::vector<uint64_t> reads(chunks), writes(chunks);
  try {
    reads[0] = submit(chunk_request(false, 0, first_of(0), size_of(0), step));
    for (std::size_t i = 0; i < chunks; ++i) {
      const std::size_t slot = i % 3;
      wait(reads[i]);
      if (i + 1 < chunks) {
        // Buffer (i+1) % 3 last held chunk i-2: its write must be done before it is read into.
        if (i >= 2) wait(writes[i - 2]);
        reads[i + 1] =
            submit(chunk_request(false, (i + 1) % 3, first_of(i + 1), size_of(i + 1), step));
      }
      float* ptrs[3] = {};
      for (int j = 0; j < planes_ && j < 3; ++j)
        ptrs[j] = buffers_.data() + (slot * static_cast<std::size_t>(planes_) + j) * chunk_;
      fn(first_of(i), size_of(i), ptrs);
      writes[i] = submit(chunk_request(true, slot, first_of(i), size_of(i), step));
    }
    for (const uint64_t w : writes) wait(w);  // each once more: an error of any is raised
  } catch (...) {
    drain();  // nothing still uses the buffers when the error leaves
    throw;
  }
}

uint64_t OffloadStore::read_async(int plane, std::size_t begin, std::size_t count, float* dst,
                                  int32_t step) {
  Request r;
  r.step = step;
  r.piece_bytes = count * sizeof(float);
  r.pieces.emplace_back(dst, (static_cast<uint64_t>(plane) * n_ + begin) * sizeof(float));
  return submit(std::move(r));
}

void OffloadStore::read(int plane, std::size_t begin, std::size_t count, float* dst, int32_t step) {
  file_.check_present();
  wait(read_async(plane, begin, count, dst, step));
}

void OffloadStore::write(int plane, std::size_t begin, std::size_t count, const float* src,
                         int32_t step) {
  file_.check_present();
  Request r;
  r.write = true;
  r.step = step;
  r.piece_bytes = count * sizeof(float);
  r.pieces.emplace_back(const_cast<float*>(src),
                        (static_cast<uint64_t>(plane) * n_ + begin) * sizeof(float));
  wait(submit(std::move(r)));
}

}  // namespace orrery::runtime
