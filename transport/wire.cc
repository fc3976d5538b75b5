#include "transport/wire.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "common/error.h"
#include "common/log.h"

namespace onebit::wire {
namespace {

void check_magic(std::uint32_t magic, std::uint32_t expected, std::uint16_t version, const char* record,
                 const std::string& from) {
  ONEBIT_CHECK(magic == expected, ONEBIT_REMOTE_ERROR, from, " sent a bad ", record, ": magic 0x", std::hex, magic,
               ", expected 0x", expected, std::dec, " (not an onebit peer, or a corrupted stream)");
  ONEBIT_CHECK(version == kProtocolVersion, ONEBIT_REMOTE_ERROR, from, " speaks onebit protocol version ", version,
               "; this build speaks version ", kProtocolVersion, " (mixed onebit versions in one job)");
}

void put_address(Writer& w, const WireAddress& a) { w.put(a.family).put(a.port).bytes(a.ip.data(), a.ip.size()); }
WireAddress get_address(Reader& r) {
  WireAddress a;
  a.family = r.get<std::uint16_t>();
  a.port = r.get<std::uint16_t>();
  r.bytes(a.ip.data(), a.ip.size());
  return a;
}

}  // namespace

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kWorkerBits: return "worker bits";
    case Kind::kWorkerHead: return "worker head";
    case Kind::kServerResult: return "server result";
    case Kind::kRingReduce: return "ring reduce-scatter";
    case Kind::kRingGather: return "ring allgather";
    case Kind::kAbort: return "abort";
    case Kind::kServerHead: return "server head";
    case Kind::kHostReduce: return "host reduce";
    case Kind::kHostGather: return "host gather";
    case Kind::kTopology: return "topology";
    case Kind::kHostSegment: return "host segment";
  }
  return "unknown";
}

std::array<std::uint8_t, Hello::kSize> Hello::encode() const {
  std::array<std::uint8_t, kSize> out{};
  Writer(out.data())
      .put(magic)
      .put(version)
      .put(socket_index)
      .put(sockets_per_peer)
      .put(std::uint16_t{0})
      .put(job_id)
      .put(from_rank)
      .put(to_rank)
      .put(std::uint32_t{0})
      .put(mac);
  return out;
}

std::uint64_t Hello::compute_mac(const SipKey& key) const {
  const auto bytes = encode();
  return siphash24(key, bytes.data(), kSize - 8);
}

Hello Hello::decode(const std::uint8_t* in, const std::string& from) {
  Reader r(in);
  Hello h;
  h.magic = r.get<std::uint32_t>();
  h.version = r.get<std::uint16_t>();
  check_magic(h.magic, kHelloMagic, h.version, "handshake", from);
  h.socket_index = r.get<std::uint16_t>();
  h.sockets_per_peer = r.get<std::uint16_t>();
  r.get<std::uint16_t>();
  h.job_id = r.get<std::uint64_t>();
  h.from_rank = r.get<std::uint32_t>();
  h.to_rank = r.get<std::uint32_t>();
  r.get<std::uint32_t>();
  h.mac = r.get<std::uint64_t>();
  return h;
}

const char* transport_name(std::uint16_t transport) {
  switch (transport) {
    case kTransportTcp: return "tcp";
    case kTransportIbverbs: return "ibverbs";
  }
  return "an unknown transport";
}

std::string WireIdentity::label_text() const {
  std::size_t n = 0;
  while (n < label.size() && label[n] != '\0') ++n;
  return printable(std::string_view(label.data(), n));
}

namespace {
void put_identity(Writer& w, const WireIdentity& id) {
  w.bytes(id.digest.data(), id.digest.size()).bytes(id.label.data(), id.label.size());
}
WireIdentity get_identity(Reader& r) {
  WireIdentity id;
  r.bytes(id.digest.data(), id.digest.size());
  r.bytes(id.label.data(), id.label.size());
  return id;
}
}  // namespace

std::array<std::uint8_t, BootstrapChallenge::kSize> BootstrapChallenge::encode() const {
  std::array<std::uint8_t, kSize> out{};
  Writer w(out.data());
  w.put(magic).put(version).put(flags).bytes(nonce.data(), nonce.size());
  put_identity(w, identity);
  return out;
}

BootstrapChallenge BootstrapChallenge::decode(const std::uint8_t* in, const std::string& from) {
  Reader r(in);
  BootstrapChallenge c;
  c.magic = r.get<std::uint32_t>();
  c.version = r.get<std::uint16_t>();
  check_magic(c.magic, kBootstrapMagic, c.version, "bootstrap challenge", from);
  c.flags = r.get<std::uint16_t>();
  r.bytes(c.nonce.data(), c.nonce.size());
  c.identity = get_identity(r);
  return c;
}

std::array<std::uint8_t, BootstrapHello::kSize> BootstrapHello::encode() const {
  std::array<std::uint8_t, kSize> out{};
  Writer w(out.data());
  w.put(magic).put(version).put(flags).put(rank).put(size).put(sockets_per_peer).put(transport).put(cannot_join);
  put_address(w, listener);
  w.bytes(nonce.data(), nonce.size());
  put_identity(w, identity);
  w.bytes(mac.data(), mac.size());
  return out;
}

BootstrapHello BootstrapHello::decode(const std::uint8_t* in, const std::string& from) {
  Reader r(in);
  BootstrapHello h;
  h.magic = r.get<std::uint32_t>();
  h.version = r.get<std::uint16_t>();
  check_magic(h.magic, kBootstrapMagic, h.version, "bootstrap hello", from);
  h.flags = r.get<std::uint16_t>();
  h.rank = r.get<std::uint32_t>();
  h.size = r.get<std::uint32_t>();
  h.sockets_per_peer = r.get<std::uint32_t>();
  h.transport = r.get<std::uint16_t>();
  h.cannot_join = r.get<std::uint16_t>();
  h.listener = get_address(r);
  r.bytes(h.nonce.data(), h.nonce.size());
  h.identity = get_identity(r);
  r.bytes(h.mac.data(), h.mac.size());
  return h;
}

std::array<std::uint8_t, BootstrapReplyHead::kSize> BootstrapReplyHead::encode() const {
  std::array<std::uint8_t, kSize> out{};
  Writer(out.data()).put(magic).put(version).put(status).put(job_id).put(size).put(secret[0]).put(secret[1]);
  return out;
}

BootstrapReplyHead BootstrapReplyHead::decode(const std::uint8_t* in, const std::string& from) {
  Reader r(in);
  BootstrapReplyHead h;
  h.magic = r.get<std::uint32_t>();
  h.version = r.get<std::uint16_t>();
  check_magic(h.magic, kBootstrapMagic, h.version, "bootstrap reply", from);
  h.status = r.get<std::uint16_t>();
  h.job_id = r.get<std::uint64_t>();
  h.size = r.get<std::uint32_t>();
  h.secret[0] = r.get<std::uint64_t>();
  h.secret[1] = r.get<std::uint64_t>();
  return h;
}

std::array<std::uint8_t, SegmentHeader::kSize> SegmentHeader::encode() const {
  std::array<std::uint8_t, kSize> out{};
  Writer(out.data())
      .put(kMessageMagic)
      .put(kProtocolVersion)
      .put(static_cast<std::uint8_t>(key.kind))
      .put(shape.dtype)
      .put(shape.op)
      .put(std::uint8_t{0})
      .put(key.part)
      .put(std::uint32_t{0})
      .put(key.stream)
      .put(key.seq)
      .put(shape.count)
      .put(total_bytes)
      .put(offset)
      .put(segment_bytes)
      .put(std::uint32_t{0});
  return out;
}

SegmentHeader SegmentHeader::decode(const std::uint8_t* in, const std::string& from) {
  Reader r(in);
  const auto magic = r.get<std::uint32_t>();
  const auto version = r.get<std::uint16_t>();
  check_magic(magic, kMessageMagic, version, "message header", from);
  SegmentHeader h;
  const auto kind = r.get<std::uint8_t>();
  ONEBIT_CHECK(kind >= 1 && kind <= kLastKind, ONEBIT_REMOTE_ERROR, from, " sent a message of unknown kind ",
               int(kind));
  h.key.kind = static_cast<Kind>(kind);
  h.shape.dtype = r.get<std::uint8_t>();
  h.shape.op = r.get<std::uint8_t>();
  r.get<std::uint8_t>();
  h.key.part = r.get<std::uint16_t>();
  r.get<std::uint32_t>();
  h.key.stream = r.get<std::uint64_t>();
  h.key.seq = r.get<std::uint64_t>();
  h.shape.count = r.get<std::uint64_t>();
  h.total_bytes = r.get<std::uint64_t>();
  h.offset = r.get<std::uint64_t>();
  h.segment_bytes = r.get<std::uint32_t>();
  ONEBIT_CHECK(h.offset <= h.total_bytes && h.segment_bytes <= h.total_bytes - h.offset, ONEBIT_REMOTE_ERROR, from,
               " sent a segment outside its message (offset ", h.offset, " + ", h.segment_bytes, " > ", h.total_bytes,
               ")");
  return h;
}

std::array<std::uint8_t, VerbsEndpoint::kSize> VerbsEndpoint::encode() const {
  std::array<std::uint8_t, kSize> out{};
  Writer(out.data())
      .put(kVerbsEndpointMagic)
      .put(kProtocolVersion)
      .put(link_layer)
      .put(mtu)
      .put(qp_num)
      .put(psn)
      .put(lid)
      .put(std::uint16_t{0})
      .bytes(gid.data(), gid.size())
      .put(job_id)
      .put(from_rank);
  return out;
}

VerbsEndpoint VerbsEndpoint::decode(const std::uint8_t* in, const std::string& from) {
  Reader r(in);
  const auto magic = r.get<std::uint32_t>();
  const auto version = r.get<std::uint16_t>();
  check_magic(magic, kVerbsEndpointMagic, version, "verbs endpoint", from);
  VerbsEndpoint e;
  e.link_layer = r.get<std::uint8_t>();
  e.mtu = r.get<std::uint8_t>();
  e.qp_num = r.get<std::uint32_t>();
  e.psn = r.get<std::uint32_t>();
  e.lid = r.get<std::uint16_t>();
  r.get<std::uint16_t>();
  r.bytes(e.gid.data(), e.gid.size());
  e.job_id = r.get<std::uint64_t>();
  e.from_rank = r.get<std::uint32_t>();
  ONEBIT_CHECK(e.link_layer == 1 || e.link_layer == 2, ONEBIT_REMOTE_ERROR, from,
               " sent a verbs endpoint with link layer ", int(e.link_layer), " (1: InfiniBand, 2: Ethernet)");
  ONEBIT_CHECK(e.mtu >= 1 && e.mtu <= 5, ONEBIT_REMOTE_ERROR, from, " sent a verbs endpoint with MTU code ", int(e.mtu),
               " (1..5: 256..4096 bytes)");
  ONEBIT_CHECK(e.psn < (1u << 24), ONEBIT_REMOTE_ERROR, from, " sent a packet sequence number wider than 24 bits");
  return e;
}

std::array<std::uint8_t, ClearToSend::kSize> ClearToSend::encode() const {
  std::array<std::uint8_t, kSize> out{};
  Writer(out.data())
      .put(kClearToSendMagic)
      .put(static_cast<std::uint8_t>(key.kind))
      .put(shape.dtype)
      .put(shape.op)
      .put(std::uint8_t{0})
      .put(key.part)
      .put(std::uint16_t{0})
      .put(recv_id)
      .put(key.stream)
      .put(key.seq)
      .put(shape.count)
      .put(bytes)
      .put(address)
      .put(rkey)
      .put(std::uint32_t{0});
  return out;
}

ClearToSend ClearToSend::decode(const std::uint8_t* in, const std::string& from) {
  Reader r(in);
  const auto magic = r.get<std::uint32_t>();
  ONEBIT_CHECK(magic == kClearToSendMagic, ONEBIT_REMOTE_ERROR, from, " sent a control message with magic 0x", std::hex,
               magic, " (expected 0x", kClearToSendMagic, ")");
  ClearToSend c;
  const auto kind = r.get<std::uint8_t>();
  ONEBIT_CHECK(kind >= 1 && kind <= kLastKind, ONEBIT_REMOTE_ERROR, from, " offered a receive of unknown kind ",
               int(kind));
  c.key.kind = static_cast<Kind>(kind);
  c.shape.dtype = r.get<std::uint8_t>();
  c.shape.op = r.get<std::uint8_t>();
  r.get<std::uint8_t>();
  c.key.part = r.get<std::uint16_t>();
  r.get<std::uint16_t>();
  c.recv_id = r.get<std::uint32_t>();
  c.key.stream = r.get<std::uint64_t>();
  c.key.seq = r.get<std::uint64_t>();
  c.shape.count = r.get<std::uint64_t>();
  c.bytes = r.get<std::uint64_t>();
  c.address = r.get<std::uint64_t>();
  c.rkey = r.get<std::uint32_t>();
  return c;
}

WireAddress to_wire(const sockaddr_storage& address) {
  WireAddress w;
  if (address.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
    w.family = 4;
    w.port = ntohs(in->sin_port);
    std::memcpy(w.ip.data(), &in->sin_addr, 4);
  } else if (address.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address);
    w.family = 6;
    w.port = ntohs(in6->sin6_port);
    std::memcpy(w.ip.data(), &in6->sin6_addr, 16);
  }
  return w;
}

void from_wire(const WireAddress& wire, sockaddr_storage* address, unsigned* length) {
  *address = sockaddr_storage{};
  if (wire.family == 4) {
    auto* in = reinterpret_cast<sockaddr_in*>(address);
    in->sin_family = AF_INET;
    in->sin_port = htons(wire.port);
    std::memcpy(&in->sin_addr, wire.ip.data(), 4);
    *length = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(address);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(wire.port);
    std::memcpy(&in6->sin6_addr, wire.ip.data(), 16);
    *length = sizeof(sockaddr_in6);
  }
}

}  // namespace onebit::wire
