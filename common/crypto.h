// The cryptography of onebit's bootstrap: HMAC-SHA256 from OpenSSL's libcrypto, random bytes from
// the kernel (getrandom), and a constant-time comparison. docs/reliability.md, "Who is in a
// communicator", says what they protect.
//
// libcrypto is opened at run time (libcrypto.so.3, else .so.1.1), the way verbs_api.cc opens
// libibverbs: every Linux that runs Python has it, while its headers (libssl-dev) are often missing
// where onebit is built — the GPU image among them. The two functions used, EVP_sha256 and HMAC,
// have had the same C signatures since OpenSSL 1.1.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace onebit::crypto {

using Digest = std::array<std::uint8_t, 32>;  // an HMAC-SHA256 tag, or a key derived from one

// A byte range that an HMAC covers; several are MAC'd as their concatenation.
struct Bytes {
  const void* data;
  std::size_t size;
  Bytes(const void* d, std::size_t n) : data(d), size(n) {}
  Bytes(std::string_view text) : data(text.data()), size(text.size()) {}  // NOLINT: implicit by design
  template <std::size_t N>
  Bytes(const std::array<std::uint8_t, N>& a) : data(a.data()), size(N) {}  // NOLINT
};

// HMAC-SHA256 of the concatenation of `parts` under `key`. Throws Error(ONEBIT_SYSTEM_ERROR) when
// libcrypto cannot be loaded, naming what was tried.
Digest hmac_sha256(Bytes key, std::initializer_list<Bytes> parts);

// `n` bytes from the kernel's random generator (getrandom). Throws on failure.
void random_bytes(void* out, std::size_t n);

// Constant-time equality of two byte ranges of length n: a MAC check leaks nothing of how many
// bytes matched.
bool equal(const void* a, const void* b, std::size_t n);

// Lower-case hex of `n` bytes (identities and ids in log lines; never a key).
std::string hex(const void* data, std::size_t n);

}  // namespace onebit::crypto
