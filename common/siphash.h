// SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed 64-bit MAC, fast on short inputs. onebit uses
// it to prove that a connection belongs to the job (docs/reliability.md, "Access").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace onebit {

using SipKey = std::array<std::uint64_t, 2>;

std::uint64_t siphash24(const SipKey& key, const void* data, std::size_t size);

// A 128-bit key from a passphrase (ONEBIT_AUTH_KEY): two SipHashes of it under fixed keys.
SipKey sip_key_from_text(const std::string& text);

// Constant-time comparison, so a MAC check does not leak how many bytes matched.
bool mac_equal(std::uint64_t a, std::uint64_t b);

}  // namespace onebit
