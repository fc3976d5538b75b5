#include "common/buffer_registry.h"

#include <map>
#include <mutex>
#include <utility>

namespace onebit::buffers {
namespace {

struct Registry {
  std::mutex mutex;                         // guards `live`
  std::map<const char*, std::size_t> live;  // begin -> bytes
  // Guards `listeners` and is held while they run, so that unsubscribe() returns only once no
  // retire() is still inside the listener it removes (its owner is about to be destroyed).
  std::mutex calling;
  std::map<int, std::function<void(const Span&)>> listeners;
  int next_id = 1;
};

// Never destroyed: buffers of static objects are retired during exit, after other statics are gone.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

void announce(const void* begin, std::size_t bytes) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.live[static_cast<const char*>(begin)] = bytes;
}

void retire(const void* begin, std::size_t bytes) {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    r.live.erase(static_cast<const char*>(begin));
  }
  std::lock_guard<std::mutex> lock(r.calling);
  for (auto& [id, listener] : r.listeners) listener(Span{begin, bytes});
}

std::optional<Span> containing(const void* p, std::size_t bytes) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const char* at = static_cast<const char*>(p);
  auto it = r.live.upper_bound(at);
  if (it == r.live.begin()) return std::nullopt;
  --it;
  if (at + bytes > it->first + it->second) return std::nullopt;
  return Span{it->first, it->second};
}

int subscribe(std::function<void(const Span&)> on_retire) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.calling);
  const int id = r.next_id++;
  r.listeners[id] = std::move(on_retire);
  return id;
}

void unsubscribe(int id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.calling);
  r.listeners.erase(id);
}

}  // namespace onebit::buffers
