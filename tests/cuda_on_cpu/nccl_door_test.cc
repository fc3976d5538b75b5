// The NCCL front door (plugin/preload/nccl_interposer.cc) on the CUDA and NCCL stand-ins, ranks as
// threads of this process, called as a framework calls ncclAllReduce: a tagged float32, float16 or
// bfloat16 sum or average is compressed, alone or deferred out of a group, every rank's output the
// float32 oracle's bit for bit; everything else (another op, an untagged buffer) reaches NCCL's
// pncclAllReduce unchanged and does not touch the tag's state; a tag's first call inside graph
// capture is forwarded and makes no state. What a GPU adds (NCCL's real transfers, streams, graph
// replays) is tools/gpu/nccl_job_check.py's.
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "kernels/cpu/half.h"
#include "onebit/onebit.h"
#include "onebit/preload.h"
#include "tests/cuda_on_cpu/ranks_as_threads.h"
#include "tests/support/float32_oracle.h"

namespace {

using onebit::testing::bits_of;
using onebit::testing::each_rank;

constexpr int kWorld = 3;
constexpr std::size_t kN = 1000;

// [call][rank][element]: normal values, rounded as `type` holds them.
std::vector<std::vector<std::vector<float>>> inputs(int calls, unsigned seed, ncclDataType_t type) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<std::vector<std::vector<float>>> x(calls,
                                                 std::vector<std::vector<float>>(kWorld, std::vector<float>(kN)));
  for (auto& call : x) {
    for (auto& rank : call) {
      for (float& v : rank) {
        v = normal(rng);
        if (type == ncclFloat16) v = onebit::kernels::half_to_float(onebit::kernels::float_to_half(v));
        if (type == ncclBfloat16) v = onebit::kernels::bfloat16_to_float(onebit::kernels::float_to_bfloat16(v));
      }
    }
  }
  return x;
}

// A device buffer of kN elements of `type`, written and read as floats.
struct DeviceBuffer {
  ncclDataType_t type;
  void* ptr = nullptr;
  explicit DeviceBuffer(ncclDataType_t t) : type(t) { EXPECT_EQ(cudaMalloc(&ptr, kN * size()), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::size_t size() const { return type == ncclFloat32 ? 4 : 2; }
  void put(const std::vector<float>& values) {
    std::vector<std::uint8_t> bytes(kN * size());
    for (std::size_t i = 0; i < kN; ++i) {
      if (type == ncclFloat32) {
        std::memcpy(&bytes[4 * i], &values[i], 4);
      } else {
        const std::uint16_t h = type == ncclFloat16 ? onebit::kernels::float_to_half(values[i])
                                                    : onebit::kernels::float_to_bfloat16(values[i]);
        std::memcpy(&bytes[2 * i], &h, 2);
      }
    }
    EXPECT_EQ(cudaMemcpy(ptr, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<float> get() const {
    std::vector<std::uint8_t> bytes(kN * size());
    EXPECT_EQ(cudaMemcpy(bytes.data(), ptr, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<float> values(kN);
    for (std::size_t i = 0; i < kN; ++i) {
      if (type == ncclFloat32) {
        std::memcpy(&values[i], &bytes[4 * i], 4);
      } else {
        std::uint16_t h;
        std::memcpy(&h, &bytes[2 * i], 2);
        values[i] = type == ncclFloat16 ? onebit::kernels::half_to_float(h) : onebit::kernels::bfloat16_to_float(h);
      }
    }
    return values;
  }
};

std::vector<float> rounded(std::vector<float> v, ncclDataType_t type) {
  for (float& x : v) {
    if (type == ncclFloat16) x = onebit::kernels::half_to_float(onebit::kernels::float_to_half(x));
    if (type == ncclBfloat16) x = onebit::kernels::bfloat16_to_float(onebit::kernels::float_to_bfloat16(x));
  }
  return v;
}

onebit_dtype_t onebit_type(ncclDataType_t type) {
  return type == ncclFloat32 ? ONEBIT_FLOAT32 : type == ncclFloat16 ? ONEBIT_FLOAT16 : ONEBIT_BFLOAT16;
}

// Calls 0 and 2: a tagged average alone; call 1: a tagged sum inside a group (deferred to its end);
// between them a tagged max and an untagged sum, forwarded to NCCL. Every rank's compressed outputs
// are the oracle's (which sees only the compressed calls), the forwarded ones NCCL's exact answers.
TEST(NcclDoorOnStandIns, TaggedSumsAndAveragesCompressAndTheRestReachesNccl) {
  for (ncclDataType_t type : {ncclFloat32, ncclFloat16, ncclBfloat16}) {
    SCOPED_TRACE(::testing::Message() << "ncclDataType " << static_cast<int>(type));
    onebit_preload_stats_t before{}, after{};
    ASSERT_EQ(onebit_preload_stats(&before), ONEBIT_SUCCESS);
    const auto x = inputs(3, 11 + static_cast<unsigned>(type), type);
    const onebit::testing::StandInWorld world(kWorld);
    std::vector<std::vector<std::vector<float>>> got(3, std::vector<std::vector<float>>(kWorld));
    std::vector<std::vector<float>> max_got(kWorld), sum_got(kWorld);
    each_rank(kWorld, [&](int r) {
      const ncclComm_t comm = world.comms[r];
      DeviceBuffer tagged(type);
      const std::string name = "momentum/rank " + std::to_string(r) + "/type " + std::to_string(type);
      ASSERT_EQ(onebit_tag(name.c_str(), tagged.ptr, kN, onebit_type(type)), ONEBIT_SUCCESS) << onebit_last_error();
      tagged.put(x[0][r]);
      ASSERT_EQ(ncclAllReduce(tagged.ptr, tagged.ptr, kN, type, ncclAvg, comm, nullptr), ncclSuccess);
      got[0][r] = tagged.get();
      if (type == ncclFloat32) {  // the stand-in NCCL reduces float32 only
        std::vector<float> ranks_values(kN, static_cast<float>(r) - 1.0f);
        ranks_values[7] = 10.0f * r;
        tagged.put(ranks_values);
        ASSERT_EQ(ncclAllReduce(tagged.ptr, tagged.ptr, kN, type, ncclMax, comm, nullptr), ncclSuccess);
        max_got[r] = tagged.get();
        DeviceBuffer untagged(type);
        untagged.put(ranks_values);
        ASSERT_EQ(ncclAllReduce(untagged.ptr, untagged.ptr, kN, type, ncclSum, comm, nullptr), ncclSuccess);
        sum_got[r] = untagged.get();
      }
      tagged.put(x[1][r]);
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      ASSERT_EQ(ncclAllReduce(tagged.ptr, tagged.ptr, kN, type, ncclSum, comm, nullptr), ncclSuccess);
      EXPECT_EQ(bits_of(tagged.get()), bits_of(rounded(x[1][r], type))) << "deferred: untouched until the group ends";
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
      got[1][r] = tagged.get();
      tagged.put(x[2][r]);
      ASSERT_EQ(ncclAllReduce(tagged.ptr, tagged.ptr, kN, type, ncclAvg, comm, nullptr), ncclSuccess);
      got[2][r] = tagged.get();
      EXPECT_EQ(onebit_untag(tagged.ptr), ONEBIT_SUCCESS);
    });
    ASSERT_EQ(onebit_preload_stats(&after), ONEBIT_SUCCESS);
    EXPECT_EQ(after.onebit.compressed_calls - before.onebit.compressed_calls, 3u * kWorld);
    const std::uint64_t forwarded = type == ncclFloat32 ? 2 * kWorld : 0;
    EXPECT_EQ(after.forwarded_calls - before.forwarded_calls, forwarded);
    EXPECT_EQ(after.forwarded_bytes - before.forwarded_bytes, forwarded * kN * 4);
    onebit::testing::Float32Oracle oracle(kWorld, kN);
    for (int c = 0; c < 3; ++c) {
      const auto expected = bits_of(rounded(oracle.step(x[c], /*sum=*/c == 1), type));
      for (int r = 0; r < kWorld; ++r) ASSERT_EQ(bits_of(got[c][r]), expected) << "call " << c << ", rank " << r;
    }
    if (type != ncclFloat32) continue;
    for (int r = 0; r < kWorld; ++r) {
      for (std::size_t i = 0; i < kN; ++i) {
        ASSERT_EQ(max_got[r][i], i == 7 ? 20.0f : 1.0f) << "a tagged max is NCCL's: rank " << r << ", element " << i;
        ASSERT_EQ(sum_got[r][i], i == 7 ? 30.0f : 0.0f) << "an untagged sum is NCCL's: rank " << r << ", element " << i;
      }
    }
  }
}

// A tag's first call on a communicator inside CUDA graph capture would allocate the tag's device
// state (and synchronize), which a capture cannot hold: it goes to NCCL uncompressed on every rank
// and makes no state, leaving the capture valid; the tag's next call, outside capture, is its first
// compressed one (the oracle's first step). (NCCL's stand-in sums at once where a GPU's NCCL would
// record the sum into the graph.)
TEST(NcclDoorOnStandIns, ATagsFirstCallInsideCaptureGoesToNcclAndMakesNoState) {
  const auto x = inputs(2, 29, ncclFloat32);
  const onebit::testing::StandInWorld world(kWorld);
  onebit_preload_stats_t before{}, after{};
  ASSERT_EQ(onebit_preload_stats(&before), ONEBIT_SUCCESS);
  std::vector<std::vector<float>> captured(kWorld), compressed(kWorld);
  std::vector<std::uint64_t> calls_after_capture(kWorld, 99);
  each_rank(kWorld, [&](int r) {
    DeviceBuffer tagged(ncclFloat32);
    const std::string name = "captured first/rank " + std::to_string(r);
    ASSERT_EQ(onebit_tag(name.c_str(), tagged.ptr, kN, ONEBIT_FLOAT32), ONEBIT_SUCCESS) << onebit_last_error();
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    tagged.put(x[0][r]);
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    EXPECT_EQ(ncclAllReduce(tagged.ptr, tagged.ptr, kN, ncclFloat32, ncclSum, world.comms[r], stream), ncclSuccess);
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "the door synchronized a capturing stream";
    captured[r] = tagged.get();
    std::uint64_t bytes = 0;
    EXPECT_EQ(onebit_tag_stats(name.c_str(), &calls_after_capture[r], &bytes), ONEBIT_SUCCESS);
    tagged.put(x[1][r]);
    EXPECT_EQ(ncclAllReduce(tagged.ptr, tagged.ptr, kN, ncclFloat32, ncclSum, world.comms[r], stream), ncclSuccess);
    compressed[r] = tagged.get();
    EXPECT_EQ(onebit_untag(tagged.ptr), ONEBIT_SUCCESS);
    cudaStreamDestroy(stream);
  });
  ASSERT_EQ(onebit_preload_stats(&after), ONEBIT_SUCCESS);
  EXPECT_EQ(after.forwarded_calls - before.forwarded_calls, std::uint64_t{kWorld});
  EXPECT_EQ(after.onebit.compressed_calls - before.onebit.compressed_calls, std::uint64_t{kWorld});
  std::vector<float> exact(kN, 0.0f);
  for (int r = 0; r < kWorld; ++r) {
    for (std::size_t i = 0; i < kN; ++i) exact[i] += x[0][r][i];
  }
  onebit::testing::Float32Oracle oracle(kWorld, kN);
  const auto first_compressed = bits_of(oracle.step(x[1], /*sum=*/true));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(calls_after_capture[r], 0u) << "rank " << r << ": the captured call was counted as the tag's";
    EXPECT_EQ(bits_of(captured[r]), bits_of(exact)) << "rank " << r << ": the captured call is NCCL's exact sum";
    EXPECT_EQ(bits_of(compressed[r]), first_compressed) << "rank " << r << ": the next call is not the tag's first";
  }
}

// A tagged call on the legacy stream while another stream captures a graph: CUDA cannot say whether
// it is capturing (cudaErrorStreamCaptureImplicit), so the call is NCCL's, counted as forwarded,
// with no state made and CUDA's error cleared for the framework's next launch check.
TEST(NcclDoorOnStandIns, ACallOnTheLegacyStreamDuringACaptureGoesToNccl) {
  const onebit::testing::StandInWorld world(1);
  DeviceBuffer tagged(ncclFloat32);
  ASSERT_EQ(onebit_tag("legacy stream", tagged.ptr, kN, ONEBIT_FLOAT32), ONEBIT_SUCCESS) << onebit_last_error();
  tagged.put(std::vector<float>(kN, 1.5f));
  cudaStream_t capturing = nullptr;
  ASSERT_EQ(cudaStreamCreate(&capturing), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal), cudaSuccess);
  onebit_preload_stats_t before{}, after{};
  ASSERT_EQ(onebit_preload_stats(&before), ONEBIT_SUCCESS);
  EXPECT_EQ(ncclAllReduce(tagged.ptr, tagged.ptr, kN, ncclFloat32, ncclSum, world.comms[0], nullptr), ncclSuccess);
  ASSERT_EQ(onebit_preload_stats(&after), ONEBIT_SUCCESS);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "CUDA's error left for the framework";
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(capturing, &graph), cudaSuccess);
  cudaStreamDestroy(capturing);
  EXPECT_EQ(after.forwarded_calls - before.forwarded_calls, 1u);
  EXPECT_EQ(after.onebit.compressed_calls, before.onebit.compressed_calls);
  std::uint64_t calls = 9, bytes = 0;
  EXPECT_EQ(onebit_tag_stats("legacy stream", &calls, &bytes), ONEBIT_SUCCESS);
  EXPECT_EQ(calls, 0u);
  EXPECT_EQ(bits_of(tagged.get()), bits_of(std::vector<float>(kN, 1.5f))) << "one rank's sum is its own buffer";
  EXPECT_EQ(onebit_untag(tagged.ptr), ONEBIT_SUCCESS);
}

// A forwarded call is counted at its elements' size, float8's one byte included (NCCL 2.24's; the
// door counted 8 before), and NCCL's answer comes back unchanged (the stand-in refuses float8).
TEST(NcclDoorOnStandIns, AForwardedCallIsCountedAtItsElementSizeAndGetsNcclsAnswer) {
  const onebit::testing::StandInWorld world(1);
  DeviceBuffer untagged(ncclFloat32);  // kN floats: room for kN float8 elements
  onebit_preload_stats_t before{}, after{};
  ASSERT_EQ(onebit_preload_stats(&before), ONEBIT_SUCCESS);
  EXPECT_EQ(ncclAllReduce(untagged.ptr, untagged.ptr, kN, ncclFloat8e4m3, ncclSum, world.comms[0], nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(untagged.ptr, untagged.ptr, kN / 8, ncclFloat64, ncclSum, world.comms[0], nullptr),
            ncclInvalidArgument);
  ASSERT_EQ(onebit_preload_stats(&after), ONEBIT_SUCCESS);
  EXPECT_EQ(after.forwarded_calls - before.forwarded_calls, 2u);
  EXPECT_EQ(after.forwarded_bytes - before.forwarded_bytes, kN * 1 + kN / 8 * 8);
}

}  // namespace
