// SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed 64-bit MAC, fast on short inputs. onebit uses
// it for the data connections' hellos, under a key the bootstrap derives with HMAC-SHA256
// (docs/reliability.md, "Who is in a communicator").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace onebit {

using SipKey = std::array<std::uint64_t, 2>;

std::uint64_t siphash24(const SipKey& key, const void* data, std::size_t size);

// Constant-time comparison, so a MAC check does not leak how many bytes matched.
bool mac_equal(std::uint64_t a, std::uint64_t b);

}  // namespace onebit
