// Rank 0's bootstrap listener, opened before the communicator — for whoever publishes the root's
// address itself (the torch backend through its c10d store, the Gloo door through the context's
// pairs, the bench's parent before it forks the ranks). It binds port 0, publishes the port the
// kernel gave, and then makes the communicator, whose rank 0 serves the root on this very listener
// (connect_mesh takes it) instead of binding the address again. There is no probe that binds,
// closes and rebinds, so no window in which another process can take the port.
//
// While it is held, a thread answers the other ranks' reachability checks (check_root_reachable in
// bootstrap.h): it accepts every connection, closes those that close without a byte (the checks),
// and keeps the others — a rank whose bootstrap came before rank 0 took the listener, or a
// stranger — for the root, which greets them as if it had accepted them itself. So every rank can
// check, however many: left in the kernel's accept queue, the checks would overflow it past 128
// (net.core.somaxconn before Linux 5.4) and fail falsely.
#pragma once

#include <vector>

#include "transport/tcp/socket.h"

namespace onebit::transport::tcp {

// Whether a held listener answers the ranks' checks. A process that forks its ranks after opening
// the listener (the bench) must not: the thread stays in the parent, which would take the child's
// connections.
enum class RootChecks { kAnswered, kNotAnswered };

// Listens on `where` (port 0: one the kernel picks) and keeps the listener for the communicator
// whose root is the address returned. Throws Error (ONEBIT_SYSTEM_ERROR naming the address) when
// the address cannot be bound.
Address open_root_listener(const Address& where, RootChecks checks = RootChecks::kAnswered);

// What the communicator takes: the listener, and the connections accepted on it while it was held
// that are still open and have not been answered (bootstrap hellos on their way, strangers).
struct HeldRoot {
  Fd listener;
  std::vector<Fd> early;
  explicit operator bool() const { return static_cast<bool>(listener); }
};

// The listener open_root_listener kept for `root`, handed over once; empty when none was opened for
// it (then the caller binds `root` itself). Stops the answering thread first, and sweeps the
// listener once more, so that every check made before this call is closed, not handed over.
HeldRoot take_root_listener(const Address& root);

// Closes every listener kept and not taken: in a forked rank other than 0, which inherited the
// parent's copies, and in the parent once its ranks are forked.
void close_root_listeners();

}  // namespace onebit::transport::tcp
