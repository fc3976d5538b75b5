// The clock every timeout in onebit is measured on, and a deadline on it: steady (never jumps with
// the wall clock). Here, below every layer, so that what needs only a deadline (a socket read, a
// shared-memory wait) does not include the transport interface for it.
#pragma once

#include <chrono>

namespace onebit {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

}  // namespace onebit
