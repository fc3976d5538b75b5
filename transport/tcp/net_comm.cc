// The connections behind onebit's NCCL_NET plugin (net_comm.h): the interfaces it may use, the
// listen handle's encoding and a connection's data path. The listening side is net_listener.cc,
// the connecting side net_connect.cc.
#include "transport/tcp/net_comm.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "common/launcher.h"
#include "common/log.h"
#include "common/params.h"
#include "transport/tcp/connection.h"
#include "transport/tcp/net_internal.h"

namespace onebit::transport::tcp {

std::string errno_string(int error) { return std::strerror(error); }

std::uint64_t random64() {
  static std::mutex mutex;
  static std::random_device entropy;
  std::lock_guard<std::mutex> lock(mutex);
  return (static_cast<std::uint64_t>(entropy()) << 32) ^ entropy();
}

Address address_of(const NetHandle& handle) {
  Address address;
  unsigned length = 0;
  wire::from_wire(handle.address, &address.storage, &length);
  address.length = length;
  return address;
}

namespace {

int interface_speed(const std::string& name) {
  std::ifstream in("/sys/class/net/" + name + "/speed");
  int speed = 0;
  if (in >> speed && speed > 0) return speed;
  return 10000;  // virtual interfaces report nothing (or -1); assume 10 GbE as NCCL does
}

std::string pci_path(const std::string& name) {
  char resolved[PATH_MAX];
  const std::string link = "/sys/class/net/" + name + "/device";
  if (::realpath(link.c_str(), resolved) == nullptr) return "";
  return resolved;
}

}  // namespace

std::vector<NetDevice> find_devices() {
  std::string spec = param::SocketIfname();
  if (spec.empty()) spec = nccl_socket_ifname();
  ifaddrs* list = nullptr;
  ONEBIT_CHECK(getifaddrs(&list) == 0, ONEBIT_SYSTEM_ERROR, "getifaddrs: ", errno_string(errno));
  std::vector<NetDevice> devices, loopbacks;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || !(it->ifa_flags & IFF_UP)) continue;
    const int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    const std::string name = it->ifa_name;
    const bool loopback = (it->ifa_flags & IFF_LOOPBACK) != 0;
    auto& into = loopback && spec.empty() ? loopbacks : devices;
    if (!(loopback && spec.empty()) && !interface_matches(spec, name, loopback)) continue;
    // One device per interface: its first IPv4 address, else its first IPv6 one.
    auto same = std::find_if(into.begin(), into.end(), [&](const NetDevice& d) { return d.name == name; });
    if (same != into.end() && !(same->address.storage.ss_family == AF_INET6 && family == AF_INET)) continue;
    if (family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(it->ifa_addr)->sin6_addr))
      continue;
    NetDevice device;
    device.name = name;
    device.address.length = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&device.address.storage, it->ifa_addr, device.address.length);
    device.address.set_port(0);
    device.speed_mbps = interface_speed(name);
    device.pci_path = pci_path(name);
    if (same != into.end()) {
      *same = device;
    } else {
      into.push_back(device);
    }
  }
  freeifaddrs(list);
  if (devices.empty()) devices = loopbacks;
  ONEBIT_CHECK(!devices.empty(), ONEBIT_INVALID_ARGUMENT, "no usable interface",
               spec.empty() ? std::string() : " matches ONEBIT_SOCKET_IFNAME/NCCL_SOCKET_IFNAME='" + spec + "'");
  return devices;
}

std::string describe(const NetHandle& handle) { return address_of(handle).to_string(); }

void encode_handle(const NetHandle& handle, std::uint8_t* out) {
  std::memset(out, 0, kHandleBytes);
  wire::Writer w(out);
  w.put(handle.magic).put(handle.version).put(handle.sockets);
  w.put(handle.address.family).put(handle.address.port).bytes(handle.address.ip.data(), handle.address.ip.size());
  w.bytes(handle.secret, sizeof(handle.secret));
  std::memcpy(out + kPendingOffset, &handle.pending, sizeof(handle.pending));
}

NetHandle decode_handle(const std::uint8_t* in) {
  wire::Reader r(in);
  NetHandle handle{};
  handle.magic = r.get<std::uint32_t>();
  handle.version = r.get<std::uint16_t>();
  handle.sockets = r.get<std::uint16_t>();
  handle.address.family = r.get<std::uint16_t>();
  handle.address.port = r.get<std::uint16_t>();
  r.bytes(handle.address.ip.data(), handle.address.ip.size());
  r.bytes(handle.secret, sizeof(handle.secret));
  std::memcpy(&handle.pending, in + kPendingOffset, sizeof(handle.pending));
  return handle;
}

// ---------------------------------------------------------------- data path

NetComm::NetComm(bool sending, std::vector<Fd> sockets, std::string peer) : sending_(sending), peer_(std::move(peer)) {
  for (Fd& fd : sockets) {
    set_nonblocking(fd.get());
    tune_data_socket(fd.get());
    sockets_.push_back(Socket{std::move(fd), {}});
  }
  for (NetRequest& r : requests_) r.comm = this;
}

NetComm::~NetComm() {
  for (Socket& s : sockets_) {
    if (s.fd) ::shutdown(s.fd.get(), SHUT_RDWR);
  }
}

void NetComm::fail_locked(onebit_result_t code, const std::string& message) {
  if (!failed_) {
    failed_ = true;
    failure_code_ = code;
    failure_ = message;
    for (Socket& s : sockets_) ::shutdown(s.fd.get(), SHUT_RDWR);  // the peer learns at once
  }
  ::onebit::fail(failure_code_, failure_);
}

NetRequest* NetComm::take_slot() {
  for (NetRequest& r : requests_) {
    if (r.kind == NetRequest::Kind::kFree) return &r;
  }
  return nullptr;
}

NetRequest* NetComm::isend(const void* data, std::size_t size, int tag) {
  std::lock_guard<std::mutex> lock(mutex_);
  ONEBIT_CHECK(sending_, ONEBIT_INVALID_ARGUMENT, "isend on a receiving comm (from ", peer_, ")");
  if (failed_) ::onebit::fail(failure_code_, failure_);
  NetRequest* r = take_slot();
  if (r == nullptr) return nullptr;
  const std::size_t sockets = sockets_.size();
  const std::uint32_t stripes =
      size == 0 ? 0 : static_cast<std::uint32_t>(std::min(sockets, std::max<std::size_t>(1, size / kStripeBytes)));
  r->kind = NetRequest::Kind::kSend;
  r->n = 1;
  r->sizes[0] = size;
  wire::NetMessageHeader{tag, stripes, size}.encode(r->header.data());
  r->pending_pieces = 1 + static_cast<int>(stripes);
  sockets_[0].queue.push_back(Piece{r, r->header.data(), r->header.size()});
  auto* bytes = static_cast<std::uint8_t*>(const_cast<void*>(data));
  for (std::uint32_t i = 0; i < stripes; ++i) {
    const std::size_t begin = size * i / stripes, end = size * (i + 1) / stripes;
    sockets_[i].queue.push_back(Piece{r, bytes + begin, end - begin});
  }
  return r;
}

NetRequest* NetComm::irecv(int n, void* const* data, const std::size_t* sizes, const int* tags) {
  std::lock_guard<std::mutex> lock(mutex_);
  ONEBIT_CHECK(!sending_, ONEBIT_INVALID_ARGUMENT, "irecv on a sending comm (to ", peer_, ")");
  ONEBIT_CHECK(n >= 1 && n <= kMaxRecvs, ONEBIT_INVALID_ARGUMENT, "irecv of ", n, " buffers; this plugin groups 1 to ",
               kMaxRecvs, " (maxRecvs)");
  if (failed_) ::onebit::fail(failure_code_, failure_);
  NetRequest* r = take_slot();
  if (r == nullptr) return nullptr;
  r->kind = NetRequest::Kind::kRecv;
  r->n = n;
  r->matched_count = 0;
  r->pending_pieces = 0;
  for (int i = 0; i < n; ++i) {
    r->data[i] = static_cast<std::uint8_t*>(data[i]);
    r->capacity[i] = sizes[i];
    r->tags[i] = tags != nullptr ? tags[i] : 0;
    r->sizes[i] = 0;
    r->matched[i] = false;
  }
  posted_.push_back(r);
  return r;
}

void NetComm::piece_done(NetRequest* request) { --request->pending_pieces; }

void NetComm::send_side(Socket& socket) {
  while (!socket.queue.empty()) {
    Piece& piece = socket.queue.front();
    while (piece.left > 0) {
      const ssize_t sent = ::send(socket.fd.get(), piece.data, piece.left, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        fail_locked(errno == EPIPE || errno == ECONNRESET ? ONEBIT_REMOTE_ERROR : ONEBIT_SYSTEM_ERROR,
                    "send to " + peer_ + ": " + errno_string(errno));
      }
      piece.data += sent;
      piece.left -= static_cast<std::size_t>(sent);
    }
    piece_done(piece.request);
    socket.queue.pop_front();
  }
}

std::size_t NetComm::read_some(int fd, void* into, std::size_t bytes) {
  for (;;) {
    const ssize_t got = ::recv(fd, into, bytes, MSG_DONTWAIT);
    if (got > 0) return static_cast<std::size_t>(got);
    if (got == 0) fail_locked(ONEBIT_REMOTE_ERROR, peer_ + " closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    fail_locked(errno == ECONNRESET ? ONEBIT_REMOTE_ERROR : ONEBIT_SYSTEM_ERROR,
                "receive from " + peer_ + ": " + errno_string(errno));
  }
}

void NetComm::on_header() {
  const auto [tag, stripes, size] = wire::NetMessageHeader::decode(incoming_header_.data());
  ONEBIT_CHECK(!posted_.empty(), ONEBIT_INTERNAL_ERROR, "a header arrived with no receive posted");
  NetRequest* r = posted_.front();
  int slot = -1;
  for (int i = 0; i < r->n && slot < 0; ++i) {
    if (!r->matched[i] && r->tags[i] == tag) slot = i;
  }
  if (slot < 0) {
    fail_locked(ONEBIT_INVALID_ARGUMENT, "a message with tag " + std::to_string(tag) + " from " + peer_ +
                                             " matches no slot of the oldest posted receive");
  }
  if (size > r->capacity[slot]) {
    fail_locked(ONEBIT_INVALID_ARGUMENT, "a message of " + std::to_string(size) + " bytes from " + peer_ +
                                             " is larger than the posted receive of " +
                                             std::to_string(r->capacity[slot]) + " bytes (tag " + std::to_string(tag) +
                                             ")");
  }
  if (stripes > sockets_.size() || (size == 0) != (stripes == 0)) {
    fail_locked(ONEBIT_REMOTE_ERROR, "a malformed message header from " + peer_ + " (" + std::to_string(stripes) +
                                         " stripes, " + std::to_string(size) + " bytes)");
  }
  r->matched[slot] = true;
  r->sizes[slot] = size;
  ++r->matched_count;
  for (std::uint32_t i = 0; i < stripes; ++i) {
    const std::size_t begin = size * i / stripes, end = size * (i + 1) / stripes;
    ++r->pending_pieces;
    sockets_[i].queue.push_back(Piece{r, r->data[slot] + begin, end - begin});
  }
  if (r->matched_count == r->n) posted_.pop_front();
}

void NetComm::receive_side(std::size_t index) {
  Socket& socket = sockets_[index];
  for (;;) {
    if (socket.queue.empty()) {
      // Socket 0 between messages: the next header, if a receive waits for one.
      if (index != 0 || posted_.empty()) return;
      const std::size_t got =
          read_some(socket.fd.get(), incoming_header_.data() + header_read_, incoming_header_.size() - header_read_);
      if (got == 0) return;
      header_read_ += got;
      if (header_read_ < incoming_header_.size()) continue;
      header_read_ = 0;
      on_header();
      continue;
    }
    Piece& piece = socket.queue.front();
    while (piece.left > 0) {
      const std::size_t got = read_some(socket.fd.get(), piece.data, piece.left);
      if (got == 0) return;
      piece.data += got;
      piece.left -= got;
    }
    piece_done(piece.request);
    socket.queue.pop_front();
  }
}

void NetComm::progress_locked() {
  if (failed_) ::onebit::fail(failure_code_, failure_);
  for (std::size_t i = 0; i < sockets_.size(); ++i) {
    if (sending_) {
      send_side(sockets_[i]);
    } else {
      receive_side(i);
    }
  }
}

bool NetComm::test(NetRequest* r, int* sizes) {
  std::lock_guard<std::mutex> lock(mutex_);
  ONEBIT_CHECK(r->kind != NetRequest::Kind::kFree, ONEBIT_INVALID_ARGUMENT, "test of a request that is not in flight");
  progress_locked();
  const bool done = r->pending_pieces == 0 && (r->kind == NetRequest::Kind::kSend || r->matched_count == r->n);
  if (!done) return false;
  for (int i = 0; i < r->n; ++i) {
    if (sizes != nullptr) sizes[i] = static_cast<int>(std::min<std::size_t>(r->sizes[i], INT_MAX));
    stats_.bytes += r->sizes[i];
  }
  stats_.messages += static_cast<std::uint64_t>(r->n);
  r->kind = NetRequest::Kind::kFree;
  return true;
}

NetCommStats NetComm::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace onebit::transport::tcp
