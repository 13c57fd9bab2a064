// CRC32C (see crc32c.hpp): eight bytes at a time by the SSE4.2 crc32 instruction where the CPU has
// it (checked once), a 256-entry table otherwise.
#include "orrery/common/crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace orrery {
namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

uint32_t crc32c_table(const unsigned char* p, std::size_t n, uint32_t c) {
  static const std::array<uint32_t, 256> t = crc_table();
  for (std::size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const unsigned char* p, std::size_t n,
                                                        uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, std::size_t bytes, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  static const bool hw = __builtin_cpu_supports("sse4.2");
  crc = hw ? crc32c_sse42(p, bytes, crc) : crc32c_table(p, bytes, crc);
#else
  crc = crc32c_table(p, bytes, crc);
#endif
  return ~crc;
}

uint32_t crc32c_portable(const void* data, std::size_t bytes, uint32_t crc) {
  return ~crc32c_table(static_cast<const unsigned char*>(data), bytes, ~crc);
}

}  // namespace orrery
