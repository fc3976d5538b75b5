// Long-lived buffers that onebit allocates itself (AlignedBuffer: error state, scratch, received
// bits), announced here from allocation to release. A transport that must register memory with a
// device (the verbs transport) keeps one registration per such buffer, cached for its life, and
// drops it when the buffer is released — before the memory goes back to the allocator, so a
// registration never outlives the pages it pinned. Memory that is not announced (the caller's
// tensors) is registered per message instead: onebit cannot know when it is freed.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>

namespace onebit::buffers {

struct Span {
  const void* begin = nullptr;
  std::size_t bytes = 0;
};

// AlignedBuffer calls these. retire() runs every listener (see subscribe) before it returns.
void announce(const void* begin, std::size_t bytes);
void retire(const void* begin, std::size_t bytes);

// The announced buffer that holds all of [p, p + bytes), if one does.
std::optional<Span> containing(const void* p, std::size_t bytes);

// `on_retire` runs for every retired buffer until unsubscribe(id), which returns only after any
// call in progress has finished. Listeners run one at a time, without the lock that announce()
// and containing() take; one must not allocate or free announced buffers itself.
int subscribe(std::function<void(const Span&)> on_retire);
void unsubscribe(int id);

}  // namespace onebit::buffers
