// AVX-512 kernels (F, BW, VL, DQ): 16 elements per step; compare masks are the packed bits.
//
// This file is compiled with -mavx512*: everything in it has internal linkage (anonymous namespace,
// no std:: templates), so the linker can never hand one of its functions to a CPU without AVX-512.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/half.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/scalar.h"

namespace onebit::kernels {
namespace {

constexpr std::size_t kLanes = 16;

// Calls that write at least this many bytes of error state store it with non-temporal stores: the
// next reader is the next call, long after it left the cache, and a plain store would first read
// each line for ownership — 16 bytes of traffic per element instead of 12.
constexpr std::size_t kStreamBytes = std::size_t{1} << 20;
// Results written into the caller's buffer stream from 2 MiB: below that they may well be read
// again from cache by the optimizer step that follows.
constexpr std::size_t kUnpackStreamBytes = std::size_t{2} << 20;

template <Dtype D>
inline __m512 load16(const void* x, std::size_t i) {
  if constexpr (D == Dtype::kFloat32) {
    return _mm512_loadu_ps(static_cast<const float*>(x) + i);
  } else {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(x) + i));
    if constexpr (D == Dtype::kFloat16) return _mm512_cvtph_ps(raw);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  }
}

inline __mmask16 non_negative(__m512 v) { return _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GE_OQ); }

// stored − scale·sign(stored), as one subtraction or addition (see scalar.cc).
inline __m512 true_error(__m512 stored, __m512 scale) {
  return _mm512_mask_sub_ps(_mm512_add_ps(stored, scale), non_negative(stored), stored, scale);
}

inline void store_bits(std::uint8_t* bits, std::size_t i, __mmask16 mask) {
  const std::uint16_t word = static_cast<std::uint16_t>(mask);
  std::memcpy(bits + i / 8, &word, sizeof(word));  // little-endian: lanes 0-7 in the first byte
}

inline __mmask16 load_mask(const std::uint8_t* bits, std::size_t i) {
  std::uint16_t word;
  std::memcpy(&word, bits + i / 8, sizeof(word));
  return static_cast<__mmask16>(word);
}

// Σ v² in fp64 lanes, flushed to a scalar total every kSumBlock elements.
class SquareSum {
 public:
  void add(__m512 v) {
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    lo_ = _mm512_fmadd_pd(lo, lo, lo_);
    hi_ = _mm512_fmadd_pd(hi, hi, hi_);
    if (++steps_ == kSumBlock / kLanes) flush();
  }
  double total() {
    flush();
    return total_;
  }

 private:
  void flush() {
    total_ += _mm512_reduce_add_pd(_mm512_add_pd(lo_, hi_));
    lo_ = hi_ = _mm512_setzero_pd();
    steps_ = 0;
  }
  __m512d lo_ = _mm512_setzero_pd();
  __m512d hi_ = _mm512_setzero_pd();
  std::size_t steps_ = 0;
  double total_ = 0.0;
};

// Where a large output may use non-temporal stores, and the head (elements done by the oracle
// first) that aligns it: 64-byte stores need `out + head` 64-byte aligned, and a head of 8 elements
// (one bits byte) fixes an offset of 8·element_size bytes.
struct StreamPlan {
  bool stream;
  std::size_t head;
};
inline StreamPlan plan_stream(const void* out, std::size_t n, std::size_t element_size, std::size_t min_bytes) {
  const std::size_t offset = reinterpret_cast<std::uintptr_t>(out) % 64;
  if (n * element_size < min_bytes) return {false, 0};
  if (offset == 0) return {true, 0};
  if (offset == 64 - 8 * element_size) return {true, 8};
  return {false, 0};
}

// [begin, end) with end − begin a multiple of kLanes.
template <Dtype D, bool kWrite, bool kStream>
double worker_steps(const void* x, const float* e_prev, float a_prev, float* e_next, std::uint8_t* bits,
                    std::size_t begin, std::size_t end) {
  const __m512 a = _mm512_set1_ps(a_prev);
  SquareSum squares;
  for (std::size_t i = begin; i < end; i += kLanes) {  // a step is a line of fp32: each prefetches
    prefetch_ahead(static_cast<const char*>(x) + i * dtype_size(D));
    prefetch_ahead(e_prev + i);
    const __m512 y = _mm512_add_ps(load16<D>(x, i), true_error(_mm512_loadu_ps(e_prev + i), a));
    if constexpr (kWrite) {
      if constexpr (kStream) _mm512_stream_ps(e_next + i, y);
      else _mm512_storeu_ps(e_next + i, y);
      store_bits(bits, i, non_negative(y));
    }
    squares.add(y);
  }
  return squares.total();
}

template <bool kWrite, bool kStream>
double worker_steps(const void* x, Dtype dtype, const float* e_prev, float a_prev, float* e_next, std::uint8_t* bits,
                    std::size_t begin, std::size_t end) {
  switch (dtype) {
    case Dtype::kFloat16:
      return worker_steps<Dtype::kFloat16, kWrite, kStream>(x, e_prev, a_prev, e_next, bits, begin, end);
    case Dtype::kBFloat16:
      return worker_steps<Dtype::kBFloat16, kWrite, kStream>(x, e_prev, a_prev, e_next, bits, begin, end);
    default: return worker_steps<Dtype::kFloat32, kWrite, kStream>(x, e_prev, a_prev, e_next, bits, begin, end);
  }
}

double worker_pass(const void* x, Dtype dtype, const float* e_prev, float a_prev, float* e_next, std::uint8_t* bits,
                   std::size_t n) {
  // Streaming stores need 64-byte aligned addresses; a head of 8 elements (one bits byte) fixes a
  // 32-byte offset, which is what chunks of a 64-byte aligned buffer have.
  const StreamPlan plan = plan_stream(e_next, n, sizeof(float), kStreamBytes);
  const bool stream = plan.stream;
  const std::size_t head = plan.head;
  const std::size_t body_end = head + (n - head) / kLanes * kLanes;
  double sum = scalar_worker_range(x, dtype, e_prev, a_prev, e_next, bits, 0, head);
  if (stream) {
    sum += worker_steps<true, true>(x, dtype, e_prev, a_prev, e_next, bits, head, body_end);
    _mm_sfence();  // order the non-temporal stores before anything the caller does next
  } else {
    sum += worker_steps<true, false>(x, dtype, e_prev, a_prev, e_next, bits, head, body_end);
  }
  return sum + scalar_worker_range(x, dtype, e_prev, a_prev, e_next, bits, body_end, n);
}

// [begin, end) with end − begin a multiple of kLanes.
template <bool kStream>
double mean_worker_steps(const float* const* x, int sources, const float* e_prev, float a_prev, float* e_next,
                         std::uint8_t* bits, std::size_t begin, std::size_t end) {
  const __m512 a = _mm512_set1_ps(a_prev);
  const __m512 count = _mm512_set1_ps(static_cast<float>(sources));
  SquareSum squares;
  for (std::size_t i = begin; i < end; i += kLanes) {
    for (int q = 0; q < sources; ++q) prefetch_ahead(x[q] + i);
    prefetch_ahead(e_prev + i);
    __m512 sum = _mm512_loadu_ps(x[0] + i);
    for (int q = 1; q < sources; ++q) sum = _mm512_add_ps(sum, _mm512_loadu_ps(x[q] + i));
    const __m512 y = _mm512_add_ps(_mm512_div_ps(sum, count), true_error(_mm512_loadu_ps(e_prev + i), a));
    if constexpr (kStream) _mm512_stream_ps(e_next + i, y);
    else _mm512_storeu_ps(e_next + i, y);
    store_bits(bits, i, non_negative(y));
    squares.add(y);
  }
  return squares.total();
}

double mean_worker_pass(const float* const* x, int sources, const float* e_prev, float a_prev, float* e_next,
                        std::uint8_t* bits, std::size_t n) {
  const StreamPlan plan = plan_stream(e_next, n, sizeof(float), kStreamBytes);
  const std::size_t head = plan.head;
  const std::size_t body_end = head + (n - head) / kLanes * kLanes;
  double sum = scalar_mean_worker_range(x, sources, e_prev, a_prev, e_next, bits, 0, head);
  if (plan.stream) {
    sum += mean_worker_steps<true>(x, sources, e_prev, a_prev, e_next, bits, head, body_end);
    _mm_sfence();
  } else {
    sum += mean_worker_steps<false>(x, sources, e_prev, a_prev, e_next, bits, head, body_end);
  }
  return sum + scalar_mean_worker_range(x, sources, e_prev, a_prev, e_next, bits, body_end, n);
}

double norm_pass(const void* x, Dtype dtype, const float* e_prev, float a_prev, std::size_t n) {
  const std::size_t body_end = n / kLanes * kLanes;
  return worker_steps<false, false>(x, dtype, e_prev, a_prev, nullptr, nullptr, 0, body_end) +
         scalar_norm_range(x, dtype, e_prev, a_prev, body_end, n);
}

template <bool kStream>
double server_steps(const std::uint8_t* const* bits, const float* scales, int ranks, const float* s_prev, float b_prev,
                    float* s_next, std::uint8_t* bits_out, std::size_t begin, std::size_t end) {
  const __m512 inv_ranks = _mm512_set1_ps(1.0f / static_cast<float>(ranks));
  const __m512 b = _mm512_set1_ps(b_prev);
  SquareSum squares;
  for (std::size_t i = begin; i < end; i += kLanes) {
    prefetch_ahead(s_prev + i);
    __m512 sum = _mm512_setzero_ps();
    for (int r = 0; r < ranks; ++r) {
      const __m512 plus = _mm512_set1_ps(scales[r]);
      const __m512 minus = _mm512_set1_ps(-scales[r]);
      sum = _mm512_add_ps(sum, _mm512_mask_blend_ps(load_mask(bits[r], i), minus, plus));
    }
    const __m512 z = _mm512_add_ps(_mm512_mul_ps(sum, inv_ranks), true_error(_mm512_loadu_ps(s_prev + i), b));
    if constexpr (kStream) _mm512_stream_ps(s_next + i, z);
    else _mm512_storeu_ps(s_next + i, z);
    store_bits(bits_out, i, non_negative(z));
    squares.add(z);
  }
  return squares.total();
}

double server_pass(const std::uint8_t* const* bits, const float* scales, int ranks, const float* s_prev, float b_prev,
                   float* s_next, std::uint8_t* bits_out, std::size_t n) {
  // The server error is next read by the next call, like the worker's: stream it when large.
  const StreamPlan plan = plan_stream(s_next, n, sizeof(float), kStreamBytes);
  const std::size_t head = plan.head;
  const std::size_t body_end = head + (n - head) / kLanes * kLanes;
  double sum = scalar_server_range(bits, scales, ranks, s_prev, b_prev, s_next, bits_out, 0, head);
  if (plan.stream) {
    sum += server_steps<true>(bits, scales, ranks, s_prev, b_prev, s_next, bits_out, head, body_end);
    _mm_sfence();
  } else {
    sum += server_steps<false>(bits, scales, ranks, s_prev, b_prev, s_next, bits_out, head, body_end);
  }
  return sum + scalar_server_range(bits, scales, ranks, s_prev, b_prev, s_next, bits_out, body_end, n);
}

template <bool kStream>
void unpack_steps(const std::uint8_t* bits, float scale, void* out, Dtype dtype, std::size_t begin, std::size_t end) {
  if (dtype == Dtype::kFloat32) {
    const __m512 plus = _mm512_set1_ps(scale);
    const __m512 minus = _mm512_set1_ps(-scale);
    auto* out32 = static_cast<float*>(out);
    for (std::size_t i = begin; i < end; i += kLanes) {
      const __m512 value = _mm512_mask_blend_ps(load_mask(bits, i), minus, plus);
      if constexpr (kStream) _mm512_stream_ps(out32 + i, value);
      else _mm512_storeu_ps(out32 + i, value);
    }
  } else {
    // Two values occur; convert each once with the scalar conversion, then select 16-bit patterns.
    const bool half = dtype == Dtype::kFloat16;
    const __m256i plus = _mm256_set1_epi16(static_cast<short>(half ? float_to_half(scale) : float_to_bfloat16(scale)));
    const __m256i minus =
        _mm256_set1_epi16(static_cast<short>(half ? float_to_half(-scale) : float_to_bfloat16(-scale)));
    auto* out16 = static_cast<std::uint16_t*>(out);
    for (std::size_t i = begin; i < end; i += kLanes) {
      const __m256i value = _mm256_mask_blend_epi16(load_mask(bits, i), minus, plus);
      if constexpr (kStream) _mm256_stream_si256(reinterpret_cast<__m256i*>(out16 + i), value);
      else _mm256_storeu_si256(reinterpret_cast<__m256i*>(out16 + i), value);
    }
  }
}

void unpack(const std::uint8_t* bits, float scale, void* out, Dtype dtype, std::size_t n) {
  // Large results go out with non-temporal stores: they are far larger than the cache, and a plain
  // store would read every line first. 16-bit results store 32 bytes per step (32-byte alignment).
  const std::size_t element = dtype_size(dtype);
  StreamPlan plan = plan_stream(out, n, element, kUnpackStreamBytes);
  if (element == 2) {
    const std::size_t offset = reinterpret_cast<std::uintptr_t>(out) % 32;
    plan = n * 2 >= kUnpackStreamBytes && (offset == 0 || offset == 16) ? StreamPlan{true, offset ? 8u : 0u}
                                                                        : StreamPlan{false, 0};
  }
  const std::size_t head = plan.head;
  const std::size_t body_end = head + (n - head) / kLanes * kLanes;
  scalar_unpack_range(bits, scale, out, dtype, 0, head);
  if (plan.stream) {
    unpack_steps<true>(bits, scale, out, dtype, head, body_end);
    _mm_sfence();
  } else {
    unpack_steps<false>(bits, scale, out, dtype, head, body_end);
  }
  scalar_unpack_range(bits, scale, out, dtype, body_end, n);
}

void unpack_accumulate(const std::uint8_t* bits, float scale, float* out, std::size_t n) {
  const std::size_t body_end = n / kLanes * kLanes;
  const __m512 plus = _mm512_set1_ps(scale);
  const __m512 minus = _mm512_set1_ps(-scale);
  for (std::size_t i = 0; i < body_end; i += kLanes) {
    prefetch_ahead(out + i);
    const __m512 value = _mm512_mask_blend_ps(load_mask(bits, i), minus, plus);
    _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(out + i), value));
  }
  scalar_unpack_accumulate_range(bits, scale, out, body_end, n);
}

}  // namespace

const CpuKernels& avx512_kernels() {
  static const CpuKernels table = {"avx512", worker_pass,       norm_pass,       server_pass,
                                   unpack,   unpack_accumulate, mean_worker_pass};
  return table;
}

}  // namespace onebit::kernels
