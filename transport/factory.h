// The transport of onebit's own communicators (the C API, the torch backend, the bench), as
// ONEBIT_TRANSPORT chooses it: `tcp`, `ibverbs`, or `gloo` — the default, which names the Gloo
// front door's choice (the framework's own gloo pairs) and means TCP here, where there is no gloo
// context. The engine says who and where (rank, size, root, the socket options); this says how.
#pragma once

#include <memory>
#include <string>

#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace onebit {

// ONEBIT_INVALID_ARGUMENT for a name that is no transport, or `ibverbs` in a build without it.
std::unique_ptr<Transport> open_transport(int rank, int size, const std::string& root,
                                          const transport::tcp::TransportOptions& options);

}  // namespace onebit
