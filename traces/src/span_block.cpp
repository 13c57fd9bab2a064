// Packed span and counter blocks (see span_block.hpp): zigzag varints, a presence byte per span,
// and the blocks' CRC32C.
#include "span_block.hpp"

#include <cstring>

#include "orrery/common/crc32c.hpp"

namespace orrery::traces::detail {
namespace {

inline uint64_t zigzag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
inline int64_t unzigzag(uint64_t v) {
  return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}

inline void put_f64(std::string& out, uint64_t bits) {
  char b[8];
  for (int k = 0; k < 8; ++k) b[k] = static_cast<char>((bits >> (8 * k)) & 0xff);
  out.append(b, 8);
}

inline void put_varint(std::string& out, uint64_t v) {
  char buf[10];
  int n = 0;
  while (v >= 0x80) {
    buf[n++] = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  buf[n++] = static_cast<char>(v);
  out.append(buf, static_cast<size_t>(n));
}

struct Cursor {
  const unsigned char* p;
  const unsigned char* end;
  bool ok = true;

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p == end) {
        ok = false;
        return 0;
      }
      const unsigned char b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    ok = false;
    return 0;
  }
  int64_t svarint() { return unzigzag(varint()); }
  double f64() {
    if (end - p < 8) {
      ok = false;
      return 0;
    }
    uint64_t bits = 0;
    for (int i = 7; i >= 0; --i) bits = (bits << 8) | p[i];
    p += 8;
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
  }
};

enum : unsigned {
  kHasStep = 1u << 0,
  kHasMicroBatch = 1u << 1,
  kHasLayer = 1u << 2,
  kHasBytes = 1u << 3,
  kHasFlops = 1u << 4,
  kHasComm = 1u << 5,
  kHasPeer = 1u << 6,
  kHasSeq = 1u << 7,
};

}  // namespace

void encode_block(const Span* spans, size_t n, std::string& out) {
  int64_t prev_start = 0;
  for (size_t i = 0; i < n; ++i) {
    const Span& s = spans[i];
    unsigned mask = 0;
    if (s.step != -1) mask |= kHasStep;
    if (s.micro_batch != -1) mask |= kHasMicroBatch;
    if (s.layer != -1) mask |= kHasLayer;
    if (s.bytes != 0) mask |= kHasBytes;
    // Compare the bits so that -0.0 and NaN payloads survive the round trip.
    uint64_t flops_bits;
    std::memcpy(&flops_bits, &s.flops, sizeof flops_bits);
    if (flops_bits != 0) mask |= kHasFlops;
    if (s.comm != -1) mask |= kHasComm;
    if (s.peer != -1) mask |= kHasPeer;
    if (s.seq != -1) mask |= kHasSeq;
    out.push_back(static_cast<char>(mask));
    // Differences in unsigned arithmetic: wrap-around is defined and undone by the decoder.
    put_varint(out, zigzag(static_cast<int64_t>(static_cast<uint64_t>(s.start_ns) -
                                                static_cast<uint64_t>(prev_start))));
    put_varint(out, zigzag(static_cast<int64_t>(static_cast<uint64_t>(s.end_ns) -
                                                static_cast<uint64_t>(s.start_ns))));
    prev_start = s.start_ns;
    put_varint(out, s.name);
    put_varint(out, zigzag(static_cast<int64_t>(s.kind)));
    put_varint(out, zigzag(static_cast<int64_t>(s.op)));
    if (mask & kHasStep) put_varint(out, zigzag(s.step));
    if (mask & kHasMicroBatch) put_varint(out, zigzag(s.micro_batch));
    if (mask & kHasLayer) put_varint(out, zigzag(s.layer));
    if (mask & kHasBytes) put_varint(out, zigzag(s.bytes));
    if (mask & kHasFlops) put_f64(out, flops_bits);
    if (mask & kHasComm) put_varint(out, zigzag(s.comm));
    if (mask & kHasPeer) put_varint(out, zigzag(s.peer));
    if (mask & kHasSeq) put_varint(out, zigzag(s.seq));
  }
}

bool decode_block(const unsigned char* data, size_t size, int32_t rank, int32_t stream,
                  size_t count, Span* out) {
  Cursor c{data, data + size};
  uint64_t prev_start = 0;
  for (size_t i = 0; i < count; ++i) {
    if (c.p == c.end) return false;
    const unsigned mask = *c.p++;
    Span& s = out[i];
    s.rank = rank;
    s.stream = stream;
    prev_start += static_cast<uint64_t>(c.svarint());
    s.start_ns = static_cast<int64_t>(prev_start);
    s.end_ns = static_cast<int64_t>(prev_start + static_cast<uint64_t>(c.svarint()));
    s.name = static_cast<NameId>(c.varint());
    s.kind = static_cast<SpanKind>(c.svarint());
    s.op = static_cast<CollOp>(c.svarint());
    s.step = (mask & kHasStep) ? static_cast<int32_t>(c.svarint()) : -1;
    s.micro_batch = (mask & kHasMicroBatch) ? static_cast<int32_t>(c.svarint()) : -1;
    s.layer = (mask & kHasLayer) ? static_cast<int32_t>(c.svarint()) : -1;
    s.bytes = (mask & kHasBytes) ? c.svarint() : 0;
    s.flops = (mask & kHasFlops) ? c.f64() : 0.0;
    s.comm = (mask & kHasComm) ? static_cast<int32_t>(c.svarint()) : -1;
    s.peer = (mask & kHasPeer) ? static_cast<int32_t>(c.svarint()) : -1;
    s.seq = (mask & kHasSeq) ? c.svarint() : -1;
    if (!c.ok) return false;
  }
  return c.p == c.end;
}

void encode_counter_block(const CounterSample* samples, size_t n, std::string& out) {
  int64_t prev = 0;
  for (size_t i = 0; i < n; ++i) {
    const CounterSample& c = samples[i];
    put_varint(out, zigzag(static_cast<int64_t>(static_cast<uint64_t>(c.ts_ns) -
                                                static_cast<uint64_t>(prev))));
    prev = c.ts_ns;
    uint64_t bits;
    std::memcpy(&bits, &c.value, sizeof bits);
    put_f64(out, bits);
  }
}

bool decode_counter_block(const unsigned char* data, size_t size, int32_t rank, NameId name,
                          size_t count, CounterSample* out) {
  Cursor c{data, data + size};
  uint64_t prev = 0;
  for (size_t i = 0; i < count; ++i) {
    CounterSample& s = out[i];
    s.rank = rank;
    s.name = name;
    prev += static_cast<uint64_t>(c.svarint());
    s.ts_ns = static_cast<int64_t>(prev);
    s.value = c.f64();
    if (!c.ok) return false;
  }
  return c.p == c.end;
}

uint32_t block_crc(int64_t key0, int64_t key1, int64_t count, const unsigned char* data,
                   size_t size) {
  unsigned char head[16];
  const auto k0 = static_cast<uint32_t>(key0), k1 = static_cast<uint32_t>(key1);
  const auto n = static_cast<uint64_t>(count);
  for (int i = 0; i < 4; ++i) {
    head[i] = static_cast<unsigned char>(k0 >> (8 * i));
    head[4 + i] = static_cast<unsigned char>(k1 >> (8 * i));
  }
  for (int i = 0; i < 8; ++i) head[8 + i] = static_cast<unsigned char>(n >> (8 * i));
  return crc32c(data, size, crc32c(head, sizeof head));
}

}  // namespace orrery::traces::detail
