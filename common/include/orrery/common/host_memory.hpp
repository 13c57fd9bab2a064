// This machine's physical memory, and its formatting, for the checks that refuse a request whose
// estimated host memory exceeds it before allocating anything (`orrery synth`, `orrery sim`).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace orrery {

// sysconf(_SC_PHYS_PAGES) x sysconf(_SC_PAGE_SIZE); 0 when the system does not say.
inline int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : 0;
}

// "23.4 GB", "1.7e+04 TB": decimal units, three significant figures.
inline std::string format_memory_bytes(double bytes) {
  char buf[48];
  if (bytes < 1e9) std::snprintf(buf, sizeof buf, "%.3g MB", bytes / 1e6);
  else if (bytes < 1e12) std::snprintf(buf, sizeof buf, "%.3g GB", bytes / 1e9);
  else std::snprintf(buf, sizeof buf, "%.3g TB", bytes / 1e12);
  return buf;
}

}  // namespace orrery
