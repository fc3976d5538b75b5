// The compressed allreduce of algorithm.md over the TCP transport.
//
//   1. worker stage: chunk by chunk (own chunk last), one fused kernel pass computes y = x + e, its
//      sign bits and Σy²; chunk j's bits go to rank j as soon as they are packed, so packing
//      overlaps the wire. Then the worker scale a_r = ||y|| / sqrt(n) goes to every rank.
//   2. server stage (rank j, chunk j), once every rank's bits and scale are in: z = mean of the
//      signed scales + s; its bits and scale b_j go to every rank.
//   3. every rank checks every scale, then unpacks into the caller's buffer and commits the new
//      error state by flipping buffers.
// Nothing touches the caller's buffer or the committed state before step 3's checks pass. A
// non-finite worker scale (NaN/Inf in some rank's input) travels through the protocol as a flag, so
// every rank fails the same call with the same error, and the communicator stays usable.
#include <bit>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "plugin/engine/communicator.h"

namespace onebit {

static_assert(std::endian::native == std::endian::little, "payload floats travel in host order: little-endian only");

namespace {

// Server results are [float scale][int32 first rank with non-finite input, or -1][bits].
constexpr std::size_t kResultHead = 8;

}  // namespace

void Communicator::compressed_allreduce(Tag& tag, void* buffer, std::size_t n, kernels::Dtype dtype, ReduceOp op) {
  std::unique_lock<std::mutex> busy(tag.busy, std::try_to_lock);
  ONEBIT_CHECK(busy.owns_lock(), ONEBIT_INVALID_ARGUMENT, where(), ": tag '", tag.name,
               "' is already in an allreduce on another thread; calls on one tag must not overlap");
  const int world = size();
  const int me = rank();
  ++compressed_calls_;
  ++tag.calls;
  if (world == 1) return;  // the average over one rank is the buffer itself

  std::unique_ptr<TagState>& slot = tag.states[id_];
  if (!slot) slot = std::make_unique<TagState>();
  TagState& st = *slot;

  // Chunks: length c = ceil(n / W) rounded up to a multiple of 8, so each chunk's bits start on a
  // byte; the last chunks may be shorter or empty.
  const std::size_t chunk = ((n + world - 1) / world + 7) / 8 * 8;
  auto begin = [&](int j) { return std::min(n, static_cast<std::size_t>(j) * chunk); };
  auto length = [&](int j) { return std::min(n, begin(j) + chunk) - begin(j); };
  const std::size_t chunk_bytes = chunk / 8;
  const std::size_t result_stride = kResultHead + chunk_bytes;
  const std::size_t element = kernels::dtype_size(dtype);
  auto* x = static_cast<std::uint8_t*>(buffer);

  if (st.requests.empty()) {  // first call: size everything once
    st.worker[0].resize(n);
    st.worker[1].resize(n);
    st.server[0].resize(length(me));
    st.server[1].resize(length(me));
    st.packed.resize(kernels::packed_bytes(n) + 8);
    st.received.resize(world * chunk_bytes);
    st.scales.resize(world);
    st.results.resize(world * result_stride);
    st.requests.resize(6 * (world - 1));
    st.stage1.reserve(2 * (world - 1));
    st.all.reserve(6 * (world - 1));
    st.chunk_bits.resize(world);
  }
  const std::uint64_t seq = st.seq;
  const wire::CallShape shape{n, static_cast<std::uint8_t>(dtype), static_cast<std::uint8_t>(op)};
  auto key = [&](wire::Kind kind, int part) { return wire::MessageKey{tag.id, seq, kind, static_cast<std::uint16_t>(part)}; };
  auto describe = [&](const tcp::Request& r) {
    return "tag '" + tag.name + "' call " + std::to_string(seq) + ": " + wire::kind_name(r.key.kind) + " of chunk " +
           std::to_string(r.key.part);
  };

  std::size_t next_request = 0;
  st.stage1.clear();
  st.all.clear();
  std::uint64_t sent = 0;
  auto post_recv = [&](int peer, wire::Kind kind, int part, void* data, std::size_t bytes, bool stage1) {
    tcp::Request& r = st.requests[next_request++];
    transport_.irecv(r, peer, key(kind, part), shape, data, bytes);
    if (stage1) st.stage1.push_back(&r);
    st.all.push_back(&r);
  };
  auto post_send = [&](int peer, wire::Kind kind, int part, const void* data, std::size_t bytes) {
    tcp::Request& r = st.requests[next_request++];
    transport_.isend(r, peer, key(kind, part), shape, data, bytes);
    st.all.push_back(&r);
    sent += bytes;
  };

  float worker_scale = 0.0f;
  float server_scale = NAN;
  try {
    // Receives first, so messages land in place instead of in the transport's unexpected store.
    for (int p = 0; p < world; ++p) {
      if (p == me) continue;
      post_recv(p, wire::Kind::kWorkerBits, me, st.received.data() + p * chunk_bytes, kernels::packed_bytes(length(me)), true);
      post_recv(p, wire::Kind::kWorkerScale, me, &st.scales.data()[p], sizeof(float), true);
      post_recv(p, wire::Kind::kServerResult, p, st.results.data() + p * result_stride,
                kResultHead + kernels::packed_bytes(length(p)), false);
    }

    // 1. Worker stage.
    const float* e_prev = st.worker[st.current].data();
    float* e_next = st.worker[1 - st.current].data();
    double sum_squares = 0.0;
    for (int k = 1; k <= world; ++k) {
      const int j = (me + k) % world;
      const std::size_t b = begin(j);
      sum_squares += kernels_.worker_pass(x + b * element, dtype, e_prev + b, st.worker_scale, e_next + b,
                                          st.packed.data() + b / 8, length(j));
      if (j != me) post_send(j, wire::Kind::kWorkerBits, j, st.packed.data() + b / 8, kernels::packed_bytes(length(j)));
    }
    worker_scale = std::isfinite(sum_squares) ? kernels::scale_from_sum_squares(sum_squares, n) : NAN;
    st.scales.data()[me] = worker_scale;
    for (int p = 0; p < world; ++p) {
      if (p != me) post_send(p, wire::Kind::kWorkerScale, p, &st.scales.data()[me], sizeof(float));
    }

    // 2. Server stage.
    transport_.wait_all(st.stage1, call_deadline(), describe);
    std::int32_t first_bad = -1;
    for (int p = 0; p < world && first_bad < 0; ++p) {
      if (!std::isfinite(st.scales.data()[p])) first_bad = p;
    }
    std::uint8_t* my_result = st.results.data() + me * result_stride;
    if (first_bad < 0) {
      for (int p = 0; p < world; ++p) {
        st.chunk_bits[p] = p == me ? st.packed.data() + begin(me) / 8 : st.received.data() + p * chunk_bytes;
      }
      const double server_squares =
          kernels_.server_pass(st.chunk_bits.data(), st.scales.data(), world, st.server[st.current].data(),
                               st.server_scale, st.server[1 - st.current].data(), my_result + kResultHead, length(me));
      server_scale = kernels::scale_from_sum_squares(server_squares, length(me));
    }
    std::memcpy(my_result, &server_scale, 4);
    std::memcpy(my_result + 4, &first_bad, 4);
    for (int p = 0; p < world; ++p) {
      if (p != me) post_send(p, wire::Kind::kServerResult, me, my_result, kResultHead + kernels::packed_bytes(length(me)));
    }
    transport_.wait_all(st.all, call_deadline(), describe);
  } catch (const Error& error) {
    fail(error.code(), where(), ": allreduce of tag '", tag.name, "' (", n, " ", kernels::dtype_name(dtype), ", call ",
         seq, ") failed; buffer and error state unchanged: ", error.what());
  }
  compressed_bytes_ += sent;
  tag.bytes_sent += sent;
  st.seq = seq + 1;  // the call's messages are consumed on every rank, whatever the checks say

  // 3. Check every server's scale, then write the result and commit.
  for (int p = 0; p < world; ++p) {
    float scale;
    std::int32_t bad;
    std::memcpy(&scale, st.results.data() + p * result_stride, 4);
    std::memcpy(&bad, st.results.data() + p * result_stride + 4, 4);
    if (bad >= 0) {
      fail(ONEBIT_NUMERIC_ERROR, where(), ": allreduce of tag '", tag.name, "' (call ", seq, "): rank ", bad,
           "'s input holds NaN or Inf (its worker scale is not finite); no buffer or error state changed on any rank");
    }
    ONEBIT_CHECK(std::isfinite(scale), ONEBIT_NUMERIC_ERROR, where(), ": allreduce of tag '", tag.name, "' (call ", seq,
                 "): server rank ", p, "'s scale is ", scale, "; no buffer or error state changed");
  }
  const float factor = op == ReduceOp::kSum ? static_cast<float>(world) : 1.0f;
  for (int j = 0; j < world; ++j) {
    float scale;
    std::memcpy(&scale, st.results.data() + j * result_stride, 4);
    kernels_.unpack(st.results.data() + j * result_stride + kResultHead, scale * factor, x + begin(j) * element, dtype,
                    length(j));
  }
  st.current = 1 - st.current;
  st.worker_scale = worker_scale;
  st.server_scale = server_scale;
}

}  // namespace onebit
