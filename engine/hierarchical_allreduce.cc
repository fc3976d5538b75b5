// The hierarchical compressed allreduce (docs/design/engine.md, "Hierarchical compression"). L ranks per
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
#include "engine/communicator.h"
#include "engine/compressed_round.h"
#include "engine/host_exchange.h"
#include "kernels/cpu/half.h"

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
void set_up_host_segment(const SegmentSetup& c, HostScratch& host) {
  constexpr std::size_t kNameBytes = 64;
  char name[kNameBytes] = {};
  std::int32_t go = 0;
  std::vector<std::int32_t> acks(c.local_size, 0);
  // At most 2 (L-1) requests between two waits (local rank 0: names out, answers in), and each
  // wait retires them: the slots are reused. (Numbered on across waits, local rank 0's go messages
  // wrote past the end from 4 ranks per host on.)
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
    next = 0;
  };
  const std::size_t region = c.shards.n * c.element;
  if (c.local == 0) {
    std::string why;
    if (param::Shm() != 0) {
      try {
        host.segment = transport::shm::HostSegment::create(c.local_size, region);
        for (int w = 0; w < c.local_size; ++w) {
          for (int q = 0; q < c.local_size; ++q) {
            if (q != w) host.segment.reserve(w, c.shards.begin(q) * c.element, c.shards.length(q) * c.element);
          }
        }
        std::snprintf(name, sizeof(name), "%s", host.segment.name().c_str());
      } catch (const Error& error) {
        host.segment = transport::shm::HostSegment();
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
    host.segment.unlink();
    if (!go) {
      host.segment = transport::shm::HostSegment();
      ONEBIT_LOG(WARN, c.where, ": the host's ranks exchange fp32 inputs over the transport, not shared memory: ", why);
    }
  } else {
    exchange(false, 0, 0, name, kNameBytes);
    wait("name");
    std::int32_t ack = 0;
    if (name[kNameBytes - 1] == '\0' && name[0] != '\0' && param::Shm() != 0) {
      try {
        host.segment = transport::shm::HostSegment::open(name, c.local_size, region);
        ack = 1;
      } catch (const Error& error) {
        ONEBIT_LOG(WARN, c.where, ": cannot map local rank 0's segment: ", error.what());
      }
    }
    exchange(true, 0, 1, &ack, sizeof(std::int32_t));
    exchange(false, 0, 2, &go, sizeof(std::int32_t));
    wait("go");
    if (!go) host.segment = transport::shm::HostSegment();
  }
  if (host.segment.mapped()) host.segment.set_pid(c.local, ::getpid());
  host.segment_tried = true;
}

}  // namespace

// One hierarchical call, in the steps of the header comment: the state sized on a tag's first
// call, the host exchange posted (shared memory or the transport), the rail round whose worker
// pass forms the host mean block by block, the host gather, then every rail's verdict and the
// unpack. Holds what the steps share: the shard and rail geometries, the call's sequence number,
// the requests posted so far.
class Communicator::HostCall {
 public:
  HostCall(Communicator& comm, Tag& tag, void* buffer, std::size_t n, kernels::Dtype dtype, ReduceOp op,
           std::uint32_t channel)
      : comm_(comm),
        tag_(tag),
        x_(static_cast<std::uint8_t*>(buffer)),
        n_(n),
        dtype_(dtype),
        op_(op),
        channel_(channel),
        world_(comm.size()),
        local_size_(comm.local_size_),
        hosts_(world_ / local_size_),
        host_(comm.rank() / local_size_),
        local_(comm.rank() % local_size_),
        shards_(n, local_size_),
        shard_(shards_.length(local_)),
        element_(kernels::dtype_size(dtype)),
        shape_{n, static_cast<std::uint8_t>(dtype), static_cast<std::uint8_t>(op)},
        st_(state_on(tag, comm.id_)),
        exchange_(host_scratch(st_)),
        seq_(st_.seq),
        segment_(exchange_.segment) {
    for (int q = 0; q < local_size_; ++q) rails_.emplace_back(shards_.length(q), hosts_);
    results_at_.assign(local_size_, 0);
    for (int q = 0; q < local_size_; ++q) {
      if (q == local_) continue;
      results_at_[q] = results_bytes_;
      results_bytes_ += hosts_ * round_layout::result_stride(rails_[q]);
    }
    for (int q = 0; q < local_size_; ++q) orders_.push_back(round_layout::worker_order(rails_[q], host_));
    block_recvs_.resize(orders_[local_].size());
  }

  void run() {
    size_state_once();
    post_host_exchange();
    const RoundResult round = rail_round();
    const Clock::time_point round_done = Clock::now();
    host_gather();
    // Every local peer has read this call's blocks (it sent its results after its worker stage),
    // so the regions may take the next call's.
    if (segment_.mapped()) ++exchange_.segment_calls;
    const Clock::time_point gathered = Clock::now();
    comm_.compressed_bytes_ += round.bytes_sent + host_sent_;
    comm_.intra_host_bytes_ += host_sent_;
    tag_.bytes_sent += round.bytes_sent + host_sent_;
    check_verdicts();
    unpack();
    // The worker stage's time includes waiting for the local peers' blocks.
    comm_.commit_round(st_, round, std::chrono::duration<double>(gathered - round_done).count(), gathered);
  }

 private:
  int peer_rank(int q) const { return host_ * local_size_ + q; }
  int slot_of(int q) const { return q < local_ ? q : q - 1; }  // a local peer's place in host_inputs
  wire::MessageKey key(wire::Kind kind, std::size_t part) const {
    return wire::MessageKey{tag_.id, seq_, kind, static_cast<std::uint16_t>(part)};
  }
  std::function<std::string(const Request&)> describe() const {
    return [this](const Request& r) {
      return "tag '" + tag_.name + "' call " + std::to_string(seq_) + ": " + wire::kind_name(r.key.kind) + " block " +
             std::to_string(r.key.part) + " (hierarchical, " + std::to_string(local_size_) + " ranks per host)";
    };
  }
  // Where local peer q's rail results are: this rank's own in `results`, the peers' in host_results.
  const std::uint8_t* results_of(int q) const {
    return q == local_ ? st_.round->results.data() : exchange_.results.data() + results_at_[q];
  }

  void size_state_once() {
    if (exchange_.requests.empty()) {
      ONEBIT_CHECK(st_.round_ranks == 0, ONEBIT_INVALID_ARGUMENT, comm_.where(), ": tag '", tag_.name,
                   "' ran flat on this communicator; a tag must not mix the flat and hierarchical algorithms");
      if (dtype_ != kernels::Dtype::kFloat32) exchange_.mean.resize(shard_);
      exchange_.results.resize(results_bytes_);
      std::size_t requests = 0;
      for (int q = 0; q < local_size_; ++q) {
        if (q != local_) requests += orders_[local_].size() + orders_[q].size() + 2;
      }
      exchange_.requests.resize(requests);
      exchange_.all.reserve(requests);
    }
    // Checked before any message leaves, so a misuse fails this rank's call alone, cleanly.
    ONEBIT_CHECK(st_.round_ranks == 0 || (st_.round_elements == shard_ && st_.round_ranks == hosts_),
                 ONEBIT_INVALID_ARGUMENT, comm_.where(), ": tag '", tag_.name,
                 "' ran flat on this communicator; a "
                 "tag must not mix the flat and hierarchical algorithms");
  }

  Request* post(bool send, int q, wire::Kind kind, std::size_t part, void* data, std::size_t bytes) {
    Request& r = exchange_.requests[next_request_++];
    if (send) {
      comm_.transport_->isend(r, peer_rank(q), channel_, key(kind, part), shape_, data, bytes);
      host_sent_ += bytes;
    } else {
      comm_.transport_->irecv(r, peer_rank(q), channel_, key(kind, part), shape_, data, bytes);
    }
    exchange_.all.push_back(&r);
    return &r;
  }

  // Any failure of this rank's call: tell the host's waiters. A failure that is not the
  // transport's own (a local peer gone from shared memory, an abort word) leaves this call's
  // messages posted and unawaited. Waiting for them with an expired deadline breaks the transport
  // — peers learn at once — and the transport contract then promises it never touches those
  // requests again, so the state that holds them may be freed.
  void settle() {
    segment_.abort(comm_.rank());
    for (const std::vector<Request*>* pending : {&round_scratch(st_).all, &exchange_.all}) {
      try {
        comm_.transport_->wait_all(*pending, Clock::now(), describe());
      } catch (const Error&) {
      }
    }
  }

  [[noreturn]] void failed(const Error& error) {
    settle();
    fail(error.code(), comm_.where(), ": allreduce of tag '", tag_.name, "' (", n_, " ", kernels::dtype_name(dtype_),
         ", call ", seq_, ", hierarchical) failed; buffer and error state unchanged: ", error.what());
  }

  // 1. The host exchange, posted: the segment set up on a tag's first call; from every local peer
  // its rail results (and, without the segment, its input of my shard, block by block); to every
  // peer its shard of my input over the transport, in the order its worker stage will want the
  // blocks, round robin over the peers.
  void post_host_exchange() {
    exchange_.all.clear();
    try {
      if (!exchange_.segment_tried) {
        set_up_host_segment(SegmentSetup{*comm_.transport_, channel_,
                                         [this](std::size_t part) { return key(wire::Kind::kHostSegment, part); },
                                         shape_, local_, local_size_, [this](int q) { return peer_rank(q); }, shards_,
                                         element_, comm_.call_deadline(), comm_.where() + ": tag '" + tag_.name + "'"},
                            exchange_);
      }
      if (!segment_.mapped()) exchange_.inputs.resize((local_size_ - 1) * shard_ * element_);
      for (int q = 0; q < local_size_; ++q) {
        if (q == local_) continue;
        if (!segment_.mapped()) {
          for (std::size_t i = 0; i < orders_[local_].size(); ++i) {
            const round_layout::Block& b = orders_[local_][i];
            block_recvs_[i].push_back(post(false, q, wire::Kind::kHostReduce, i,
                                           exchange_.inputs.data() + (slot_of(q) * shard_ + b.first) * element_,
                                           b.length * element_));
          }
        }
        post(false, q, wire::Kind::kHostGather, 0, exchange_.results.data() + results_at_[q],
             hosts_ * round_layout::result_stride(rails_[q]));
      }
      std::size_t most = 0;
      for (const auto& order : orders_) most = std::max(most, order.size());
      for (std::size_t i = 0; i < most && !segment_.mapped(); ++i) {
        for (int q = 0; q < local_size_; ++q) {
          if (q == local_ || i >= orders_[q].size()) continue;
          const round_layout::Block& b = orders_[q][i];
          post(true, q, wire::Kind::kHostReduce, i, x_ + (shards_.begin(q) + b.first) * element_, b.length * element_);
        }
      }
    } catch (const Error& error) {
      failed(error);
    }
  }

  // Through shared memory: block i for every peer goes into this rank's region just before this
  // rank waits for its own block i, and whatever a peer still lacks goes with the last block, so
  // no rank waits for a block its writer has not reached.
  void publish(std::size_t i) {
    for (int q = 0; q < local_size_; ++q) {
      if (q == local_) continue;
      const std::size_t last = i + 1 == orders_[local_].size() ? orders_[q].size() : std::min(i + 1, orders_[q].size());
      for (std::size_t j = std::min(i, last); j < last; ++j) {
        const round_layout::Block& b = orders_[q][j];
        const std::size_t at = (shards_.begin(q) + b.first) * element_;
        if (b.length > 0) std::memcpy(segment_.region(local_) + at, x_ + at, b.length * element_);
        segment_.publish(local_, q,
                         exchange_.segment_calls * static_cast<std::uint32_t>(orders_[q].size()) +
                             static_cast<std::uint32_t>(j) + 1);
      }
    }
  }

  // The local peers' inputs of block i of my worker order, in place: from shared memory or the
  // transport.
  void await_block(std::size_t i, std::uint32_t read_base) {
    if (!segment_.mapped()) {
      comm_.transport_->wait_all(block_recvs_[i], comm_.call_deadline(), describe());
      return;
    }
    publish(i);
    for (int q = 0; q < local_size_; ++q) {
      if (q == local_) continue;
      segment_.wait(q, local_, read_base + static_cast<std::uint32_t>(i) + 1, comm_.call_deadline(), peer_rank(q),
                    "block " + std::to_string(i) + " of the host reduce of tag '" + tag_.name + "' call " +
                        std::to_string(seq_) + " (shared memory)");
    }
  }

  // The rail's worker pass on block i: the host mean of the block, formed as it is needed (fp32:
  // inside the pass, never written; fp16/bf16: converted first).
  double host_mean_worker_pass(std::size_t i, std::size_t first, std::size_t length, const float* e_prev, float a_prev,
                               float* e_next, std::uint8_t* bits, std::uint32_t read_base) {
    await_block(i, read_base);
    for (int q = 0; q < local_size_; ++q) {
      const std::size_t at = (shards_.begin(local_) + first) * element_;
      sources_[q] = q == local_         ? x_ + at
                    : segment_.mapped() ? segment_.region(q) + at
                                        : exchange_.inputs.data() + (slot_of(q) * shard_ + first) * element_;
    }
    if (dtype_ == kernels::Dtype::kFloat32) {
      for (int q = 0; q < local_size_; ++q) fp32_sources_[q] = reinterpret_cast<const float*>(sources_[q]);
      return comm_.kernels_.mean_worker_pass(fp32_sources_.data(), local_size_, e_prev, a_prev, e_next, bits, length);
    }
    host_mean(sources_, dtype_, exchange_.mean.data() + first, length);
    return comm_.kernels_.worker_pass(exchange_.mean.data() + first, kernels::Dtype::kFloat32, e_prev, a_prev, e_next,
                                      bits, length);
  }

  // 2. The rail round over my shard's host mean; its failures (the host reduce's too, which it
  // waits for) come out phrased.
  RoundResult rail_round() {
    sources_.assign(local_size_, nullptr);
    fp32_sources_.assign(local_size_, nullptr);
    RankGroup rail;
    for (int h = 0; h < hosts_; ++h) rail.ranks.push_back(h * local_size_ + local_);
    rail.me = host_;
    const std::uint32_t read_base = exchange_.segment_calls * static_cast<std::uint32_t>(orders_[local_].size());
    try {
      return comm_.compressed_round(tag_, st_, rail, shard_, shards_.begin(local_), shape_, channel_,
                                    [&](std::size_t i, std::size_t first, std::size_t length, const float* e_prev,
                                        float a_prev, float* e_next, std::uint8_t* bits) {
                                      return host_mean_worker_pass(i, first, length, e_prev, a_prev, e_next, bits,
                                                                   read_base);
                                    });
    } catch (const Error&) {
      settle();
      throw;
    }
  }

  // 3. My rail's results to every local peer, and theirs in.
  void host_gather() {
    try {
      const std::size_t my_stride = round_layout::result_stride(rails_[local_]);
      for (int q = 0; q < local_size_; ++q) {
        if (q != local_) post(true, q, wire::Kind::kHostGather, 0, st_.round->results.data(), hosts_ * my_stride);
      }
      comm_.transport_->wait_all(exchange_.all, comm_.call_deadline(), describe());
    } catch (const Error& error) {
      failed(error);
    }
  }

  // Every rail's results, in local-index order: the same verdict, in the same order, on every rank.
  // Settings are compared within each rail (against its member on host 0, rank q) and across the
  // rails (rank q's against rank 0's, from the heads), so every rank is compared with rank 0.
  void check_verdicts() const {
    for (int q = 0; q < local_size_; ++q) {
      round_layout::check_verdicts(
          results_of(q), rails_[q],
          [&](int, std::int32_t host) { unlike_settings(static_cast<int>(host) * local_size_ + q, q); },
          [&](int, std::int32_t bad) {
            fail(ONEBIT_NUMERIC_ERROR, comm_.where(), ": allreduce of tag '", tag_.name, "' (call ", seq_,
                 "): the input of host ", bad, " (ranks ", bad * local_size_, "..", bad * local_size_ + local_size_ - 1,
                 ") holds NaN or Inf in shard ", q, " (elements ", shards_.begin(q), "..",
                 shards_.begin(q) + shards_.length(q), "); no buffer or error state changed on any rank");
          },
          [&](int p, float scale) {
            fail(ONEBIT_NUMERIC_ERROR, comm_.where(), ": allreduce of tag '", tag_.name, "' (call ", seq_,
                 "): the scale of rank ", p * local_size_ + q, " (server of rail ", q, ") is ", scale,
                 "; no buffer or error state changed on any rank");
          });
      const std::uint64_t reference = round_layout::result_head(results_of(q), rails_[q], 0).reference;
      if (reference != round_layout::result_head(results_of(0), rails_[0], 0).reference) unlike_settings(q, 0);
    }
  }

  [[noreturn]] void unlike_settings(int rank, int reference_rank) const {
    fail(ONEBIT_MISMATCH, comm_.where(), ": allreduce of tag '", tag_.name, "' (call ", seq_, "): rank ", rank,
         "'s settings for this call differ from rank ", reference_rank, "'s — ", settings_mismatch_hint(tag_));
  }

  // Every rail's results into its shard of the caller's buffer.
  void unpack() {
    const float factor = op_ == ReduceOp::kSum ? static_cast<float>(world_) : 1.0f;
    for (int q = 0; q < local_size_; ++q) {
      round_layout::unpack_round(comm_.kernels_, results_of(q), rails_[q], factor, x_ + shards_.begin(q) * element_,
                                 dtype_);
    }
  }

  Communicator& comm_;
  Tag& tag_;
  std::uint8_t* const x_;
  const std::size_t n_;
  const kernels::Dtype dtype_;
  const ReduceOp op_;
  const std::uint32_t channel_;
  const int world_, local_size_, hosts_, host_, local_;
  const ChunkGeometry shards_;
  const std::size_t shard_, element_;
  const wire::CallShape shape_;
  TagState& st_;
  HostScratch& exchange_;
  const std::uint64_t seq_;
  transport::shm::HostSegment& segment_;
  std::vector<ChunkGeometry> rails_;     // the rail geometry of each shard
  std::vector<std::size_t> results_at_;  // where local peer q's rail results sit in host_results
  std::size_t results_bytes_ = 0;
  std::vector<std::vector<round_layout::Block>> orders_;  // each shard's worker order on this host
  std::vector<std::vector<Request*>> block_recvs_;        // [i]: the local peers' inputs of my block i
  std::vector<const std::uint8_t*> sources_;              // the worker pass's L inputs of one block
  std::vector<const float*> fp32_sources_;
  std::size_t next_request_ = 0;
  std::uint64_t host_sent_ = 0;
};

void Communicator::hierarchical_allreduce(Tag& tag, void* buffer, std::size_t n, kernels::Dtype dtype, ReduceOp op,
                                          std::uint32_t channel) {
  CallScope scope(*this);
  const std::unique_lock<std::mutex> busy = claim_tag_for_call(tag, where());
  ONEBIT_CHECK(hierarchical(), ONEBIT_INVALID_ARGUMENT, where(), ": tag '", tag.name,
               "': hierarchical compression needs several ranks per host and several hosts; this communicator has ",
               local_size_, " rank(s) per host of ", size(), " (set ONEBIT_LOCAL_SIZE)");
  check_topology(tag);
  ++compressed_calls_;
  ++tag.calls;
  HostCall(*this, tag, buffer, n, dtype, op, channel).run();
}

}  // namespace onebit
