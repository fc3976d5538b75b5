// The wire format: every record survives encode → decode, decoders reject what is not theirs with a
// message that says what they saw, and the handshake MAC covers every field.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "common/error.h"
#include "transport/wire.h"

namespace onebit::wire {
namespace {

std::string error_of(const std::function<void()>& decode) {
  try {
    decode();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ONEBIT_REMOTE_ERROR);
    return error.what();
  }
  ADD_FAILURE() << "expected the decoder to refuse";
  return "";
}

TEST(Wire, RecordsRoundTrip) {
  Hello hello;
  hello.socket_index = 3;
  hello.sockets_per_peer = 4;
  hello.job_id = 0x0123456789abcdefull;
  hello.from_rank = 7;
  hello.to_rank = 2;
  hello.mac = 99;
  const Hello h = Hello::decode(hello.encode().data(), "test");
  EXPECT_EQ(h.socket_index, 3);
  EXPECT_EQ(h.sockets_per_peer, 4);
  EXPECT_EQ(h.job_id, 0x0123456789abcdefull);
  EXPECT_EQ(h.from_rank, 7u);
  EXPECT_EQ(h.to_rank, 2u);
  EXPECT_EQ(h.mac, 99u);

  SegmentHeader segment;
  segment.key = {0xfeedull, 42, Kind::kServerResult, 17};
  segment.shape = {1000003, 2, 1};
  segment.total_bytes = 5000;
  segment.offset = 4096;
  segment.segment_bytes = 904;
  const SegmentHeader s = SegmentHeader::decode(segment.encode().data(), "test");
  EXPECT_TRUE(s.key == segment.key);
  EXPECT_TRUE(s.shape == segment.shape);
  EXPECT_EQ(s.total_bytes, 5000u);
  EXPECT_EQ(s.offset, 4096u);
  EXPECT_EQ(s.segment_bytes, 904u);

  BootstrapReplyHead head;
  head.status = 3;
  head.job_id = 77;
  head.size = 64;
  head.secret[0] = 1;
  head.secret[1] = 2;
  const BootstrapReplyHead b = BootstrapReplyHead::decode(head.encode().data(), "test");
  EXPECT_EQ(b.status, 3);
  EXPECT_EQ(b.job_id, 77u);
  EXPECT_EQ(b.size, 64u);
  EXPECT_EQ(b.secret[1], 2u);
}

TEST(Wire, DecodersRefuseOtherBytesWithAReason) {
  auto bytes = Hello().encode();
  bytes[0] ^= 0xFF;
  EXPECT_NE(error_of([&] { Hello::decode(bytes.data(), "peer X"); }).find("peer X sent a bad handshake: magic"),
            std::string::npos);
  bytes = Hello().encode();
  bytes[4] = 9;  // version 9
  EXPECT_NE(error_of([&] { Hello::decode(bytes.data(), "peer X"); }).find("speaks onebit protocol version 9"),
            std::string::npos);
  // A segment header must not claim bytes outside its message, nor an unknown kind.
  SegmentHeader segment;
  segment.total_bytes = 100;
  segment.offset = 90;
  segment.segment_bytes = 20;
  auto encoded = segment.encode();
  EXPECT_NE(error_of([&] { SegmentHeader::decode(encoded.data(), "rank 1"); }).find("outside its message"),
            std::string::npos);
  segment.segment_bytes = 10;
  encoded = segment.encode();
  encoded[6] = 42;  // kind
  EXPECT_NE(error_of([&] { SegmentHeader::decode(encoded.data(), "rank 1"); }).find("unknown kind 42"),
            std::string::npos);
  // A hello for the bootstrap is not a data handshake, and the other way round.
  const auto bootstrap = BootstrapHello().encode();
  EXPECT_NE(error_of([&] { Hello::decode(bootstrap.data(), "x"); }).find("bad handshake"), std::string::npos);
}

TEST(Wire, HandshakeMacCoversEveryField) {
  const SipKey key = {1, 2};
  Hello hello;
  hello.job_id = 5;
  hello.from_rank = 1;
  const std::uint64_t mac = hello.compute_mac(key);
  EXPECT_NE(mac, hello.compute_mac({1, 3})) << "the key matters";
  for (int field = 0; field < 5; ++field) {
    Hello changed = hello;
    switch (field) {
      case 0: changed.socket_index = 1; break;
      case 1: changed.sockets_per_peer = 9; break;
      case 2: changed.job_id = 6; break;
      case 3: changed.from_rank = 2; break;
      case 4: changed.to_rank = 1; break;
    }
    EXPECT_NE(changed.compute_mac(key), mac) << "field " << field;
  }
  hello.mac = 12345;  // the MAC field itself is not covered
  EXPECT_EQ(hello.compute_mac(key), mac);
}

}  // namespace
}  // namespace onebit::wire
