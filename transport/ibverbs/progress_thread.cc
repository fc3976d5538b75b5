// The verbs transport's progress thread (ibverbs_transport.h): it sleeps in epoll on the completion
// channel and every peer's set-up socket, drains completions (writes, offers, control messages,
// writes that arrived) and reads aborts and the peers' ends from the set-up sockets.
#include "transport/ibverbs/ibverbs_transport.h"

#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <exception>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "transport/ibverbs/ibverbs_internal.h"
#include "transport/ibverbs/verbs_api.h"
#include "transport/wire.h"

namespace onebit::transport::ibverbs {

void IbverbsTransport::progress_loop() {
  epoll_event events[16];
  {
    // Completions that came before the queue was armed (a peer's first offer may) raise no event:
    // drain them once now, as after every event.
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      handle_completions();
    } catch (const Error& error) {
      fail_locked(error.code(), "rank " + std::to_string(rank_) + ": " + error.what());
    }
  }
  for (;;) {
    const int n = ::epoll_wait(epoll_.get(), events, 16, -1);
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_locked(ONEBIT_SYSTEM_ERROR, "epoll_wait: " + errno_text(errno));
      continue;
    }
    try {
      for (int i = 0; i < n; ++i) {
        const std::uint64_t what = events[i].data.u64;
        if (what == 1) {
          handle_completions();
        } else if (what >= 2 && !failed_) {
          handle_side_socket(*peers_[static_cast<int>(what - 2)]);
        }
      }
    } catch (const Error& error) {
      fail_locked(error.code(), "rank " + std::to_string(rank_) + ": " + error.what());
    } catch (const std::exception& error) {
      // Nothing may escape the progress thread: that would terminate the training process.
      fail_locked(ONEBIT_INTERNAL_ERROR, "rank " + std::to_string(rank_) + ": internal error: " + error.what());
    }
  }
}

void IbverbsTransport::handle_completions() {
  const VerbsApi& api = verbs();
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (api.get_cq_event(device_->channel, &cq, &context) == 0) api.ack_cq_events(cq, 1);
  // Re-arm first, then drain: a completion that lands in between raises a new event.
  ibv_req_notify_cq(device_->cq, 0);
  ibv_wc wc[32];
  for (;;) {
    const int n = ibv_poll_cq(device_->cq, 32, wc);
    ONEBIT_CHECK(n >= 0, ONEBIT_SYSTEM_ERROR, "ibv_poll_cq on ", device_->name, " failed");
    if (n == 0) return;
    for (int i = 0; i < n; ++i) on_completion(wc[i]);
  }
}

void IbverbsTransport::on_completion(const ibv_wc& wc) {
  const Work kind = work_kind(wc.wr_id);
  const int rank = work_peer(wc.wr_id);
  const std::uint32_t slot = work_slot(wc.wr_id);
  if (failed_) return;  // flushed work of a broken transport: nothing to do but let it drain
  ONEBIT_CHECK(rank >= 0 && rank < size_ && peers_[rank], ONEBIT_INTERNAL_ERROR, "a completion for unknown rank ",
               rank);
  Peer& peer = *peers_[rank];
  if (wc.status != IBV_WC_SUCCESS) {
    const char* what = kind == Work::kWrite   ? "an RDMA write to"
                       : kind == Work::kOffer ? "an offer to"
                                              : "a receive from";
    fail(ONEBIT_REMOTE_ERROR, what, " rank ", rank, " failed: ", verbs().wc_status_str(wc.status), " (vendor error ",
         wc.vendor_err, ")",
         wc.status == IBV_WC_RETRY_EXC_ERR || wc.status == IBV_WC_RNR_RETRY_EXC_ERR
             ? "; rank " + std::to_string(rank) + " is unreachable or gone (ONEBIT_IB_TIMEOUT, ONEBIT_IB_HCA)"
             : std::string());
  }
  switch (kind) {
    case Work::kWrite: {
      auto found = peer.writes.find(slot);
      ONEBIT_CHECK(found != peer.writes.end(), ONEBIT_INTERNAL_ERROR, "completion of unknown write ", slot);
      Request& send = *found->second;
      peer.writes.erase(found);
      --peer.sends_posted;
      stats_.bytes_sent += send.bytes;
      complete(send);
      break;
    }
    case Work::kOffer:
      --peer.sends_posted;
      peer.free_offer_slots.push_back(slot);
      break;
    case Work::kReceive: {
      if (wc.opcode == IBV_WC_RECV) {
        ONEBIT_CHECK(wc.byte_len == kSlotBytes, ONEBIT_REMOTE_ERROR, "rank ", rank, " sent a control message of ",
                     wc.byte_len, " bytes (expected ", kSlotBytes, ")");
        stats_.bytes_received += kSlotBytes;
        const wire::ClearToSend offer = wire::ClearToSend::decode(peer.slot(slot), "rank " + std::to_string(rank));
        post_receive_slot(peer, slot);
        if (auto write = peer.rendezvous.offer_arrived(offer)) start_write(peer, *write->send, write->offer);
      } else if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        post_receive_slot(peer, slot);
        Request& receive = peer.rendezvous.write_arrived(ntohl(wc.imm_data), wc.byte_len);
        stats_.bytes_received += wc.byte_len;
        complete(receive);
      } else {
        fail(ONEBIT_REMOTE_ERROR, "rank ", rank, " sent an unexpected verbs operation (opcode ", int(wc.opcode), ")");
      }
      break;
    }
    default: fail(ONEBIT_INTERNAL_ERROR, "a completion of unknown kind ", static_cast<int>(kind));
  }
  flush_waiting(peer);
}

void IbverbsTransport::handle_side_socket(Peer& peer) {
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(peer.side.get(), buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n > 0) {
      peer.side_input.append(buffer, static_cast<std::size_t>(n));
      if (peer.side_input.size() >= 4) {
        const std::uint32_t length =
            wire::Reader(reinterpret_cast<const std::uint8_t*>(peer.side_input.data())).get<std::uint32_t>();
        ONEBIT_CHECK(length <= kMaxAbortText, ONEBIT_REMOTE_ERROR, "rank ", peer.rank, " aborted the job");
        if (peer.side_input.size() >= 4 + length) {
          fail(ONEBIT_REMOTE_ERROR, "rank ", peer.rank,
               " failed and left the job: ", printable(std::string_view(peer.side_input).substr(4, length)));
        }
      }
      continue;
    }
    // The end (or a reset). Completions the peer caused before it closed are drained first, so that
    // a peer that finished its last call and left is not taken for one that died in it.
    handle_completions();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, peer.side.get(), nullptr);
    if (peer.rendezvous.expecting() || peer.rendezvous.owing() || !peer.writes.empty() ||
        !peer.writes_waiting.empty()) {
      fail(ONEBIT_REMOTE_ERROR, "rank ", peer.rank, " closed the connection (it exited, crashed or aborted)");
    }
    peer.closed = true;
    return;
  }
}

}  // namespace onebit::transport::ibverbs
