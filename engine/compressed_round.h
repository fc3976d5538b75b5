// What the two compressed algorithms share (compressed_allreduce.cc: flat; hierarchical_allreduce.cc):
// the group of ranks a round of docs/algorithm.md runs over, what a round leaves behind, and the layout
// of its messages and results. Internal to the engine.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/aligned_buffer.h"
#include "engine/chunk_geometry.h"
#include "engine/communicator.h"
#include "engine/tag_registry.h"
#include "transport/transport.h"

namespace onebit {

namespace round_layout {

// A worker's head, sent to every member once its bits are packed: [float scale][4 bytes zero]
// [uint64 the tag's settings digest] (Tag::settings: what the ranks must share for this call).
constexpr std::size_t kWorkerHead = 16;

// A server's result is held as [float scale][int32 first member with non-finite input, or -1]
// [int32 first member whose settings digest is not member 0's, or -1][4 bytes zero][uint64 member
// 0's settings digest][bits]; the head travels as one message, the bits as blocks.
constexpr std::size_t kResultHead = 24;

// Bits travel in blocks of this many elements (128 KiB of bits): small enough that the wire starts
// soon after a pass starts, large enough that per-message costs vanish. A multiple of 8.
constexpr std::size_t kBlockElements = std::size_t{1} << 20;

// Blocks of a chunk of `length` elements; an empty chunk still has one (empty) block, so every
// rank posts and sends the same messages whatever the sizes.
inline std::size_t blocks_of(std::size_t length) {
  return std::max<std::size_t>(1, (length + kBlockElements - 1) / kBlockElements);
}

// One result per server: head and a full chunk's bits.
inline std::size_t result_stride(const ChunkGeometry& geometry) { return kResultHead + geometry.chunk_bytes(); }

struct Block {
  int chunk;          // the chunk it belongs to, i.e. the member that serves it
  std::size_t index;  // its index within that chunk (the message part)
  std::size_t first;  // its first element
  std::size_t length;
};

// The order in which member `me`'s worker stage visits the blocks: chunk me+1, me+2, …, its own
// chunk last (so the bits for the other servers leave first), each chunk's blocks in order.
inline std::vector<Block> worker_order(const ChunkGeometry& geometry, int me) {
  std::vector<Block> order;
  for (int k = 1; k <= geometry.world; ++k) {
    const int j = (me + k) % geometry.world;
    const std::size_t end = geometry.begin(j) + geometry.length(j);
    for (std::size_t b = 0; b < blocks_of(geometry.length(j)); ++b) {
      const std::size_t first = std::min(end, geometry.begin(j) + b * kBlockElements);
      order.push_back(Block{j, b, first, std::min(end, first + kBlockElements) - first});
    }
  }
  return order;
}

// Server j's result head: its scale, the first member whose input was not finite (or -1), the
// first member whose settings differ from member 0's (or -1), and member 0's settings digest.
struct ResultHead {
  float scale;
  std::int32_t first_bad;
  std::int32_t first_unlike;
  std::uint64_t reference;
};

// The head of server j's result in a round's results (`results`: every server's, result_stride apart).
inline ResultHead result_head(const std::uint8_t* results, const ChunkGeometry& geometry, int j) {
  ResultHead head;
  const std::uint8_t* at = results + j * result_stride(geometry);
  std::memcpy(&head.scale, at, 4);
  std::memcpy(&head.first_bad, at + 4, 4);
  std::memcpy(&head.first_unlike, at + 8, 4);
  std::memcpy(&head.reference, at + 16, 8);
  return head;
}

inline void write_result_head(std::uint8_t* at, const ResultHead& head) {
  std::memset(at, 0, kResultHead);
  std::memcpy(at, &head.scale, 4);
  std::memcpy(at + 4, &head.first_bad, 4);
  std::memcpy(at + 8, &head.first_unlike, 4);
  std::memcpy(at + 16, &head.reference, 8);
}

// Every server's verdict, in server order, before anything is written — the same on every rank,
// since every rank holds the same heads: unlike_settings(p, member) for a server whose head names a
// member whose settings differ from member 0's, bad_input(p, member) for a member's non-finite
// input, bad_scale(p, scale) for a non-finite server scale. All three throw.
template <typename UnlikeSettings, typename BadInput, typename BadScale>
void check_verdicts(const std::uint8_t* results, const ChunkGeometry& geometry, UnlikeSettings&& unlike_settings,
                    BadInput&& bad_input, BadScale&& bad_scale) {
  for (int p = 0; p < geometry.world; ++p) {
    const ResultHead head = result_head(results, geometry, p);
    if (head.first_unlike >= 0) unlike_settings(p, head.first_unlike);
    if (head.first_bad >= 0) bad_input(p, head.first_bad);
    if (!std::isfinite(head.scale)) bad_scale(p, head.scale);
  }
}

// Every server's result unpacked into `out` (the round's first element), each chunk at its place:
// ±scale·factor per bit, in dtype.
inline void unpack_round(const kernels::CpuKernels& kernels, const std::uint8_t* results, const ChunkGeometry& geometry,
                         float factor, std::uint8_t* out, kernels::Dtype dtype) {
  const std::size_t element = kernels::dtype_size(dtype);
  for (int j = 0; j < geometry.world; ++j) {
    kernels.unpack(results + j * result_stride(geometry) + kResultHead,
                   result_head(results, geometry, j).scale * factor, out + geometry.begin(j) * element, dtype,
                   geometry.length(j));
  }
}

}  // namespace round_layout

// How an error of ranks whose settings for a call differ ends: what the settings are, this rank's
// values (each rank's error names its own), the usual causes, and that nothing changed.
inline std::string settings_mismatch_hint(Tag& tag) {
  return "the settings every rank must share for it (an optimizer's learning rate, betas, eps, weight decay, step "
         "or stage; onebit_tag_set_step_settings) are not the same on every rank. This rank's: " +
         tag.settings_said() +
         " (each rank's error names its own). A learning-rate scheduler stepped on some ranks only, or skipped "
         "where GradScaler lowered its scale, which is per rank? No buffer or error state changed on any rank";
}

// The ranks of a round, in member order, and this rank's place among them. Flat: every rank.
// Hierarchical: a rail, the ranks with one local index, one per host, in host order.
struct Communicator::RankGroup {
  std::vector<int> ranks;
  int me = 0;
  int size() const { return static_cast<int>(ranks.size()); }
};

// A round's scratch for one tag on one communicator (TagState::round), sized by the tag's first
// round there and reused by every later one.
struct RoundScratch {
  AlignedBuffer<std::uint8_t> packed;           // this rank's bits of the whole round
  AlignedBuffer<std::uint8_t> received;         // W × chunk bits, from each member (server stage)
  AlignedBuffer<std::uint8_t> worker_heads;     // W worker heads (kWorkerHead each)
  AlignedBuffer<float> scales;                  // W worker scales, from the heads
  std::vector<std::uint64_t> settings;          // W settings digests, from the heads
  AlignedBuffer<std::uint8_t> results;          // W × (8 + chunk bits): every server's result
  std::vector<Request> requests;                // every message of a round, sized once
  std::vector<Request*> stage1, all;            // what the round waits for
  std::vector<const std::uint8_t*> chunk_bits;  // the server stage's W inputs
  std::vector<const std::uint8_t*> block_bits;  // the same, at one block
};

// The tag's round scratch on this communicator, made empty on its first use.
inline RoundScratch& round_scratch(TagState& st) {
  if (!st.round) st.round = std::make_unique<RoundScratch>();
  return *st.round;
}

// What a round leaves for its caller, besides every server's result in RoundScratch::results: the
// scales to commit, and where its time went (seconds: worker, wait for inputs, server, wait for
// results).
struct Communicator::RoundResult {
  float worker_scale = 0.0f;
  float server_scale = 0.0f;
  std::uint64_t bytes_sent = 0;
  double seconds[4] = {0, 0, 0, 0};
};

}  // namespace onebit
