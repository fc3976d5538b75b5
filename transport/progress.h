// The shutdown of a transport's progress thread, shared by the backends that run one (tcp,
// ibverbs): each sleeps in epoll with an eventfd among its descriptors and checks `stopping` under
// its mutex whenever it wakes.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <mutex>
#include <thread>

namespace onebit {

// Sets `stopping` under `mutex`, wakes the thread through `wakeup_fd` and joins it. Nothing if
// the thread never started (a one-rank transport).
inline void stop_progress_thread(std::thread& progress, std::mutex& mutex, bool& stopping, int wakeup_fd) {
  if (!progress.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex);
    stopping = true;
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wakeup_fd, &one, sizeof(one));
  progress.join();
}

}  // namespace onebit
