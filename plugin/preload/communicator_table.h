// What the NCCL door knows of each live communicator, by address: a process-unique id — a tag's
// device state is keyed by it, so a communicator destroyed or aborted takes its states with it and
// a later one at the same address starts fresh — and whether NCCL runs it non-blocking (learnt
// from the config of the interposed init or split that made it).
//
// A communicator's end is two steps around NCCL's own ncclCommDestroy/ncclCommAbort: begin_end
// marks it ending, so that a call that starts on it meanwhile (another thread's, racing the
// watchdog's abort) is refused instead of making device state for a communicator that is going —
// state that nothing would free, and that a new communicator NCCL made at the same address would
// inherit, error feedback and all; a call that took its id just before asks live() once it holds
// its tag. finish_end, once NCCL's call returned, forgets the address; cancel_end, when NCCL's
// call failed and the communicator lives on, makes it live again.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

#include "common/error.h"

namespace onebit::front::nccl {

class CommunicatorTable {
 public:
  // A communicator an interposed init or split made: a fresh id, and how it blocks (an address
  // reused by NCCL replaces whatever was recorded there).
  void made(const void* comm, bool blocking) {
    if (comm == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    known_[comm] = Known{next_++, blocking, false, false};
  }

  // A communicator's id, for a call about to make or use device state on it: one the door did not
  // see made is recorded now, with a fresh id, blocking as `unseen_blocking` says (NCCL's default).
  // Refuses one whose end has begun (ONEBIT_INVALID_ARGUMENT, naming it).
  std::uint64_t id_of(const void* comm, bool unseen_blocking) {
    std::lock_guard<std::mutex> lock(mutex_);
    const Known& known = entry(comm, unseen_blocking);
    ONEBIT_CHECK(!known.ending, ONEBIT_INVALID_ARGUMENT, "communicator ", comm,
                 " is being destroyed or aborted (ncclCommDestroy/ncclCommAbort on another thread): a compressed "
                 "call on it now would make state for a communicator that is going");
    return known.id;
  }

  // Whether NCCL runs `comm` blocking (recorded as id_of does; an ending one answers as it was made).
  bool blocking(const void* comm, bool unseen_blocking) {
    std::lock_guard<std::mutex> lock(mutex_);
    return entry(comm, unseen_blocking).blocking;
  }

  // A communicator whose end has begun: the id its states are kept under, and whether the door
  // knew it (an unseen one has no states: nothing to drop).
  struct Ending {
    std::uint64_t id;
    bool seen;
  };

  // NCCL's destroy or abort of `comm` is about to run: from now until finish_end (or cancel_end),
  // calls on it are refused. An unseen communicator is recorded for the while, as id_of would.
  Ending begin_end(const void* comm, bool unseen_blocking) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, added] = known_.try_emplace(comm, Known{next_, unseen_blocking, false, true});
    if (added) ++next_;
    it->second.ending = true;
    return Ending{it->second.id, !added && !it->second.placeholder};
  }

  // NCCL's call returned and the communicator is gone: the address is forgotten, so that a
  // communicator made there next starts fresh — unless an init has already recorded a new one
  // there (its own id), which stays.
  void finish_end(const void* comm, const Ending& ending) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = known_.find(comm);
    if (it != known_.end() && it->second.id == ending.id) known_.erase(it);
  }

  // NCCL's call failed and the communicator lives on (the caller may abort it next): it is live
  // again as it was; one recorded only for the end is forgotten.
  void cancel_end(const void* comm, const Ending& ending) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = known_.find(comm);
    if (it == known_.end() || it->second.id != ending.id) return;
    if (it->second.placeholder) {
      known_.erase(it);
    } else {
      it->second.ending = false;
    }
  }

  // Whether `id` still names `comm` and its end has not begun: asked by a call once it holds its
  // tag, so that a call that took its id just before the end began, and lost the race to it, is
  // refused before it makes state under a dead id (the end's dropping of states waits for, or
  // sets aside, a tag a call holds).
  bool live(const void* comm, std::uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = known_.find(comm);
    return it != known_.end() && it->second.id == id && !it->second.ending;
  }

 private:
  struct Known {
    std::uint64_t id;
    bool blocking;
    bool ending;
    bool placeholder;  // recorded by begin_end for a communicator the door had not seen
  };

  // Under mutex_.
  const Known& entry(const void* comm, bool unseen_blocking) {
    auto [it, added] = known_.try_emplace(comm, Known{next_, unseen_blocking, false, false});
    if (added) ++next_;
    return it->second;
  }

  std::mutex mutex_;
  std::map<const void*, Known> known_;
  std::uint64_t next_ = std::uint64_t{1} << 48;  // apart from the CPU engine's communicator ids
};

}  // namespace onebit::front::nccl
