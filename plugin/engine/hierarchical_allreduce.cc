// The hierarchical compressed allreduce (docs/design.md, "Hierarchical compression"). L ranks per
// host, H = W / L hosts; ranks h·L … h·L+L−1 share host h (torchrun's numbering). The buffer is cut
// into L shards (ChunkGeometry(n, L)); local rank ℓ of host h owns shard ℓ and belongs to rail ℓ,
// the H ranks {ℓ, L+ℓ, …} with local index ℓ, one per host:
//
//   1. host reduce: each rank sends every local peer q that peer's shard of its input (in the
//      call's dtype) and receives its local peers' inputs of shard ℓ, block by block in the order
//      its rail's worker stage visits the blocks. The host's fp32 mean of a block,
//      m = (x_0 + x_1 + … + x_{L−1}) / L summed in local-rank order, is formed just before the
//      worker pass needs it, so the host exchange overlaps the rail's first messages.
//   2. rail round: docs/algorithm.md over the rail on m, with this rank's error state of the tag
//      (worker error: the shard; server error: the rail chunk it serves). Only this round's
//      messages cross a host's link: L rails of n/L elements, one flat call's worth of bits per
//      host instead of L.
//   3. host gather: every rank sends its rail's results (each rail server's scale, verdict and
//      bits, 1/32 of the shard's fp32 bytes) to its local peers.
//
// All or nothing: after step 3 every rank holds every rail's verdicts. If any rail saw a
// non-finite input or scale, every rank fails the call with the same error and nothing is
// unpacked or committed on any rank; else every rank unpacks all L·H server results into its
// buffer (the same bits on every rank of the job) and commits its rail state. A transport failure
// anywhere leaves every buffer and state as it was, as in the flat call.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>

#include "common/error.h"
#include "common/log.h"
#include "common/params.h"
#include "kernels/cpu/half.h"
#include "plugin/engine/communicator.h"
#include "plugin/engine/compressed_round.h"

namespace onebit {
namespace {

using round_layout::kResultHead;

// The host mean of fp16 or bf16 inputs, converted exactly to fp32: out[i] = (src[0][i] + src[1][i]
// + … + src[L−1][i]) / L, left to right — the order CpuKernels::mean_worker_pass takes for fp32,
// which forms the mean inside its pass instead.
void host_mean(const std::vector<const std::uint8_t*>& src, kernels::Dtype dtype, float* out, std::size_t n) {
  const int sources = static_cast<int>(src.size());
  auto value = [&](int q, std::size_t i) {
    const std::uint16_t h = reinterpret_cast<const std::uint16_t*>(src[q])[i];
    return dtype == kernels::Dtype::kFloat16 ? kernels::half_to_float(h) : kernels::bfloat16_to_float(h);
  };
  for (std::size_t i = 0; i < n; ++i) {
    float sum = value(0, i);
    for (int q = 1; q < sources; ++q) sum += value(q, i);
    out[i] = sum / static_cast<float>(sources);
  }
}

// What the host segment's setup needs to know about the call it runs in.
struct SegmentSetup {
  Transport& transport;
  std::uint32_t channel;
  std::function<wire::MessageKey(std::size_t part)> key;  // kHostSegment keys of this call
  wire::CallShape shape;
  int local, local_size;
  std::function<int(int)> peer_rank;
  const ChunkGeometry& shards;
  std::size_t element;
  Deadline deadline;
  std::string where;  // "rank 2/4: tag 'm'"
};

// Once per tag and communicator, at its first hierarchical call: local rank 0 makes the host's
// segment (every rank's region the size of the buffer; the pages each writer will touch reserved
// now) and sends its name to its local peers; they map it and answer; rank 0 says go only if all
// could, then unlinks the name. Without a go (ONEBIT_SHM=0 on some rank, /dev/shm too small) the
// host reduce runs over the transport, with a warning.
void set_up_host_segment(const SegmentSetup& c, TagState& st) {
  constexpr std::size_t kNameBytes = 64;
  char name[kNameBytes] = {};
  std::int32_t go = 0;
  std::vector<std::int32_t> acks(c.local_size, 0);
  std::vector<Request> requests(2 * c.local_size);
  std::vector<Request*> pending;
  std::size_t next = 0;
  auto exchange = [&](bool send, int q, std::size_t part, void* data, std::size_t bytes) {
    Request& r = requests[next++];
    if (send) c.transport.isend(r, c.peer_rank(q), c.channel, c.key(part), c.shape, data, bytes);
    else c.transport.irecv(r, c.peer_rank(q), c.channel, c.key(part), c.shape, data, bytes);
    pending.push_back(&r);
  };
  auto wait = [&](const char* what) {
    c.transport.wait_all(pending, c.deadline, [&](const Request& r) {
      return std::string("the host segment's ") + what + " (local rank " + std::to_string(r.peer % c.local_size) + ")";
    });
    pending.clear();
  };
  const std::size_t region = c.shards.n * c.element;
  if (c.local == 0) {
    std::string why;
    if (param::Shm() != 0) {
      try {
        st.host_segment = shm::HostSegment::create(c.local_size, region);
        for (int w = 0; w < c.local_size; ++w) {
          for (int q = 0; q < c.local_size; ++q) {
            if (q != w) st.host_segment.reserve(w, c.shards.begin(q) * c.element, c.shards.length(q) * c.element);
          }
        }
        std::snprintf(name, sizeof(name), "%s", st.host_segment.name().c_str());
      } catch (const Error& error) {
        st.host_segment = shm::HostSegment();
        why = error.what();
      }
    } else {
      why = "ONEBIT_SHM=0";
    }
    for (int q = 1; q < c.local_size; ++q) exchange(true, q, 0, name, kNameBytes);
    for (int q = 1; q < c.local_size; ++q) exchange(false, q, 1, &acks[q], sizeof(std::int32_t));
    wait("name and answers");
    go = name[0] != '\0';
    for (int q = 1; q < c.local_size; ++q) {
      if (acks[q] == 0 && go) why = "local rank " + std::to_string(q) + " could not map it (see its log)";
      go = go && acks[q] != 0;
    }
    for (int q = 1; q < c.local_size; ++q) exchange(true, q, 2, &go, sizeof(std::int32_t));
    wait("go");
    st.host_segment.unlink();
    if (!go) {
      st.host_segment = shm::HostSegment();
      ONEBIT_LOG(WARN, c.where, ": the host's ranks exchange fp32 inputs over the transport, not shared memory: ", why);
    }
  } else {
    exchange(false, 0, 0, name, kNameBytes);
    wait("name");
    std::int32_t ack = 0;
    if (name[kNameBytes - 1] == '\0' && name[0] != '\0' && param::Shm() != 0) {
      try {
        st.host_segment = shm::HostSegment::open(name, c.local_size, region);
        ack = 1;
      } catch (const Error& error) {
        ONEBIT_LOG(WARN, c.where, ": cannot map local rank 0's segment: ", error.what());
      }
    }
    exchange(true, 0, 1, &ack, sizeof(std::int32_t));
    exchange(false, 0, 2, &go, sizeof(std::int32_t));
    wait("go");
    if (!go) st.host_segment = shm::HostSegment();
  }
  if (st.host_segment.mapped()) st.host_segment.set_pid(c.local, ::getpid());
  st.host_segment_tried = true;
}

}  // namespace

void Communicator::hierarchical_allreduce(Tag& tag, void* buffer, std::size_t n, kernels::Dtype dtype, ReduceOp op,
                                          std::uint32_t channel) {
  CallScope scope(*this);
  std::unique_lock<std::mutex> busy(tag.busy, std::try_to_lock);
  ONEBIT_CHECK(busy.owns_lock(), ONEBIT_INVALID_ARGUMENT, where(), ": tag '", tag.name,
               "' is already in an allreduce on another thread; calls on one tag must not overlap");
  ONEBIT_CHECK(hierarchical(), ONEBIT_INVALID_ARGUMENT, where(), ": tag '", tag.name,
               "': hierarchical compression needs several ranks per host and several hosts; this communicator has ",
               local_size_, " rank(s) per host of ", size(), " (set ONEBIT_LOCAL_SIZE)");
  check_topology(tag);
  ++compressed_calls_;
  ++tag.calls;

  const int world = size();
  const int local_size = local_size_;
  const int hosts = world / local_size;
  const int host = rank() / local_size;
  const int local = rank() % local_size;
  const ChunkGeometry shards(n, local_size);
  std::vector<ChunkGeometry> rails;  // the rail geometry of each shard
  for (int q = 0; q < local_size; ++q) rails.emplace_back(shards.length(q), hosts);
  const std::size_t shard = shards.length(local);
  const std::size_t element = kernels::dtype_size(dtype);
  auto* x = static_cast<std::uint8_t*>(buffer);
  auto peer_rank = [&](int q) { return host * local_size + q; };
  auto slot_of = [&](int q) { return q < local ? q : q - 1; };  // a local peer's place in host_inputs
  // Where local peer q's rail results sit in host_results.
  std::vector<std::size_t> results_at(local_size, 0);
  std::size_t results_bytes = 0;
  for (int q = 0; q < local_size; ++q) {
    if (q == local) continue;
    results_at[q] = results_bytes;
    results_bytes += hosts * round_layout::result_stride(rails[q]);
  }
  std::vector<std::vector<round_layout::Block>> orders;  // each shard's worker order on this host
  for (int q = 0; q < local_size; ++q) orders.push_back(round_layout::worker_order(rails[q], host));

  std::unique_ptr<TagState>& slot = tag.states[id_];
  if (!slot) slot = std::make_unique<TagState>();
  TagState& st = *slot;
  if (st.host_requests.empty()) {
    ONEBIT_CHECK(st.requests.empty(), ONEBIT_INVALID_ARGUMENT, where(), ": tag '", tag.name,
                 "' ran flat on this communicator; a tag must not mix the flat and hierarchical algorithms");
    if (dtype != kernels::Dtype::kFloat32) st.host_mean.resize(shard);
    st.host_results.resize(results_bytes);
    std::size_t requests = 0;
    for (int q = 0; q < local_size; ++q) {
      if (q != local) requests += orders[local].size() + orders[q].size() + 2;
    }
    st.host_requests.resize(requests);
    st.host_all.reserve(requests);
  }
  // Checked before any message leaves, so a misuse fails this rank's call alone, cleanly.
  ONEBIT_CHECK(st.requests.empty() || (st.round_elements == shard && st.round_ranks == hosts), ONEBIT_INVALID_ARGUMENT,
               where(), ": tag '", tag.name, "' ran flat on this communicator; a tag must not mix the flat and "
               "hierarchical algorithms");

  const std::uint64_t seq = st.seq;
  const wire::CallShape shape{n, static_cast<std::uint8_t>(dtype), static_cast<std::uint8_t>(op)};
  auto key = [&](wire::Kind kind, std::size_t part) {
    return wire::MessageKey{tag.id, seq, kind, static_cast<std::uint16_t>(part)};
  };
  auto describe = [&](const Request& r) {
    return "tag '" + tag.name + "' call " + std::to_string(seq) + ": " + wire::kind_name(r.key.kind) + " block " +
           std::to_string(r.key.part) + " (hierarchical, " + std::to_string(local_size) + " ranks per host)";
  };
  std::size_t next_request = 0;
  std::uint64_t host_sent = 0;
  st.host_all.clear();
  // block_recvs[i]: the local peers' inputs of block i of this rank's worker order.
  std::vector<std::vector<Request*>> block_recvs(orders[local].size());
  auto post = [&](bool send, int q, wire::Kind kind, std::size_t part, void* data, std::size_t bytes) {
    Request& r = st.host_requests[next_request++];
    if (send) {
      transport_->isend(r, peer_rank(q), channel, key(kind, part), shape, data, bytes);
      host_sent += bytes;
    } else {
      transport_->irecv(r, peer_rank(q), channel, key(kind, part), shape, data, bytes);
    }
    st.host_all.push_back(&r);
    return &r;
  };

  shm::HostSegment& segment = st.host_segment;
  // Any failure of this rank's call from here on: tell the host's waiters, then report it.
  // A failure that is not the transport's own (a local peer gone from shared memory, an abort
  // word) leaves this call's messages posted and unawaited. Waiting for them with an expired
  // deadline breaks the transport — peers learn at once — and the transport contract then
  // promises it never touches those requests again, so the state that holds them may be freed.
  auto settle = [&] {
    segment.abort(rank());
    for (const std::vector<Request*>* pending : {&st.all, &st.host_all}) {
      try {
        transport_->wait_all(*pending, Clock::now(), describe);
      } catch (const Error&) {
      }
    }
  };
  auto failed = [&](const Error& error) {
    settle();
    fail(error.code(), where(), ": allreduce of tag '", tag.name, "' (", n, " ", kernels::dtype_name(dtype), ", call ",
         seq, ", hierarchical) failed; buffer and error state unchanged: ", error.what());
  };
  try {
    if (!st.host_segment_tried) {
      set_up_host_segment(SegmentSetup{*transport_, channel,
                                       [&](std::size_t part) { return key(wire::Kind::kHostSegment, part); }, shape,
                                       local, local_size, peer_rank, shards, element, call_deadline(),
                                       where() + ": tag '" + tag.name + "'"},
                          st);
    }
    if (!segment.mapped()) st.host_inputs.resize((local_size - 1) * shard * element);
    for (int q = 0; q < local_size; ++q) {
      if (q == local) continue;
      if (!segment.mapped()) {
        for (std::size_t i = 0; i < orders[local].size(); ++i) {
          const round_layout::Block& b = orders[local][i];
          block_recvs[i].push_back(post(false, q, wire::Kind::kHostReduce, i,
                                        st.host_inputs.data() + (slot_of(q) * shard + b.first) * element,
                                        b.length * element));
        }
      }
      post(false, q, wire::Kind::kHostGather, 0, st.host_results.data() + results_at[q],
           hosts * round_layout::result_stride(rails[q]));
    }
    // Over the transport: every peer's blocks at once, in the order its worker stage will want
    // them, round robin over the peers.
    std::size_t most = 0;
    for (const auto& order : orders) most = std::max(most, order.size());
    for (std::size_t i = 0; i < most && !segment.mapped(); ++i) {
      for (int q = 0; q < local_size; ++q) {
        if (q == local || i >= orders[q].size()) continue;
        const round_layout::Block& b = orders[q][i];
        post(true, q, wire::Kind::kHostReduce, i, x + (shards.begin(q) + b.first) * element, b.length * element);
      }
    }
  } catch (const Error& error) {
    failed(error);
  }

  // Through shared memory: block i for every peer goes into this rank's region just before this
  // rank waits for its own block i, and whatever a peer still lacks goes with the last block, so
  // no rank waits for a block its writer has not reached.
  const std::uint32_t read_base = st.host_segment_calls * static_cast<std::uint32_t>(orders[local].size());
  auto publish = [&](std::size_t i) {
    for (int q = 0; q < local_size; ++q) {
      if (q == local) continue;
      const std::size_t last = i + 1 == orders[local].size() ? orders[q].size() : std::min(i + 1, orders[q].size());
      for (std::size_t j = std::min(i, last); j < last; ++j) {
        const round_layout::Block& b = orders[q][j];
        const std::size_t at = (shards.begin(q) + b.first) * element;
        if (b.length > 0) std::memcpy(segment.region(local) + at, x + at, b.length * element);
        segment.publish(local, q, st.host_segment_calls * static_cast<std::uint32_t>(orders[q].size()) +
                                      static_cast<std::uint32_t>(j) + 1);
      }
    }
  };

  // The rail round; its failures (the host reduce's too, which it waits for) come out phrased.
  std::vector<const std::uint8_t*> sources(local_size);
  std::vector<const float*> fp32_sources(local_size);
  RankGroup rail;
  for (int h = 0; h < hosts; ++h) rail.ranks.push_back(h * local_size + local);
  rail.me = host;
  RoundResult round;
  try {
    round = compressed_round(
        tag, st, rail, shard, shards.begin(local), shape, channel,
        [&](std::size_t i, std::size_t first, std::size_t length, const float* e_prev, float a_prev, float* e_next,
            std::uint8_t* bits) {
          if (segment.mapped()) {
            publish(i);
            for (int q = 0; q < local_size; ++q) {
              if (q == local) continue;
              segment.wait(q, local, read_base + static_cast<std::uint32_t>(i) + 1, call_deadline(), peer_rank(q),
                           "block " + std::to_string(i) + " of the host reduce of tag '" + tag.name + "' call " +
                               std::to_string(seq) + " (shared memory)");
            }
          } else {
            transport_->wait_all(block_recvs[i], call_deadline(), describe);
          }
          for (int q = 0; q < local_size; ++q) {
            const std::size_t at = (shards.begin(local) + first) * element;
            sources[q] = q == local          ? x + at
                         : segment.mapped() ? segment.region(q) + at
                                            : st.host_inputs.data() + (slot_of(q) * shard + first) * element;
          }
          // fp32: the mean inside the worker pass, never written; fp16/bf16: converted first.
          if (dtype == kernels::Dtype::kFloat32) {
            for (int q = 0; q < local_size; ++q) fp32_sources[q] = reinterpret_cast<const float*>(sources[q]);
            return kernels_.mean_worker_pass(fp32_sources.data(), local_size, e_prev, a_prev, e_next, bits, length);
          }
          host_mean(sources, dtype, st.host_mean.data() + first, length);
          return kernels_.worker_pass(st.host_mean.data() + first, kernels::Dtype::kFloat32, e_prev, a_prev, e_next,
                                      bits, length);
        });
  } catch (const Error&) {
    settle();
    throw;
  }
  const Clock::time_point round_done = Clock::now();
  try {
    const std::size_t my_stride = round_layout::result_stride(rails[local]);
    for (int q = 0; q < local_size; ++q) {
      if (q != local) post(true, q, wire::Kind::kHostGather, 0, st.results.data(), hosts * my_stride);
    }
    transport_->wait_all(st.host_all, call_deadline(), describe);
  } catch (const Error& error) {
    failed(error);
  }
  // Every local peer has read this call's blocks (it sent its results after its worker stage), so
  // the regions may take the next call's.
  if (segment.mapped()) ++st.host_segment_calls;
  const Clock::time_point gathered = Clock::now();
  compressed_bytes_ += round.bytes_sent + host_sent;
  intra_host_bytes_ += host_sent;
  tag.bytes_sent += round.bytes_sent + host_sent;

  // Every rail's results, in local-index order: the same verdict, in the same order, on every rank.
  auto results_of = [&](int q) { return q == local ? st.results.data() : st.host_results.data() + results_at[q]; };
  for (int q = 0; q < local_size; ++q) {
    const std::size_t stride = round_layout::result_stride(rails[q]);
    for (int p = 0; p < hosts; ++p) {
      float scale;
      std::int32_t bad;
      std::memcpy(&scale, results_of(q) + p * stride, 4);
      std::memcpy(&bad, results_of(q) + p * stride + 4, 4);
      if (bad >= 0) {
        fail(ONEBIT_NUMERIC_ERROR, where(), ": allreduce of tag '", tag.name, "' (call ", seq, "): the input of host ",
             bad, " (ranks ", bad * local_size, "..", bad * local_size + local_size - 1, ") holds NaN or Inf in shard ",
             q, " (elements ", shards.begin(q), "..", shards.begin(q) + shards.length(q),
             "); no buffer or error state changed on any rank");
      }
      ONEBIT_CHECK(std::isfinite(scale), ONEBIT_NUMERIC_ERROR, where(), ": allreduce of tag '", tag.name, "' (call ",
                   seq, "): the scale of rank ", p * local_size + q, " (server of rail ", q, ") is ", scale,
                   "; no buffer or error state changed on any rank");
    }
  }
  const float factor = op == ReduceOp::kSum ? static_cast<float>(world) : 1.0f;
  for (int q = 0; q < local_size; ++q) {
    const std::size_t stride = round_layout::result_stride(rails[q]);
    for (int p = 0; p < hosts; ++p) {
      float scale;
      std::memcpy(&scale, results_of(q) + p * stride, 4);
      kernels_.unpack(results_of(q) + p * stride + kResultHead, scale * factor,
                      x + (shards.begin(q) + rails[q].begin(p)) * element, dtype, rails[q].length(p));
    }
  }
  // The worker stage's time includes waiting for the local peers' blocks.
  commit_round(st, round, std::chrono::duration<double>(gathered - round_done).count(), gathered);
}

}  // namespace onebit
