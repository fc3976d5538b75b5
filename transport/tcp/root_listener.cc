#include "transport/tcp/root_listener.h"

#include <map>
#include <mutex>
#include <string>

namespace onebit::transport::tcp {
namespace {

struct Kept {
  std::mutex mutex;
  std::map<std::string, Fd> listeners;  // by the address they are bound to
};

Kept& kept() {
  static Kept* table = new Kept;  // never destroyed: a listener taken during exit must still be found
  return *table;
}

}  // namespace

Address open_root_listener(const Address& where) {
  Fd listener = listen_on(where, 1024);
  const Address bound = local_address(listener.get());
  Kept& table = kept();
  const std::lock_guard<std::mutex> lock(table.mutex);
  table.listeners[bound.to_string()] = std::move(listener);
  return bound;
}

Fd take_root_listener(const Address& root) {
  Kept& table = kept();
  const std::lock_guard<std::mutex> lock(table.mutex);
  const auto found = table.listeners.find(root.to_string());
  if (found == table.listeners.end()) return Fd();
  Fd listener = std::move(found->second);
  table.listeners.erase(found);
  return listener;
}

void close_root_listeners() {
  Kept& table = kept();
  const std::lock_guard<std::mutex> lock(table.mutex);
  table.listeners.clear();
}

}  // namespace onebit::transport::tcp
