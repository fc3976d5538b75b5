// AVX2 kernels (with FMA and F16C): 8 elements per step, one bits byte per step.
//
// This file is compiled with -mavx2 -mfma -mf16c: everything in it has internal linkage (anonymous
// namespace, no std:: templates), so the linker can never hand one of its functions to a CPU
// without AVX2.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/half.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/scalar.h"

namespace onebit::kernels {
namespace {

constexpr std::size_t kLanes = 8;

// Whether step i starts a 64-byte line of fp32 (steps are half a line): the steps that prefetch.
inline bool starts_line(std::size_t i) { return i % 16 == 0; }

// See avx512.cc: non-temporal stores for large error buffers (32-byte aligned ones here) and for
// large results.
constexpr std::size_t kStreamBytes = std::size_t{1} << 20;
constexpr std::size_t kUnpackStreamBytes = std::size_t{2} << 20;

template <Dtype D>
inline __m256 load8(const void* x, std::size_t i) {
  if constexpr (D == Dtype::kFloat32) {
    return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(x) + i));
    if constexpr (D == Dtype::kFloat16) return _mm256_cvtph_ps(raw);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  }
}

inline __m256 non_negative(__m256 v) { return _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GE_OQ); }

// stored − scale·sign(stored), as one subtraction or addition (see scalar.cc).
inline __m256 true_error(__m256 stored, __m256 scale) {
  return _mm256_blendv_ps(_mm256_add_ps(stored, scale), _mm256_sub_ps(stored, scale), non_negative(stored));
}

inline std::uint8_t sign_byte(__m256 v) { return static_cast<std::uint8_t>(_mm256_movemask_ps(non_negative(v))); }

// All-ones in lane k where bit k of byte is set.
inline __m256 lanes_of(std::uint8_t byte) {
  const __m256i select = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i masked = _mm256_and_si256(_mm256_set1_epi32(byte), select);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(masked, select));
}

// For each bits byte, eight lanes holding the sign bit where the byte's bit is 0: XORed into a
// broadcast +scale it gives ±scale lane by lane — the same values as selecting scale or −scale
// (negation is a sign flip), in one load and one XOR instead of a broadcast, AND, compare and blend.
// 8 KiB, built at compile time.
struct SignFlips {
  alignas(32) std::uint32_t lanes[256][8];
  constexpr SignFlips() : lanes() {
    for (int byte = 0; byte < 256; ++byte) {
      for (int k = 0; k < 8; ++k) lanes[byte][k] = ((byte >> k) & 1) ? 0u : 0x80000000u;
    }
  }
};
constexpr SignFlips kSignFlips;

inline __m256 signed_scale(__m256 scale, std::uint8_t byte) {
  return _mm256_xor_ps(scale, _mm256_load_ps(reinterpret_cast<const float*>(kSignFlips.lanes[byte])));
}

// The same for eight 16-bit lanes.
inline __m128i halfword_lanes_of(std::uint8_t byte) {
  const __m128i select = _mm_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm_cmpeq_epi16(_mm_and_si128(_mm_set1_epi16(byte), select), select);
}

// Σ v² in fp64 lanes, flushed to a scalar total every kSumBlock elements.
class SquareSum {
 public:
  void add(__m256 v) {
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    lo_ = _mm256_fmadd_pd(lo, lo, lo_);
    hi_ = _mm256_fmadd_pd(hi, hi, hi_);
    if (++steps_ == kSumBlock / kLanes) flush();
  }
  double total() {
    flush();
    return total_;
  }

 private:
  void flush() {
    const __m256d both = _mm256_add_pd(lo_, hi_);
    const __m128d pair = _mm_add_pd(_mm256_castpd256_pd128(both), _mm256_extractf128_pd(both, 1));
    total_ += _mm_cvtsd_f64(_mm_add_sd(pair, _mm_unpackhi_pd(pair, pair)));
    lo_ = hi_ = _mm256_setzero_pd();
    steps_ = 0;
  }
  __m256d lo_ = _mm256_setzero_pd();
  __m256d hi_ = _mm256_setzero_pd();
  std::size_t steps_ = 0;
  double total_ = 0.0;
};

template <Dtype D, bool kWrite, bool kStream>
double worker_steps(const void* x, const float* e_prev, float a_prev, float* e_next, std::uint8_t* bits,
                    std::size_t end) {
  const __m256 a = _mm256_set1_ps(a_prev);
  SquareSum squares;
  for (std::size_t i = 0; i < end; i += kLanes) {
    if (starts_line(i)) {
      prefetch_ahead(static_cast<const char*>(x) + i * dtype_size(D));
      prefetch_ahead(e_prev + i);
    }
    const __m256 y = _mm256_add_ps(load8<D>(x, i), true_error(_mm256_loadu_ps(e_prev + i), a));
    if constexpr (kWrite) {
      if constexpr (kStream) _mm256_stream_ps(e_next + i, y);
      else _mm256_storeu_ps(e_next + i, y);
      bits[i / 8] = sign_byte(y);
    }
    squares.add(y);
  }
  return squares.total();
}

template <bool kWrite, bool kStream>
double worker_steps(const void* x, Dtype dtype, const float* e_prev, float a_prev, float* e_next, std::uint8_t* bits,
                    std::size_t end) {
  switch (dtype) {
    case Dtype::kFloat16: return worker_steps<Dtype::kFloat16, kWrite, kStream>(x, e_prev, a_prev, e_next, bits, end);
    case Dtype::kBFloat16: return worker_steps<Dtype::kBFloat16, kWrite, kStream>(x, e_prev, a_prev, e_next, bits, end);
    default: return worker_steps<Dtype::kFloat32, kWrite, kStream>(x, e_prev, a_prev, e_next, bits, end);
  }
}

double worker_pass(const void* x, Dtype dtype, const float* e_prev, float a_prev, float* e_next, std::uint8_t* bits,
                   std::size_t n) {
  const std::size_t body_end = n / kLanes * kLanes;
  const bool stream = n * sizeof(float) >= kStreamBytes && reinterpret_cast<std::uintptr_t>(e_next) % 32 == 0;
  double sum;
  if (stream) {
    sum = worker_steps<true, true>(x, dtype, e_prev, a_prev, e_next, bits, body_end);
    _mm_sfence();  // order the non-temporal stores before anything the caller does next
  } else {
    sum = worker_steps<true, false>(x, dtype, e_prev, a_prev, e_next, bits, body_end);
  }
  return sum + scalar_worker_range(x, dtype, e_prev, a_prev, e_next, bits, body_end, n);
}

template <bool kStream>
double mean_worker_steps(const float* const* x, int sources, const float* e_prev, float a_prev, float* e_next,
                         std::uint8_t* bits, std::size_t end) {
  const __m256 a = _mm256_set1_ps(a_prev);
  const __m256 count = _mm256_set1_ps(static_cast<float>(sources));
  SquareSum squares;
  for (std::size_t i = 0; i < end; i += kLanes) {
    if (starts_line(i)) {
      for (int q = 0; q < sources; ++q) prefetch_ahead(x[q] + i);
      prefetch_ahead(e_prev + i);
    }
    __m256 sum = _mm256_loadu_ps(x[0] + i);
    for (int q = 1; q < sources; ++q) sum = _mm256_add_ps(sum, _mm256_loadu_ps(x[q] + i));
    const __m256 y = _mm256_add_ps(_mm256_div_ps(sum, count), true_error(_mm256_loadu_ps(e_prev + i), a));
    if constexpr (kStream) _mm256_stream_ps(e_next + i, y);
    else _mm256_storeu_ps(e_next + i, y);
    bits[i / 8] = sign_byte(y);
    squares.add(y);
  }
  return squares.total();
}

double mean_worker_pass(const float* const* x, int sources, const float* e_prev, float a_prev, float* e_next,
                        std::uint8_t* bits, std::size_t n) {
  const std::size_t body_end = n / kLanes * kLanes;
  const bool stream = n * sizeof(float) >= kStreamBytes && reinterpret_cast<std::uintptr_t>(e_next) % 32 == 0;
  double sum;
  if (stream) {
    sum = mean_worker_steps<true>(x, sources, e_prev, a_prev, e_next, bits, body_end);
    _mm_sfence();
  } else {
    sum = mean_worker_steps<false>(x, sources, e_prev, a_prev, e_next, bits, body_end);
  }
  return sum + scalar_mean_worker_range(x, sources, e_prev, a_prev, e_next, bits, body_end, n);
}

double norm_pass(const void* x, Dtype dtype, const float* e_prev, float a_prev, std::size_t n) {
  const std::size_t body_end = n / kLanes * kLanes;
  return worker_steps<false, false>(x, dtype, e_prev, a_prev, nullptr, nullptr, body_end) +
         scalar_norm_range(x, dtype, e_prev, a_prev, body_end, n);
}

template <bool kStream>
double server_steps(const std::uint8_t* const* bits, const float* scales, int ranks, const float* s_prev, float b_prev,
                    float* s_next, std::uint8_t* bits_out, std::size_t end) {
  const __m256 inv_ranks = _mm256_set1_ps(1.0f / static_cast<float>(ranks));
  const __m256 b = _mm256_set1_ps(b_prev);
  SquareSum squares;
  for (std::size_t i = 0; i < end; i += kLanes) {
    if (starts_line(i)) prefetch_ahead(s_prev + i);
    __m256 sum = _mm256_setzero_ps();
    for (int r = 0; r < ranks; ++r) sum = _mm256_add_ps(sum, signed_scale(_mm256_set1_ps(scales[r]), bits[r][i / 8]));
    const __m256 z = _mm256_add_ps(_mm256_mul_ps(sum, inv_ranks), true_error(_mm256_loadu_ps(s_prev + i), b));
    if constexpr (kStream) _mm256_stream_ps(s_next + i, z);
    else _mm256_storeu_ps(s_next + i, z);
    bits_out[i / 8] = sign_byte(z);
    squares.add(z);
  }
  return squares.total();
}

double server_pass(const std::uint8_t* const* bits, const float* scales, int ranks, const float* s_prev, float b_prev,
                   float* s_next, std::uint8_t* bits_out, std::size_t n) {
  // The server error is next read by the next call: stream it when large (see kStreamBytes).
  const std::size_t body_end = n / kLanes * kLanes;
  const bool stream = n * sizeof(float) >= kStreamBytes && reinterpret_cast<std::uintptr_t>(s_next) % 32 == 0;
  double sum;
  if (stream) {
    sum = server_steps<true>(bits, scales, ranks, s_prev, b_prev, s_next, bits_out, body_end);
    _mm_sfence();
  } else {
    sum = server_steps<false>(bits, scales, ranks, s_prev, b_prev, s_next, bits_out, body_end);
  }
  return sum + scalar_server_range(bits, scales, ranks, s_prev, b_prev, s_next, bits_out, body_end, n);
}

template <bool kStream>
void unpack_steps(const std::uint8_t* bits, float scale, void* out, Dtype dtype, std::size_t end) {
  if (dtype == Dtype::kFloat32) {
    const __m256 plus = _mm256_set1_ps(scale);
    const __m256 minus = _mm256_set1_ps(-scale);
    auto* out32 = static_cast<float*>(out);
    for (std::size_t i = 0; i < end; i += kLanes) {
      const __m256 value = _mm256_blendv_ps(minus, plus, lanes_of(bits[i / 8]));
      if constexpr (kStream) _mm256_stream_ps(out32 + i, value);
      else _mm256_storeu_ps(out32 + i, value);
    }
  } else {
    // Two values occur; convert each once with the scalar conversion, then select 16-bit patterns.
    const bool half = dtype == Dtype::kFloat16;
    const __m128i plus = _mm_set1_epi16(static_cast<short>(half ? float_to_half(scale) : float_to_bfloat16(scale)));
    const __m128i minus = _mm_set1_epi16(static_cast<short>(half ? float_to_half(-scale) : float_to_bfloat16(-scale)));
    auto* out16 = static_cast<std::uint16_t*>(out);
    for (std::size_t i = 0; i < end; i += kLanes) {
      const __m128i value = _mm_blendv_epi8(minus, plus, halfword_lanes_of(bits[i / 8]));
      if constexpr (kStream) _mm_stream_si128(reinterpret_cast<__m128i*>(out16 + i), value);
      else _mm_storeu_si128(reinterpret_cast<__m128i*>(out16 + i), value);
    }
  }
}

void unpack(const std::uint8_t* bits, float scale, void* out, Dtype dtype, std::size_t n) {
  // Large results stream (see avx512.cc); a step stores 32 (fp32) or 16 (16-bit) bytes, which must
  // be aligned to their size — chunks of an aligned buffer are.
  const std::size_t element = dtype_size(dtype);
  const std::size_t body_end = n / kLanes * kLanes;
  const bool stream =
      n * element >= kUnpackStreamBytes && reinterpret_cast<std::uintptr_t>(out) % (kLanes * element) == 0;
  if (stream) {
    unpack_steps<true>(bits, scale, out, dtype, body_end);
    _mm_sfence();
  } else {
    unpack_steps<false>(bits, scale, out, dtype, body_end);
  }
  scalar_unpack_range(bits, scale, out, dtype, body_end, n);
}

void unpack_accumulate(const std::uint8_t* bits, float scale, float* out, std::size_t n) {
  const std::size_t body_end = n / kLanes * kLanes;
  const __m256 plus = _mm256_set1_ps(scale);
  const __m256 minus = _mm256_set1_ps(-scale);
  for (std::size_t i = 0; i < body_end; i += kLanes) {
    if (starts_line(i)) prefetch_ahead(out + i);
    const __m256 value = _mm256_blendv_ps(minus, plus, lanes_of(bits[i / 8]));
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), value));
  }
  scalar_unpack_accumulate_range(bits, scale, out, body_end, n);
}

}  // namespace

const CpuKernels& avx2_kernels() {
  static const CpuKernels table = {"avx2", worker_pass,       norm_pass,       server_pass,
                                   unpack, unpack_accumulate, mean_worker_pass};
  return table;
}

}  // namespace onebit::kernels
