#include "transport/tcp/root_listener.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/log.h"

namespace onebit::transport::tcp {
namespace {

// At most this many early connections are kept open at once; beyond them new ones wait in the
// kernel's backlog, as they would without the answerer.
constexpr std::size_t kMaxEarly = 1024;

// What an accepted connection that has not been greeted shows: nothing yet (a rank waiting for the
// root's challenge, or a check whose close is on its way), a close (a check: it sent nothing), or
// bytes of its own (not a onebit rank: the root's gate refuses it).
enum class Shows { kNothing, kClose, kBytes };

Shows what_it_shows(int fd) {
  char byte;
  for (;;) {
    const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return Shows::kBytes;
    if (n == 0) return Shows::kClose;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? Shows::kNothing : Shows::kClose;
  }
}

// A listener held for its communicator, with the thread that answers the checks (root_listener.h).
class Held {
 public:
  Held(Fd listener, RootChecks checks) : listener_(std::move(listener)) {
    set_nonblocking(listener_.get());
    if (checks == RootChecks::kNotAnswered) return;
    wake_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    ONEBIT_CHECK(static_cast<bool>(wake_), ONEBIT_SYSTEM_ERROR, "eventfd: ", errno_text(errno));
    answerer_ = std::make_unique<std::thread>([this] { answer(); });
  }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  ~Held() { stop(); }

  // The listener and the early connections, once the answerer has stopped and one last sweep has
  // closed every check made before now.
  HeldRoot take() {
    stop();
    accept_queued();
    close_checks();
    HeldRoot held{std::move(listener_), {}};
    for (Early& e : early_) held.early.push_back(std::move(e.fd));
    early_.clear();
    if (checks_ > 0 || !held.early.empty()) {
      ONEBIT_LOG(INFO, "bootstrap root at ", local_address(held.listener.get()).to_string(), ": answered ", checks_,
                 " reachability check(s); ", held.early.size(), " connection(s) handed to the root");
    }
    return held;
  }

  // Stops the answerer (joins it); what it accepted stays for take().
  void stop() {
    if (!answerer_) return;
    const std::uint64_t one = 1;
    if (::write(wake_.get(), &one, sizeof(one)) < 0) {
      ONEBIT_LOG(WARN, "bootstrap root: eventfd: ", errno_text(errno));
    }
    answerer_->join();
    answerer_.reset();
  }

 private:
  struct Early {
    Fd fd;
    bool spoke = false;  // sent bytes of its own: left for the gate, no longer watched
  };

  // The answering thread: accepts, and closes the checks as their closes arrive, until woken.
  void answer() {
    Deadline paused_until{};
    for (;;) {
      std::vector<pollfd> fds{{wake_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
      if (early_.size() >= kMaxEarly || Clock::now() < paused_until) fds[1].events = 0;
      for (const Early& e : early_) fds.push_back({e.spoke ? -1 : e.fd.get(), POLLIN, 0});  // -1: not watched
      const int ready = ::poll(fds.data(), fds.size(), fds[1].events == 0 ? 100 : -1);
      if (ready < 0 && errno != EINTR) {
        ONEBIT_LOG(WARN, "bootstrap root: poll: ", errno_text(errno), "; checks wait in the backlog from now on");
        return;
      }
      if (fds[0].revents != 0) return;
      for (std::size_t i = early_.size(); ready > 0 && i-- > 0;) {
        if (fds[2 + i].revents != 0) look_at(i);
      }
      if (fds[1].revents != 0 && !accept_queued()) paused_until = Clock::now() + std::chrono::milliseconds(100);
    }
  }

  // Accepts what waits in the backlog (up to kMaxEarly kept); false when accept failed for want of
  // descriptors or buffers, to be tried again shortly.
  bool accept_queued() {
    while (early_.size() < kMaxEarly) {
      Fd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (fd) {
        early_.push_back({std::move(fd), false});
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    return true;
  }

  // Early connection `i` closed without a byte: a check, answered — closed here too. Bytes of its
  // own: left for the gate, no longer watched. Nothing yet: watched on.
  void look_at(std::size_t i) {
    const Shows shown = early_[i].spoke ? Shows::kBytes : what_it_shows(early_[i].fd.get());
    if (shown == Shows::kClose) {
      early_.erase(early_.begin() + static_cast<std::ptrdiff_t>(i));
      ++checks_;
      return;
    }
    early_[i].spoke = shown == Shows::kBytes;
  }

  void close_checks() {
    for (std::size_t i = early_.size(); i-- > 0;) look_at(i);
  }

  Fd listener_;
  Fd wake_;  // eventfd: stop() wakes the answerer with it
  std::vector<Early> early_;
  std::unique_ptr<std::thread> answerer_;
  std::size_t checks_ = 0;
};

struct Kept {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<Held>> listeners;  // by the address they are bound to
};

Kept& kept() {
  static Kept* table = new Kept;  // never destroyed: a listener taken during exit must still be found
  return *table;
}

// A fork stops every answerer for good, in both processes: the child has no such thread, and the
// parent's would take the connections meant for a child that serves the root (a launcher that
// forks its ranks after listening). From then on checks wait in the accept queue, as they did
// before there were answerers.
void stop_answering_before_fork() {
  Kept& table = kept();
  const std::lock_guard<std::mutex> lock(table.mutex);
  for (auto& [address, held] : table.listeners) held->stop();
}

}  // namespace

Address open_root_listener(const Address& where, RootChecks checks) {
  static std::once_flag fork_handler;
  std::call_once(fork_handler, [] { ::pthread_atfork(stop_answering_before_fork, nullptr, nullptr); });
  Fd listener = listen_on(where, 1024);
  const Address bound = local_address(listener.get());
  auto held = std::make_unique<Held>(std::move(listener), checks);
  Kept& table = kept();
  const std::lock_guard<std::mutex> lock(table.mutex);
  table.listeners[bound.to_string()] = std::move(held);
  return bound;
}

HeldRoot take_root_listener(const Address& root) {
  std::unique_ptr<Held> held;
  {
    Kept& table = kept();
    const std::lock_guard<std::mutex> lock(table.mutex);
    const auto found = table.listeners.find(root.to_string());
    if (found == table.listeners.end()) return {};
    held = std::move(found->second);
    table.listeners.erase(found);
  }
  return held->take();
}

void close_root_listeners() {
  std::map<std::string, std::unique_ptr<Held>> closing;
  {
    Kept& table = kept();
    const std::lock_guard<std::mutex> lock(table.mutex);
    closing.swap(table.listeners);
  }
}

}  // namespace onebit::transport::tcp
