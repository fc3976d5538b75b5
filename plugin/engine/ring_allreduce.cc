// The exact full-precision allreduce: a ring reduce-scatter then a ring allgather, in fp32, over the
// same transport as the compressed one — the baseline it is measured against.
//
// The caller's buffer is copied into an fp32 accumulator (converted from fp16/bf16), reduced there
// and copied back only when every step has succeeded, so a failed call leaves it untouched. Every
// rank ends with the same bits: each chunk is summed once, along the ring, then broadcast.
#include "common/error.h"
#include "kernels/cpu/half.h"
#include "plugin/engine/communicator.h"

namespace onebit {

void Communicator::ring_allreduce(void* buffer, std::size_t n, kernels::Dtype dtype, ReduceOp op) {
  std::lock_guard<std::mutex> lock(ring_mutex_);
  ++full_precision_calls_;
  const int world = size();
  const int me = rank();
  if (world == 1) return;  // sum and average over one rank are the buffer itself
  const std::uint64_t seq = ring_seq_++;

  ring_accumulator_.resize(n);
  float* acc = ring_accumulator_.data();
  switch (dtype) {
    case kernels::Dtype::kFloat32: std::memcpy(acc, buffer, n * sizeof(float)); break;
    case kernels::Dtype::kFloat16:
      for (std::size_t i = 0; i < n; ++i) acc[i] = kernels::half_to_float(static_cast<const std::uint16_t*>(buffer)[i]);
      break;
    case kernels::Dtype::kBFloat16:
      for (std::size_t i = 0; i < n; ++i) acc[i] = kernels::bfloat16_to_float(static_cast<const std::uint16_t*>(buffer)[i]);
      break;
  }

  const std::size_t chunk = (n + world - 1) / world;
  auto begin = [&](int j) { return std::min(n, static_cast<std::size_t>(j) * chunk); };
  auto length = [&](int j) { return std::min(n, begin(j) + chunk) - begin(j); };
  ring_staging_.resize(chunk);
  float* staging = ring_staging_.data();
  const int right = (me + 1) % world;
  const int left = (me + world - 1) % world;
  const wire::CallShape shape{n, static_cast<std::uint8_t>(dtype), static_cast<std::uint8_t>(op)};
  auto describe = [&](const tcp::Request& r) {
    return "untagged allreduce call " + std::to_string(seq) + ": " + wire::kind_name(r.key.kind) + " step " +
           std::to_string(r.key.part);
  };
  std::uint64_t sent = 0;
  auto step = [&](wire::Kind kind, int s, int send_chunk, int recv_chunk, float* recv_into) {
    const wire::MessageKey key{0, seq, kind, static_cast<std::uint16_t>(s)};
    tcp::Request send, recv;
    transport_.irecv(recv, left, key, shape, recv_into, length(recv_chunk) * sizeof(float));
    transport_.isend(send, right, key, shape, acc + begin(send_chunk), length(send_chunk) * sizeof(float));
    sent += length(send_chunk) * sizeof(float);
    transport_.wait_all({&send, &recv}, call_deadline(), describe);
  };

  try {
    // Reduce-scatter: after W−1 steps this rank holds the full sum of chunk (me + 1) mod W.
    for (int s = 0; s < world - 1; ++s) {
      const int send_chunk = (me - s + world) % world;
      const int recv_chunk = (me - s - 1 + 2 * world) % world;
      step(wire::Kind::kRingReduce, s, send_chunk, recv_chunk, staging);
      float* target = acc + begin(recv_chunk);
      const std::size_t len = length(recv_chunk);
      for (std::size_t i = 0; i < len; ++i) target[i] += staging[i];
    }
    // Allgather: pass the finished chunks around.
    for (int s = 0; s < world - 1; ++s) {
      const int send_chunk = (me + 1 - s + world) % world;
      const int recv_chunk = (me - s + world) % world;
      step(wire::Kind::kRingGather, s, send_chunk, recv_chunk, acc + begin(recv_chunk));
    }
  } catch (const Error& error) {
    full_precision_bytes_ += sent;
    fail(error.code(), where(), ": untagged allreduce (", n, " ", kernels::dtype_name(dtype), ", call ", seq,
         ") failed; buffer unchanged: ", error.what());
  }
  full_precision_bytes_ += sent;

  // Division, not multiplication by 1/W: the average of integers is then correctly rounded.
  if (op == ReduceOp::kAvg) {
    const float w = static_cast<float>(world);
    for (std::size_t i = 0; i < n; ++i) acc[i] /= w;
  }
  switch (dtype) {
    case kernels::Dtype::kFloat32: std::memcpy(buffer, acc, n * sizeof(float)); break;
    case kernels::Dtype::kFloat16:
      for (std::size_t i = 0; i < n; ++i) static_cast<std::uint16_t*>(buffer)[i] = kernels::float_to_half(acc[i]);
      break;
    case kernels::Dtype::kBFloat16:
      for (std::size_t i = 0; i < n; ++i) static_cast<std::uint16_t*>(buffer)[i] = kernels::float_to_bfloat16(acc[i]);
      break;
  }
}

}  // namespace onebit
