// The compressed allreduce of docs/algorithm.md over a transport (transport/transport.h): one round over
// a group of ranks (compressed_round, which the hierarchical algorithm runs over each rail too), and
// the flat algorithm, one round over all ranks.
//
// A round:
//   1. worker stage: chunk by chunk (own chunk last), block by block, one fused kernel pass computes
//      y = x + e, its sign bits and Σy²; each block's bits go to the chunk's server as soon as they
//      are packed, so packing overlaps the wire. Then the worker scale a_r = ||y|| / sqrt(n) goes
//      to every member (signs do not depend on it, which is what lets the bits leave early).
//   2. server stage (member j, chunk j), once every member's bits and scale are in: z = mean of
//      the signed scales + s, block by block, each block's bits sent to every member as it is
//      done; then the scale b_j.
// The flat call then
//   3. checks every scale, unpacks into the caller's buffer and commits the new error state by
//      flipping buffers.
// Nothing touches the caller's buffer or the committed state before step 3's checks pass. A
// non-finite worker scale (NaN/Inf in some rank's input) travels through the protocol as a flag, so
// every rank fails the same call with the same error, and the communicator stays usable.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "plugin/engine/communicator.h"
#include "plugin/engine/compressed_round.h"

namespace onebit {

static_assert(std::endian::native == std::endian::little, "payload floats travel in host order: little-endian only");

using round_layout::blocks_of;
using round_layout::kResultHead;

void Communicator::compressed_allreduce(Tag& tag, void* buffer, std::size_t n, kernels::Dtype dtype, ReduceOp op,
                                        std::uint32_t channel) {
  CallScope scope(*this);
  check_topology(tag);
  if (hierarchical()) {
    hierarchical_allreduce(tag, buffer, n, dtype, op, channel);
  } else {
    flat_compressed_allreduce(tag, buffer, n, dtype, op, channel);
  }
}

Communicator::RoundResult Communicator::compressed_round(Tag& tag, TagState& st, const RankGroup& group, std::size_t n,
                                                         std::size_t offset, const wire::CallShape& shape,
                                                         std::uint32_t channel, const RoundWorker& worker) {
  const int world = group.size();
  const int me = group.me;
  const ChunkGeometry geometry(n, world);
  auto begin = [&](int j) { return geometry.begin(j); };
  auto length = [&](int j) { return geometry.length(j); };
  const std::size_t chunk_bytes = geometry.chunk_bytes();
  const std::size_t result_stride = round_layout::result_stride(geometry);
  const std::vector<round_layout::Block> order = round_layout::worker_order(geometry, me);

  if (st.requests.empty()) {  // first call: size everything once
    st.round_elements = n;
    st.round_ranks = world;
    st.offset = offset;
    st.worker[0].resize(n);
    st.worker[1].resize(n);
    st.server[0].resize(length(me));
    st.server[1].resize(length(me));
    st.packed.resize(kernels::packed_bytes(n) + 8);
    st.received.resize(world * chunk_bytes);
    st.scales.resize(world);
    st.results.resize(world * result_stride);
    // Per peer: worker blocks of my chunk in, its scale in, its server blocks and scale in; my
    // worker blocks of its chunk out, my scale out, my server blocks and scale out.
    std::size_t requests = 0;
    for (int p = 0; p < world; ++p) {
      if (p != me) requests += blocks_of(length(me)) + blocks_of(length(p)) + blocks_of(length(p)) + blocks_of(length(me)) + 4;
    }
    st.requests.resize(requests);
    st.stage1.reserve(requests);
    st.all.reserve(requests);
    st.chunk_bits.resize(world);
    st.block_bits.resize(world);
    if (tag.restored) {
      // The true errors of a checkpoint, stored with scale 0: stored − 0·sign(stored) is stored,
      // exactly, so the next call continues bit for bit. A hierarchical rank keeps its shard's part.
      ONEBIT_CHECK(tag.restored_worker.size() == tag.count && tag.restored_server.size() == length(me),
                   ONEBIT_INVALID_ARGUMENT, where(), ": tag '", tag.name, "': the restored state has ",
                   tag.restored_worker.size(), " + ", tag.restored_server.size(), " floats; this job needs ", tag.count,
                   " + ", length(me), " (was it saved with another world size, rank or ranks per host?)");
      std::copy(tag.restored_worker.begin() + offset, tag.restored_worker.begin() + offset + n, st.worker[0].data());
      std::copy(tag.restored_server.begin(), tag.restored_server.end(), st.server[0].data());
      tag.restored = false;
    }
  }
  ONEBIT_CHECK(st.round_elements == n && st.round_ranks == world, ONEBIT_INVALID_ARGUMENT, where(), ": tag '", tag.name,
               "' ran over ", st.round_ranks, " ranks with ", st.round_elements, " elements on this communicator; this "
               "call runs over ", world, " with ", n, " (a tag must not mix the flat and hierarchical algorithms)");
  const std::uint64_t seq = st.seq;
  auto key = [&](wire::Kind kind, std::size_t part) {
    return wire::MessageKey{tag.id, seq, kind, static_cast<std::uint16_t>(part)};
  };
  auto describe = [&](const Request& r) {
    return "tag '" + tag.name + "' call " + std::to_string(seq) + ": " + wire::kind_name(r.key.kind) + " block " +
           std::to_string(r.key.part);
  };
  // Block b of chunk j: elements [begin(j) + b·B, ...), bits at byte (begin(j) + b·B) / 8.
  auto block_begin = [&](int j, std::size_t b) {
    return std::min(begin(j) + length(j), begin(j) + b * round_layout::kBlockElements);
  };
  auto block_length = [&](int j, std::size_t b) {
    return std::min(begin(j) + length(j), block_begin(j, b) + round_layout::kBlockElements) - block_begin(j, b);
  };

  RoundResult result;
  std::size_t next_request = 0;
  st.stage1.clear();
  st.all.clear();
  auto post_recv = [&](int p, wire::Kind kind, std::size_t part, void* data, std::size_t bytes, bool stage1) {
    Request& r = st.requests[next_request++];
    transport_->irecv(r, group.ranks[p], channel, key(kind, part), shape, data, bytes);
    if (stage1) st.stage1.push_back(&r);
    st.all.push_back(&r);
  };
  auto post_send = [&](int p, wire::Kind kind, std::size_t part, const void* data, std::size_t bytes) {
    Request& r = st.requests[next_request++];
    transport_->isend(r, group.ranks[p], channel, key(kind, part), shape, data, bytes);
    st.all.push_back(&r);
    result.bytes_sent += bytes;
  };

  float server_scale = NAN;
  Clock::time_point marks[5];  // start, worker done, inputs in, server done, results in
  marks[0] = Clock::now();
  try {
    // Receives first, so messages land in place instead of in the transport's unexpected store.
    for (int p = 0; p < world; ++p) {
      if (p == me) continue;
      for (std::size_t b = 0; b < blocks_of(length(me)); ++b) {
        post_recv(p, wire::Kind::kWorkerBits, b, st.received.data() + p * chunk_bytes + (block_begin(me, b) - begin(me)) / 8,
                  kernels::packed_bytes(block_length(me, b)), true);
      }
      post_recv(p, wire::Kind::kWorkerScale, 0, &st.scales.data()[p], sizeof(float), true);
      std::uint8_t* theirs = st.results.data() + p * result_stride;
      for (std::size_t b = 0; b < blocks_of(length(p)); ++b) {
        post_recv(p, wire::Kind::kServerResult, b, theirs + kResultHead + (block_begin(p, b) - begin(p)) / 8,
                  kernels::packed_bytes(block_length(p, b)), false);
      }
      post_recv(p, wire::Kind::kServerScale, 0, theirs, kResultHead, false);
    }

    // 1. Worker stage.
    const float* e_prev = st.worker[st.current].data();
    float* e_next = st.worker[1 - st.current].data();
    double sum_squares = 0.0;
    for (std::size_t i = 0; i < order.size(); ++i) {
      const round_layout::Block& block = order[i];
      sum_squares += worker(i, block.first, block.length, e_prev + block.first, st.worker_scale, e_next + block.first,
                            st.packed.data() + block.first / 8);
      if (block.chunk != me) {
        post_send(block.chunk, wire::Kind::kWorkerBits, block.index, st.packed.data() + block.first / 8,
                  kernels::packed_bytes(block.length));
      }
    }
    marks[1] = Clock::now();
    result.worker_scale = std::isfinite(sum_squares) ? kernels::scale_from_sum_squares(sum_squares, n) : NAN;
    st.scales.data()[me] = result.worker_scale;
    for (int p = 0; p < world; ++p) {
      if (p != me) post_send(p, wire::Kind::kWorkerScale, 0, &st.scales.data()[me], sizeof(float));
    }

    // 2. Server stage.
    transport_->wait_all(st.stage1, call_deadline(), describe);
    marks[2] = Clock::now();
    std::int32_t first_bad = -1;
    for (int p = 0; p < world && first_bad < 0; ++p) {
      if (!std::isfinite(st.scales.data()[p])) first_bad = p;
    }
    std::uint8_t* my_result = st.results.data() + me * result_stride;
    for (int p = 0; p < world; ++p) {
      st.chunk_bits[p] = p == me ? st.packed.data() + begin(me) / 8 : st.received.data() + p * chunk_bytes;
    }
    double server_squares = 0.0;
    const float* s_prev = st.server[st.current].data();
    float* s_next = st.server[1 - st.current].data();
    for (std::size_t b = 0; b < blocks_of(length(me)); ++b) {
      const std::size_t within = block_begin(me, b) - begin(me);
      std::uint8_t* out_bits = my_result + kResultHead + within / 8;
      // With a non-finite worker scale the bits are meaningless; they are still sent (every member
      // posted for them) and the scale message below carries the verdict.
      if (first_bad < 0) {
        for (int p = 0; p < world; ++p) st.block_bits[p] = st.chunk_bits[p] + within / 8;
        server_squares += kernels_.server_pass(st.block_bits.data(), st.scales.data(), world, s_prev + within,
                                               st.server_scale, s_next + within, out_bits, block_length(me, b));
      }
      for (int p = 0; p < world; ++p) {
        if (p != me) post_send(p, wire::Kind::kServerResult, b, out_bits, kernels::packed_bytes(block_length(me, b)));
      }
    }
    if (first_bad < 0) server_scale = kernels::scale_from_sum_squares(server_squares, length(me));
    marks[3] = Clock::now();
    std::memcpy(my_result, &server_scale, 4);
    std::memcpy(my_result + 4, &first_bad, 4);
    for (int p = 0; p < world; ++p) {
      if (p != me) post_send(p, wire::Kind::kServerScale, 0, my_result, kResultHead);
    }
    transport_->wait_all(st.all, call_deadline(), describe);
    marks[4] = Clock::now();
  } catch (const Error& error) {
    fail(error.code(), where(), ": allreduce of tag '", tag.name, "' (", shape.count, " ",
         kernels::dtype_name(static_cast<kernels::Dtype>(shape.dtype)), ", call ", seq,
         ") failed; buffer and error state unchanged: ", error.what());
  }
  st.seq = seq + 1;  // the call's messages are consumed on every member, whatever the checks say
  result.server_scale = server_scale;
  for (int s = 0; s < 4; ++s) result.seconds[s] = std::chrono::duration<double>(marks[s + 1] - marks[s]).count();
  return result;
}

void Communicator::flat_compressed_allreduce(Tag& tag, void* buffer, std::size_t n, kernels::Dtype dtype, ReduceOp op,
                                             std::uint32_t channel) {
  CallScope scope(*this);
  std::unique_lock<std::mutex> busy(tag.busy, std::try_to_lock);
  ONEBIT_CHECK(busy.owns_lock(), ONEBIT_INVALID_ARGUMENT, where(), ": tag '", tag.name,
               "' is already in an allreduce on another thread; calls on one tag must not overlap");
  const int world = size();
  ++compressed_calls_;
  ++tag.calls;
  if (world == 1) return;  // the average over one rank is the buffer itself

  std::unique_ptr<TagState>& slot = tag.states[id_];
  if (!slot) slot = std::make_unique<TagState>();
  TagState& st = *slot;
  RankGroup everyone;
  for (int r = 0; r < world; ++r) everyone.ranks.push_back(r);
  everyone.me = rank();
  const std::size_t element = kernels::dtype_size(dtype);
  auto* x = static_cast<std::uint8_t*>(buffer);
  const wire::CallShape shape{n, static_cast<std::uint8_t>(dtype), static_cast<std::uint8_t>(op)};
  const std::uint64_t seq = st.seq;
  const RoundResult round = compressed_round(
      tag, st, everyone, n, 0, shape, channel,
      [&](std::size_t, std::size_t first, std::size_t length, const float* e_prev, float a_prev, float* e_next,
          std::uint8_t* bits) {
        return kernels_.worker_pass(x + first * element, dtype, e_prev, a_prev, e_next, bits, length);
      });
  compressed_bytes_ += round.bytes_sent;
  tag.bytes_sent += round.bytes_sent;

  // 3. Check every server's scale, then write the result and commit.
  const auto unpack_start = Clock::now();
  const ChunkGeometry geometry(n, world);
  const std::size_t result_stride = round_layout::result_stride(geometry);
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
    kernels_.unpack(st.results.data() + j * result_stride + kResultHead, scale * factor, x + geometry.begin(j) * element,
                    dtype, geometry.length(j));
  }
  commit_round(st, round, 0.0, unpack_start);
}

void Communicator::commit_round(TagState& st, const RoundResult& round, double more_waiting,
                                Clock::time_point unpack_start) {
  {
    std::lock_guard<std::mutex> lock(stage_mutex_);
    stage_times_.worker += round.seconds[0];
    stage_times_.wait_inputs += round.seconds[1];
    stage_times_.server += round.seconds[2];
    stage_times_.wait_results += round.seconds[3] + more_waiting;
    stage_times_.unpack += std::chrono::duration<double>(Clock::now() - unpack_start).count();
    ++stage_times_.calls;
  }
  st.current = 1 - st.current;
  st.worker_scale = round.worker_scale;
  st.server_scale = round.server_scale;
}

}  // namespace onebit
