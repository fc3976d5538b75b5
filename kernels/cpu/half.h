// Exact fp16/bf16 ↔ fp32 conversions for the scalar kernels, and for converting one scale.
// Functions are `static inline` on purpose: the SIMD translation units are built with -mavx2 /
// -mavx512f, and a function with external linkage compiled there could be picked by the linker for
// scalar callers and fault on CPUs without those instructions.
#pragma once

#include <cstdint>
#include <cstring>

namespace onebit::kernels {

static inline float bits_to_float(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

static inline std::uint32_t float_to_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// IEEE binary16 → binary32, exact (subnormals and infinities included; NaN payloads kept).
static inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1Fu;
  std::uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) {
    // Infinity, or NaN made quiet with its payload kept — what F16C's vcvtph2ps does.
    return bits_to_float(sign | 0x7F800000u | (mantissa != 0 ? 0x400000u : 0u) | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_float(sign);
    // Subnormal: normalise the mantissa.
    int shift = 0;
    while ((mantissa & 0x400u) == 0) mantissa <<= 1, ++shift;
    mantissa &= 0x3FFu;
    exponent = static_cast<std::uint32_t>(127 - 15 + 1 - shift);
    return bits_to_float(sign | (exponent << 23) | (mantissa << 13));
  }
  return bits_to_float(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

// binary32 → binary16, round to nearest even (what F16C's vcvtps2ph does with imm 0).
static inline std::uint16_t float_to_half(float value) {
  const std::uint32_t f = float_to_bits(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((f >> 16) & 0x8000u);
  const std::uint32_t abs = f & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // Inf or NaN (NaN keeps its top payload bits and stays quiet)
    return static_cast<std::uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? (0x200u | ((abs >> 13) & 0x3FFu)) : 0u));
  }
  if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (abs < 0x38800000u) {               // result is subnormal or zero: round abs / 2^-24 to an integer
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const std::uint32_t exponent = abs >> 23;
    const std::uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
    // value = mantissa · 2^(exponent − 150); in units of 2^-24 that is mantissa >> (126 − exponent),
    // a shift of 14..24 here. Rounding up to 0x400 yields the smallest normal, correctly encoded.
    const std::uint32_t shift = 126 - exponent;
    const std::uint32_t kept = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    const std::uint32_t rounded = kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
    return static_cast<std::uint16_t>(sign | rounded);
  }
  // Normal: rebias the exponent, round the 23-bit mantissa to 10 bits; a carry rolls into the exponent.
  const std::uint32_t rebased = abs - ((127u - 15u) << 23);
  const std::uint32_t kept = rebased >> 13;
  const std::uint32_t rest = rebased & 0x1FFFu;
  const std::uint32_t rounded = kept + ((rest > 0x1000u || (rest == 0x1000u && (kept & 1))) ? 1 : 0);
  return static_cast<std::uint16_t>(sign | rounded);
}

static inline float bfloat16_to_float(std::uint16_t b) { return bits_to_float(static_cast<std::uint32_t>(b) << 16); }

// binary32 → bfloat16, round to nearest even; NaN stays a quiet NaN.
static inline std::uint16_t float_to_bfloat16(float value) {
  const std::uint32_t f = float_to_bits(value);
  if ((f & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((f >> 16) | 0x40u);
  const std::uint32_t bias = 0x7FFFu + ((f >> 16) & 1u);
  return static_cast<std::uint16_t>((f + bias) >> 16);
}

}  // namespace onebit::kernels
