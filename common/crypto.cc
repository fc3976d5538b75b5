#include "common/crypto.h"

#include <dlfcn.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"

namespace onebit::crypto {
namespace {

// OpenSSL's prototypes (openssl/hmac.h, openssl/evp.h, openssl/crypto.h), declared here because the
// library is opened at run time; EVP_MD is opaque.
struct EvpMd;
using EvpSha256 = const EvpMd* (*)();
using Hmac = unsigned char* (*)(const EvpMd* md, const void* key, int key_len, const unsigned char* data,
                                std::size_t data_len, unsigned char* out, unsigned int* out_len);

struct Libcrypto {
  EvpSha256 sha256 = nullptr;
  Hmac hmac = nullptr;
  std::string error;  // why it could not be loaded
};

const Libcrypto& libcrypto() {
  static const Libcrypto loaded = [] {
    Libcrypto l;
    for (const char* name : {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"}) {
      void* handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        l.error += std::string(l.error.empty() ? "" : "; ") + ::dlerror();
        continue;
      }
      l.sha256 = reinterpret_cast<EvpSha256>(::dlsym(handle, "EVP_sha256"));
      l.hmac = reinterpret_cast<Hmac>(::dlsym(handle, "HMAC"));
      if (l.sha256 != nullptr && l.hmac != nullptr) return l;  // stays open for the process's life
      l.error += std::string("; ") + name + " lacks EVP_sha256 or HMAC";
      l.sha256 = nullptr;
      l.hmac = nullptr;
      ::dlclose(handle);
    }
    return l;
  }();
  return loaded;
}

}  // namespace

Digest hmac_sha256(Bytes key, std::initializer_list<Bytes> parts) {
  const Libcrypto& l = libcrypto();
  ONEBIT_CHECK(l.hmac != nullptr, ONEBIT_SYSTEM_ERROR,
               "onebit's bootstrap needs OpenSSL's libcrypto (libcrypto.so.3 or .so.1.1) for its handshake MAC, "
               "and none could be loaded: ",
               l.error);
  std::vector<unsigned char> message;
  for (const Bytes& part : parts) {
    const auto* p = static_cast<const unsigned char*>(part.data);
    message.insert(message.end(), p, p + part.size);
  }
  Digest out{};
  unsigned int length = 0;
  // A zero-length key is valid HMAC; OpenSSL wants a non-NULL pointer for it.
  static const unsigned char kEmpty = 0;
  const void* key_data = key.size == 0 ? &kEmpty : key.data;
  const unsigned char* result =
      l.hmac(l.sha256(), key_data, static_cast<int>(key.size), message.data(), message.size(), out.data(), &length);
  ONEBIT_CHECK(result != nullptr && length == out.size(), ONEBIT_SYSTEM_ERROR, "libcrypto's HMAC-SHA256 failed");
  return out;
}

void random_bytes(void* out, std::size_t n) {
  auto* p = static_cast<std::uint8_t*>(out);
  while (n > 0) {
    const ssize_t got = ::getrandom(p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    ONEBIT_CHECK(got > 0, ONEBIT_SYSTEM_ERROR, "getrandom: ", std::strerror(errno));
    p += got;
    n -= static_cast<std::size_t>(got);
  }
}

bool equal(const void* a, const void* b, std::size_t n) {
  const auto* x = static_cast<const volatile std::uint8_t*>(a);
  const auto* y = static_cast<const volatile std::uint8_t*>(b);
  std::uint8_t difference = 0;
  for (std::size_t i = 0; i < n; ++i) difference |= x[i] ^ y[i];
  return difference == 0;
}

std::string hex(const void* data, std::size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  const auto* p = static_cast<const std::uint8_t*>(data);
  std::string out;
  out.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(kDigits[p[i] >> 4]);
    out.push_back(kDigits[p[i] & 15]);
  }
  return out;
}

}  // namespace onebit::crypto
