// Formatting helpers for durations, sizes and rates.
#include "orrery/common/format.hpp"

#include <cmath>
#include <cstdio>

#include "orrery/common/error.hpp"

namespace orrery {

std::string format_duration_ns(double ns) {
  char buf[64];
  const double a = std::fabs(ns);
  if (a < 1e3) {
    std::snprintf(buf, sizeof buf, "%.0f ns", ns);
  } else if (a < 1e6) {
    std::snprintf(buf, sizeof buf, "%.2f us", ns / 1e3);
  } else if (a < 1e9) {
    std::snprintf(buf, sizeof buf, "%.2f ms", ns / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.3f s", ns / 1e9);
  }
  return buf;
}

std::string format_bytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024.0 && u < 5) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%.0f %s", bytes, kUnits[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", bytes, kUnits[u]);
  }
  return buf;
}

std::string format_gbps(double bytes_per_s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GB/s", bytes_per_s / 1e9);
  return buf;
}

int64_t parse_size(const std::string& text) {
  if (text.empty()) throw InputError("empty size; expected a number with an optional K, M or G suffix");
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw InputError("size '" + text + "' is not a number; expected e.g. 8, 64K, 1M, 1G");
  }
  double mult = 1;
  if (pos < text.size()) {
    const char s = text[pos];
    if (s == 'K' || s == 'k') mult = 1024.0;
    else if (s == 'M' || s == 'm') mult = 1024.0 * 1024;
    else if (s == 'G' || s == 'g') mult = 1024.0 * 1024 * 1024;
    else if (s == 'T' || s == 't') mult = 1024.0 * 1024 * 1024 * 1024;
    else throw InputError("size '" + text + "' has an unknown suffix; expected K, M, G or T");
    ++pos;
    if (pos < text.size() && (text[pos] == 'B' || text[pos] == 'b')) ++pos;
    if (pos != text.size()) throw InputError("size '" + text + "' has trailing characters");
  }
  if (value < 0) throw InputError("size '" + text + "' is negative");
  return static_cast<int64_t>(std::llround(value * mult));
}

}  // namespace orrery
