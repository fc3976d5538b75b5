// The stand-in's __nv_bfloat16 (tests/cuda_on_cpu/cuda_runtime.h): the bits of a bfloat16, converted
// as kernels/cpu/half.h converts them (round to nearest even), the CPU kernels' own conversion.
#pragma once

#include <cstdint>

#include "kernels/cpu/half.h"

struct __nv_bfloat16 {
  std::uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 b) { return onebit::kernels::bfloat16_to_float(b.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float value) {
  return __nv_bfloat16{onebit::kernels::float_to_bfloat16(value)};
}
