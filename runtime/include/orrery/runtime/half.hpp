// 16-bit number formats emulated on fp32 bit patterns (runtime.precision bf16 | fp16 on device
// cpu): round-to-nearest-even conversion of a float to bfloat16 (8-bit exponent, 7-bit mantissa)
// or IEEE 754 binary16 (5-bit exponent, 10-bit mantissa, subnormals down to 2^-24), and back.
// NaN stays NaN (quiet, sign kept), ±inf stays ±inf, a finite value past the largest finite one
// (bf16 ~3.39e38, fp16 65504) after rounding becomes ±inf. Integer arithmetic only: the result is
// the same bit pattern on every machine and compiler.
#pragma once

#include <bit>
#include <cstdint>

#include "orrery/common/scenario.hpp"

namespace orrery::runtime {

inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // NaN
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even; a carry out of the
  // mantissa bumps the exponent (the largest finite values round to inf).
  const uint32_t rounded = x + 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

inline float bf16_bits_to_float(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

inline uint16_t float_to_fp16_bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  if (ax >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 2^16 or inf: inf
  const int e = static_cast<int>(ax >> 23) - 127;
  if (e >= -14) {  // normal: drop 13 mantissa bits; a carry may reach the exponent (65520 -> inf)
    uint32_t h = (static_cast<uint32_t>(e + 15) << 10) | ((ax >> 13) & 0x3FFu);
    const uint32_t rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  // Subnormal (units of 2^-24): the full mantissa (implicit bit set) shifted right by -e - 1.
  const int shift = -e - 1;
  if (shift > 24) return sign;  // below 2^-25: rounds to zero (fp32 subnormals included)
  const uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u;
  uint32_t m = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (m & 1u))) ++m;  // m = 0x400 is the smallest normal: right
  return static_cast<uint16_t>(sign | m);
}

inline float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1Fu) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign != 0 ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

// f rounded to the format and back to fp32 (FP32 and TF32 leave it as it is).
inline float round_to(Precision p, float f) {
  switch (p) {
    case Precision::BF16:
      return bf16_bits_to_float(float_to_bf16_bits(f));
    case Precision::FP16:
      return fp16_bits_to_float(float_to_fp16_bits(f));
    default:
      return f;
  }
}

inline bool is_16_bit(Precision p) { return p == Precision::BF16 || p == Precision::FP16; }

}  // namespace orrery::runtime
