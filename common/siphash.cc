#include "common/siphash.h"

#include <cstring>

namespace onebit {
namespace {

std::uint64_t rotl(std::uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

void round(std::uint64_t& v0, std::uint64_t& v1, std::uint64_t& v2, std::uint64_t& v3) {
  v0 += v1;
  v1 = rotl(v1, 13);
  v1 ^= v0;
  v0 = rotl(v0, 32);
  v2 += v3;
  v3 = rotl(v3, 16);
  v3 ^= v2;
  v0 += v3;
  v3 = rotl(v3, 21);
  v3 ^= v0;
  v2 += v1;
  v1 = rotl(v1, 17);
  v1 ^= v2;
  v2 = rotl(v2, 32);
}

std::uint64_t load_le64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

std::uint64_t siphash24(const SipKey& key, const void* data, std::size_t size) {
  const auto* in = static_cast<const std::uint8_t*>(data);
  std::uint64_t v0 = 0x736f6d6570736575ull ^ key[0];
  std::uint64_t v1 = 0x646f72616e646f6dull ^ key[1];
  std::uint64_t v2 = 0x6c7967656e657261ull ^ key[0];
  std::uint64_t v3 = 0x7465646279746573ull ^ key[1];
  const std::size_t whole = size - size % 8;
  for (std::size_t i = 0; i < whole; i += 8) {
    const std::uint64_t m = load_le64(in + i);
    v3 ^= m;
    round(v0, v1, v2, v3);
    round(v0, v1, v2, v3);
    v0 ^= m;
  }
  std::uint64_t last = static_cast<std::uint64_t>(size & 0xFF) << 56;
  for (std::size_t i = 0; i < size % 8; ++i) last |= static_cast<std::uint64_t>(in[whole + i]) << (8 * i);
  v3 ^= last;
  round(v0, v1, v2, v3);
  round(v0, v1, v2, v3);
  v0 ^= last;
  v2 ^= 0xFF;
  for (int i = 0; i < 4; ++i) round(v0, v1, v2, v3);
  return v0 ^ v1 ^ v2 ^ v3;
}

bool mac_equal(std::uint64_t a, std::uint64_t b) {
  volatile std::uint64_t difference = a ^ b;
  return difference == 0;
}

}  // namespace onebit
