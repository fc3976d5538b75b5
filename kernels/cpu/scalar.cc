// The scalar kernels: the oracle. Written for clarity; every SIMD set must produce the same bits
// and stored values (see cpu_kernels.h), and is tested against these on random data.
#include "kernels/cpu/scalar.h"

#include "kernels/cpu/half.h"

namespace onebit::kernels {
namespace {

float load(const void* x, Dtype dtype, std::size_t i) {
  switch (dtype) {
    case Dtype::kFloat16: return half_to_float(static_cast<const std::uint16_t*>(x)[i]);
    case Dtype::kBFloat16: return bfloat16_to_float(static_cast<const std::uint16_t*>(x)[i]);
    default: return static_cast<const float*>(x)[i];
  }
}

// e − scale·sign(e), written as one subtraction or addition: scale·(±1) is exact, so this is one
// rounding, the same one the SIMD sets perform.
float true_error(float stored, float scale) { return stored >= 0.0f ? stored - scale : stored + scale; }

bool bit(const std::uint8_t* bits, std::size_t i) { return (bits[i / 8] >> (i % 8)) & 1u; }

// Packs one sign bit per element into bytes, and sums squares in fp64 blocks of kSumBlock.
class SignPacker {
 public:
  SignPacker(std::uint8_t* bits, std::size_t begin) : bits_(bits), begin_(begin) {}
  void add(std::size_t i, float v) {
    block_ += static_cast<double>(v) * static_cast<double>(v);
    if ((i - begin_) % kSumBlock == kSumBlock - 1) total_ += block_, block_ = 0.0;
    if (bits_ == nullptr) return;
    if (v >= 0.0f) byte_ |= static_cast<std::uint8_t>(1u << (i % 8));
    if (i % 8 == 7) bits_[i / 8] = byte_, byte_ = 0;
  }
  double finish(std::size_t end) {
    if (bits_ != nullptr && end % 8 != 0) bits_[end / 8] = byte_;
    return total_ + block_;
  }

 private:
  std::uint8_t* bits_;
  std::size_t begin_;
  std::uint8_t byte_ = 0;
  double block_ = 0.0;
  double total_ = 0.0;
};

double worker(const void* x, Dtype dtype, const float* e_prev, float a_prev, float* e_next, std::uint8_t* bits,
              std::size_t begin, std::size_t end) {
  SignPacker packer(bits, begin);
  for (std::size_t i = begin; i < end; ++i) {
    const float y = load(x, dtype, i) + true_error(e_prev[i], a_prev);
    if (e_next != nullptr) e_next[i] = y;
    packer.add(i, y);
  }
  return packer.finish(end);
}

// The host mean of element i over `sources` fp32 inputs, in the documented order.
float mean_of(const float* const* x, int sources, std::size_t i) {
  float sum = x[0][i];
  for (int q = 1; q < sources; ++q) sum += x[q][i];
  return sum / static_cast<float>(sources);
}

}  // namespace

double scalar_mean_worker_range(const float* const* x, int sources, const float* e_prev, float a_prev, float* e_next,
                                std::uint8_t* bits, std::size_t begin, std::size_t end) {
  SignPacker packer(bits, begin);
  for (std::size_t i = begin; i < end; ++i) {
    const float y = mean_of(x, sources, i) + true_error(e_prev[i], a_prev);
    e_next[i] = y;
    packer.add(i, y);
  }
  return packer.finish(end);
}

double scalar_worker_range(const void* x, Dtype dtype, const float* e_prev, float a_prev, float* e_next,
                           std::uint8_t* bits, std::size_t begin, std::size_t end) {
  return worker(x, dtype, e_prev, a_prev, e_next, bits, begin, end);
}

double scalar_norm_range(const void* x, Dtype dtype, const float* e_prev, float a_prev, std::size_t begin,
                         std::size_t end) {
  return worker(x, dtype, e_prev, a_prev, nullptr, nullptr, begin, end);
}

double scalar_server_range(const std::uint8_t* const* bits, const float* scales, int ranks, const float* s_prev,
                           float b_prev, float* s_next, std::uint8_t* bits_out, std::size_t begin, std::size_t end) {
  const float inv_ranks = 1.0f / static_cast<float>(ranks);
  SignPacker packer(bits_out, begin);
  for (std::size_t i = begin; i < end; ++i) {
    float sum = 0.0f;
    for (int r = 0; r < ranks; ++r) sum += bit(bits[r], i) ? scales[r] : -scales[r];
    const float z = sum * inv_ranks + true_error(s_prev[i], b_prev);
    s_next[i] = z;
    packer.add(i, z);
  }
  return packer.finish(end);
}

void scalar_unpack_range(const std::uint8_t* bits, float scale, void* out, Dtype dtype, std::size_t begin,
                         std::size_t end) {
  // Only two values occur: convert each once.
  switch (dtype) {
    case Dtype::kFloat16:
    case Dtype::kBFloat16: {
      const bool half = dtype == Dtype::kFloat16;
      const std::uint16_t plus = half ? float_to_half(scale) : float_to_bfloat16(scale);
      const std::uint16_t minus = half ? float_to_half(-scale) : float_to_bfloat16(-scale);
      auto* out16 = static_cast<std::uint16_t*>(out);
      for (std::size_t i = begin; i < end; ++i) out16[i] = bit(bits, i) ? plus : minus;
      break;
    }
    default: {
      auto* out32 = static_cast<float*>(out);
      for (std::size_t i = begin; i < end; ++i) out32[i] = bit(bits, i) ? scale : -scale;
    }
  }
}

void scalar_unpack_accumulate_range(const std::uint8_t* bits, float scale, float* out, std::size_t begin,
                                    std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) out[i] += bit(bits, i) ? scale : -scale;
}

namespace {
double worker_pass(const void* x, Dtype dtype, const float* e_prev, float a_prev, float* e_next, std::uint8_t* bits,
                   std::size_t n) {
  return worker(x, dtype, e_prev, a_prev, e_next, bits, 0, n);
}

double mean_worker_pass(const float* const* x, int sources, const float* e_prev, float a_prev, float* e_next,
                        std::uint8_t* bits, std::size_t n) {
  return scalar_mean_worker_range(x, sources, e_prev, a_prev, e_next, bits, 0, n);
}
double norm_pass(const void* x, Dtype dtype, const float* e_prev, float a_prev, std::size_t n) {
  return worker(x, dtype, e_prev, a_prev, nullptr, nullptr, 0, n);
}
double server_pass(const std::uint8_t* const* bits, const float* scales, int ranks, const float* s_prev, float b_prev,
                   float* s_next, std::uint8_t* bits_out, std::size_t n) {
  return scalar_server_range(bits, scales, ranks, s_prev, b_prev, s_next, bits_out, 0, n);
}
void unpack(const std::uint8_t* bits, float scale, void* out, Dtype dtype, std::size_t n) {
  scalar_unpack_range(bits, scale, out, dtype, 0, n);
}
void unpack_accumulate(const std::uint8_t* bits, float scale, float* out, std::size_t n) {
  scalar_unpack_accumulate_range(bits, scale, out, 0, n);
}
}  // namespace

const CpuKernels& scalar_kernels() {
  static const CpuKernels table = {"scalar", worker_pass,       norm_pass,       server_pass,
                                   unpack,   unpack_accumulate, mean_worker_pass};
  return table;
}

void materialize_error(const float* stored, float scale, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = true_error(stored[i], scale);
}

const char* dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFloat32: return "float32";
    case Dtype::kFloat16: return "float16";
    case Dtype::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

}  // namespace onebit::kernels
