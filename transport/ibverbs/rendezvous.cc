#include "transport/ibverbs/rendezvous.h"

#include "common/error.h"
#include "transport/wait_all.h"

namespace onebit::transport::ibverbs {

wire::ClearToSend Rendezvous::post_receive(Request& request, std::uint64_t address, std::uint32_t rkey) {
  if (!receive_keys_.insert(request.key).second)
    fail(ONEBIT_INTERNAL_ERROR, second_receive_text(me_, peer_, request.key));
  wire::ClearToSend offer;
  offer.key = request.key;
  offer.shape = request.shape;
  offer.bytes = request.bytes;
  offer.address = address;
  offer.rkey = rkey;
  offer.recv_id = next_recv_id_++;
  if (next_recv_id_ == 0) next_recv_id_ = 1;  // 0 is never an id; 2^32 offers wrap long after they complete
  receives_[offer.recv_id] = &request;
  return offer;
}

void Rendezvous::check_match(const Request& send, const wire::ClearToSend& offer) const {
  if (send.shape == offer.shape && send.bytes == offer.bytes) return;
  fail(ONEBIT_MISMATCH, "rank ", me_, " and rank ", peer_, " disagree on a ", wire::kind_name(send.key.kind),
       " message: rank ", me_, " sends ", send.shape.count, " elements of dtype ", int(send.shape.dtype), " op ",
       int(send.shape.op), " (", send.bytes, " bytes), rank ", peer_, " expects ", offer.shape.count,
       " elements of dtype ", int(offer.shape.dtype), " op ", int(offer.shape.op), " (", offer.bytes, " bytes)");
}

std::optional<Rendezvous::Write> Rendezvous::post_send(Request& request) {
  auto found = offers_.find(request.key);
  if (found == offers_.end()) {
    sends_[request.key].push_back(&request);
    return std::nullopt;
  }
  const wire::ClearToSend offer = found->second.front();
  check_match(request, offer);
  found->second.pop_front();
  --waiting_offers_;
  if (found->second.empty()) offers_.erase(found);
  return Write{&request, offer};
}

std::optional<Rendezvous::Write> Rendezvous::offer_arrived(const wire::ClearToSend& offer) {
  auto found = sends_.find(offer.key);
  if (found == sends_.end()) {
    ONEBIT_CHECK(waiting_offers_ < kMaxWaitingOffers, ONEBIT_REMOTE_ERROR, "rank ", peer_, " has offered ",
                 waiting_offers_ + 1, " receives that no send of rank ", me_, " has matched yet (at most ",
                 kMaxWaitingOffers, " are held): a broken or hostile peer, or ranks whose calls have parted");
    offers_[offer.key].push_back(offer);
    ++waiting_offers_;
    return std::nullopt;
  }
  Request* send = found->second.front();
  check_match(*send, offer);
  found->second.pop_front();
  if (found->second.empty()) sends_.erase(found);
  return Write{send, offer};
}

Request& Rendezvous::write_arrived(std::uint32_t recv_id, std::size_t bytes) {
  auto found = receives_.find(recv_id);
  ONEBIT_CHECK(found != receives_.end(), ONEBIT_REMOTE_ERROR, "rank ", peer_, " wrote into receive ", recv_id,
               ", which rank ", me_, " never offered or has already completed");
  Request& request = *found->second;
  ONEBIT_CHECK(bytes == request.bytes, ONEBIT_REMOTE_ERROR, "rank ", peer_, " wrote ", bytes, " bytes into a ",
               wire::kind_name(request.key.kind), " receive of ", request.bytes, " bytes");
  receives_.erase(found);
  receive_keys_.erase(request.key);
  return request;
}

bool Rendezvous::owing() const { return !sends_.empty(); }

void Rendezvous::drain(const std::function<void(Request&)>& each) {
  for (auto& [id, request] : receives_) each(*request);
  for (auto& [key, queue] : sends_) {
    for (Request* request : queue) each(*request);
  }
  receives_.clear();
  receive_keys_.clear();
  sends_.clear();
  offers_.clear();
  waiting_offers_ = 0;
}

}  // namespace onebit::transport::ibverbs
