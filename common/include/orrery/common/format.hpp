// Human-readable formatting of the quantities Orrery prints: durations, byte counts, rates.
#pragma once

#include <cstdint>
#include <string>

namespace orrery {

// 1234 -> "1.23 us"; picks ns, us, ms or s.
std::string format_duration_ns(double ns);
// 1536 -> "1.50 KiB".
std::string format_bytes(double bytes);
// Bytes per second as "GB/s" (decimal, as nccl-tests prints).
std::string format_gbps(double bytes_per_s);
// Parses "8", "1K", "1M", "1G" (binary multiples, as nccl-tests' -b/-e) into bytes; throws InputError.
int64_t parse_size(const std::string& text);

}  // namespace orrery
