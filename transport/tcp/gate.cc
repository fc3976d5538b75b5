#include "transport/tcp/gate.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/log.h"

namespace onebit::transport::tcp {
Gate::Gate(int listen_fd, std::size_t record_size, std::chrono::milliseconds grace, std::string owner)
    : listen_fd_(listen_fd), record_size_(record_size), grace_(grace), owner_(std::move(owner)) {}

Gate::~Gate() = default;

void Gate::drop(std::size_t index, const std::string& why, bool quiet) {
  if (quiet) {
    ONEBIT_LOG(INFO, owner_, ": closed a ", pending_[index].who, ": ", why);
  } else {
    ONEBIT_LOG(WARN, owner_, ": closed a ", pending_[index].who, ": ", why);
  }
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(index));
}

void Gate::accept_waiting() {
  while (pending_.size() < kMaxPending) {
    Fd fd(::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // Out of descriptors or buffers, or one of the network errors accept(2) passes on from the
      // connection: nothing about the listener. Leave the rest in the backlog until the next turn.
      ONEBIT_LOG(WARN, owner_, ": accept: ", errno_text(errno), "; trying again shortly");
      accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
      return;
    }
    admit(std::move(fd));
  }
}

void Gate::adopt(std::vector<Fd> accepted) {
  for (Fd& fd : accepted) {
    set_nonblocking(fd.get());
    admit(std::move(fd));
  }
}

void Gate::admit(Fd fd) {
  Pending p;
  p.who = "connection from " + peer_address(fd.get()).to_string();
  p.until = Clock::now() + grace_;
  p.record.resize(record_size_);
  if (greeting_) {
    p.greeting = greeting_();
    // A fresh socket's send buffer takes a greeting of a few hundred bytes whole.
    const ssize_t sent = ::send(fd.get(), p.greeting.data(), p.greeting.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent != static_cast<ssize_t>(p.greeting.size())) {  // gone already: a check that it listens
      ONEBIT_LOG(INFO, owner_, ": closed a ", p.who, ": could not send it the greeting (", errno_text(errno), ")");
      return;
    }
  }
  p.fd = std::move(fd);
  pending_.push_back(std::move(p));
}

bool Gate::read_some(Pending& p) {
  while (p.have < record_size_) {
    const ssize_t n = ::recv(p.fd.get(), p.record.data() + p.have, record_size_ - p.have, MSG_DONTWAIT);
    if (n > 0) {
      p.have += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    fail(ONEBIT_REMOTE_ERROR, n == 0 ? "it closed" : "it failed (" + errno_text(errno) + ")", " after ", p.have,
         " of the ", record_size_, " bytes of its hello");
  }
  return true;
}

std::optional<Gate::Arrival> Gate::next(Deadline deadline) {
  // The listener must not block: accept4 drains it until EAGAIN.
  const int flags = ::fcntl(listen_fd_, F_GETFL);
  if (flags >= 0 && !(flags & O_NONBLOCK)) ::fcntl(listen_fd_, F_SETFL, flags | O_NONBLOCK);
  for (;;) {
    const Deadline now = Clock::now();
    for (std::size_t i = 0; i < pending_.size();) {
      if (pending_[i].until <= now) {
        drop(i, "sent no complete hello within " + std::to_string(grace_.count()) + " ms");
      } else {
        ++i;
      }
    }
    if (now >= deadline) return std::nullopt;
    std::vector<pollfd> fds(1 + pending_.size());
    fds[0] = {listen_fd_, POLLIN, 0};
    Deadline wake = deadline;
    for (std::size_t i = 0; i < pending_.size(); ++i) {
      fds[1 + i] = {pending_[i].fd.get(), POLLIN, 0};
      wake = std::min(wake, pending_[i].until);
    }
    // While kMaxPending connections wait, new ones stay in the kernel's backlog: a flood delays,
    // but never pushes out, a rank whose hello is on its way.
    if (pending_.size() >= kMaxPending || now < accept_paused_until_) {
      fds[0].events = 0;
      if (now < accept_paused_until_) wake = std::min(wake, accept_paused_until_);
    }
    const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1;
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(wait_ms, 1000)));
    if (ready < 0 && errno != EINTR) fail(ONEBIT_SYSTEM_ERROR, owner_, ": poll: ", errno_text(errno));
    if (ready <= 0) continue;
    // Pending connections first (indices shift once one leaves, so walk from the back).
    for (std::size_t i = pending_.size(); i-- > 0;) {
      if (fds[1 + i].revents == 0) continue;
      try {
        if (!read_some(pending_[i])) continue;
      } catch (const Error& error) {
        drop(i, error.what(), pending_[i].have == 0);
        continue;
      }
      Pending done = std::move(pending_[i]);
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      const int fd_flags = ::fcntl(done.fd.get(), F_GETFL);
      ::fcntl(done.fd.get(), F_SETFL, fd_flags & ~O_NONBLOCK);
      return Arrival{std::move(done.fd), std::move(done.greeting), std::move(done.record), std::move(done.who)};
    }
    if (fds[0].revents & POLLIN) accept_waiting();
  }
}

}  // namespace onebit::transport::tcp
