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
namespace {
// Segment size of the pipelined ring: 1 MiB of floats, Gloo's choice too.
constexpr std::size_t kRingSegmentFloats = (1 << 20) / sizeof(float);
}  // namespace

void Communicator::ring_allreduce(void* buffer, std::size_t n, kernels::Dtype dtype, ReduceOp op) {
  CallScope scope(*this);
  std::lock_guard<std::mutex> lock(ring_mutex_);
  ++full_precision_calls_;
  const int world = size();
  const int me = rank();
  if (world == 1) return;  // sum and average over one rank are the buffer itself
  const std::uint64_t seq = ring_seq_++;

  ring_accumulator_.resize(n);
  float* acc = ring_accumulator_.data();
  switch (dtype) {
    case kernels::Dtype::kFloat32:
      if (n > 0) std::memcpy(acc, buffer, n * sizeof(float));  // buffer may be NULL when n is 0
      break;
    case kernels::Dtype::kFloat16:
      for (std::size_t i = 0; i < n; ++i) acc[i] = kernels::half_to_float(static_cast<const std::uint16_t*>(buffer)[i]);
      break;
    case kernels::Dtype::kBFloat16:
      for (std::size_t i = 0; i < n; ++i) acc[i] = kernels::bfloat16_to_float(static_cast<const std::uint16_t*>(buffer)[i]);
      break;
  }

  // W chunks, each cut into segments that move through the ring one behind the other: a segment
  // is forwarded as soon as it has arrived and been added, so every link stays busy, rather than
  // each step waiting for a whole chunk (Gloo's ring does the same, with 1 MiB segments).
  const std::size_t chunk = (n + world - 1) / world;
  auto begin = [&](int j) { return std::min(n, static_cast<std::size_t>(j) * chunk); };
  auto length = [&](int j) { return std::min(n, begin(j) + chunk) - begin(j); };
  const int steps = 2 * (world - 1);  // W−1 reduce-scatter steps, then W−1 allgather steps
  std::size_t segment = std::max<std::size_t>(kRingSegmentFloats, 1);
  // Message parts (step · segments + segment) are 16 bits.
  while ((chunk + segment - 1) / segment * steps > 65535) segment *= 2;
  const int segments = static_cast<int>(std::max<std::size_t>(1, (chunk + segment - 1) / segment));
  auto seg_begin = [&](int j, int p) { return std::min(begin(j) + length(j), begin(j) + p * segment); };
  auto seg_length = [&](int j, int p) { return std::min(begin(j) + length(j), seg_begin(j, p) + segment) - seg_begin(j, p); };
  // Step t sends chunk (me − t) and receives chunk (me − t − 1) in the reduce-scatter; in the
  // allgather (t ≥ W−1) it sends chunk (me + 1 − s) and receives chunk (me − s), s = t − (W−1).
  auto send_chunk = [&](int t) { return t < world - 1 ? (me - t + world) % world : (me + 1 - (t - world + 1) + world) % world; };
  auto recv_chunk = [&](int t) { return t < world - 1 ? (me - t - 1 + 2 * world) % world : (me - (t - world + 1) + world) % world; };

  ring_staging_.resize(2 * chunk + 1);  // reduce-scatter receives, double-buffered by step parity
  ring_sends_.resize(static_cast<std::size_t>(steps) * segments);
  ring_recvs_.resize(static_cast<std::size_t>(steps) * segments);
  const int right = (me + 1) % world;
  const int left = (me + world - 1) % world;
  const wire::CallShape shape{n, static_cast<std::uint8_t>(dtype), static_cast<std::uint8_t>(op)};
  auto describe = [&](const Request& r) {
    return "untagged allreduce call " + std::to_string(seq) + ": " + wire::kind_name(r.key.kind) + " step " +
           std::to_string(r.key.part / segments) + " segment " + std::to_string(r.key.part % segments);
  };
  auto key = [&](int t, int p) {
    return wire::MessageKey{0, seq, t < world - 1 ? wire::Kind::kRingReduce : wire::Kind::kRingGather,
                            static_cast<std::uint16_t>(t * segments + p)};
  };
  auto staging = [&](int t, int p) {
    return ring_staging_.data() + (t % 2) * chunk + (seg_begin(recv_chunk(t), p) - begin(recv_chunk(t)));
  };
  std::uint64_t sent = 0;
  auto post_recvs = [&](int t) {
    for (int p = 0; p < segments; ++p) {
      float* into = t < world - 1 ? staging(t, p) : acc + seg_begin(recv_chunk(t), p);
      transport_->irecv(ring_recvs_[t * segments + p], left, 0, key(t, p), shape, into,
                       seg_length(recv_chunk(t), p) * sizeof(float));
    }
  };
  auto post_send = [&](int t, int p) {
    const int j = send_chunk(t);
    transport_->isend(ring_sends_[t * segments + p], right, 0, key(t, p), shape, acc + seg_begin(j, p),
                     seg_length(j, p) * sizeof(float));
    sent += seg_length(j, p) * sizeof(float);
  };

  try {
    post_recvs(0);
    for (int p = 0; p < segments; ++p) post_send(0, p);
    std::vector<Request*> one(1);
    for (int t = 0; t < steps; ++t) {
      // Step t+1's receives are posted before step t's are consumed, so they land in place. Its
      // staging half is free: step t−1's adds are done.
      if (t + 1 < steps) post_recvs(t + 1);
      for (int p = 0; p < segments; ++p) {
        one[0] = &ring_recvs_[t * segments + p];
        transport_->wait_all(one, call_deadline(), describe);
        if (t < world - 1) {
          float* target = acc + seg_begin(recv_chunk(t), p);
          const float* incoming = staging(t, p);
          const std::size_t len = seg_length(recv_chunk(t), p);
          for (std::size_t i = 0; i < len; ++i) target[i] += incoming[i];
        }
        if (t + 1 < steps) post_send(t + 1, p);  // what just arrived is what goes on next
      }
    }
    std::vector<Request*> sends;
    for (Request& r : ring_sends_) sends.push_back(&r);
    transport_->wait_all(sends, call_deadline(), describe);
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
    case kernels::Dtype::kFloat32:
      if (n > 0) std::memcpy(buffer, acc, n * sizeof(float));
      break;
    case kernels::Dtype::kFloat16:
      for (std::size_t i = 0; i < n; ++i) static_cast<std::uint16_t*>(buffer)[i] = kernels::float_to_half(acc[i]);
      break;
    case kernels::Dtype::kBFloat16:
      for (std::size_t i = 0; i < n; ++i) static_cast<std::uint16_t*>(buffer)[i] = kernels::float_to_bfloat16(acc[i]);
      break;
  }
}

}  // namespace onebit
