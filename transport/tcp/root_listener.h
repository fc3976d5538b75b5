// Rank 0's bootstrap listener, opened before the communicator — for whoever publishes the root's
// address itself (the torch backend through its c10d store, the Gloo door through the context's
// pairs, the bench's parent before it forks the ranks). It binds port 0, publishes the port the
// kernel gave, and then makes the communicator, whose rank 0 serves the root on this very listener
// (connect_mesh takes it) instead of binding the address again. There is no probe that binds,
// closes and rebinds, so no window in which another process can take the port.
#pragma once

#include "transport/tcp/socket.h"

namespace onebit::transport::tcp {

// Listens on `where` (port 0: one the kernel picks) and keeps the listener for the communicator
// whose root is the address returned. Throws Error (ONEBIT_SYSTEM_ERROR naming the address) when
// the address cannot be bound.
Address open_root_listener(const Address& where);

// The listener open_root_listener kept for `root`, handed over once; an empty Fd when none was
// opened for it (then the caller binds `root` itself).
Fd take_root_listener(const Address& root);

// Closes every listener kept and not taken: in a forked rank other than 0, which inherited the
// parent's copies, and in the parent once its ranks are forked.
void close_root_listeners();

}  // namespace onebit::transport::tcp
