// The CUDA kernels against the scalar CPU kernel, their oracle: random data, odd sizes, every
// dtype, misaligned chunk starts; elementwise outputs (stored values, bits, unpacked values) must be
// bit-identical, sums of squares within the contract's reassociation bound. Skips, saying so, where
// no CUDA device is present (the development machines); tools/gpu-check.sh runs it on a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/half.h"
#include "kernels/cuda/cuda_kernels.h"

namespace onebit::kernels {
namespace {

bool have_device() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!have_device())      \
  GTEST_SKIP() << "no CUDA device here (cudaGetDeviceCount: none); run tools/gpu-check.sh on a GPU machine"

template <typename T>
struct DeviceArray {
  T* ptr = nullptr;
  std::size_t count = 0;
  explicit DeviceArray(std::size_t n) : count(n) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<std::size_t>(1, n) * sizeof(T)), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(ptr); }
  void put(const T* host) { ASSERT_EQ(cudaMemcpy(ptr, host, count * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess); }
  std::vector<T> get() const {
    std::vector<T> host(count);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

std::vector<float> normal(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  if (n > 3) v[1] = -0.0f, v[2] = 0.0f;  // signs of zeros: +1 both
  return v;
}

// The input as bytes of the dtype (fp16/bf16 rounded from the floats).
std::vector<std::uint8_t> as_dtype(const std::vector<float>& v, Dtype dtype) {
  std::vector<std::uint8_t> out(v.size() * dtype_size(dtype));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (dtype == Dtype::kFloat32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const std::uint16_t h = dtype == Dtype::kFloat16 ? float_to_half(v[i]) : float_to_bfloat16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

const std::vector<std::size_t> kSizes = {0, 1, 7, 31, 32, 33, 1000, 4097, (1u << 20) + 13};

TEST(CudaKernels, WorkerPassMatchesTheScalarOracle) {
  SKIP_WITHOUT_GPU();
  for (Dtype dtype : {Dtype::kFloat32, Dtype::kFloat16, Dtype::kBFloat16}) {
    for (std::size_t n : kSizes) {
      const auto x = as_dtype(normal(n, 1 + static_cast<unsigned>(n)), dtype);
      const auto e_prev = normal(n, 7 + static_cast<unsigned>(n));
      const float a_prev = 0.37f;
      std::vector<float> e_next(n);
      std::vector<std::uint8_t> bits(packed_bytes(n) + 1, 0xAA);
      const double sum =
          scalar_kernels().worker_pass(x.data(), dtype, e_prev.data(), a_prev, e_next.data(), bits.data(), n);

      DeviceArray<std::uint8_t> dx(x.size()), dbits(packed_bytes(n) + 1);
      DeviceArray<float> de_prev(n), de_next(n), da(1), dscale(1);
      DeviceArray<double> dsum(1);
      DeviceArray<std::uint8_t> workspace(cuda::workspace_bytes(n));
      dx.put(x.data());
      de_prev.put(e_prev.data());
      da.put(&a_prev);
      std::vector<std::uint8_t> marker(packed_bytes(n) + 1, 0xAA);
      dbits.put(marker.data());
      ASSERT_EQ(cuda::worker_pass(dx.ptr, dtype, de_prev.ptr, da.ptr, de_next.ptr, dbits.ptr, n,
                                  cuda::Reduction{dsum.ptr, dscale.ptr}, workspace.ptr, nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got_e = de_next.get();
      const auto got_bits = dbits.get();
      const double got_sum = dsum.get()[0];
      ASSERT_EQ(0, n == 0 ? 0 : std::memcmp(got_e.data(), e_next.data(), n * 4)) << dtype_name(dtype) << " n=" << n;
      ASSERT_EQ(0, std::memcmp(got_bits.data(), bits.data(), packed_bytes(n) + 1))
          << dtype_name(dtype) << " n=" << n << ": bits differ (or the byte past the end was touched)";
      EXPECT_NEAR(got_sum, sum, 1e-12 * sum + 1e-300) << dtype_name(dtype) << " n=" << n;
      const float want_scale = scale_from_sum_squares(sum, n), got_scale = dscale.get()[0];
      EXPECT_LE(std::fabs(got_scale - want_scale), std::fabs(want_scale) * 1.2e-7f) << "n=" << n;
    }
  }
}

// The engine's entry points choose the pair by a parity on the device (what makes captured calls
// replay correctly): with parity 1 the worker and server passes read buffer[1] and write buffer[0],
// exactly as the pointer passes with those two; a revert restores buffer[0] from buffer[1]; then
// finish_call flips the parity to 0 and counts the call in mapped host memory.
TEST(CudaKernels, ParityChosenPairsMatchThePointerPassesAndFinishCallFlips) {
  SKIP_WITHOUT_GPU();
  const std::size_t n = 4097;
  const auto x = normal(n, 3);
  const auto stored = normal(n, 5);
  const float a_prev = 0.25f;
  DeviceArray<float> dx(n), pair0(n), pair1(n), fixed_next(n), da(1), dscale(1);
  DeviceArray<std::uint8_t> bits_parity(packed_bytes(n)), bits_fixed(packed_bytes(n)),
      workspace(cuda::workspace_bytes(n));
  DeviceArray<double> dsum(1);
  DeviceArray<int> parity(1);
  dx.put(x.data());
  pair1.put(stored.data());
  da.put(&a_prev);
  const int one = 1;
  parity.put(&one);
  const cuda::ErrorBuffers e{{pair0.ptr, pair1.ptr}, parity.ptr};
  ASSERT_EQ(cuda::worker_pass(dx.ptr, Dtype::kFloat32, e, da.ptr, bits_parity.ptr, n, {dsum.ptr, dscale.ptr},
                              workspace.ptr, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::worker_pass(dx.ptr, Dtype::kFloat32, pair1.ptr, da.ptr, fixed_next.ptr, bits_fixed.ptr, n,
                              {dsum.ptr, dscale.ptr}, workspace.ptr, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(pair0.get(), fixed_next.get()) << "parity 1: the pass writes buffer[0] from buffer[1]";
  EXPECT_EQ(bits_parity.get(), bits_fixed.get());
  EXPECT_EQ(pair1.get(), stored) << "parity 1: buffer[1] is read, not written";

  // A revert (a NaN scale) copies buffer[1] back over buffer[0].
  const float nan = NAN, saved[2] = {0.5f, 0.75f};
  DeviceArray<float> worker_scales(1), server_scales(1), dsaved(2);
  DeviceArray<int> verdict(1);
  DeviceArray<unsigned> failures(1);
  worker_scales.put(&nan);
  server_scales.put(&a_prev);
  dsaved.put(saved);
  const unsigned zero = 0;
  failures.put(&zero);
  const cuda::ParityRevert revert{e, n, e, 0, dsaved.ptr, worker_scales.ptr, dscale.ptr, verdict.ptr, failures.ptr};
  ASSERT_EQ(cuda::revert_unless_finite(worker_scales.ptr, server_scales.ptr, 1, revert, nullptr), cudaSuccess);

  unsigned long long* completed = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&completed), sizeof(*completed), cudaHostAllocMapped), cudaSuccess);
  *completed = 0;
  unsigned long long* completed_device = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&completed_device), completed, 0), cudaSuccess);
  ASSERT_EQ(cuda::finish_call(parity.ptr, completed_device, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(pair0.get(), stored) << "the revert restores the written buffer from the read one";
  EXPECT_EQ(failures.get()[0], 1u);
  EXPECT_EQ(parity.get()[0], 0) << "finish_call flips the parity";
  EXPECT_EQ(*completed, 1ull) << "and counts the call";
  cudaFreeHost(completed);
}

TEST(CudaKernels, ServerPassMatchesTheScalarOracle) {
  SKIP_WITHOUT_GPU();
  for (int ranks : {1, 2, 3, 8}) {
    for (std::size_t n : kSizes) {
      std::vector<std::vector<std::uint8_t>> rank_bits(ranks);
      std::vector<const std::uint8_t*> host_pointers(ranks);
      std::vector<float> scales(ranks);
      std::mt19937 rng(static_cast<unsigned>(ranks * 1000 + n));
      for (int r = 0; r < ranks; ++r) {
        rank_bits[r].resize(packed_bytes(n) + 1);
        for (auto& b : rank_bits[r]) b = static_cast<std::uint8_t>(rng());
        host_pointers[r] = rank_bits[r].data();
        scales[r] = 0.1f + 0.01f * static_cast<float>(r);
      }
      const auto s_prev = normal(n, 99 + static_cast<unsigned>(n));
      const float b_prev = 0.21f;
      std::vector<float> s_next(n);
      std::vector<std::uint8_t> bits_out(packed_bytes(n) + 1, 0x55);
      const double sum = scalar_kernels().server_pass(host_pointers.data(), scales.data(), ranks, s_prev.data(), b_prev,
                                                      s_next.data(), bits_out.data(), n);

      std::vector<std::unique_ptr<DeviceArray<std::uint8_t>>> dbits;
      std::vector<std::uint8_t*> device_pointers;
      for (int r = 0; r < ranks; ++r) {
        dbits.push_back(std::make_unique<DeviceArray<std::uint8_t>>(rank_bits[r].size()));
        dbits.back()->put(rank_bits[r].data());
        device_pointers.push_back(dbits.back()->ptr);
      }
      DeviceArray<std::uint8_t*> dpointers(ranks);
      dpointers.put(device_pointers.data());
      DeviceArray<float> dscales(ranks), ds_prev(n), ds_next(n), db(1), dscale(1);
      DeviceArray<double> dsum(1);
      DeviceArray<std::uint8_t> dout(packed_bytes(n) + 1), workspace(cuda::workspace_bytes(n));
      dscales.put(scales.data());
      ds_prev.put(s_prev.data());
      db.put(&b_prev);
      std::vector<std::uint8_t> marker(packed_bytes(n) + 1, 0x55);
      dout.put(marker.data());
      ASSERT_EQ(
          cuda::server_pass(dpointers.ptr, dscales.ptr, ranks, 1.0f / static_cast<float>(ranks), ds_prev.ptr, db.ptr,
                            ds_next.ptr, dout.ptr, n, cuda::Reduction{dsum.ptr, dscale.ptr}, workspace.ptr, nullptr),
          cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got = ds_next.get();
      ASSERT_EQ(0, n == 0 ? 0 : std::memcmp(got.data(), s_next.data(), n * 4)) << "ranks=" << ranks << " n=" << n;
      ASSERT_EQ(0, std::memcmp(dout.get().data(), bits_out.data(), bits_out.size())) << "ranks=" << ranks << " n=" << n;
      EXPECT_NEAR(dsum.get()[0], sum, 1e-12 * sum + 1e-300);
    }
  }
}

TEST(CudaKernels, UnpackMatchesTheScalarOracle) {
  SKIP_WITHOUT_GPU();
  for (Dtype dtype : {Dtype::kFloat32, Dtype::kFloat16, Dtype::kBFloat16}) {
    for (std::size_t n : kSizes) {
      std::vector<std::uint8_t> bits(packed_bytes(n) + 1);
      std::mt19937 rng(static_cast<unsigned>(n) + 5);
      for (auto& b : bits) b = static_cast<std::uint8_t>(rng());
      const float scale = 0.123456f, factor = 4.0f;
      std::vector<std::uint8_t> want(n * dtype_size(dtype) + 2, 0x77);
      scalar_kernels().unpack(bits.data(), scale * factor, want.data(), dtype, n);
      DeviceArray<std::uint8_t> dbits(bits.size()), dout(want.size());
      DeviceArray<float> dscale(1);
      dbits.put(bits.data());
      dscale.put(&scale);
      std::vector<std::uint8_t> marker(want.size(), 0x77);
      dout.put(marker.data());
      ASSERT_EQ(cuda::unpack(dbits.ptr, dscale.ptr, factor, dout.ptr, dtype, n, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(0, std::memcmp(dout.get().data(), want.data(), want.size())) << dtype_name(dtype) << " n=" << n;
    }
  }
}

TEST(CudaKernels, LoadsWithoutADevice) {
  // Always runs: the kernels' host side links and answers sizes without touching a device.
  EXPECT_GT(cuda::workspace_bytes(1u << 20), 0u);
  EXPECT_EQ(cuda::workspace_bytes(0), sizeof(double));
}

// D6: a non-finite scale on any rank must leave the state as it was before the call; a finite
// call must leave the call's new state alone.
TEST(CudaKernels, RevertUnlessFiniteRestoresTheStateOnlyAfterANonFiniteScale) {
  SKIP_WITHOUT_GPU();
  const std::size_t n = 70001, server_n = 17501;
  for (bool poisoned : {false, true}) {
    const auto e_prev = normal(n, 1), e_next = normal(n, 2), s_prev = normal(server_n, 3), s_next = normal(server_n, 4);
    DeviceArray<float> d_e_prev(n), d_e_next(n), d_s_prev(server_n), d_s_next(server_n);
    d_e_prev.put(e_prev.data()), d_e_next.put(e_next.data()), d_s_prev.put(s_prev.data()), d_s_next.put(s_next.data());
    std::vector<float> worker_scales = {0.5f, 0.75f, 1.0f, 2.0f}, server_scales = {0.1f, 0.2f, 0.3f, 0.4f};
    if (poisoned) server_scales[2] = NAN;  // what every rank sees when rank r's input held a NaN
    DeviceArray<float> d_worker(4), d_server(4), d_saved(2);
    d_worker.put(worker_scales.data()), d_server.put(server_scales.data());
    const float saved[2] = {7.0f, 9.0f};
    d_saved.put(saved);
    DeviceArray<int> verdict(1);
    DeviceArray<unsigned> failures(1);
    const unsigned zero = 0;
    failures.put(&zero);
    // This rank (1) owns worker_scales[1] and server_scales[1].
    cuda::Revert r{d_e_prev.ptr,     d_e_next.ptr,     n,           d_s_prev.ptr, d_s_next.ptr, server_n, d_saved.ptr,
                   d_worker.ptr + 1, d_server.ptr + 1, verdict.ptr, failures.ptr};
    ASSERT_EQ(cuda::revert_unless_finite(d_worker.ptr, d_server.ptr, 4, r, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto& want_e = poisoned ? e_prev : e_next;
    const auto& want_s = poisoned ? s_prev : s_next;
    EXPECT_EQ(std::memcmp(d_e_next.get().data(), want_e.data(), n * 4), 0) << "poisoned " << poisoned;
    EXPECT_EQ(std::memcmp(d_s_next.get().data(), want_s.data(), server_n * 4), 0) << "poisoned " << poisoned;
    EXPECT_EQ(d_worker.get()[1], poisoned ? 7.0f : 0.75f);
    EXPECT_EQ(d_server.get()[1], poisoned ? 9.0f : 0.2f);
    EXPECT_EQ(failures.get()[0], poisoned ? 1u : 0u);
  }
}

}  // namespace
}  // namespace onebit::kernels
