// libFuzzer target: every decoder of bytes that arrive from the network (transport/wire.h). The
// first byte picks the record; the rest is the record, zero-padded to its size. A decoder may
// refuse (onebit::Error); it must not crash, read out of bounds, or hit undefined behaviour.
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "transport/wire.h"

using namespace onebit;

template <typename Record>
static void decode(const std::uint8_t* data, std::size_t size) {
  std::vector<std::uint8_t> bytes(Record::kSize, 0);
  std::memcpy(bytes.data(), data, size < Record::kSize ? size : Record::kSize);
  try {
    const Record record = Record::decode(bytes.data(), "fuzz");
    (void)record;
  } catch (const Error&) {
  }
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t* body = data + 1;
  const std::size_t body_size = size - 1;
  switch (data[0] % 5) {
    case 0: decode<wire::Hello>(body, body_size); break;
    case 1: decode<wire::BootstrapHello>(body, body_size); break;
    case 2: decode<wire::BootstrapReplyHead>(body, body_size); break;
    case 4: decode<wire::BootstrapChallenge>(body, body_size); break;
    default: decode<wire::SegmentHeader>(body, body_size); break;
  }
  if (body_size >= wire::WireAddress::kSize) {
    wire::WireAddress address;
    wire::Reader r(body);
    address.family = r.get<std::uint16_t>();
    address.port = r.get<std::uint16_t>();
    r.bytes(address.ip.data(), 16);
    sockaddr_storage storage;
    unsigned length = 0;
    wire::from_wire(address, &storage, &length);
  }
  return 0;
}
