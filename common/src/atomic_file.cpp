// Output files written whole or not at all (atomic_file.hpp): a temporary beside the target,
// fsync, rename, directory fsync.
#include "orrery/common/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <filesystem>
#include <streambuf>
#include <system_error>

#include "orrery/common/error.hpp"

namespace orrery {
namespace {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// After the rename the new file is in place whatever happens here; a directory that cannot be
// synced (some file systems refuse it) only makes the rename less durable across a power loss.
void sync_directory_of(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

// A buffered stream onto the temporary's descriptor that keeps the first write error's errno (an
// ofstream forgets why it failed).
class AtomicFile::FdBuf : public std::streambuf {
 public:
  explicit FdBuf(int fd) : fd_(fd) { setp(buf_.data(), buf_.data() + buf_.size()); }
  ~FdBuf() override { close_fd(); }
  FdBuf(const FdBuf&) = delete;
  FdBuf& operator=(const FdBuf&) = delete;

  int fd() const { return fd_; }
  int error() const { return err_; }

  // Writes out what is buffered; false (error() set) on a write error.
  bool drain() {
    const auto n = static_cast<size_t>(pptr() - pbase());
    if (n > 0 && !write_all(pbase(), n)) return false;
    setp(buf_.data(), buf_.data() + buf_.size());
    return err_ == 0;
  }
  // Closes the descriptor; the errno of a failed close (NFS reports ENOSPC there), else 0.
  int close_fd() {
    if (fd_ < 0) return 0;
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }

 protected:
  int_type overflow(int_type ch) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    // Large pieces go straight to the file rather than through the buffer.
    if (static_cast<size_t>(n) < buf_.size()) return std::streambuf::xsputn(s, n);
    if (!drain() || !write_all(s, static_cast<size_t>(n))) return 0;
    return n;
  }
  int sync() override { return drain() ? 0 : -1; }

 private:
  bool write_all(const char* p, size_t n) {
    if (err_ != 0) return false;
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        err_ = errno;
        return false;
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }

  int fd_ = -1;
  int err_ = 0;
  std::array<char, 1 << 16> buf_{};
};

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), temp_(path_ + ".partial") {
  const int fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) throw InputError(path_ + ": cannot create output file: " + errno_text(errno));
  buf_ = std::make_unique<FdBuf>(fd);
  out_ = std::make_unique<std::ostream>(buf_.get());
}

AtomicFile::AtomicFile(std::string path, ByName by_name)
    : path_(std::move(path)), temp_(path_ + ".partial"), sidecars_(std::move(by_name.sidecars)) {
  // Created here, empty, so that a place that cannot be written fails now with an error naming the
  // target rather than the temporary; the writer replaces it.
  const int fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) throw InputError(path_ + ": cannot create output file: " + errno_text(errno));
  ::close(fd);
}

AtomicFile::~AtomicFile() {
  if (!committed_) discard();
}

void AtomicFile::write(std::string_view data) {
  if (!buf_) throw InternalError(path_ + ": an AtomicFile opened by name is written by its writer");
  buf_->sputn(data.data(), static_cast<std::streamsize>(data.size()));
  throw_if_failed();
}

std::ostream& AtomicFile::stream() {
  if (!out_) throw InternalError(path_ + ": an AtomicFile opened by name has no stream");
  return *out_;
}

void AtomicFile::throw_if_failed() const {
  if (buf_ && buf_->error() != 0)
    throw InputError(path_ + ": write failed: " + errno_text(buf_->error()));
}

void AtomicFile::commit() {
  if (committed_) throw InternalError(path_ + ": committed twice");
  try {
    int fd = -1;
    if (buf_) {
      out_->flush();
      buf_->drain();
      throw_if_failed();
      fd = buf_->fd();
    } else {
      fd = ::open(temp_.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0)
        throw InternalError(temp_ + ": the writer left no file to commit: " + errno_text(errno));
    }
    const int sync_err = ::fsync(fd) == 0 ? 0 : errno;
    int close_err = 0;
    if (buf_) {
      close_err = buf_->close_fd();
    } else {
      ::close(fd);
    }
    if (sync_err != 0) throw InputError(path_ + ": cannot flush to disk: " + errno_text(sync_err));
    if (close_err != 0) throw InputError(path_ + ": write failed: " + errno_text(close_err));
    std::error_code ec;
    for (const auto& s : sidecars_) std::filesystem::remove(path_ + s, ec);
    if (::rename(temp_.c_str(), path_.c_str()) != 0) {
      throw InputError(path_ + ": cannot replace it with the new file: " + errno_text(errno));
    }
  } catch (...) {
    discard();
    throw;
  }
  committed_ = true;
  sync_directory_of(path_);
}

void AtomicFile::discard() noexcept {
  out_.reset();
  buf_.reset();  // closes the descriptor
  std::error_code ec;
  std::filesystem::remove(temp_, ec);
  for (const auto& s : sidecars_) std::filesystem::remove(temp_ + s, ec);
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

}  // namespace orrery
