// How the verbs transport matches messages with one peer, receiver-driven: a posted receive
// registers its buffer and offers it to the peer (a ClearToSend control message); the peer's
// matching send, once it has both, RDMA-writes straight into it with the offer's id as immediate
// data, and that write's arrival completes the receive. Messages land in place — no unexpected
// store, no copy — and a send never moves before its receive exists, which is the transport
// contract's "receives may be posted before or after the matching send".
//
// Offers and sends of one key are matched first to first, so messages with the same match arrive
// in posting order. No device here: the transport (ibverbs_transport.cc) posts what this returns.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "transport/transport.h"
#include "transport/wire.h"

namespace onebit::transport::ibverbs {

class Rendezvous {
 public:
  Rendezvous(int my_rank, int peer) : me_(my_rank), peer_(peer) {}

  struct Write {
    Request* send;
    wire::ClearToSend offer;  // where it goes
  };

  // A receive was posted into memory the peer may write at (address, rkey): the offer to send.
  // Throws Error(ONEBIT_INTERNAL_ERROR) naming the key when a receive for it is already offered
  // (transport.h: keys are unique among one peer's messages in flight).
  wire::ClearToSend post_receive(Request& request, std::uint64_t address, std::uint32_t rkey);
  // A send was posted: the write to start now, if the peer's offer for it is already here.
  // Throws Error(ONEBIT_MISMATCH) naming both ranks when that offer disagrees with the send.
  std::optional<Write> post_send(Request& request);
  // The peer's offer arrived: the write to start now, if the matching send is already posted.
  // Throws Error(ONEBIT_MISMATCH) as post_send, and Error(ONEBIT_REMOTE_ERROR) past
  // kMaxWaitingOffers offers waiting.
  std::optional<Write> offer_arrived(const wire::ClearToSend& offer);
  // The peer's write into receive `recv_id` arrived with `bytes`: that receive, no longer pending
  // here. Throws Error(ONEBIT_REMOTE_ERROR) for an id never offered or a size that is not the
  // receive's.
  Request& write_arrived(std::uint32_t recv_id, std::size_t bytes);

  bool expecting() const { return !receives_.empty(); }  // a receive is waiting for the peer's write
  bool owing() const;                                    // a send is waiting for the peer's offer

  // Every request still held (receives offered, sends waiting), then forgets them all.
  void drain(const std::function<void(Request&)>& each);

  // Offers held for sends not yet posted: a call or two ahead at most. A peer that offers more is
  // a broken or hostile one, and is an error naming it rather than memory without end.
  static constexpr std::size_t kMaxWaitingOffers = std::size_t{1} << 16;

 private:
  void check_match(const Request& send, const wire::ClearToSend& offer) const;

  const int me_;
  const int peer_;
  std::map<wire::MessageKey, std::deque<Request*>> sends_;            // waiting for their offer
  std::map<wire::MessageKey, std::deque<wire::ClearToSend>> offers_;  // waiting for their send
  std::size_t waiting_offers_ = 0;                                    // in offers_, bounded
  std::map<std::uint32_t, Request*> receives_;                        // offered, by recv_id
  std::set<wire::MessageKey> receive_keys_;                           // the keys of receives_
  std::uint32_t next_recv_id_ = 1;
};

}  // namespace onebit::transport::ibverbs
