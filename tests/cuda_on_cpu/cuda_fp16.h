// The stand-in's __half (tests/cuda_on_cpu/cuda_runtime.h): the bits of an IEEE half, converted as
// kernels/cpu/half.h converts them (round to nearest even), the CPU kernels' own conversion.
#pragma once

#include <cstdint>

#include "kernels/cpu/half.h"

struct __half {
  std::uint16_t bits;
};

inline float __half2float(__half h) { return onebit::kernels::half_to_float(h.bits); }
inline __half __float2half_rn(float value) { return __half{onebit::kernels::float_to_half(value)}; }
