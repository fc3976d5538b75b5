// A gate in front of a listening socket: it accepts connections and reads each one's first record
// concurrently, each under a deadline of its own, so that a silent, slow or idle connection delays
// nobody (a stranger's dozen idle connections used to cost the bootstrap 5 s each). The bootstrap
// root (bootstrap.h) and every data listener (connection.h) take their connections through one.
//
// A connection that closes, errs or misses its deadline before its record is complete is logged and
// closed: at WARN, or at INFO when it sent nothing and closed (a reachability check, a port scan). At most kMaxPending
// connections wait at once; further ones stay in the kernel's backlog until one of those is done (none is pushed out: a
// flood delays a rank, it cannot evict it).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "transport/tcp/socket.h"

namespace onebit::transport::tcp {

class Gate {
 public:
  static constexpr std::size_t kMaxPending = 256;

  // `owner` prefixes the log lines ("bootstrap root", "rank 3").
  Gate(int listen_fd, std::size_t record_size, std::chrono::milliseconds grace, std::string owner);
  Gate(Gate&&) = default;
  ~Gate();

  // The bytes each accepted connection is sent first (the root's challenge); none by default.
  using Greeting = std::function<std::vector<std::uint8_t>()>;
  void greet_with(Greeting greeting) { greeting_ = std::move(greeting); }

  struct Arrival {
    Fd fd;                               // blocking mode
    std::vector<std::uint8_t> greeting;  // what it was sent
    std::vector<std::uint8_t> record;    // its first `record_size` bytes
    std::string who;                     // "connection from 10.0.0.2:41234"
  };
  // Connections accepted on the listener before the gate stood there (root_listener.h), greeted
  // and read as if it had accepted them itself. Call after greet_with.
  void adopt(std::vector<Fd> accepted);

  // The next connection whose record is complete, in the order they complete; nothing once the
  // deadline passes.
  std::optional<Arrival> next(Deadline deadline);

 private:
  struct Pending {
    Fd fd;
    Deadline until;
    std::vector<std::uint8_t> greeting;
    std::vector<std::uint8_t> record;
    std::size_t have = 0;
    std::string who;
  };
  void accept_waiting();
  void admit(Fd fd);  // greets `fd` and waits for its record
  // Reads what `p` has for us; true when its record is complete. Throws Error when it failed.
  bool read_some(Pending& p);
  void drop(std::size_t index, const std::string& why, bool quiet = false);

  int listen_fd_;
  std::size_t record_size_;
  std::chrono::milliseconds grace_;
  std::string owner_;
  Greeting greeting_;
  std::vector<Pending> pending_;
  Deadline accept_paused_until_{};  // after an accept error (no descriptors, a network error)
};

}  // namespace onebit::transport::tcp
