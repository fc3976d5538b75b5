// The open-files limit (RLIMIT_NOFILE, `ulimit -n`) and a communicator's sockets. A flat mesh of W
// ranks holds (W-1) x ONEBIT_SOCKETS_PER_PEER sockets on every rank, and the bootstrap root W more
// while the ranks arrive: 1022 at 512 ranks and 2, past 1024, the usual soft limit, with the
// listeners and the framework's own files (torch's gloo group holds W-1 more). Without a check the
// first rank out of descriptors failed with a bare EMFILE while others waited for it until their
// timeout (the root retried its accept until then), each blaming the ranks that never came.
#pragma once

#include <cstddef>
#include <string>

namespace onebit::transport::tcp {

// Makes room for `needed` more descriptors before they are opened: where the soft limit is too low,
// it is raised to the hard limit (as NCCL's bootstrap root does; logged at INFO). Throws
// Error(ONEBIT_SYSTEM_ERROR) naming `what` needs them, the descriptors open, both limits and the
// remedies where even the hard limit leaves too few. Thread-safe: the limit is the process's.
void make_room_for_descriptors(std::size_t needed, const std::string& what);

// For an errno of EMFILE or ENFILE, what the bare "Too many open files" leaves out: the files open
// and the limit, or the system's limit; "" for any other errno.
std::string descriptor_note(int err);

}  // namespace onebit::transport::tcp
