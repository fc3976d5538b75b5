// Ranks as real processes on loopback: fork W children that each run a body, collect their exit
// codes, and kill them all if the test's deadline passes (so a hang is a failure, never a stuck CI).
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace onebit::testing {

// A port nobody listens on right now (the kernel's choice; a race with other processes is possible
// but harmless in practice on a test machine).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

// Memory shared by the parent and all children (MAP_SHARED before fork).
class SharedMemory {
 public:
  explicit SharedMemory(std::size_t bytes) : bytes_(bytes == 0 ? 1 : bytes) {
    data_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (data_ == MAP_FAILED) throw std::runtime_error("mmap failed");
  }
  ~SharedMemory() { ::munmap(data_, bytes_); }
  template <typename T>
  T* as() { return static_cast<T*>(data_); }

 private:
  std::size_t bytes_;
  void* data_;
};

struct RankOutcome {
  int exit_code = -1;  // the body's return value, or 128 + signal
};

// Runs body(rank) in `world` child processes; returns each one's outcome. Children still running at
// the deadline are killed and reported as 128 + SIGKILL.
inline std::vector<RankOutcome> run_ranks(int world, const std::function<int(int)>& body,
                                          std::chrono::seconds deadline = std::chrono::seconds(120)) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = body(rank);
      } catch (...) {
        code = 99;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<RankOutcome> outcomes(world);
  // Wait on pidfds with poll: no sleeping, and a hard deadline after which the rest are killed.
  std::vector<pollfd> fds(world);
  for (int r = 0; r < world; ++r) fds[r] = pollfd{static_cast<int>(::syscall(SYS_pidfd_open, pids[r], 0)), POLLIN, 0};
  // Without pidfds (Linux before 5.3) there is nothing to wait on: kill and reap every rank and
  // fail loudly, rather than poll no descriptor forever.
  if (std::any_of(fds.begin(), fds.end(), [](const pollfd& p) { return p.fd < 0; })) {
    const int error = errno;
    for (int r = 0; r < world; ++r) {
      ::kill(pids[r], SIGKILL);
      ::waitpid(pids[r], nullptr, 0);
      if (fds[r].fd >= 0) ::close(fds[r].fd);
    }
    throw std::runtime_error(std::string("run_ranks: pidfd_open failed (") + std::strerror(error) +
                             "); these tests need Linux 5.3 or later");
  }
  const auto until = std::chrono::steady_clock::now() + deadline;
  int remaining = world;
  bool killed = false;
  while (remaining > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
    const int ready = ::poll(fds.data(), fds.size(), killed ? -1 : static_cast<int>(left < 0 ? 0 : left));
    if (ready == 0 && !killed) {
      for (int r = 0; r < world; ++r) {
        if (fds[r].fd >= 0) ::kill(pids[r], SIGKILL);
      }
      killed = true;
      continue;
    }
    for (int r = 0; r < world; ++r) {
      if (fds[r].fd < 0 || !(fds[r].revents & POLLIN)) continue;
      int status = 0;
      ::waitpid(pids[r], &status, 0);
      outcomes[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      ::close(fds[r].fd);
      fds[r].fd = -1;  // poll ignores negative descriptors
      --remaining;
    }
  }
  return outcomes;
}

}  // namespace onebit::testing
