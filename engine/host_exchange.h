// The hierarchical algorithm's scratch for one tag on one communicator (TagState::host): the host
// exchange's buffers and messages, and the host's shared-memory segment. Internal to the engine;
// hierarchical_allreduce.cc sizes and uses it, tag_registry.cc frees it with the state.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/aligned_buffer.h"
#include "engine/tag_registry.h"
#include "transport/shm/host_segment.h"
#include "transport/transport.h"

namespace onebit {

struct HostScratch {
  AlignedBuffer<std::uint8_t> inputs;   // (L−1) × shard elements: the local peers' inputs of my shard
  AlignedBuffer<float> mean;            // fp16/bf16 calls: the host mean of my shard, the rail input
  AlignedBuffer<std::uint8_t> results;  // the local peers' rail results, as RoundScratch::results
  std::vector<Request> requests;        // every message of the exchange, sized once
  std::vector<Request*> all;
  // The host reduce through shared memory (when the host's ranks could set it up): every local
  // rank's region, and the calls it has carried (its ready counters count blocks since then).
  bool segment_tried = false;
  transport::shm::HostSegment segment;
  std::uint32_t segment_calls = 0;
};

// The tag's host-exchange scratch on this communicator, made empty on its first use.
inline HostScratch& host_scratch(TagState& st) {
  if (!st.host) st.host = std::make_unique<HostScratch>();
  return *st.host;
}

}  // namespace onebit
