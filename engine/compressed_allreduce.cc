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
#include <mutex>
#include <set>

#include "common/error.h"
#include "common/log.h"
#include "engine/communicator.h"
#include "engine/compressed_round.h"

namespace onebit {

static_assert(std::endian::native == std::endian::little, "payload floats travel in host order: little-endian only");

using round_layout::blocks_of;
using round_layout::kResultHead;

namespace {

// Every server's verdict before anything is written: ranks whose settings for the call differ, a
// member's non-finite input, or a non-finite server scale fails the call alike on every rank with
// nothing changed.
void check_verdicts(const std::string& where, Tag& tag, const RoundScratch& round, const ChunkGeometry& geometry,
                    std::uint64_t seq) {
  round_layout::check_verdicts(
      round.results.data(), geometry,
      [&](int, std::int32_t member) {
        fail(ONEBIT_MISMATCH, where, ": allreduce of tag '", tag.name, "' (call ", seq, "): rank ", member,
             "'s settings for this call differ from rank 0's — ", settings_mismatch_hint(tag));
      },
      [&](int, std::int32_t member) {
        fail(ONEBIT_NUMERIC_ERROR, where, ": allreduce of tag '", tag.name, "' (call ", seq, "): rank ", member,
             "'s input holds NaN or Inf (its worker scale is not finite); no buffer or error state changed on any "
             "rank");
      },
      [&](int p, float scale) {
        fail(ONEBIT_NUMERIC_ERROR, where, ": allreduce of tag '", tag.name, "' (call ", seq, "): server rank ", p,
             "'s scale is ", scale, "; no buffer or error state changed");
      });
}

}  // namespace

void Communicator::compressed_allreduce(Tag& tag, void* buffer, std::size_t n, kernels::Dtype dtype, ReduceOp op,
                                        std::uint32_t channel) {
  CallScope scope(*this);
  check_topology(tag);
  say_if_too_small(tag, n);
  if (hierarchical()) {
    hierarchical_allreduce(tag, buffer, n, dtype, op, channel);
  } else {
    flat_compressed_allreduce(tag, buffer, n, dtype, op, channel);
  }
}

// Below this many elements per peer a compressed call's messages cost about as much as the rest of
// it, or more: each rank sends and receives about 4 messages per peer (the peers: the other ranks,
// or the other hosts of a hierarchical call), ~15 us of CPU each. docs/scale.md's model puts the
// break-even at 21-26 thousand elements a peer at 1 GbE (flat; 8-23 hierarchical) and 52-57
// thousand at 10 and 25 GbE (56-80 hierarchical), for W = 4 to 1,024.
constexpr std::size_t kTooSmallPerPeer = 32768;

void Communicator::say_if_too_small(const Tag& tag, std::size_t n) {
  const int peers = (hierarchical() ? size() / local_size() : size()) - 1;
  if (rank() != 0 || peers < 1 || n >= kTooSmallPerPeer * static_cast<std::size_t>(peers)) return;
  // Once a name in the process: a tag untagged and tagged again (0/1 Adam's at its freeze, an
  // optimizer made anew) is the same buffer to the user.
  static std::mutex said_mutex;
  static std::set<std::string> said;
  {
    const std::lock_guard<std::mutex> lock(said_mutex);
    if (!said.insert(tag.name).second) return;
  }
  ONEBIT_LOG(
      WARN, where(), ": tag '", tag.name, "': a call of ", n, " elements with ", peers, peers == 1 ? " peer" : " peers",
      " is mostly per-message cost (about 4 messages a peer, some 15 us of CPU each): below ",
      kTooSmallPerPeer * static_cast<std::size_t>(peers),
      " elements they cost about as much as the rest of the call, or more. Tag a larger buffer, or let several "
      "ranks a host share one (docs/usage/optimizers.md, \"How large a tagged call pays\"); said once a tag name");
}

// One round, in the steps of the header comment: the state sized on a tag's first round, the
// receives posted, the worker stage, the server stage, the wait for every result. Holds what the
// steps share (the group's geometry, the call's sequence number, the requests posted so far).
class Communicator::Round {
 public:
  Round(Communicator& comm, Tag& tag, TagState& st, const RankGroup& group, std::size_t n, std::size_t offset,
        const wire::CallShape& shape, std::uint32_t channel)
      : comm_(comm),
        tag_(tag),
        st_(st),
        scratch_(round_scratch(st)),
        group_(group),
        n_(n),
        offset_(offset),
        shape_(shape),
        channel_(channel),
        world_(group.size()),
        me_(group.me),
        geometry_(n, world_),
        result_stride_(round_layout::result_stride(geometry_)),
        seq_(st.seq) {}

  RoundResult run(const RoundWorker& worker) {
    size_state_once();
    check_state_fits();
    Clock::time_point marks[5];  // start, worker done, inputs in, server done, results in
    marks[0] = Clock::now();
    try {
      post_receives();  // first, so that messages land in place, not in the transport's unexpected store
      worker_passes(worker);
      marks[1] = Clock::now();
      send_worker_head();
      comm_.transport_->wait_all(scratch_.stage1, comm_.call_deadline(), describe());
      marks[2] = Clock::now();
      server_passes();
      marks[3] = Clock::now();
      send_server_head();
      comm_.transport_->wait_all(scratch_.all, comm_.call_deadline(), describe());
      marks[4] = Clock::now();
    } catch (const Error& error) {
      fail(error.code(), comm_.where(), ": allreduce of tag '", tag_.name, "' (", shape_.count, " ",
           kernels::dtype_name(static_cast<kernels::Dtype>(shape_.dtype)), ", call ", seq_,
           ") failed; buffer and error state unchanged: ", error.what());
    }
    st_.seq = seq_ + 1;  // the call's messages are consumed on every member, whatever the checks say
    for (int s = 0; s < 4; ++s) result_.seconds[s] = std::chrono::duration<double>(marks[s + 1] - marks[s]).count();
    return result_;
  }

 private:
  std::size_t begin(int j) const { return geometry_.begin(j); }
  std::size_t length(int j) const { return geometry_.length(j); }
  // Block b of chunk j: elements [begin(j) + b·B, ...), bits at byte (begin(j) + b·B) / 8.
  std::size_t block_begin(int j, std::size_t b) const {
    return std::min(begin(j) + length(j), begin(j) + b * round_layout::kBlockElements);
  }
  std::size_t block_length(int j, std::size_t b) const {
    return std::min(begin(j) + length(j), block_begin(j, b) + round_layout::kBlockElements) - block_begin(j, b);
  }
  wire::MessageKey key(wire::Kind kind, std::size_t part) const {
    return wire::MessageKey{tag_.id, seq_, kind, static_cast<std::uint16_t>(part)};
  }
  std::function<std::string(const Request&)> describe() const {
    return [this](const Request& r) {
      return "tag '" + tag_.name + "' call " + std::to_string(seq_) + ": " + wire::kind_name(r.key.kind) + " block " +
             std::to_string(r.key.part);
    };
  }
  std::uint8_t* result_of(int p) const { return scratch_.results.data() + p * result_stride_; }

  // A tag's first round on this communicator sizes its state and its round scratch once, and
  // applies a restored checkpoint.
  void size_state_once() {
    if (!scratch_.requests.empty()) return;
    st_.round_elements = n_;
    st_.round_ranks = world_;
    st_.offset = offset_;
    st_.worker[0].resize(n_);
    st_.worker[1].resize(n_);
    st_.server[0].resize(length(me_));
    st_.server[1].resize(length(me_));
    scratch_.packed.resize(kernels::packed_bytes(n_) + 8);
    scratch_.received.resize(world_ * geometry_.chunk_bytes());
    scratch_.worker_heads.resize(world_ * round_layout::kWorkerHead);
    scratch_.scales.resize(world_);
    scratch_.settings.resize(world_);
    scratch_.results.resize(world_ * result_stride_);
    // Per peer: worker blocks of my chunk in, its scale in, its server blocks and scale in; my
    // worker blocks of its chunk out, my scale out, my server blocks and scale out.
    std::size_t requests = 0;
    for (int p = 0; p < world_; ++p) {
      if (p != me_) requests += 2 * (blocks_of(length(me_)) + blocks_of(length(p))) + 4;
    }
    scratch_.requests.resize(requests);
    scratch_.stage1.reserve(requests);
    scratch_.all.reserve(requests);
    scratch_.chunk_bits.resize(world_);
    scratch_.block_bits.resize(world_);
    if (tag_.restored) apply_restored();
  }

  // The true errors of a checkpoint, stored with scale 0: stored − 0·sign(stored) is stored,
  // exactly, so the next call continues bit for bit. A hierarchical rank keeps its shard's part.
  void apply_restored() {
    ONEBIT_CHECK(tag_.restored_worker.size() == tag_.count && tag_.restored_server.size() == length(me_),
                 ONEBIT_INVALID_ARGUMENT, comm_.where(), ": tag '", tag_.name, "': the restored state has ",
                 tag_.restored_worker.size(), " + ", tag_.restored_server.size(), " floats; this job needs ",
                 tag_.count, " + ", length(me_), " (was it saved with another world size, rank or ranks per host?)");
    std::copy(tag_.restored_worker.begin() + offset_, tag_.restored_worker.begin() + offset_ + n_,
              st_.worker[0].data());
    std::copy(tag_.restored_server.begin(), tag_.restored_server.end(), st_.server[0].data());
    tag_.restored = false;
  }

  void check_state_fits() const {
    ONEBIT_CHECK(st_.round_elements == n_ && st_.round_ranks == world_, ONEBIT_INVALID_ARGUMENT, comm_.where(),
                 ": tag '", tag_.name, "' ran over ", st_.round_ranks, " ranks with ", st_.round_elements,
                 " elements on this communicator; this call runs over ", world_, " with ", n_,
                 " (a tag must not mix the flat and hierarchical algorithms)");
  }

  void post_recv(int p, wire::Kind kind, std::size_t part, void* data, std::size_t bytes, bool stage1) {
    Request& r = scratch_.requests[next_request_++];
    comm_.transport_->irecv(r, group_.ranks[p], channel_, key(kind, part), shape_, data, bytes);
    if (stage1) scratch_.stage1.push_back(&r);
    scratch_.all.push_back(&r);
  }

  void post_send(int p, wire::Kind kind, std::size_t part, const void* data, std::size_t bytes) {
    Request& r = scratch_.requests[next_request_++];
    comm_.transport_->isend(r, group_.ranks[p], channel_, key(kind, part), shape_, data, bytes);
    scratch_.all.push_back(&r);
    result_.bytes_sent += bytes;
  }

  // From every peer: the worker bits of my chunk and its scale (stage 1), its server result (stage 2).
  void post_receives() {
    scratch_.stage1.clear();
    scratch_.all.clear();
    const std::size_t chunk_bytes = geometry_.chunk_bytes();
    for (int p = 0; p < world_; ++p) {
      if (p == me_) continue;
      for (std::size_t b = 0; b < blocks_of(length(me_)); ++b) {
        post_recv(p, wire::Kind::kWorkerBits, b,
                  scratch_.received.data() + p * chunk_bytes + (block_begin(me_, b) - begin(me_)) / 8,
                  kernels::packed_bytes(block_length(me_, b)), true);
      }
      post_recv(p, wire::Kind::kWorkerHead, 0, scratch_.worker_heads.data() + p * round_layout::kWorkerHead,
                round_layout::kWorkerHead, true);
      for (std::size_t b = 0; b < blocks_of(length(p)); ++b) {
        post_recv(p, wire::Kind::kServerResult, b, result_of(p) + kResultHead + (block_begin(p, b) - begin(p)) / 8,
                  kernels::packed_bytes(block_length(p, b)), false);
      }
      post_recv(p, wire::Kind::kServerHead, 0, result_of(p), kResultHead, false);
    }
  }

  // 1. Worker stage: block by block in worker order, each block's bits sent to its server once
  // packed; then (send_worker_head) the worker scale and the settings digest to every member.
  void worker_passes(const RoundWorker& worker) {
    const std::vector<round_layout::Block> order = round_layout::worker_order(geometry_, me_);
    const float* e_prev = st_.worker[st_.current].data();
    float* e_next = st_.worker[1 - st_.current].data();
    double sum_squares = 0.0;
    for (std::size_t i = 0; i < order.size(); ++i) {
      const round_layout::Block& block = order[i];
      sum_squares += worker(i, block.first, block.length, e_prev + block.first, st_.worker_scale, e_next + block.first,
                            scratch_.packed.data() + block.first / 8);
      if (block.chunk != me_) {
        post_send(block.chunk, wire::Kind::kWorkerBits, block.index, scratch_.packed.data() + block.first / 8,
                  kernels::packed_bytes(block.length));
      }
    }
    result_.worker_scale = std::isfinite(sum_squares) ? kernels::scale_from_sum_squares(sum_squares, n_) : NAN;
  }

  void send_worker_head() {
    std::uint8_t* mine = scratch_.worker_heads.data() + me_ * round_layout::kWorkerHead;
    const std::uint64_t settings = tag_.settings_digest();
    std::memset(mine, 0, round_layout::kWorkerHead);
    std::memcpy(mine, &result_.worker_scale, 4);
    std::memcpy(mine + 8, &settings, 8);
    for (int p = 0; p < world_; ++p) {
      if (p != me_) post_send(p, wire::Kind::kWorkerHead, 0, mine, round_layout::kWorkerHead);
    }
  }

  // Every member's worker scale and settings digest, out of the heads.
  void read_worker_heads() {
    for (int p = 0; p < world_; ++p) {
      const std::uint8_t* head = scratch_.worker_heads.data() + p * round_layout::kWorkerHead;
      std::memcpy(&scratch_.scales.data()[p], head, 4);
      std::memcpy(&scratch_.settings[p], head + 8, 8);
    }
  }

  // The first member whose settings digest is not member 0's, or -1.
  std::int32_t first_unlike_member() const {
    for (int p = 1; p < world_; ++p) {
      if (scratch_.settings[p] != scratch_.settings[0]) return p;
    }
    return -1;
  }

  // The first member whose worker scale is not finite, or -1.
  std::int32_t first_non_finite_member() const {
    for (int p = 0; p < world_; ++p) {
      if (!std::isfinite(scratch_.scales.data()[p])) return p;
    }
    return -1;
  }

  // 2. Server stage, once every member's bits and scale are in: my chunk's server pass block by
  // block, each block's bits sent to every member as it is done; then (send_server_head) the head:
  // the scale and the verdict.
  void server_passes() {
    read_worker_heads();
    first_bad_ = first_non_finite_member();
    std::uint8_t* mine = result_of(me_);
    for (int p = 0; p < world_; ++p) {
      scratch_.chunk_bits[p] =
          p == me_ ? scratch_.packed.data() + begin(me_) / 8 : scratch_.received.data() + p * geometry_.chunk_bytes();
    }
    double server_squares = 0.0;
    const float* s_prev = st_.server[st_.current].data();
    float* s_next = st_.server[1 - st_.current].data();
    for (std::size_t b = 0; b < blocks_of(length(me_)); ++b) {
      const std::size_t within = block_begin(me_, b) - begin(me_);
      std::uint8_t* out_bits = mine + kResultHead + within / 8;
      // With a non-finite worker scale the bits are meaningless; they are still sent (every member
      // posted for them) and the head below carries the verdict.
      if (first_bad_ < 0) {
        for (int p = 0; p < world_; ++p) scratch_.block_bits[p] = scratch_.chunk_bits[p] + within / 8;
        server_squares +=
            comm_.kernels_.server_pass(scratch_.block_bits.data(), scratch_.scales.data(), world_, s_prev + within,
                                       st_.server_scale, s_next + within, out_bits, block_length(me_, b));
      }
      for (int p = 0; p < world_; ++p) {
        if (p != me_) post_send(p, wire::Kind::kServerResult, b, out_bits, kernels::packed_bytes(block_length(me_, b)));
      }
    }
    result_.server_scale = first_bad_ < 0 ? kernels::scale_from_sum_squares(server_squares, length(me_)) : NAN;
  }

  void send_server_head() {
    std::uint8_t* mine = result_of(me_);
    round_layout::write_result_head(
        mine, round_layout::ResultHead{result_.server_scale, first_bad_, first_unlike_member(), scratch_.settings[0]});
    for (int p = 0; p < world_; ++p) {
      if (p != me_) post_send(p, wire::Kind::kServerHead, 0, mine, kResultHead);
    }
  }

  Communicator& comm_;
  Tag& tag_;
  TagState& st_;
  RoundScratch& scratch_;
  const RankGroup& group_;
  const std::size_t n_, offset_;
  const wire::CallShape shape_;
  const std::uint32_t channel_;
  const int world_, me_;
  const ChunkGeometry geometry_;
  const std::size_t result_stride_;
  const std::uint64_t seq_;
  std::size_t next_request_ = 0;
  std::int32_t first_bad_ = -1;  // the server stage's verdict: the first member with non-finite input
  RoundResult result_;
};

Communicator::RoundResult Communicator::compressed_round(Tag& tag, TagState& st, const RankGroup& group, std::size_t n,
                                                         std::size_t offset, const wire::CallShape& shape,
                                                         std::uint32_t channel, const RoundWorker& worker) {
  return Round(*this, tag, st, group, n, offset, shape, channel).run(worker);
}

void Communicator::flat_compressed_allreduce(Tag& tag, void* buffer, std::size_t n, kernels::Dtype dtype, ReduceOp op,
                                             std::uint32_t channel) {
  CallScope scope(*this);
  const std::unique_lock<std::mutex> busy = claim_tag_for_call(tag, where());
  const int world = size();
  ++compressed_calls_;
  ++tag.calls;
  if (world == 1) return;  // the average over one rank is the buffer itself

  TagState& st = state_on(tag, id_);
  RankGroup everyone;
  for (int r = 0; r < world; ++r) everyone.ranks.push_back(r);
  everyone.me = rank();
  const std::size_t element = kernels::dtype_size(dtype);
  auto* x = static_cast<std::uint8_t*>(buffer);
  const wire::CallShape shape{n, static_cast<std::uint8_t>(dtype), static_cast<std::uint8_t>(op)};
  const std::uint64_t seq = st.seq;
  const RoundResult round =
      compressed_round(tag, st, everyone, n, 0, shape, channel,
                       [&](std::size_t, std::size_t first, std::size_t length, const float* e_prev, float a_prev,
                           float* e_next, std::uint8_t* bits) {
                         return kernels_.worker_pass(x + first * element, dtype, e_prev, a_prev, e_next, bits, length);
                       });
  compressed_bytes_ += round.bytes_sent;
  tag.bytes_sent += round.bytes_sent;

  // 3. Check every server's verdict, then write the result and commit.
  const auto unpack_start = Clock::now();
  const ChunkGeometry geometry(n, world);
  check_verdicts(where(), tag, *st.round, geometry, seq);
  const float factor = op == ReduceOp::kSum ? static_cast<float>(world) : 1.0f;
  round_layout::unpack_round(kernels_, st.round->results.data(), geometry, factor, x, dtype);
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
