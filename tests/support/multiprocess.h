// Ranks as real processes on loopback: fork W children that each run a body, collect their exit
// codes, and kill them all if the test's deadline passes (so a hang is a failure, never a stuck CI).
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
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
  T* as() {
    return static_cast<T*>(data_);
  }

 private:
  std::size_t bytes_;
  void* data_;
};

struct RankOutcome {
  int exit_code = -1;  // the body's return value, or 128 + signal
  std::string reason;  // why it failed, when it did: what RANK_FAILED recorded, the exception, the signal
};

// Where a child rank writes why it failed, in memory its parent reads after it exits; null outside
// run_ranks' children.
constexpr std::size_t kReasonBytes = 1024;
inline char*& rank_reason_slot() {
  static char* slot = nullptr;
  return slot;
}

// Records why this rank fails — `file:line: what`, or `what` alone without a file — and returns
// `code`, the rank's exit code:
//   if (got != want) return RANK_FAILED(3, "got != want");
inline int rank_failed(int code, const std::string& what, const char* file = nullptr, int line = 0) {
  const char* base = file != nullptr ? std::strrchr(file, '/') : nullptr;
  const std::string reason =
      file == nullptr ? what
                      : std::string(base != nullptr ? base + 1 : file) + ":" + std::to_string(line) + ": " + what;
  std::fprintf(stderr, "rank failure (exit %d): %s\n", code, reason.c_str());
  if (char* slot = rank_reason_slot()) std::snprintf(slot, kReasonBytes, "%s", reason.c_str());
  return code;
}
#define RANK_FAILED(code, what) ::onebit::testing::rank_failed((code), (what), __FILE__, __LINE__)
// In a rank's body: when `bad` holds, returns `code` from the body, recording `bad` as the reason.
#define RANK_FAILS_IF(bad, code)               \
  do {                                         \
    if (bad) return RANK_FAILED((code), #bad); \
  } while (0)

namespace detail {
// A child's exit status as an outcome, with the reason it left in its slot (or what the status says).
inline RankOutcome outcome_of(int status, const char* slot, bool killed_at_deadline) {
  RankOutcome outcome;
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (outcome.exit_code == 0) return outcome;
  if (slot[0] != '\0') {
    outcome.reason = slot;
  } else if (WIFSIGNALED(status)) {
    outcome.reason = killed_at_deadline && WTERMSIG(status) == SIGKILL
                         ? "still running at the test's deadline: killed"
                         : std::string("killed by signal ") + std::to_string(WTERMSIG(status));
  } else {
    outcome.reason = "exit code " + std::to_string(outcome.exit_code) + " with no reason recorded";
  }
  return outcome;
}
}  // namespace detail

// Runs body(rank) in `world` child processes; returns each one's outcome, and prints each failed
// rank's reason. Children still running at the deadline are killed and reported as 128 + SIGKILL.
inline std::vector<RankOutcome> run_ranks(int world, const std::function<int(int)>& body,
                                          std::chrono::seconds deadline = std::chrono::seconds(120)) {
  SharedMemory reasons(static_cast<std::size_t>(world) * kReasonBytes);
  std::memset(reasons.as<char>(), 0, static_cast<std::size_t>(world) * kReasonBytes);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      rank_reason_slot() = reasons.as<char>() + rank * kReasonBytes;
      int code = 1;
      try {
        code = body(rank);
      } catch (const std::exception& error) {
        code = rank_failed(99, std::string("threw: ") + error.what());
      } catch (...) {
        code = rank_failed(99, "threw something that is not a std::exception");
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
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
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
      outcomes[r] = detail::outcome_of(status, reasons.as<char>() + r * kReasonBytes, killed);
      ::close(fds[r].fd);
      fds[r].fd = -1;  // poll ignores negative descriptors
      --remaining;
    }
  }
  for (int r = 0; r < world; ++r) {
    if (outcomes[r].exit_code != 0) {
      std::fprintf(stderr, "rank %d of %d failed (exit %d): %s\n", r, world, outcomes[r].exit_code,
                   outcomes[r].reason.c_str());
    }
  }
  return outcomes;
}

}  // namespace onebit::testing
