// The body of Transport::wait_all for backends whose progress thread completes requests under one
// mutex and signals one condition variable (tcp, ibverbs): both wait, time out and word the
// timeout the same way, so a user reads one message whatever the transport.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace onebit {

bool all_done(const std::vector<Request*>& requests);

// Waits under `lock` until every request is done or `failed()` says the transport broke. Returns
// null then; at the deadline, the first request still pending.
const Request* wait_until_settled(std::unique_lock<std::mutex>& lock, std::condition_variable& completed,
                                  const std::vector<Request*>& requests, Deadline deadline,
                                  const std::function<bool()>& failed);

// "rank 0: timed out after 300000 ms (ONEBIT_TIMEOUT_MS) waiting for rank 2 (<describe>); rank 2
// is stalled, dead or not in this call".
std::string timeout_text(int rank, std::chrono::milliseconds timeout, const Request& late,
                         const std::function<std::string(const Request&)>& describe);

// Every backend's refusal of a second receive for a key whose first is still pending
// (Transport::isend): "rank 0 posted a second receive from rank 1 for one server result message
// (stream 7, call 3, part 1) while the first is pending: ...". Shared so that the text, which
// tests and users search for, is one whatever the transport (gloo too).
std::string second_receive_text(int rank, int peer, const wire::MessageKey& key);

}  // namespace onebit
