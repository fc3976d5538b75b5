#include "transport/shm/host_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <utility>

#include "common/error.h"

namespace onebit::transport::shm {
namespace {

constexpr std::uint32_t kMagic = 0x4F425331;    // "OBS1"
constexpr std::size_t kHeaderBytes = 5 * 4096;  // the Header below, in whole pages
constexpr std::size_t kPage = 4096;

// A word on its own cache line: ready counters are written by one rank and polled by another.
struct alignas(64) Word {
  std::atomic<std::uint32_t> value;
};

std::size_t round_up(std::size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

[[noreturn]] void system_error(const std::string& what) {
  fail(ONEBIT_SYSTEM_ERROR, "shared memory: ", what, ": ", std::strerror(errno));
}

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

struct HostSegment::Header {
  std::uint32_t magic;
  std::int32_t ranks;
  std::int32_t pids[kMaxRanks];
  Word aborted;  // 0, or 1 + the rank that aborted
  Word ready[kMaxRanks][kMaxRanks];
};

HostSegment HostSegment::map(int fd, const std::string& name, int ranks, std::size_t region_bytes, bool creator) {
  static_assert(sizeof(Header) <= kHeaderBytes, "the header must fit its pages");
  ONEBIT_CHECK(ranks >= 1 && ranks <= kMaxRanks, ONEBIT_INVALID_ARGUMENT, "shared memory: ", ranks,
               " ranks per host; a host segment holds at most ", kMaxRanks);
  HostSegment segment;
  segment.name_ = name;
  segment.fd_ = fd;
  segment.ranks_ = ranks;
  segment.region_bytes_ = round_up(region_bytes);
  segment.bytes_ = kHeaderBytes + ranks * segment.region_bytes_;
  segment.linked_ = creator;
  if (creator && ::ftruncate(fd, static_cast<off_t>(segment.bytes_)) != 0) system_error("ftruncate " + name);
  if (!creator) {
    struct stat info {};
    if (::fstat(fd, &info) != 0) system_error("fstat " + name);
    ONEBIT_CHECK(static_cast<std::size_t>(info.st_size) == segment.bytes_, ONEBIT_MISMATCH, "shared memory: ", name,
                 " has ", info.st_size, " bytes; this rank expects ", segment.bytes_);
  }
  void* base = ::mmap(nullptr, segment.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) system_error("mmap " + name);
  segment.base_ = static_cast<std::uint8_t*>(base);
  // The header page is reserved here by whoever touches it first; the creator does, before the
  // name leaves this process.
  if (creator) {
    if (::posix_fallocate(fd, 0, kHeaderBytes) != 0) system_error("fallocate " + name);
    Header* h = new (segment.base_) Header();
    h->magic = kMagic;
    h->ranks = ranks;
  } else {
    ONEBIT_CHECK(segment.header()->magic == kMagic && segment.header()->ranks == ranks, ONEBIT_MISMATCH,
                 "shared memory: ", name, " is not a host segment for ", ranks, " ranks");
  }
  return segment;
}

HostSegment HostSegment::create(int ranks, std::size_t region_bytes) {
  std::random_device entropy;
  char name[64];
  std::snprintf(name, sizeof(name), "/onebit-%d-%08x%08x", static_cast<int>(::getpid()), entropy(), entropy());
  const int fd = ::shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) system_error(std::string("shm_open ") + name);
  try {
    return map(fd, name, ranks, region_bytes, true);
  } catch (...) {
    ::shm_unlink(name);
    ::close(fd);
    throw;
  }
}

HostSegment HostSegment::open(const std::string& name, int ranks, std::size_t region_bytes) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) system_error("shm_open " + name);
  try {
    return map(fd, name, ranks, region_bytes, false);
  } catch (...) {
    ::close(fd);
    throw;
  }
}

HostSegment::HostSegment(HostSegment&& other) noexcept { *this = std::move(other); }

HostSegment& HostSegment::operator=(HostSegment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = other.bytes_;
    region_bytes_ = other.region_bytes_;
    ranks_ = other.ranks_;
    fd_ = std::exchange(other.fd_, -1);
    linked_ = std::exchange(other.linked_, false);
  }
  return *this;
}

HostSegment::~HostSegment() { release(); }

void HostSegment::release() {
  if (linked_) ::shm_unlink(name_.c_str());
  if (base_ != nullptr) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
  base_ = nullptr;
  fd_ = -1;
  linked_ = false;
}

HostSegment::Header* HostSegment::header() const { return reinterpret_cast<Header*>(base_); }

void HostSegment::reserve(int writer, std::size_t offset, std::size_t bytes) {
  if (bytes == 0) return;
  const int error = ::posix_fallocate(fd_, static_cast<off_t>(kHeaderBytes + writer * region_bytes_ + offset),
                                      static_cast<off_t>(bytes));
  if (error != 0) {
    errno = error;
    system_error("reserving " + std::to_string(bytes) + " bytes of " + name_ + " (is /dev/shm big enough?)");
  }
}

void HostSegment::unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

std::uint8_t* HostSegment::region(int writer) const { return base_ + kHeaderBytes + writer * region_bytes_; }

void HostSegment::set_pid(int writer, pid_t pid) { header()->pids[writer] = static_cast<std::int32_t>(pid); }

void HostSegment::publish(int writer, int reader, std::uint32_t count) {
  std::atomic<std::uint32_t>& word = header()->ready[writer][reader].value;
  word.store(count, std::memory_order_release);
  futex(&word, FUTEX_WAKE, INT32_MAX, nullptr);
}

void HostSegment::abort(int rank) {
  if (!mapped()) return;
  header()->aborted.value.store(static_cast<std::uint32_t>(rank) + 1, std::memory_order_release);
  for (int w = 0; w < ranks_; ++w) {
    for (int r = 0; r < ranks_; ++r) futex(&header()->ready[w][r].value, FUTEX_WAKE, INT32_MAX, nullptr);
  }
}

void HostSegment::wait(int writer, int reader, std::uint32_t count, Deadline deadline, int writer_rank,
                       const std::string& describe) const {
  std::atomic<std::uint32_t>& word = header()->ready[writer][reader].value;
  // Counters wrap: "at least count" is a signed difference.
  auto arrived = [&](std::uint32_t seen) { return static_cast<std::int32_t>(seen - count) >= 0; };
  for (int spin = 0; spin < 256; ++spin) {  // a block is usually a few hundred microseconds away
    if (arrived(word.load(std::memory_order_acquire))) return;
  }
  for (;;) {
    const std::uint32_t seen = word.load(std::memory_order_acquire);
    if (arrived(seen)) return;
    const std::uint32_t aborted = header()->aborted.value.load(std::memory_order_acquire);
    ONEBIT_CHECK(aborted == 0, ONEBIT_REMOTE_ERROR, "rank ", aborted - 1,
                 " on this host failed its call while this "
                 "rank waited for ",
                 describe);
    const pid_t pid = header()->pids[writer];
    ONEBIT_CHECK(pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH, ONEBIT_REMOTE_ERROR, "rank ", writer_rank,
                 " (process ", pid, " on this host) has exited while this rank waited for ", describe);
    const auto now = Clock::now();
    ONEBIT_CHECK(now < deadline, ONEBIT_TIMEOUT, "rank ", writer_rank, " did not send ", describe,
                 " within the timeout");
    // Sleep on the word, but wake often enough to notice a dead writer quickly.
    const auto slice = std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(50));
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
    const timespec timeout{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    futex(&word, FUTEX_WAIT, seen, &timeout);
  }
}

}  // namespace onebit::transport::shm
