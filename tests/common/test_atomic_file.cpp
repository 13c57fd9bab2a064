// Tests of the atomic output files (common/atomic_file.hpp): contents, no temporary left, errors
// naming the path, and the old file intact when a write fails.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "orrery/common/atomic_file.hpp"
#include "orrery/common/error.hpp"

namespace orrery {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("orrery_atomic_" + std::to_string(::getpid()) + "_" + std::string(info->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  fs::path dir_;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_plain(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// Throws and returns the message (empty when nothing was thrown).
template <typename F>
std::string input_error_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Lowers this process's file-size limit for the test: a write past it fails with EFBIG, which
// stands in for a full disk (ENOSPC) here: the same write(2) failing part-way through a file.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    rlimit r = old_;
    r.rlim_cur = bytes;
    ok_ = ::setrlimit(RLIMIT_FSIZE, &r) == 0;
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);  // else the write kills the process
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  bool ok_ = false;
  void (*old_handler_)(int) = nullptr;
};

TEST(AtomicFile, WritesTheContentsAndLeavesNoTemporary) {
  TempDir dir;
  const auto p = dir.path("out.csv");
  write_file_atomic(p, "a,b\n1,2\n");
  EXPECT_EQ(read_file(p), "a,b\n1,2\n");
  EXPECT_FALSE(fs::exists(p + ".partial"));
  write_file_atomic(p, "replaced");
  EXPECT_EQ(read_file(p), "replaced");
  write_file_atomic(p, "");
  EXPECT_TRUE(fs::exists(p));
  EXPECT_EQ(fs::file_size(p), 0u);
  EXPECT_EQ(
      std::distance(fs::directory_iterator(fs::path(p).parent_path()), fs::directory_iterator()),
      1);
}

TEST(AtomicFile, StreamsSmallAndLargePieces) {
  TempDir dir;
  const auto p = dir.path("big.json");
  std::string expected;
  {
    AtomicFile f(p);
    for (int i = 0; i < 20000; ++i) {
      const std::string piece = std::to_string(i) + ",";
      f.stream() << piece;
      expected += piece;
    }
    const std::string large(300000, 'x');  // bigger than the buffer: written straight through
    f.stream() << large;
    f.write("tail");
    expected += large + "tail";
    EXPECT_FALSE(fs::exists(p)) << "visible before commit";
    f.commit();
  }
  EXPECT_EQ(read_file(p), expected);
  EXPECT_FALSE(fs::exists(p + ".partial"));
}

TEST(AtomicFile, MissingDirectoryIsAnInputErrorNamingThePath) {
  TempDir dir;
  const auto p = dir.path("no/such/dir/out.yaml");
  const std::string msg = input_error_of([&] { write_file_atomic(p, "x"); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
}

TEST(AtomicFile, NotCommittedLeavesTheOldFile) {
  TempDir dir;
  const auto p = dir.path("out.txt");
  write_plain(p, "old");
  {
    AtomicFile f(p);
    f.write("new contents");
  }
  EXPECT_EQ(read_file(p), "old");
  EXPECT_FALSE(fs::exists(p + ".partial"));
}

TEST(AtomicFile, FailedWriteLeavesTheOldFileAndNoTemporary) {
  TempDir dir;
  const auto p = dir.path("out.csv");
  write_plain(p, "old contents\n");
  const std::string big(1 << 20, 'y');
  std::string msg;
  {
    FileSizeLimit limit(64 * 1024);
    ASSERT_TRUE(limit.ok());
    msg = input_error_of([&] { write_file_atomic(p, big); });
  }
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("write failed: File too large"), std::string::npos) << msg;
  EXPECT_EQ(read_file(p), "old contents\n");
  EXPECT_FALSE(fs::exists(p + ".partial"));

  // The same through the stream: the error is kept, commit() throws it and removes the temporary.
  {
    FileSizeLimit limit(64 * 1024);
    AtomicFile f(p);
    f.stream() << big;
    EXPECT_TRUE(f.stream().bad());
    EXPECT_THROW(f.throw_if_failed(), InputError);
    msg = input_error_of([&] { f.commit(); });
  }
  EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
  EXPECT_EQ(read_file(p), "old contents\n");
  EXPECT_FALSE(fs::exists(p + ".partial"));
}

TEST(AtomicFile, FailedRenameLeavesTheTargetAndNoTemporary) {
  TempDir dir;
  const auto p = dir.path("taken");
  fs::create_directories(fs::path(p) / "inside");  // a non-empty directory cannot be replaced
  const std::string msg = input_error_of([&] { write_file_atomic(p, "x"); });
  EXPECT_NE(msg.find(p + ": cannot replace it with the new file"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_directory(fs::path(p) / "inside"));
  EXPECT_FALSE(fs::exists(p + ".partial"));
}

TEST(AtomicFile, ReadOnlyDirectoryIsAnInputError) {
  TempDir dir;
  const auto d = dir.path("ro");
  const auto p = d + "/out.txt";
  fs::create_directories(d);
  write_plain(p, "old");
  using fs::perms;
  fs::permissions(d, perms::owner_read | perms::owner_exec | perms::group_read | perms::group_exec |
                         perms::others_read | perms::others_exec);
  // In a child process, which drops to nobody when it runs as root (root ignores permissions).
  const auto attempt = [&] {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) std::_Exit(3);
    const std::string msg = input_error_of([&] { write_file_atomic(p, "new"); });
    std::_Exit(
        msg.find(p) != std::string::npos && msg.find("Permission denied") != std::string::npos ? 0
                                                                                               : 1);
  };
  EXPECT_EXIT(attempt(), ::testing::ExitedWithCode(0), "");
  fs::permissions(d, perms::owner_all);
  EXPECT_EQ(read_file(p), "old");
  EXPECT_FALSE(fs::exists(p + ".partial"));
}

TEST(AtomicFile, ByNameCommitsWhatTheWriterWroteAndClearsSidecars) {
  TempDir dir;
  const auto p = dir.path("t.db");
  write_plain(p, "old");
  write_plain(p + "-wal", "stale journal of the old file");
  {
    AtomicFile f(p, AtomicFile::ByName{{"-wal", "-shm"}});
    EXPECT_EQ(f.temp_path(), p + ".partial");
    EXPECT_THROW(f.stream(), InternalError);
    write_plain(f.temp_path(), "new");
    f.commit();
  }
  EXPECT_EQ(read_file(p), "new");
  EXPECT_FALSE(fs::exists(p + "-wal"));
  EXPECT_FALSE(fs::exists(p + ".partial"));

  // Discarded: the temporary and its sidecars go, the target stays.
  {
    AtomicFile f(p, AtomicFile::ByName{{"-wal"}});
    write_plain(f.temp_path(), "half");
    write_plain(f.temp_path() + "-wal", "half");
  }
  EXPECT_EQ(read_file(p), "new");
  EXPECT_FALSE(fs::exists(p + ".partial"));
  EXPECT_FALSE(fs::exists(p + ".partial-wal"));

  // The writer removed the temporary: an internal error, the target untouched.
  {
    AtomicFile f(p, AtomicFile::ByName{});
    EXPECT_TRUE(fs::exists(f.temp_path())) << "created empty for the writer";
    fs::remove(f.temp_path());
    EXPECT_THROW(f.commit(), InternalError);
  }
  EXPECT_EQ(read_file(p), "new");

  // A place that cannot be written fails at once, naming the target.
  const auto missing = dir.path("no/such/dir/t.db");
  const std::string msg =
      input_error_of([&] { AtomicFile f(missing, AtomicFile::ByName{{"-wal"}}); });
  EXPECT_NE(msg.find(missing + ": cannot create output file: No such file or directory"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace orrery
