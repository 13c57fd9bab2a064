// Helpers shared by the libFuzzer harnesses: the input as text, "#set" directives, a scratch file,
// and the one way a harness reports a broken invariant.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace orrery::fuzz {

inline std::string as_text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// Lines "#set key=value" are YAML comments, so the text still parses as it is; the harness also
// passes each as a --set override. Lets one input exercise the override path too.
inline std::vector<std::string> set_directives(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size() && out.size() < 8) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    if (line.substr(0, 5) == "#set ") out.emplace_back(line.substr(5));
    pos = eol + 1;
  }
  return out;
}

// A broken invariant (not a crash the sanitizers see): print why and abort, so libFuzzer keeps
// the input as a crash.
[[noreturn]] inline void fail(const std::string& why) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", why.c_str());
  std::abort();
}

// One scratch file per process (libFuzzer -fork/-jobs run several), rewritten for every input;
// SQLite's -wal and -shm companions are removed with it.
class ScratchFile {
 public:
  ScratchFile(const std::string& stem, const std::string& ext) {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir && *dir ? dir : "/tmp") + "/" + stem + "-" + std::to_string(getpid()) + ext;
  }
  ~ScratchFile() { remove(); }
  const std::string& write(const uint8_t* data, size_t size) {
    remove();
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    return path_;
  }
  void remove() {
    std::error_code ec;
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) std::filesystem::remove(path_ + suffix, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace orrery::fuzz
