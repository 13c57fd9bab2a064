// CRC32C (Castagnoli): the checksum of checkpoint files (runtime/checkpoint.hpp) and of the trace
// store's packed span and counter blocks (traces/store.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace orrery {

// CRC32C (reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF), continuing
// from `crc` (0 to start): crc32c("123456789") = 0xE3069283, and crc32c(b, n, crc32c(a, m)) is the
// CRC of a followed by b. The SSE4.2 instruction when the CPU has it, a table otherwise.
uint32_t crc32c(const void* data, std::size_t bytes, uint32_t crc = 0);

// The same by the table alone (what crc32c() computes on a CPU without SSE4.2); for tests.
uint32_t crc32c_portable(const void* data, std::size_t bytes, uint32_t crc = 0);

}  // namespace orrery
