// The verbs transport (ibverbs_transport.h) once connected: its constructor and destructor, posting
// receives, writes and offers, requests and failure. Opening the device and connecting the queue
// pairs is device_setup.cc, the progress thread progress_thread.cc; what they share is
// ibverbs_internal.h.
#include "transport/ibverbs/ibverbs_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "transport/ibverbs/ibverbs_internal.h"
#include "transport/ibverbs/verbs_api.h"
#include "transport/progress.h"
#include "transport/wait_all.h"

namespace onebit::transport::ibverbs {

std::string errno_text(int err) { return std::strerror(err); }

namespace {

constexpr std::size_t kMaxMessageBytes = std::size_t{1} << 30;  // one RDMA write; the engine's are a few MiB

}  // namespace

IbverbsTransport::IbverbsTransport(int rank, int size, const tcp::Address& root, const VerbsOptions& options)
    : rank_(rank), size_(size), options_(options) {
  ONEBIT_CHECK(size >= 1, ONEBIT_INVALID_ARGUMENT, "world size ", size, " must be at least 1");
  ONEBIT_CHECK(rank >= 0 && rank < size, ONEBIT_INVALID_ARGUMENT, "rank ", rank, " is out of range for ", size,
               " ranks");
  ONEBIT_CHECK(options.ack_timeout >= 1 && options.ack_timeout <= 31, ONEBIT_INVALID_ARGUMENT,
               "ONEBIT_IB_TIMEOUT=", options.ack_timeout, " must be in 1..31");
  peers_.resize(size);
  if (size == 1) return;  // nothing to connect: no device needed
  open_device();
  cache_ = std::make_unique<RegistrationCache>(*device_);
  connect_queue_pairs(root);
  epoll_ = tcp::Fd(::epoll_create1(EPOLL_CLOEXEC));
  wakeup_ = tcp::Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  ONEBIT_CHECK(epoll_ && wakeup_, ONEBIT_SYSTEM_ERROR, "epoll/eventfd: ", errno_text(errno));
  auto watch = [&](int fd, std::uint64_t what) {
    epoll_event event{};
    event.events = EPOLLIN | EPOLLRDHUP;
    event.data.u64 = what;
    ONEBIT_CHECK(::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) == 0, ONEBIT_SYSTEM_ERROR,
                 "epoll_ctl: ", errno_text(errno));
  };
  // 0: wake-up; 1: completions; 2 + r: rank r's set-up socket.
  watch(wakeup_.get(), 0);
  const int channel_flags = ::fcntl(device_->channel->fd, F_GETFL);
  ::fcntl(device_->channel->fd, F_SETFL, channel_flags | O_NONBLOCK);
  watch(device_->channel->fd, 1);
  for (auto& peer : peers_) {
    if (!peer) continue;
    tcp::set_nonblocking(peer->side.get());
    watch(peer->side.get(), 2 + static_cast<std::uint64_t>(peer->rank));
  }
  ONEBIT_CHECK(ibv_req_notify_cq(device_->cq, 0) == 0, ONEBIT_SYSTEM_ERROR, "ibv_req_notify_cq on ", device_->name);
  progress_ = std::thread([this] { progress_loop(); });
}

IbverbsTransport::~IbverbsTransport() {
  stop_progress_thread(progress_, mutex_, stopping_, wakeup_.get());
  // Queue pairs first, so the adapter is done with every buffer before its registration goes.
  for (auto& peer : peers_) {
    if (peer && peer->qp) verbs().destroy_qp(std::exchange(peer->qp, nullptr));
  }
  if (cache_) {
    for (auto& [request, lease] : leases_) cache_->release(lease);
    for (auto& peer : peers_) {
      if (peer) cache_->release(peer->control_lease);
    }
  }
  leases_.clear();
  peers_.clear();  // queue pairs destroyed; control buffers retire, so the cache drops their registrations
  cache_.reset();
  device_.reset();
}

void IbverbsTransport::post_receive_slot(Peer& peer, std::uint32_t slot) {
  ibv_sge sge = peer.slot_entry(slot);
  ibv_recv_wr wr{};
  wr.wr_id = work_id(Work::kReceive, peer.rank, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ONEBIT_CHECK(ibv_post_recv(peer.qp, &wr, &bad) == 0, ONEBIT_SYSTEM_ERROR, "rank ", rank_, ": ibv_post_recv to rank ",
               peer.rank, " failed");
}

// ---- requests ----

bool IbverbsTransport::start_locked(Request& request, bool is_send, int peer, const wire::MessageKey& key,
                                    const wire::CallShape& shape, void* data, std::size_t bytes) {
  ONEBIT_CHECK(peer >= 0 && peer < size_ && peer != rank_, ONEBIT_INTERNAL_ERROR, "rank ", rank_,
               ": no queue pair to rank ", peer);
  request = Request::of(is_send, peer, key, shape, data, bytes);
  request.state = failed_ ? Request::State::kFailed : Request::State::kPending;
  if (failed_) return false;
  if (peers_[peer]->closed) {
    request.state = Request::State::kFailed;
    fail_locked(ONEBIT_REMOTE_ERROR, "rank " + std::to_string(rank_) + ": rank " + std::to_string(peer) +
                                         " closed the connection (it left the job or exited)");
    return false;
  }
  if (bytes > kMaxMessageBytes) {
    request.state = Request::State::kFailed;
    fail_locked(ONEBIT_INVALID_ARGUMENT, "rank " + std::to_string(rank_) + ": a message of " + std::to_string(bytes) +
                                             " bytes to or from rank " + std::to_string(peer) +
                                             " is larger than the verbs transport's 1 GiB per message");
    return false;
  }
  try {
    leases_[&request] = cache_->acquire(data, bytes);
  } catch (const Error& error) {
    request.state = Request::State::kFailed;
    fail_locked(error.code(), "rank " + std::to_string(rank_) + ": " + error.what());
    return false;
  }
  return true;
}

void IbverbsTransport::isend(Request& request, int peer, std::uint32_t, const wire::MessageKey& key,
                             const wire::CallShape& shape, const void* data, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!start_locked(request, true, peer, key, shape, const_cast<void*>(data), bytes)) return;
  Peer& p = *peers_[peer];
  try {
    if (auto write = p.rendezvous.post_send(request)) start_write(p, *write->send, write->offer);
  } catch (const Error& error) {
    fail_locked(error.code(), error.what());
  }
}

void IbverbsTransport::irecv(Request& request, int peer, std::uint32_t, const wire::MessageKey& key,
                             const wire::CallShape& shape, void* data, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!start_locked(request, false, peer, key, shape, data, bytes)) return;
  Peer& p = *peers_[peer];
  try {
    send_offer(p, p.rendezvous.post_receive(request, reinterpret_cast<std::uint64_t>(data),
                                            leases_[&request].registration.rkey));
  } catch (const Error& error) {
    request.state = Request::State::kFailed;  // not held by the rendezvous when it refused the receive
    fail_locked(error.code(), error.what());
  }
}

void IbverbsTransport::start_write(Peer& peer, Request& send, const wire::ClearToSend& offer) {
  if (peer.sends_posted >= kSendDepth) {
    peer.writes_waiting.push_back(Peer::PendingWrite{&send, offer});
    return;
  }
  const std::uint32_t id = peer.next_write_id++;
  ibv_sge sge{};
  sge.addr = reinterpret_cast<std::uint64_t>(send.data);
  sge.length = static_cast<std::uint32_t>(send.bytes);
  sge.lkey = leases_[&send].registration.lkey;
  ibv_send_wr wr{};
  wr.wr_id = work_id(Work::kWrite, peer.rank, id);
  wr.sg_list = send.bytes > 0 ? &sge : nullptr;
  wr.num_sge = send.bytes > 0 ? 1 : 0;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.imm_data = htonl(offer.recv_id);
  wr.wr.rdma.remote_addr = offer.address;
  wr.wr.rdma.rkey = offer.rkey;
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(peer.qp, &wr, &bad);
  if (rc != 0) {
    fail(ONEBIT_SYSTEM_ERROR, "rank ", rank_, ": RDMA write to rank ", peer.rank,
         " could not be posted: ", errno_text(rc));
  }
  peer.writes[id] = &send;
  ++peer.sends_posted;
}

void IbverbsTransport::send_offer(Peer& peer, const wire::ClearToSend& offer) {
  if (peer.free_offer_slots.empty() || peer.sends_posted >= kSendDepth) {
    peer.offers_waiting.push_back(offer);
    return;
  }
  const std::uint32_t slot = peer.free_offer_slots.back();
  peer.free_offer_slots.pop_back();
  const auto bytes = offer.encode();
  std::memcpy(peer.slot(slot), bytes.data(), bytes.size());
  ibv_sge sge = peer.slot_entry(slot);
  ibv_send_wr wr{};
  wr.wr_id = work_id(Work::kOffer, peer.rank, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(peer.qp, &wr, &bad);
  if (rc != 0) {
    fail(ONEBIT_SYSTEM_ERROR, "rank ", rank_, ": an offer to rank ", peer.rank,
         " could not be posted: ", errno_text(rc));
  }
  ++peer.sends_posted;
  stats_.bytes_sent += kSlotBytes;
}

void IbverbsTransport::flush_waiting(Peer& peer) {
  while (!peer.offers_waiting.empty() && !peer.free_offer_slots.empty() && peer.sends_posted < kSendDepth) {
    const wire::ClearToSend offer = peer.offers_waiting.front();
    peer.offers_waiting.pop_front();
    send_offer(peer, offer);
  }
  while (!peer.writes_waiting.empty() && peer.sends_posted < kSendDepth) {
    const Peer::PendingWrite write = peer.writes_waiting.front();
    peer.writes_waiting.pop_front();
    start_write(peer, *write.send, write.offer);
  }
}

void IbverbsTransport::wait_all(const std::vector<Request*>& requests, Deadline deadline,
                                const std::function<std::string(const Request&)>& describe) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (const Request* late = wait_until_settled(lock, completed_, requests, deadline, [this] { return failed_; })) {
    fail_locked(ONEBIT_TIMEOUT, timeout_text(rank_, options_.tcp.timeout, *late, describe));
  }
  if (!all_done(requests)) throw_failure_locked();
}

void IbverbsTransport::abort(onebit_result_t code, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  fail_locked(code, why);
}

TransportStats IbverbsTransport::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void IbverbsTransport::complete(Request& request) {
  auto lease = leases_.find(&request);
  if (lease != leases_.end()) {
    cache_->release(lease->second);
    leases_.erase(lease);
  }
  request.state = Request::State::kDone;
  completed_.notify_all();
}

void IbverbsTransport::throw_failure_locked() const { throw Error(failure_code_, failure_message_); }

void IbverbsTransport::fail_locked(onebit_result_t code, const std::string& message) {
  if (failed_) return;
  failed_ = true;
  failure_code_ = code;
  failure_message_ = message;
  ONEBIT_LOG(WARN, "verbs transport of rank ", rank_, " broken: ", message);
  const std::string text = message.substr(0, kMaxAbortText);
  for (auto& peer : peers_) {
    if (!peer) continue;
    // The error state flushes every posted work request and drops whatever arrives from now on,
    // so no peer's write lands in this rank's buffers once the requests below have failed.
    // Registrations stay until the destructor: the adapter may still be reading a send buffer.
    if (peer->qp) {
      ibv_qp_attr attr{};
      attr.qp_state = IBV_QPS_ERR;
      verbs().modify_qp(peer->qp, &attr, IBV_QP_STATE);
    }
    peer->rendezvous.drain([](Request& r) { r.state = Request::State::kFailed; });
    for (auto& [id, request] : peer->writes) request->state = Request::State::kFailed;
    for (auto& write : peer->writes_waiting) write.send->state = Request::State::kFailed;
    peer->writes.clear();
    peer->writes_waiting.clear();
    peer->offers_waiting.clear();
    if (peer->side && !peer->closed) {
      std::uint8_t head[4];
      wire::Writer(head).put(static_cast<std::uint32_t>(text.size()));
      iovec parts[2] = {{head, sizeof(head)}, {const_cast<char*>(text.data()), text.size()}};
      msghdr frame{};
      frame.msg_iov = parts;
      frame.msg_iovlen = 2;
      [[maybe_unused]] ssize_t sent = ::sendmsg(peer->side.get(), &frame, MSG_NOSIGNAL | MSG_DONTWAIT);
      ::shutdown(peer->side.get(), SHUT_RDWR);
      if (epoll_) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, peer->side.get(), nullptr);
    }
  }
  completed_.notify_all();
}

}  // namespace onebit::transport::ibverbs
