// The scalar fp16/bf16 conversions against the hardware's (F16C) and against the definition of
// round-to-nearest-even.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/half.h"

namespace onebit::kernels {
namespace {

__attribute__((target("f16c"))) std::uint16_t hardware_float_to_half(float v) {
  return static_cast<std::uint16_t>(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float hardware_half_to_float(std::uint16_t h) { return _cvtsh_ss(h); }

bool has_f16c() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("f16c");
}

TEST(Half, EveryHalfConvertsLikeF16C) {
  if (!has_f16c()) GTEST_SKIP() << "this CPU has no F16C to compare with";
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float ours = half_to_float(static_cast<std::uint16_t>(h));
    const float theirs = hardware_half_to_float(static_cast<std::uint16_t>(h));
    ASSERT_EQ(float_to_bits(ours), float_to_bits(theirs)) << std::hex << "h=0x" << h;
  }
}

TEST(Half, FloatsRoundLikeF16C) {
  if (!has_f16c()) GTEST_SKIP() << "this CPU has no F16C to compare with";
  // Every 251st bit pattern covers all exponents, both signs, NaNs and the rounding boundaries
  // densely; the boundaries themselves are added explicitly.
  auto check = [](std::uint32_t bits) {
    const float v = bits_to_float(bits);
    ASSERT_EQ(float_to_half(v), hardware_float_to_half(v)) << std::hex << "f=0x" << bits;
  };
  for (std::uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 251) check(static_cast<std::uint32_t>(bits));
  for (std::uint32_t h = 0; h < 0x7C00; ++h) {  // every half's value and the midpoints around it
    const std::uint32_t f = float_to_bits(half_to_float(static_cast<std::uint16_t>(h)));
    for (std::uint32_t delta : {0u, 1u, 0xFFFu, 0x1000u, 0x1001u}) {
      check(f + delta);
      check((f + delta) | 0x80000000u);
    }
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bfloat16(bits_to_float(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(float_to_bfloat16(bits_to_float(0x3F818000u)), 0x3F82);  // tie, odd goes up
  EXPECT_EQ(float_to_bfloat16(bits_to_float(0x3F808001u)), 0x3F81);  // past the tie
  EXPECT_EQ(float_to_bfloat16(bits_to_float(0x7F7FFFFFu)), 0x7F80);  // rounds to infinity
  EXPECT_EQ(float_to_bfloat16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(NAN))));
  // Every bf16 value converts to a float and back unchanged.
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float v = bfloat16_to_float(static_cast<std::uint16_t>(b));
    if (std::isnan(v)) continue;
    ASSERT_EQ(float_to_bfloat16(v), b);
  }
}

TEST(BFloat16, IsTheNearestRepresentable) {
  for (std::uint64_t bits = 0; bits < 0x7F800000ull; bits += 4099) {
    const float v = bits_to_float(static_cast<std::uint32_t>(bits));
    const std::uint16_t b = float_to_bfloat16(v);
    if (b >= 0x7F80) continue;  // rounded past the largest finite bf16: infinity, as IEEE says
    const double here = std::fabs(static_cast<double>(bfloat16_to_float(b)) - v);
    if (b > 0) {
      const double below = std::fabs(static_cast<double>(bfloat16_to_float(static_cast<std::uint16_t>(b - 1))) - v);
      ASSERT_LE(here, below) << std::hex << bits;
    }
    if (b < 0x7F80) {
      const double above = std::fabs(static_cast<double>(bfloat16_to_float(static_cast<std::uint16_t>(b + 1))) - v);
      ASSERT_LE(here, above) << std::hex << bits;
    }
  }
}

}  // namespace
}  // namespace onebit::kernels
