// The exact full-precision allreduce: a ring reduce-scatter then a ring allgather, in fp32, over the
// same transport as the compressed one — the baseline it is measured against.
//
// The caller's buffer is copied into an fp32 accumulator (converted from fp16/bf16), reduced there
// and copied back only when every step has succeeded, so a failed call leaves it untouched. Every
// rank ends with the same bits: each chunk is summed once, along the ring, then broadcast.
#include <algorithm>
#include <cstring>
#include <functional>

#include "common/error.h"
#include "engine/communicator.h"
#include "kernels/cpu/half.h"

namespace onebit {
namespace {

// Segment size of the pipelined ring: 1 MiB of floats, Gloo's choice too.
constexpr std::size_t kRingSegmentFloats = (1 << 20) / sizeof(float);

// The caller's buffer into the fp32 accumulator (converted from fp16/bf16).
void load_accumulator(const void* buffer, kernels::Dtype dtype, float* acc, std::size_t n) {
  switch (dtype) {
    case kernels::Dtype::kFloat32:
      if (n > 0) std::memcpy(acc, buffer, n * sizeof(float));  // buffer may be NULL when n is 0
      break;
    case kernels::Dtype::kFloat16:
      for (std::size_t i = 0; i < n; ++i) acc[i] = kernels::half_to_float(static_cast<const std::uint16_t*>(buffer)[i]);
      break;
    case kernels::Dtype::kBFloat16:
      for (std::size_t i = 0; i < n; ++i) {
        acc[i] = kernels::bfloat16_to_float(static_cast<const std::uint16_t*>(buffer)[i]);
      }
      break;
  }
}

// The reduced accumulator back into the caller's buffer: averaged for AVG — by division, not
// multiplication by 1/W, so that the average of integers is correctly rounded — and converted.
void store_result(float* acc, std::size_t n, int world, ReduceOp op, kernels::Dtype dtype, void* buffer) {
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

// The ring's geometry: W chunks, each cut into segments that move through the ring one behind the
// other — a segment is forwarded as soon as it has arrived and been added, so every link stays
// busy, rather than each step waiting for a whole chunk (Gloo's ring does the same, with 1 MiB
// segments). Steps 0 … W−2 reduce-scatter, W−1 … 2W−3 allgather.
struct RingPlan {
  RingPlan(std::size_t elements, int ranks, int rank)
      : n(elements), world(ranks), me(rank), chunk((n + world - 1) / world), steps(2 * (world - 1)) {
    segment = std::max<std::size_t>(kRingSegmentFloats, 1);
    while ((chunk + segment - 1) / segment * steps > 65535) segment *= 2;  // message parts are 16 bits
    segments = static_cast<int>(std::max<std::size_t>(1, (chunk + segment - 1) / segment));
  }
  std::size_t begin(int j) const { return std::min(n, static_cast<std::size_t>(j) * chunk); }
  std::size_t length(int j) const { return std::min(n, begin(j) + chunk) - begin(j); }
  std::size_t seg_begin(int j, int p) const { return std::min(begin(j) + length(j), begin(j) + p * segment); }
  std::size_t seg_length(int j, int p) const {
    return std::min(begin(j) + length(j), seg_begin(j, p) + segment) - seg_begin(j, p);
  }
  bool reducing(int t) const { return t < world - 1; }
  // Step t sends chunk (me − t) and receives chunk (me − t − 1) in the reduce-scatter; in the
  // allgather it sends chunk (me + 1 − s) and receives chunk (me − s), s = t − (W−1).
  int send_chunk(int t) const {
    return reducing(t) ? (me - t + world) % world : (me + 1 - (t - world + 1) + world) % world;
  }
  int recv_chunk(int t) const {
    return reducing(t) ? (me - t - 1 + 2 * world) % world : (me - (t - world + 1) + world) % world;
  }
  wire::MessageKey key(std::uint64_t seq, int t, int p) const {
    return wire::MessageKey{0, seq, reducing(t) ? wire::Kind::kRingReduce : wire::Kind::kRingGather,
                            static_cast<std::uint16_t>(t * segments + p)};
  }

  std::size_t n;
  int world, me;
  std::size_t chunk;
  int steps;
  std::size_t segment;
  int segments;
};

}  // namespace

// One untagged call's ring: receives posted a step ahead, each arrived segment added (reduce-
// scatter) and sent on, then the sends awaited.
class Communicator::Ring {
 public:
  Ring(Communicator& comm, std::size_t n, kernels::Dtype dtype, ReduceOp op, std::uint64_t seq)
      : comm_(comm),
        plan_(n, comm.size(), comm.rank()),
        seq_(seq),
        shape_{n, static_cast<std::uint8_t>(dtype), static_cast<std::uint8_t>(op)},
        right_((plan_.me + 1) % plan_.world),
        left_((plan_.me + plan_.world - 1) % plan_.world),
        acc_(comm.ring_accumulator_.data()) {
    comm.ring_staging_.resize(2 * plan_.chunk + 1);  // reduce-scatter receives, double-buffered by step parity
    comm.ring_sends_.resize(static_cast<std::size_t>(plan_.steps) * plan_.segments);
    comm.ring_recvs_.resize(static_cast<std::size_t>(plan_.steps) * plan_.segments);
  }

  // Runs the ring; `sent` counts the bytes this rank sent, also when it throws.
  void run() {
    post_recvs(0);
    for (int p = 0; p < plan_.segments; ++p) post_send(0, p);
    std::vector<Request*> one(1);
    for (int t = 0; t < plan_.steps; ++t) {
      // Step t+1's receives are posted before step t's are consumed, so they land in place. Its
      // staging half is free: step t−1's adds are done.
      if (t + 1 < plan_.steps) post_recvs(t + 1);
      for (int p = 0; p < plan_.segments; ++p) {
        one[0] = &comm_.ring_recvs_[t * plan_.segments + p];
        comm_.transport_->wait_all(one, comm_.call_deadline(), describe());
        if (plan_.reducing(t)) add_arrived(t, p);
        if (t + 1 < plan_.steps) post_send(t + 1, p);  // what just arrived is what goes on next
      }
    }
    std::vector<Request*> sends;
    for (Request& r : comm_.ring_sends_) sends.push_back(&r);
    comm_.transport_->wait_all(sends, comm_.call_deadline(), describe());
  }

  std::uint64_t sent = 0;

 private:
  std::function<std::string(const Request&)> describe() const {
    return [this](const Request& r) {
      return "untagged allreduce call " + std::to_string(seq_) + ": " + wire::kind_name(r.key.kind) + " step " +
             std::to_string(r.key.part / plan_.segments) + " segment " + std::to_string(r.key.part % plan_.segments);
    };
  }
  float* staging(int t, int p) const {
    const int j = plan_.recv_chunk(t);
    return comm_.ring_staging_.data() + (t % 2) * plan_.chunk + (plan_.seg_begin(j, p) - plan_.begin(j));
  }
  void post_recvs(int t) {
    for (int p = 0; p < plan_.segments; ++p) {
      const int j = plan_.recv_chunk(t);
      float* into = plan_.reducing(t) ? staging(t, p) : acc_ + plan_.seg_begin(j, p);
      comm_.transport_->irecv(comm_.ring_recvs_[t * plan_.segments + p], left_, 0, plan_.key(seq_, t, p), shape_, into,
                              plan_.seg_length(j, p) * sizeof(float));
    }
  }
  void post_send(int t, int p) {
    const int j = plan_.send_chunk(t);
    comm_.transport_->isend(comm_.ring_sends_[t * plan_.segments + p], right_, 0, plan_.key(seq_, t, p), shape_,
                            acc_ + plan_.seg_begin(j, p), plan_.seg_length(j, p) * sizeof(float));
    sent += plan_.seg_length(j, p) * sizeof(float);
  }
  void add_arrived(int t, int p) {
    const int j = plan_.recv_chunk(t);
    float* target = acc_ + plan_.seg_begin(j, p);
    const float* incoming = staging(t, p);
    const std::size_t len = plan_.seg_length(j, p);
    for (std::size_t i = 0; i < len; ++i) target[i] += incoming[i];
  }

  Communicator& comm_;
  const RingPlan plan_;
  const std::uint64_t seq_;
  const wire::CallShape shape_;
  const int right_, left_;
  float* const acc_;
};

void Communicator::ring_allreduce(void* buffer, std::size_t n, kernels::Dtype dtype, ReduceOp op) {
  CallScope scope(*this);
  std::lock_guard<std::mutex> lock(ring_mutex_);
  ++full_precision_calls_;
  if (size() == 1) return;  // sum and average over one rank are the buffer itself
  const std::uint64_t seq = ring_seq_++;
  ring_accumulator_.resize(n);
  load_accumulator(buffer, dtype, ring_accumulator_.data(), n);
  Ring ring(*this, n, dtype, op, seq);
  try {
    ring.run();
  } catch (const Error& error) {
    full_precision_bytes_ += ring.sent;
    fail(error.code(), where(), ": untagged allreduce (", n, " ", kernels::dtype_name(dtype), ", call ", seq,
         ") failed; buffer unchanged: ", error.what());
  }
  full_precision_bytes_ += ring.sent;
  store_result(ring_accumulator_.data(), n, size(), op, dtype, buffer);
}

}  // namespace onebit
