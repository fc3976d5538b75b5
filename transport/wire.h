// onebit's wire format (docs/wire_format.md): fixed-size little-endian records, encoded and decoded
// field by field so that no struct layout or host byte order leaks onto the network. Every record
// starts with a magic and the protocol version; a decoder rejects anything else with a message
// that says what it saw.
#pragma once

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/siphash.h"

namespace onebit::wire {

// 2: the bootstrap binds its records to the communicator's identity, challenge first (version 1
// had neither). 3: the compressed call's worker and server heads carry the settings digest.
constexpr std::uint16_t kProtocolVersion = 3;
constexpr std::uint32_t kHelloMagic = 0x4F424831;          // "OBH1": data-connection handshake
constexpr std::uint32_t kBootstrapMagic = 0x4F424231;      // "OBB1": rank <-> root exchange
constexpr std::uint32_t kMessageMagic = 0x4F424D31;        // "OBM1": a message segment
constexpr std::uint32_t kVerbsEndpointMagic = 0x4F425631;  // "OBV1": a queue pair's address (verbs set-up)
constexpr std::uint32_t kClearToSendMagic = 0x4F424331;    // "OBC1": a posted receive, offered for RDMA write

// Little-endian field packing.
class Writer {
 public:
  explicit Writer(std::uint8_t* out) : out_(out) {}
  template <typename T>
  Writer& put(T value) {
    for (std::size_t i = 0; i < sizeof(T); ++i)
      out_[pos_++] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(value) >> (8 * i));
    return *this;
  }
  Writer& bytes(const void* data, std::size_t n) {
    std::memcpy(out_ + pos_, data, n);
    pos_ += n;
    return *this;
  }
  std::size_t size() const { return pos_; }

 private:
  std::uint8_t* out_;
  std::size_t pos_ = 0;
};

class Reader {
 public:
  explicit Reader(const std::uint8_t* in) : in_(in) {}
  template <typename T>
  T get() {
    std::uint64_t value = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) value |= static_cast<std::uint64_t>(in_[pos_++]) << (8 * i);
    return static_cast<T>(value);
  }
  void bytes(void* data, std::size_t n) {
    std::memcpy(data, in_ + pos_, n);
    pos_ += n;
  }

 private:
  const std::uint8_t* in_;
  std::size_t pos_ = 0;
};

// First record on every data connection, sent by the connecting side. `mac` is SipHash-2-4 of the
// record's other 32 bytes under the job's data key (see bootstrap.h): it proves the sender went
// through this job's bootstrap.
struct Hello {
  static constexpr std::size_t kSize = 40;
  std::uint32_t magic = kHelloMagic;
  std::uint16_t version = kProtocolVersion;
  std::uint16_t socket_index = 0;      // which of the pair's sockets this is
  std::uint16_t sockets_per_peer = 0;  // both sides must agree
  std::uint64_t job_id = 0;            // chosen by the root at bootstrap
  std::uint32_t from_rank = 0;
  std::uint32_t to_rank = 0;
  std::uint64_t mac = 0;

  std::array<std::uint8_t, kSize> encode() const;
  // Throws Error(ONEBIT_REMOTE_ERROR) naming what is wrong: magic, version.
  static Hello decode(const std::uint8_t* in, const std::string& from);
  // The MAC of this record's fields (all but `mac`) under `key`.
  std::uint64_t compute_mac(const SipKey& key) const;
};

// An IPv4/IPv6 address and port in 20 bytes: family (4 or 6), port, 16 address bytes.
struct WireAddress {
  static constexpr std::size_t kSize = 20;
  std::uint16_t family = 0;
  std::uint16_t port = 0;
  std::array<std::uint8_t, 16> ip{};
};

// The identity a bootstrap binds its records to (transport/tcp/bootstrap.h): a 16-byte digest that
// is compared, and up to 64 bytes of its text, NUL-padded, that error messages name.
struct WireIdentity {
  static constexpr std::size_t kSize = 80;
  std::array<std::uint8_t, 16> digest{};
  std::array<char, 64> label{};
  std::string label_text() const;  // the label up to its first NUL, printable() (it came from the network)
};

// Bits of the bootstrap's `flags`: which key material a side holds. Both sides must hold the same.
constexpr std::uint16_t kKeyedByAuthKey = 1;  // ONEBIT_AUTH_KEY
constexpr std::uint16_t kKeyedBySecret = 2;   // a secret from the job's rendezvous (torch store, gloo context)

// Root -> rank, first, on every connection: a fresh nonce (the rank's hello MAC covers it, so a
// recorded hello proves nothing), the communicator the root serves, and its key flags.
struct BootstrapChallenge {
  static constexpr std::size_t kSize = 24 + WireIdentity::kSize;
  std::uint32_t magic = kBootstrapMagic;
  std::uint16_t version = kProtocolVersion;
  std::uint16_t flags = 0;
  std::array<std::uint8_t, 16> nonce{};
  WireIdentity identity;

  std::array<std::uint8_t, kSize> encode() const;
  static BootstrapChallenge decode(const std::uint8_t* in, const std::string& from);
};

// A hello's `cannot_join`: the rank's open-files limit leaves too few descriptors for its sockets.
constexpr std::uint16_t kShortOfDescriptors = 1;

// Which transport a rank's communicator runs over; every rank must use the same (ONEBIT_TRANSPORT).
constexpr std::uint16_t kTransportTcp = 0;
constexpr std::uint16_t kTransportIbverbs = 1;
const char* transport_name(std::uint16_t transport);

// Rank -> root, answering the challenge: who I am, where my data listener is, a nonce of mine (the
// root's reply MAC covers it), and `mac`: HMAC-SHA256 under the communicator's bootstrap key of
// "hello", the challenge and this record's other bytes.
struct BootstrapHello {
  static constexpr std::size_t kSize = 60 + WireIdentity::kSize + 32;
  std::uint32_t magic = kBootstrapMagic;
  std::uint16_t version = kProtocolVersion;
  std::uint16_t flags = 0;
  std::uint32_t rank = 0;
  std::uint32_t size = 0;
  std::uint32_t sockets_per_peer = 0;
  std::uint16_t transport = kTransportTcp;
  std::uint16_t cannot_join = 0;  // 0, or why this rank cannot join (kShortOfDescriptors): the root fails them all
  WireAddress listener;
  std::array<std::uint8_t, 16> nonce{};
  WireIdentity identity;
  std::array<std::uint8_t, 32> mac{};

  std::array<std::uint8_t, kSize> encode() const;
  static BootstrapHello decode(const std::uint8_t* in, const std::string& from);
};

// Root -> rank, after all ranks arrived: a status, then (if 0) the job id, the job secret, every
// listener, and a 32-byte HMAC-SHA256 under the bootstrap key of "reply", the rank's hello and all
// of this. Status != 0 is followed by a u16 length and the error text, and the root closes.
struct BootstrapReplyHead {
  static constexpr std::size_t kSize = 36;
  std::uint32_t magic = kBootstrapMagic;
  std::uint16_t version = kProtocolVersion;
  std::uint16_t status = 0;  // an onebit_result_t
  std::uint64_t job_id = 0;
  std::uint32_t size = 0;
  std::uint64_t secret[2] = {0, 0};  // the job secret: keys data-connection MACs

  std::array<std::uint8_t, kSize> encode() const;
  static BootstrapReplyHead decode(const std::uint8_t* in, const std::string& from);
};

// The NCCL_NET plugin's per-message header (transport/tcp/net_comm.h), on socket 0 ahead of the
// payload: NCCL's tag, how many sockets carry the payload's stripes, and its size. No magic: it
// runs on a connection whose hello was proven, and every field is checked against the posted
// receive (net_comm.cc).
struct NetMessageHeader {
  static constexpr std::size_t kSize = 16;
  std::int32_t tag = 0;
  std::uint32_t stripes = 0;
  std::uint64_t size = 0;

  void encode(std::uint8_t* out) const { Writer(out).put(tag).put(stripes).put(size); }
  static NetMessageHeader decode(const std::uint8_t* in) {
    Reader r(in);
    NetMessageHeader h;
    h.tag = r.get<std::int32_t>();
    h.stripes = r.get<std::uint32_t>();
    h.size = r.get<std::uint64_t>();
    return h;
  }
};

// What a message is, within one collective call.
enum class Kind : std::uint8_t {
  kWorkerBits = 1,  // compressed stage 1: block `part` of the sender's bits of the receiver's chunk
  kWorkerHead = 2,  // compressed stage 1: the sender's worker scale (NaN if its input was not finite), settings digest
  kServerResult = 3,  // compressed stage 2: block `part` of the sending server's result bits
  kRingReduce = 4,    // ring reduce-scatter step `part`
  kRingGather = 5,    // ring allgather step `part`
  kAbort = 6,         // the sender failed: the payload is its error text; it closes next
  kServerHead = 7,    // compressed stage 2: the sending server's scale, verdicts and reference settings digest
  kHostReduce = 8,    // hierarchical: block `part` of the sender's input for the receiver's shard
  kHostGather = 9,    // hierarchical: the sender's rail results (every server's scale and bits)
  kTopology = 10,     // hierarchical, once per communicator: the sender's ranks per host
  kHostSegment = 11,  // hierarchical, once per tag: setting up the host's shared memory (part 0 name, 1 ack, 2 go)
};
constexpr std::uint8_t kLastKind = 11;
const char* kind_name(Kind kind);

// Identifies a message: the call's stream (the tag's id; 0 for untagged calls), the call's
// sequence number in that stream, the kind and the part. One message per key and direction.
struct MessageKey {
  std::uint64_t stream = 0;
  std::uint64_t seq = 0;
  Kind kind = Kind::kWorkerBits;
  std::uint16_t part = 0;
  bool operator<(const MessageKey& o) const {
    if (stream != o.stream) return stream < o.stream;
    if (seq != o.seq) return seq < o.seq;
    if (kind != o.kind) return kind < o.kind;
    return part < o.part;
  }
  bool operator==(const MessageKey& o) const {
    return stream == o.stream && seq == o.seq && kind == o.kind && part == o.part;
  }
};

// What both sides must agree on for a key: the whole call's element count, dtype and op.
struct CallShape {
  std::uint64_t count = 0;
  std::uint8_t dtype = 0;
  std::uint8_t op = 0;
  bool operator==(const CallShape& o) const { return count == o.count && dtype == o.dtype && op == o.op; }
};

// The header of one segment of a message (a message is striped over the pair's sockets).
struct SegmentHeader {
  static constexpr std::size_t kSize = 64;
  MessageKey key;
  CallShape shape;
  std::uint64_t total_bytes = 0;  // the whole message
  std::uint64_t offset = 0;       // of this segment in the message
  std::uint32_t segment_bytes = 0;

  std::array<std::uint8_t, kSize> encode() const;
  static SegmentHeader decode(const std::uint8_t* in, const std::string& from);
};

// The verbs transport (transport/ibverbs): what one rank tells a peer about the queue pair it made
// for it, over their authenticated set-up socket, so that the peer can connect its own to it.
struct VerbsEndpoint {
  static constexpr std::size_t kSize = 48;
  std::uint32_t magic = kVerbsEndpointMagic;
  std::uint16_t version = kProtocolVersion;
  std::uint8_t link_layer = 0;  // IBV_LINK_LAYER_INFINIBAND (1) or _ETHERNET (2, RoCE)
  std::uint8_t mtu = 0;         // the port's active MTU, an enum ibv_mtu (1: 256 .. 5: 4096)
  std::uint32_t qp_num = 0;
  std::uint32_t psn = 0;  // first packet sequence number, 24 bits
  std::uint16_t lid = 0;  // InfiniBand: the port's LID
  std::uint16_t reserved = 0;
  std::array<std::uint8_t, 16> gid{};  // RoCE (and IB with ONEBIT_IB_GID_INDEX): the GID to route to
  std::uint64_t job_id = 0;
  std::uint32_t from_rank = 0;

  std::array<std::uint8_t, kSize> encode() const;
  // Throws Error(ONEBIT_REMOTE_ERROR) naming what is wrong: magic, version, MTU, link layer.
  static VerbsEndpoint decode(const std::uint8_t* in, const std::string& from);
};

// The verbs transport's one control message, a SEND on the queue pair: the receiver of a message
// has posted its receive and offers the buffer (address, rkey) for the sender's RDMA write, whose
// immediate data is `recv_id`. The sender checks key, shape and size against its own send.
struct ClearToSend {
  static constexpr std::size_t kSize = 64;
  MessageKey key;
  CallShape shape;
  std::uint64_t bytes = 0;
  std::uint64_t address = 0;
  std::uint32_t rkey = 0;
  std::uint32_t recv_id = 0;

  std::array<std::uint8_t, kSize> encode() const;
  static ClearToSend decode(const std::uint8_t* in, const std::string& from);
};

WireAddress to_wire(const ::sockaddr_storage& address);
void from_wire(const WireAddress& wire, ::sockaddr_storage* address, unsigned* length);

}  // namespace onebit::wire
