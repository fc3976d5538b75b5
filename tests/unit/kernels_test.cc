// Every CPU kernel set against the scalar oracle, and the oracle against docs/algorithm.md.
//
// Stated bounds: bits, stored errors and unpacked values are bit-identical across sets; sums of
// squares agree within kSumTolerance relative (fp64 accumulation in a different order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/half.h"

namespace onebit::kernels {
namespace {

constexpr double kSumTolerance = 1e-12;

const std::vector<std::size_t> kLengths = {0,  1,  7,  8,   9,    15,   16,   17,   31,     33,
                                           63, 64, 65, 127, 1000, 4095, 4096, 4097, 262147, 1000003};

// A buffer whose data pointer sits `offset` elements past a 64-byte boundary, to test misaligned
// pointers (and, at offset 8, the 32-byte head of the streaming path).
template <typename T>
class Aligned {
 public:
  Aligned(std::size_t n, std::size_t offset) : storage_((n + offset) * sizeof(T) + 128) {
    auto base = reinterpret_cast<std::uintptr_t>(storage_.data());
    data_ = reinterpret_cast<T*>((base + 63) / 64 * 64) + offset;
  }
  T* data() { return data_; }
  T& operator[](std::size_t i) { return data_[i]; }

 private:
  std::vector<std::uint8_t> storage_;
  T* data_;
};

// Random input values of every kind the kernels meet: normal values of mixed magnitude, exact
// zeros of both signs, subnormals, and huge finite values.
float random_value(std::mt19937& rng) {
  std::uniform_int_distribution<int> kind(0, 19);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  switch (kind(rng)) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return normal(rng) * 1e-40f;  // subnormal
    case 3: return normal(rng) * 1e30f;
    case 4: return normal(rng) * 1e-30f;
    default: return normal(rng);
  }
}

// x in the given dtype, filled with random values representable in it.
std::vector<std::uint8_t> random_input(Dtype dtype, std::size_t n, std::mt19937& rng) {
  std::vector<std::uint8_t> bytes(n * dtype_size(dtype) + 16);
  for (std::size_t i = 0; i < n; ++i) {
    float v = random_value(rng);
    if (dtype == Dtype::kFloat32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    } else {
      if (dtype == Dtype::kFloat16 && std::fabs(v) > 60000.0f) v = std::copysign(60000.0f, v);
      const std::uint16_t h = dtype == Dtype::kFloat16 ? float_to_half(v) : float_to_bfloat16(v);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  return bytes;
}

std::string set_name(const testing::TestParamInfo<const CpuKernels*>& info) { return info.param->name; }

std::vector<const CpuKernels*> simd_sets() {
  std::vector<const CpuKernels*> sets;
  for (const CpuKernels* k : runnable_cpu_kernels()) {
    if (std::string(k->name) != "scalar") sets.push_back(k);
  }
  return sets;
}

void expect_sum_near(double expected, double actual, const std::string& where) {
  if (expected == actual) return;
  EXPECT_LE(std::fabs(expected - actual), kSumTolerance * std::fabs(expected)) << where;
}

class KernelSetTest : public testing::TestWithParam<const CpuKernels*> {};

TEST_P(KernelSetTest, WorkerPassMatchesScalar) {
  const CpuKernels& simd = *GetParam();
  const CpuKernels& oracle = scalar_kernels();
  std::mt19937 rng(1);
  for (Dtype dtype : {Dtype::kFloat32, Dtype::kFloat16, Dtype::kBFloat16}) {
    for (std::size_t n : kLengths) {
      for (std::size_t offset : {0, 1, 3, 8}) {
        for (float a_prev : {0.0f, 0.75f}) {
          const std::string where = std::string(dtype_name(dtype)) + " n=" + std::to_string(n) +
                                    " offset=" + std::to_string(offset) + " a_prev=" + std::to_string(a_prev);
          std::vector<std::uint8_t> x_bytes = random_input(dtype, n + 1, rng);
          const void* x = x_bytes.data() + offset % 2 * dtype_size(dtype);  // x misaligned too
          Aligned<float> e_prev(n, offset), e_simd(n, offset), e_oracle(n, (offset + 1) % 4);
          for (std::size_t i = 0; i < n; ++i) e_prev[i] = random_value(rng);
          std::vector<std::uint8_t> bits_simd(packed_bytes(n) + 1, 0xAB), bits_oracle(packed_bytes(n) + 1, 0xAB);

          const double sum_oracle =
              oracle.worker_pass(x, dtype, e_prev.data(), a_prev, e_oracle.data(), bits_oracle.data(), n);
          const double sum_simd = simd.worker_pass(x, dtype, e_prev.data(), a_prev, e_simd.data(), bits_simd.data(), n);

          ASSERT_EQ(bits_oracle, bits_simd) << where;  // pad bits and the byte past the end too
          ASSERT_EQ(0, std::memcmp(e_oracle.data(), e_simd.data(), n * sizeof(float))) << where;
          expect_sum_near(sum_oracle, sum_simd, where);
          expect_sum_near(sum_oracle, simd.norm_pass(x, dtype, e_prev.data(), a_prev, n), where + " norm_pass");
        }
      }
    }
  }
}

TEST_P(KernelSetTest, MeanWorkerPassIsTheWorkerPassOfTheMean) {
  // The documented mean, written out here, then the oracle's worker pass: the fused kernel must
  // give the same stored values and bits, whatever the number of sources and the alignment.
  const CpuKernels& simd = *GetParam();
  const CpuKernels& oracle = scalar_kernels();
  std::mt19937 rng(5);
  for (int sources = 1; sources <= 4; ++sources) {
    for (std::size_t n : kLengths) {
      for (std::size_t offset : {0, 3, 8}) {
        const std::string where =
            std::to_string(sources) + " sources n=" + std::to_string(n) + " offset=" + std::to_string(offset);
        std::vector<Aligned<float>> inputs;
        std::vector<const float*> x;
        for (int q = 0; q < sources; ++q) {
          inputs.emplace_back(n, (offset + q) % 4);
          for (std::size_t i = 0; i < n; ++i) inputs.back()[i] = random_value(rng);
        }
        for (auto& input : inputs) x.push_back(input.data());
        std::vector<float> mean(n);
        for (std::size_t i = 0; i < n; ++i) {
          float sum = x[0][i];
          for (int q = 1; q < sources; ++q) sum += x[q][i];
          mean[i] = sum / static_cast<float>(sources);
        }
        Aligned<float> e_prev(n, offset), e_simd(n, offset), e_oracle(n, 0);
        for (std::size_t i = 0; i < n; ++i) e_prev[i] = random_value(rng);
        std::vector<std::uint8_t> bits_simd(packed_bytes(n) + 1, 0xAB), bits_oracle(packed_bytes(n) + 1, 0xAB);
        const double sum_oracle = oracle.worker_pass(mean.data(), Dtype::kFloat32, e_prev.data(), 0.75f,
                                                     e_oracle.data(), bits_oracle.data(), n);
        const double sum_simd =
            simd.mean_worker_pass(x.data(), sources, e_prev.data(), 0.75f, e_simd.data(), bits_simd.data(), n);
        ASSERT_EQ(bits_oracle, bits_simd) << where;
        ASSERT_EQ(0, std::memcmp(e_oracle.data(), e_simd.data(), n * sizeof(float))) << where;
        expect_sum_near(sum_oracle, sum_simd, where);
      }
    }
  }
}

TEST_P(KernelSetTest, WorkerPassInPlaceMatchesSeparateBuffers) {
  const CpuKernels& simd = *GetParam();
  std::mt19937 rng(2);
  const std::size_t n = 1000003;
  std::vector<std::uint8_t> x = random_input(Dtype::kFloat32, n, rng);
  Aligned<float> e(n, 8), separate(n, 0);
  for (std::size_t i = 0; i < n; ++i) e[i] = random_value(rng);
  std::vector<std::uint8_t> bits_a(packed_bytes(n)), bits_b(packed_bytes(n));
  const double sum_a = simd.worker_pass(x.data(), Dtype::kFloat32, e.data(), 0.5f, separate.data(), bits_a.data(), n);
  const double sum_b = simd.worker_pass(x.data(), Dtype::kFloat32, e.data(), 0.5f, e.data(), bits_b.data(), n);
  EXPECT_EQ(sum_a, sum_b);
  EXPECT_EQ(bits_a, bits_b);
  EXPECT_EQ(0, std::memcmp(e.data(), separate.data(), n * sizeof(float)));
}

TEST_P(KernelSetTest, ServerPassMatchesScalar) {
  const CpuKernels& simd = *GetParam();
  const CpuKernels& oracle = scalar_kernels();
  std::mt19937 rng(3);
  for (int ranks : {1, 2, 3, 4, 7, 8, 16}) {
    for (std::size_t n : kLengths) {
      if (n > 300000 && ranks > 4) continue;  // keep the test quick; the kernel does not care
      for (std::size_t offset : {0, 1, 8}) {  // 0 and 8: the streaming path, with and without a head
        const std::string where =
            "W=" + std::to_string(ranks) + " n=" + std::to_string(n) + " offset=" + std::to_string(offset);
        std::vector<std::vector<std::uint8_t>> rank_bits(ranks, std::vector<std::uint8_t>(packed_bytes(n)));
        std::vector<const std::uint8_t*> bits;
        std::vector<float> scales;
        for (auto& rb : rank_bits) {
          for (auto& byte : rb) byte = static_cast<std::uint8_t>(rng());
          bits.push_back(rb.data());
          scales.push_back(std::fabs(random_value(rng)));
        }
        Aligned<float> s_prev(n, offset), s_simd(n, offset), s_oracle(n, 0);
        for (std::size_t i = 0; i < n; ++i) s_prev[i] = random_value(rng);
        std::vector<std::uint8_t> out_simd(packed_bytes(n) + 1, 0xCD), out_oracle(packed_bytes(n) + 1, 0xCD);
        const float b_prev = 0.3f;
        const double sum_oracle = oracle.server_pass(bits.data(), scales.data(), ranks, s_prev.data(), b_prev,
                                                     s_oracle.data(), out_oracle.data(), n);
        const double sum_simd = simd.server_pass(bits.data(), scales.data(), ranks, s_prev.data(), b_prev,
                                                 s_simd.data(), out_simd.data(), n);
        ASSERT_EQ(out_oracle, out_simd) << where;
        ASSERT_EQ(0, std::memcmp(s_oracle.data(), s_simd.data(), n * sizeof(float))) << where;
        expect_sum_near(sum_oracle, sum_simd, where);
      }
    }
  }
}

TEST_P(KernelSetTest, UnpackMatchesScalar) {
  const CpuKernels& simd = *GetParam();
  const CpuKernels& oracle = scalar_kernels();
  std::mt19937 rng(4);
  for (Dtype dtype : {Dtype::kFloat32, Dtype::kFloat16, Dtype::kBFloat16}) {
    for (std::size_t n : kLengths) {
      for (float scale : {0.0f, 1.0f, 0.3333f, 1e-30f, 70000.0f}) {
        const std::string where =
            std::string(dtype_name(dtype)) + " n=" + std::to_string(n) + " scale=" + std::to_string(scale);
        std::vector<std::uint8_t> bits(packed_bytes(n));
        for (auto& byte : bits) byte = static_cast<std::uint8_t>(rng());
        const std::size_t bytes = n * dtype_size(dtype);
        // One element of slack on each side, filled with a pattern that must survive.
        std::vector<std::uint8_t> out_simd(bytes + 8, 0x5A), out_oracle(bytes + 8, 0x5A);
        oracle.unpack(bits.data(), scale, out_oracle.data() + 4, dtype, n);
        simd.unpack(bits.data(), scale, out_simd.data() + 4, dtype, n);
        ASSERT_EQ(out_oracle, out_simd) << where;
      }
    }
  }
  // Large outputs at 64-byte-aligned offsets take the non-temporal path (with an 8-element head
  // at offset 8); offset 1 does not. Both must equal the oracle.
  for (Dtype dtype : {Dtype::kFloat32, Dtype::kFloat16, Dtype::kBFloat16}) {
    for (std::size_t n : {std::size_t{1000003}, std::size_t{4000037}}) {
      for (std::size_t offset : {0, 1, 8, 16}) {
        std::vector<std::uint8_t> bits(packed_bytes(n));
        for (auto& byte : bits) byte = static_cast<std::uint8_t>(rng());
        const std::size_t element = dtype_size(dtype);
        Aligned<std::uint8_t> out_simd(n * element + 64, offset * element), out_oracle(n * element + 64, 0);
        simd.unpack(bits.data(), 0.75f, out_simd.data(), dtype, n);
        oracle.unpack(bits.data(), 0.75f, out_oracle.data(), dtype, n);
        ASSERT_EQ(0, std::memcmp(out_simd.data(), out_oracle.data(), n * element))
            << dtype_name(dtype) << " n=" << n << " offset=" << offset;
      }
    }
  }
  for (std::size_t n : kLengths) {
    std::vector<std::uint8_t> bits(packed_bytes(n));
    for (auto& byte : bits) byte = static_cast<std::uint8_t>(rng());
    std::vector<float> acc_simd(n + 1), acc_oracle;
    for (auto& v : acc_simd) v = random_value(rng);
    acc_oracle = acc_simd;
    oracle.unpack_accumulate(bits.data(), 0.625f, acc_oracle.data() + 1, n);
    simd.unpack_accumulate(bits.data(), 0.625f, acc_simd.data() + 1, n);
    ASSERT_EQ(0, std::memcmp(acc_oracle.data(), acc_simd.data(), (n + 1) * sizeof(float))) << "accumulate n=" << n;
  }
}

TEST_P(KernelSetTest, NonFiniteInputIsReportedBySum) {
  const CpuKernels& k = *GetParam();
  const std::size_t n = 1000;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (std::size_t at : {std::size_t{0}, std::size_t{17}, std::size_t{500}, n - 1}) {
      std::vector<float> x(n, 1.0f), e(n, 0.0f), e_next(n);
      std::vector<std::uint8_t> bits(packed_bytes(n));
      x[at] = bad;
      EXPECT_FALSE(
          std::isfinite(k.worker_pass(x.data(), Dtype::kFloat32, e.data(), 0.0f, e_next.data(), bits.data(), n)))
          << "x[" << at << "] = " << bad;
      x[at] = 1.0f;
      e[at] = bad;  // a poisoned error state is reported the same way
      EXPECT_FALSE(std::isfinite(k.norm_pass(x.data(), Dtype::kFloat32, e.data(), 0.0f, n))) << "e[" << at << "]";
    }
  }
  // Finite inputs whose sum overflows fp32 are reported too.
  std::vector<float> x(64, 3e38f), e(64, 3e38f), e_next(64);
  std::vector<std::uint8_t> bits(8);
  EXPECT_FALSE(std::isfinite(k.worker_pass(x.data(), Dtype::kFloat32, e.data(), 0.0f, e_next.data(), bits.data(), 64)));
  // fp16 infinity and NaN.
  std::vector<std::uint16_t> h(40, float_to_half(1.0f));
  h[33] = 0x7C00;
  EXPECT_FALSE(std::isfinite(k.norm_pass(h.data(), Dtype::kFloat16, e_next.data(), 0.0f, 40)));
  h[33] = 0x7E00;
  EXPECT_FALSE(std::isfinite(k.norm_pass(h.data(), Dtype::kFloat16, e_next.data(), 0.0f, 40)));
}

TEST_P(KernelSetTest, SumOfSquaresIsAccurateAgainstLongDouble) {
  const CpuKernels& k = *GetParam();
  std::mt19937 rng(5);
  const std::size_t n = 4000037;
  std::vector<float> x(n), e(n, 0.0f);
  std::lognormal_distribution<float> magnitude(0.0f, 3.0f);
  long double reference = 0.0L;
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = magnitude(rng) * (rng() % 2 ? 1.0f : -1.0f);
    reference += static_cast<long double>(x[i]) * x[i];
  }
  const double sum = k.norm_pass(x.data(), Dtype::kFloat32, e.data(), 0.0f, n);
  EXPECT_LE(std::fabs(static_cast<long double>(sum) - reference), 1e-13L * reference);
}

TEST_P(KernelSetTest, SumOfOnesIsExactPastWhereFloatStalls) {
  // fp32 accumulation stops growing at 2^24; the fp64 blocks give the exact count.
  const CpuKernels& k = *GetParam();
  const std::size_t n = (std::size_t{1} << 25) + 5;
  std::vector<float> x(n, 1.0f), e(n, 0.0f);
  EXPECT_EQ(static_cast<double>(n), k.norm_pass(x.data(), Dtype::kFloat32, e.data(), 0.0f, n));
}

INSTANTIATE_TEST_SUITE_P(Simd, KernelSetTest, testing::ValuesIn(simd_sets()), set_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(KernelSetTest);

// ---- The oracle against docs/algorithm.md ----

TEST(ScalarOracle, BitsAreLsbFirstAndZeroIsPositive) {
  // Element i is bit i % 8 of byte i / 8; +1 for v >= 0, also for -0.0; pad bits are 0.
  const std::vector<float> x = {1.0f, -1.0f, -0.0f, 0.0f, -2.0f, -3.0f, -4.0f, 5.0f, -1.0f, 2.0f, -1e-38f};
  const std::size_t n = x.size();
  std::vector<float> e(n, 0.0f), e_next(n);
  std::vector<std::uint8_t> bits(2, 0xFF);
  scalar_kernels().worker_pass(x.data(), Dtype::kFloat32, e.data(), 0.0f, e_next.data(), bits.data(), n);
  EXPECT_EQ(bits[0], 0b10001101);
  EXPECT_EQ(bits[1], 0b00000010);
}

TEST(ScalarOracle, OnePassFormEqualsExplicitErrorFeedback) {
  // Two calls of the worker stage of docs/algorithm.md, written out in fp64 with an explicit error
  // update, against the kernels' one-pass form (stored y, previous scale).
  std::mt19937 rng(6);
  const std::size_t n = 1001;
  std::vector<float> x0(n), x1(n);
  for (auto& v : x0) v = random_value(rng);
  for (auto& v : x1) v = random_value(rng);
  for (std::size_t i = 0; i < n; ++i) x0[i] = std::fmod(x0[i], 10.0f), x1[i] = std::fmod(x1[i], 10.0f);

  for (const CpuKernels* k : runnable_cpu_kernels()) {
    std::vector<float> zeros(n, 0.0f), stored0(n), stored1(n);
    std::vector<std::uint8_t> bits0(packed_bytes(n)), bits1(packed_bytes(n));
    const float a0 = scale_from_sum_squares(
        k->worker_pass(x0.data(), Dtype::kFloat32, zeros.data(), 0.0f, stored0.data(), bits0.data(), n), n);
    const float a1 = scale_from_sum_squares(
        k->worker_pass(x1.data(), Dtype::kFloat32, stored0.data(), a0, stored1.data(), bits1.data(), n), n);

    // Explicit: e starts at 0; y = x + e; a = ||y|| / sqrt(n); e = y − a·sign(y).
    std::vector<double> e(n, 0.0);
    double sum0 = 0, sum1 = 0;
    std::vector<double> y0(n), y1(n);
    for (std::size_t i = 0; i < n; ++i) y0[i] = x0[i] + e[i], sum0 += y0[i] * y0[i];
    const double ref_a0 = std::sqrt(sum0 / n);
    for (std::size_t i = 0; i < n; ++i) e[i] = y0[i] - ref_a0 * (y0[i] >= 0 ? 1 : -1);
    for (std::size_t i = 0; i < n; ++i) y1[i] = x1[i] + e[i], sum1 += y1[i] * y1[i];
    const double ref_a1 = std::sqrt(sum1 / n);

    EXPECT_NEAR(a0, ref_a0, 1e-6 * ref_a0) << k->name;
    EXPECT_NEAR(a1, ref_a1, 1e-6 * ref_a1) << k->name;
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(stored1[i], y1[i], 1e-5 * (1 + std::fabs(y1[i]))) << k->name << " i=" << i;
      if (std::fabs(y1[i]) > 1e-4) {
        ASSERT_EQ((bits1[i / 8] >> (i % 8)) & 1, y1[i] >= 0 ? 1 : 0) << k->name << " i=" << i;
      }
    }
    std::vector<float> materialized(n);
    materialize_error(stored1.data(), a1, materialized.data(), n);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(materialized[i], y1[i] - ref_a1 * (y1[i] >= 0 ? 1 : -1), 1e-5 * (1 + std::fabs(y1[i])));
    }
  }
}

TEST(ScalarOracle, ServerPassAveragesSignedScales) {
  // Two ranks, 3 elements: signs (+,-,+) and (+,+,-), scales 2 and 4, no server error.
  const std::uint8_t r0 = 0b101, r1 = 0b011;
  const std::uint8_t* bits[] = {&r0, &r1};
  const float scales[] = {2.0f, 4.0f};
  std::vector<float> s(3, 0.0f), s_next(3);
  std::uint8_t out = 0xFF;
  const double sum = scalar_kernels().server_pass(bits, scales, 2, s.data(), 0.0f, s_next.data(), &out, 3);
  EXPECT_EQ(s_next, (std::vector<float>{3.0f, 1.0f, -1.0f}));
  EXPECT_EQ(out, 0b011);
  EXPECT_EQ(sum, 11.0);
}

TEST(ScalarOracle, UnpackRoundsHalfPrecisionToNearestEven) {
  const std::uint8_t bits = 0b01;
  std::uint16_t out[2];
  scalar_kernels().unpack(&bits, 1.0f + 1.0f / 2048, out, Dtype::kFloat16, 2);  // a tie in fp16: to even
  EXPECT_EQ(out[0], 0x3C00);
  EXPECT_EQ(out[1], 0xBC00);
  scalar_kernels().unpack(&bits, 1.0f + 3.0f / 2048, out, Dtype::kFloat16, 2);  // the other tie: up
  EXPECT_EQ(out[0], 0x3C02);
}

// ---- Dispatch ----

TEST(Dispatch, UnknownSetIsAClearError) {
  try {
    select_cpu_kernels("sse9");
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ONEBIT_INVALID_ARGUMENT);
    EXPECT_NE(std::string(error.what()).find("ONEBIT_SIMD='sse9' is not a kernel set"), std::string::npos)
        << error.what();
  }
}

TEST(Dispatch, EmptyPicksTheBestRunnableSet) {
  EXPECT_EQ(&select_cpu_kernels(""), runnable_cpu_kernels().back());
  EXPECT_STREQ(runnable_cpu_kernels().front()->name, "scalar");
  for (const CpuKernels* k : runnable_cpu_kernels()) EXPECT_EQ(&select_cpu_kernels(k->name), k);
}

TEST(Dispatch, SetTheCpuCannotRunIsAClearError) {
  for (const char* name : {"avx2", "avx512"}) {
    if (cpu_runs(name)) continue;
    try {
      select_cpu_kernels(name);
      FAIL() << "expected an error for " << name;
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ONEBIT_INVALID_ARGUMENT);
      EXPECT_NE(std::string(error.what()).find(name), std::string::npos);
    }
    return;
  }
  GTEST_SKIP() << "this CPU runs every kernel set; nothing to refuse";
}

// The benchmarks name the CPU by CPUID's brand string: the name Linux gives it too.
TEST(Dispatch, CpuModelIsTheNameLinuxGivesTheCpu) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const std::string linux_name = line.substr(line.find(':') + 2);
    EXPECT_EQ(cpu_model(), linux_name);
    return;
  }
  GTEST_SKIP() << "no model name in /proc/cpuinfo";
}

}  // namespace
}  // namespace onebit::kernels
