// Packed blocks of spans: the compact form the store keeps beside its spans table so that
// load_all() and window queries decode bytes instead of stepping SQLite once per span.
// Private to the traces library.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orrery/traces/span.hpp"

namespace orrery::traces::detail {

// At most this many spans per block: a window query decodes at most two partial blocks more
// than it returns.
inline constexpr size_t kBlockSpans = 1024;

// Appends `n` spans of one (rank, stream), sorted by start, to `out`. Format per span:
// a presence byte (bit i set: optional field i differs from its default), zigzag varints of
// start - previous start, duration, name, kind, op, then the present fields in order step,
// micro_batch, layer, bytes (zigzag varints), flops (8 bytes, IEEE little-endian), comm, peer,
// seq (zigzag varints). rank and stream are the block's.
void encode_block(const Span* spans, size_t n, std::string& out);

// Decodes a block of `count` spans of (rank, stream) into out[0..count). Returns false if the
// bytes are malformed (the caller reports a corrupt file).
bool decode_block(const unsigned char* data, size_t size, int32_t rank, int32_t stream,
                  size_t count, Span* out);

}  // namespace orrery::traces::detail
