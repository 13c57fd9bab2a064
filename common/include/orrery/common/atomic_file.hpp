// Output files written whole or not at all. The contents go to a temporary beside the target
// ("<path>.partial", same directory, so the rename cannot cross file systems), are flushed to disk
// (fsync) and renamed over the target, then the directory is synced. A crash, a full disk or any
// error leaves the old file (or none) under the target's name, never a half-written one, and no
// temporary behind. Every file the CLI writes goes through here.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace orrery {

// Errors are InputError naming the target and the system's reason ("out.csv: write failed: No
// space left on device"): the user chose where to write, and `orrery` exits 2 for it.
class AtomicFile {
 public:
  // Creates the temporary (truncating a stale one) and opens it for write() and stream().
  explicit AtomicFile(std::string path);

  // For a writer that opens files by name (SQLite): the temporary is created empty (an unwritable
  // place fails here, naming the target); the writer writes temp_path() and closes it before
  // commit(). `sidecars` are the suffixes of files that writer keeps beside its file (SQLite:
  // "-wal", "-shm", "-journal"): removed beside the temporary when it is discarded, and beside the
  // target before the rename, so a stale journal is never applied to the new file.
  struct ByName {
    std::vector<std::string> sidecars;
  };
  AtomicFile(std::string path, ByName by_name);

  // Not committed: the temporary (and its sidecars) is removed; the target is untouched.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_; }

  // Appends to the temporary; throws on a write error.
  void write(std::string_view data);
  // The temporary as a stream, for writers that stream (large outputs are never held whole). A
  // write error sets badbit; throw_if_failed() and commit() then throw it with its reason.
  std::ostream& stream();
  // Throws the first write error seen by stream(), if any.
  void throw_if_failed() const;

  // Flushes, fsyncs and closes the temporary, renames it over the target and syncs the directory.
  // On failure the temporary is removed and the target keeps its old contents.
  void commit();

 private:
  class FdBuf;
  void discard() noexcept;

  std::string path_;
  std::string temp_;
  std::vector<std::string> sidecars_;
  std::unique_ptr<FdBuf> buf_;  // null for ByName
  std::unique_ptr<std::ostream> out_;
  bool committed_ = false;
};

// The whole of `contents` to `path` through an AtomicFile.
void write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace orrery
