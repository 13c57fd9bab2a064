// Packed blocks of spans and of counter samples: the compact form the store keeps so that
// load_all() and window queries decode bytes instead of stepping SQLite once per span, and the
// CRC32C each block carries (schema version 3). Private to the traces library.
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

// Appends `n` samples of one (rank, counter name), sorted by time, to `out`. Format per sample: the
// zigzag varint of ts_ns - previous ts_ns (the first: ts_ns), then the value (8 bytes, IEEE
// little-endian). rank and name are the block's.
void encode_counter_block(const CounterSample* samples, size_t n, std::string& out);

// Decodes a block of `count` samples of (rank, name) into out[0..count). Returns false if the
// bytes are malformed.
bool decode_counter_block(const unsigned char* data, size_t size, int32_t rank, NameId name,
                          size_t count, CounterSample* out);

// A block's checksum: CRC32C of its key (span block: rank, stream; counter block: rank, name id;
// each as a 32-bit little-endian integer), its count (64-bit little-endian), then its packed bytes.
// The key and count are covered so that a flipped bit there cannot move a block's spans to another
// stream unnoticed.
uint32_t block_crc(int64_t key0, int64_t key1, int64_t count, const unsigned char* data,
                   size_t size);

}  // namespace orrery::traces::detail
