// A shared-memory segment among the L ranks of one host, for the hierarchical allreduce's host
// reduce (engine/hierarchical_allreduce.cc): each rank has a region it writes its local
// peers' inputs into, and one ready counter per reader, so a reader takes block i as soon as it is
// there, without a copy through the kernel's socket buffers.
//
// Not a Transport: it moves only the host reduce's blocks, and it is set up over the job's
// transport (the creator sends the segment's name to its local peers, who map it and answer; then
// the creator unlinks the name, so nothing outlives the processes). Waiting honours the call's
// deadline, notices a writer whose process has gone (kill(pid, 0)) or that marked the segment
// aborted, and then fails the way the transport contract says: an onebit::Error naming the peer.
//
// Layout: a 20 KiB header (magic, L, the writers' pids, the abort word, ready[writer][reader] on
// their own cache lines), then L regions of `region_bytes`, page-aligned.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/clock.h"

namespace onebit::transport::shm {

class HostSegment {
 public:
  static constexpr int kMaxRanks = 16;  // ranks per host a segment can hold

  // Creates a segment for `ranks` writers with regions of `region_bytes`, reserving the pages the
  // writers will touch (reserve(writer, offset, bytes) before anyone maps it), under a fresh name.
  // Throws Error(ONEBIT_SYSTEM_ERROR) naming the call that failed (e.g. /dev/shm is full).
  static HostSegment create(int ranks, std::size_t region_bytes);
  // Maps the segment another rank of this host created. Throws like create.
  static HostSegment open(const std::string& name, int ranks, std::size_t region_bytes);

  HostSegment() = default;
  HostSegment(HostSegment&& other) noexcept;
  HostSegment& operator=(HostSegment&& other) noexcept;
  HostSegment(const HostSegment&) = delete;
  HostSegment& operator=(const HostSegment&) = delete;
  ~HostSegment();

  bool mapped() const { return base_ != nullptr; }
  const std::string& name() const { return name_; }
  // Allocates the pages [offset, offset + bytes) of a writer's region now (so a full /dev/shm is
  // an error here, not a SIGBUS later). Creator only, before the name is sent.
  void reserve(int writer, std::size_t offset, std::size_t bytes);
  // Removes the name (the creator, once every peer has mapped it); the memory stays until unmapped.
  void unlink();

  std::uint8_t* region(int writer) const;
  void set_pid(int writer, pid_t pid);
  // The writer has published `count` blocks for `reader` since the segment was made.
  void publish(int writer, int reader, std::uint32_t count);
  // Waits until `writer` has published at least `count` blocks for `reader`. Throws
  // ONEBIT_TIMEOUT at the deadline and ONEBIT_REMOTE_ERROR when the writer's process is gone or
  // some rank aborted; `describe` names what was awaited.
  void wait(int writer, int reader, std::uint32_t count, Deadline deadline, int writer_rank,
            const std::string& describe) const;
  // Tells every waiter on the segment that this rank's call failed.
  void abort(int rank);

 private:
  struct Header;
  Header* header() const;
  void release();  // unlinks (the creator, if not yet), unmaps, closes; leaves an empty segment
  static HostSegment map(int fd, const std::string& name, int ranks, std::size_t region_bytes, bool creator);

  std::string name_;
  std::uint8_t* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t region_bytes_ = 0;
  int ranks_ = 0;
  int fd_ = -1;
  bool linked_ = false;
};

}  // namespace onebit::transport::shm
