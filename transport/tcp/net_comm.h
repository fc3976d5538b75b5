// The connections behind onebit's NCCL_NET plugin: NCCL's net model (a listen handle, a
// unidirectional send comm and recv comm per connection, tagged isend/irecv with grouped
// receives, completion by test) over several TCP sockets per connection, every call non-blocking.
//
// A connection: the listener's handle carries its address, the socket count and a 128-bit secret
// made at listen time; connect opens that many non-blocking sockets and sends on each a hello
// (transport/wire.h's Hello: job_id = a random connection id, socket_index) with its MAC under the
// secret — the handshake of connection.h (signed_hello / verify_hello), run without blocking.
// accept groups the sockets of one connection id and refuses any hello whose MAC fails, so only a
// holder of the handle (NCCL's bootstrap hands it out) can connect; a connection that sends no
// hello, or a group whose other sockets never come, is dropped after ONEBIT_TIMEOUT_MS.
//
// A message: a 16-byte header (wire::NetMessageHeader) on socket 0, then the payload cut into
// `stripes` contiguous pieces, piece i on socket i. Each socket carries its pieces in message
// order, so the receiver knows where each byte goes once it has read the header. Messages under
// kStripeBytes per stripe use fewer sockets; a zero-byte message is a header alone.
//
// Progress happens inside test() (NCCL's proxy thread calls it in a loop): every socket of the
// request's comm moves what it can without blocking. No thread, no allocation after set-up:
// each comm owns NCCL_NET_MAX_REQUESTS request slots. Errors are onebit::Error; the ABI layer
// turns them into ncclResult_t and a NET/onebit log line.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/siphash.h"
#include "transport/tcp/socket.h"
#include "transport/wire.h"

namespace onebit::transport::tcp {

constexpr int kMaxRequests = 32;                 // NCCL_NET_MAX_REQUESTS
constexpr int kMaxRecvs = 8;                     // grouped receives per irecv
constexpr int kMaxSockets = 64;                  // ONEBIT_SOCKETS_PER_PEER's range, as for the engine's mesh
constexpr std::size_t kStripeBytes = 64 * 1024;  // a stripe is at least this (except the last)

// What NCCL's bootstrap carries from the listening side to the connecting one, in its 128-byte
// handle (NCCL_NET_HANDLE_MAXSIZE), encoded field by field (docs/wire_format.md).
struct NetHandle {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t sockets;
  wire::WireAddress address;
  std::uint8_t secret[16];
  // The connecting side's own state between retries of connect (NCCL passes the same handle
  // bytes on every retry): a pointer that never leaves the process, at kPendingOffset.
  void* pending;
};

constexpr std::size_t kHandleBytes = 128;  // NCCL_NET_HANDLE_MAXSIZE
constexpr std::size_t kHandleRecordBytes = 44;
constexpr std::size_t kPendingOffset = 64;
void encode_handle(const NetHandle& handle, std::uint8_t* out);  // kHandleBytes
NetHandle decode_handle(const std::uint8_t* in);                 // checked by connect_step

struct NetDevice {
  std::string name;  // interface
  Address address;
  int speed_mbps = 10000;
  std::string pci_path;  // empty when not a PCI device
};

// The interfaces NCCL may use: NCCL_SOCKET_IFNAME's syntax in ONEBIT_SOCKET_IFNAME (or
// NCCL_SOCKET_IFNAME when that is unset); by default every interface that is up except loopback,
// and loopback when there is nothing else.
std::vector<NetDevice> find_devices();

class NetComm;

struct NetRequest {
  enum class Kind { kFree, kSend, kRecv };
  Kind kind = Kind::kFree;
  NetComm* comm = nullptr;
  int n = 0;
  std::array<std::uint8_t*, kMaxRecvs> data{};
  std::array<std::size_t, kMaxRecvs> capacity{};
  std::array<int, kMaxRecvs> tags{};
  std::array<std::size_t, kMaxRecvs> sizes{};
  std::array<bool, kMaxRecvs> matched{};
  int matched_count = 0;
  int pending_pieces = 0;  // header and stripes not yet fully moved
  std::array<std::uint8_t, wire::NetMessageHeader::kSize> header{};
};

// What one comm has moved: payload bytes and messages of finished requests (each buffer of a grouped
// receive is a message). The wire adds a 16-byte header per message.
struct NetCommStats {
  std::uint64_t bytes = 0;
  std::uint64_t messages = 0;
};

// One direction of one connection, either end.
class NetComm {
 public:
  NetComm(bool sending, std::vector<Fd> sockets, std::string peer);
  ~NetComm();

  // Null when every request slot is in use (NCCL then retries).
  NetRequest* isend(const void* data, std::size_t size, int tag);
  NetRequest* irecv(int n, void* const* data, const std::size_t* sizes, const int* tags);
  // Progresses, then reports; a finished request is released. Throws the comm's failure.
  bool test(NetRequest* request, int* sizes);

  const std::string& peer() const { return peer_; }
  bool sending() const { return sending_; }
  NetCommStats stats();

 private:
  struct Piece {
    NetRequest* request;
    std::uint8_t* data;
    std::size_t left;
  };
  struct Socket {
    Fd fd;
    std::deque<Piece> queue;  // in wire order
  };

  NetRequest* take_slot();
  void progress_locked();
  void send_side(Socket& socket);
  void receive_side(std::size_t index);
  void on_header();
  // What one non-blocking read gave (0: nothing now); the end of the stream or an error fails the comm.
  std::size_t read_some(int fd, void* into, std::size_t bytes);
  void piece_done(NetRequest* request);
  [[noreturn]] void fail_locked(onebit_result_t code, const std::string& message);

  const bool sending_;
  const std::string peer_;
  std::mutex mutex_;
  std::vector<Socket> sockets_;
  std::array<NetRequest, kMaxRequests> requests_;
  std::deque<NetRequest*> posted_;  // receives with unmatched slots, oldest first
  std::array<std::uint8_t, wire::NetMessageHeader::kSize> incoming_header_{};
  std::size_t header_read_ = 0;
  NetCommStats stats_;
  bool failed_ = false;
  onebit_result_t failure_code_ = ONEBIT_SUCCESS;
  std::string failure_;
};

// Connection set-up, both ends, non-blocking: each call does what it can and returns.
class NetListener {
 public:
  NetListener(const NetDevice& device, int sockets);
  ~NetListener();
  const NetHandle& handle() const { return handle_; }
  // A finished connection, or null (call again).
  std::unique_ptr<NetComm> accept();

 private:
  // Dropped when their deadline passes first (a stranger, a peer that died mid-connect).
  struct Incoming {
    Fd fd;
    std::array<std::uint8_t, wire::Hello::kSize> hello{};
    std::size_t read = 0;
    Deadline deadline;
  };
  struct PendingGroup {
    std::vector<Fd> sockets;  // by socket index
    std::string from;
    Deadline deadline;
  };
  Fd fd_;
  NetHandle handle_{};
  SipKey key_{};
  std::vector<Incoming> incoming_;
  std::map<std::uint64_t, PendingGroup> groups_;  // by connection id
};

class PendingNetConnect;
// Starts or continues connecting to `handle` (its `pending` field holds the state between
// calls). Returns the comm once every socket is connected and has sent its hello.
std::unique_ptr<NetComm> connect_step(NetHandle& handle);

std::string describe(const NetHandle& handle);

// Where set-up messages (refused connections) go: the plugin points this at NCCL's logger.
using LogSink = void (*)(bool warning, const std::string& text);
void set_log_sink(LogSink sink);

}  // namespace onebit::transport::tcp
