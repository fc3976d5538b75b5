#include "transport/wait_all.h"

namespace onebit {

bool all_done(const std::vector<Request*>& requests) {
  for (const Request* r : requests) {
    if (r->state != Request::State::kDone) return false;
  }
  return true;
}

const Request* wait_until_settled(std::unique_lock<std::mutex>& lock, std::condition_variable& completed,
                                  const std::vector<Request*>& requests, Deadline deadline,
                                  const std::function<bool()>& failed) {
  if (completed.wait_until(lock, deadline, [&] { return failed() || all_done(requests); })) return nullptr;
  for (const Request* r : requests) {
    if (r->state != Request::State::kDone) return r;
  }
  return nullptr;
}

std::string timeout_text(int rank, std::chrono::milliseconds timeout, const Request& late,
                         const std::function<std::string(const Request&)>& describe) {
  return "rank " + std::to_string(rank) + ": timed out after " + std::to_string(timeout.count()) +
         " ms (ONEBIT_TIMEOUT_MS) " + (late.is_send ? "sending to" : "waiting for") + " rank " +
         std::to_string(late.peer) + " (" + describe(late) + "); rank " + std::to_string(late.peer) +
         " is stalled, dead or not in this call";
}

std::string second_receive_text(int rank, int peer, const wire::MessageKey& key) {
  return "rank " + std::to_string(rank) + " posted a second receive from rank " + std::to_string(peer) + " for one " +
         wire::kind_name(key.kind) + " message (stream " + std::to_string(key.stream) + ", call " +
         std::to_string(key.seq) + ", part " + std::to_string(key.part) +
         ") while the first is pending: a bug in onebit's call sequencing";
}

}  // namespace onebit
