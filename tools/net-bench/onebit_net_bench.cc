// onebit-net-bench: the NCCL_NET plugin's throughput between two ranks, side by side with one
// plain TCP stream on the same link. Rank 0 receives, rank 1 sends; the plugin is dlopened and
// driven through its v11 table as NCCL's proxy drives it (8 requests in flight).
//
//   tools/ethernet/onebit-ethernet --ranks 2 --link 10gbit --bench build/release/tools/onebit-net-bench -- [--size 64M
//   --count 32]
//
// Run by onebit-ethernet it gets --host (this rank's address) and --gloo-store (a directory both
// ranks see), which it uses to pass the plugin's handle and the plain stream's port; ONEBIT_RANK
// says which side it is.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "plugin/nccl_net/nccl_net_abi.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "onebit-net-bench: %s\n", message.c_str());
  std::exit(1);
}

std::size_t parse_size(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const std::string unit = end;
  const double scale = unit == "K" ? 1024.0 : unit == "M" ? 1048576.0 : unit == "G" ? 1073741824.0 : 1.0;
  return static_cast<std::size_t>(value * scale);
}

// The store directory carries small files from one rank to the other: the writer renames a finished
// file into place; the reader waits for that rename with inotify (no polling), up to 60 s.
void put(const std::string& dir, const std::string& name, const void* data, std::size_t bytes) {
  const std::string tmp = dir + "/" + name + ".tmp";
  std::ofstream(tmp, std::ios::binary).write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (std::rename(tmp.c_str(), (dir + "/" + name).c_str()) != 0) die("rename in " + dir);
}
void get(const std::string& dir, const std::string& name, void* data, std::size_t bytes) {
  const int watch = inotify_init1(IN_CLOEXEC);
  if (watch < 0 || inotify_add_watch(watch, dir.c_str(), IN_MOVED_TO) < 0) die("inotify on " + dir);
  const auto until = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    // Checked after the watch is set, so a rename in between is not missed.
    std::ifstream in(dir + "/" + name, std::ios::binary);
    if (in && in.read(static_cast<char*>(data), static_cast<std::streamsize>(bytes))) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    pollfd p{watch, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0)
      die("the other rank did not write " + name + " within 60 s");
    alignas(inotify_event) char events[4096];
    if (::read(watch, events, sizeof(events)) < 0) die("reading inotify events");
  }
  ::close(watch);
}

void logger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  if (level != NCCL_LOG_WARN) return;
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  std::fprintf(stderr, "\n");
  va_end(args);
}

void check(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) die(std::string(what) + " failed with ncclResult " + std::to_string(result));
}

double run_plugin(const ncclNet_v11_t* net, int rank, const std::string& store, std::size_t size, int count) {
  void* ctx = nullptr;
  check(net->init(&ctx, 1, nullptr, logger, nullptr), "init");
  std::vector<char> buffer(size * 8);
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  constexpr int kInFlight = 8;
  void* requests[kInFlight] = {};
  Clock::time_point start;
  if (rank == 0) {
    void *listen_comm = nullptr, *recv_comm = nullptr;
    check(net->listen(ctx, 0, handle, &listen_comm), "listen");
    put(store, "plugin-handle", handle, sizeof(handle));
    while (recv_comm == nullptr) check(net->accept(listen_comm, &recv_comm, nullptr), "accept");
    int posted = 0, done_count = 0;
    start = Clock::now();
    while (done_count < count) {
      for (int slot = 0; slot < kInFlight; ++slot) {
        if (requests[slot] == nullptr && posted < count) {
          void* data = buffer.data() + slot * size;
          std::size_t capacity = size;
          int tag = 0;
          check(net->irecv(recv_comm, 1, &data, &capacity, &tag, nullptr, nullptr, &requests[slot]), "irecv");
          if (requests[slot] != nullptr) ++posted;
        }
        if (requests[slot] != nullptr) {
          int done = 0, got = 0;
          check(net->test(requests[slot], &done, &got), "test");
          if (done) requests[slot] = nullptr, ++done_count;
        }
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    char ack = 1;
    put(store, "plugin-done", &ack, 1);
    net->closeRecv(recv_comm);
    net->closeListen(listen_comm);
    return seconds;
  }
  get(store, "plugin-handle", handle, sizeof(handle));
  void* send_comm = nullptr;
  while (send_comm == nullptr) check(net->connect(ctx, 0, handle, &send_comm, nullptr), "connect");
  int posted = 0, done_count = 0;
  start = Clock::now();
  while (done_count < count) {
    for (int slot = 0; slot < kInFlight; ++slot) {
      if (requests[slot] == nullptr && posted < count) {
        check(net->isend(send_comm, buffer.data() + slot * size, size, 0, nullptr, nullptr, &requests[slot]), "isend");
        if (requests[slot] != nullptr) ++posted;
      }
      if (requests[slot] != nullptr) {
        int done = 0;
        check(net->test(requests[slot], &done, nullptr), "test");
        if (done) requests[slot] = nullptr, ++done_count;
      }
    }
  }
  char ack;
  get(store, "plugin-done", &ack, 1);  // the receiver has it all before the sender closes
  net->closeSend(send_comm);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double run_plain(int rank, const std::string& store, const std::string& host, std::size_t total) {
  std::vector<char> buffer(8 << 20);
  if (rank == 0) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    ::inet_pton(AF_INET, host.c_str(), &address.sin_addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 || ::listen(fd, 1) != 0)
      die("plain listen");
    socklen_t length = sizeof(address);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
    put(store, "plain-address", &address, sizeof(address));
    const int conn = ::accept(fd, nullptr, nullptr);
    std::size_t got = 0;
    Clock::time_point start = Clock::now();
    bool first = true;
    while (got < total) {
      const ssize_t n = ::recv(conn, buffer.data(), buffer.size(), 0);
      if (n <= 0) die("plain recv");
      if (first) start = Clock::now(), first = false;
      got += static_cast<std::size_t>(n);
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    ::send(conn, "k", 1, 0);
    ::close(conn);
    ::close(fd);
    return seconds;
  }
  sockaddr_in address{};
  get(store, "plain-address", &address, sizeof(address));
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) die("plain connect");
  const Clock::time_point start = Clock::now();
  std::size_t sent = 0;
  while (sent < total) {
    const ssize_t n = ::send(fd, buffer.data(), std::min(buffer.size(), total - sent), 0);
    if (n <= 0) die("plain send");
    sent += static_cast<std::size_t>(n);
  }
  char ack;
  ::recv(fd, &ack, 1, 0);
  ::close(fd);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1", store, plugin_path, link_name = "unshaped";
  std::size_t size = 64 << 20;
  int count = 16;
  double link_rate = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] { return i + 1 < argc ? std::string(argv[++i]) : (die(arg + " needs a value"), std::string()); };
    if (arg == "--host") host = value();
    else if (arg == "--gloo-store") store = value();
    else if (arg == "--link-rate") link_rate = std::stod(value());
    else if (arg == "--link-name") link_name = value();
    else if (arg == "--size") size = parse_size(value());
    else if (arg == "--count") count = std::stoi(value());
    else if (arg == "--plugin") plugin_path = value();
    else die("unknown argument " + arg);
  }
  if (store.empty()) die("--gloo-store DIR is required (onebit-ethernet passes it)");
  const char* rank_text = std::getenv("ONEBIT_RANK");
  const int rank = rank_text != nullptr ? std::atoi(rank_text) : -1;
  if (rank != 0 && rank != 1) die("ONEBIT_RANK must be 0 (receiver) or 1 (sender)");
  if (plugin_path.empty()) {
    plugin_path = std::string(argv[0]);
    plugin_path = plugin_path.substr(0, plugin_path.rfind('/') + 1) + "../libnccl-net-onebit.so";
  }
  void* library = dlopen(plugin_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) die(std::string("dlopen: ") + dlerror());
  const auto* net = static_cast<const ncclNet_v11_t*>(dlsym(library, "ncclNetPlugin_v11"));
  if (net == nullptr) die("no ncclNetPlugin_v11");

  const double total = static_cast<double>(size) * count;
  const double plugin_seconds = run_plugin(net, rank, store, size, count);
  const double plain_seconds = run_plain(rank, store, host, size * static_cast<std::size_t>(count));
  if (rank == 0) {
    const char* sockets = std::getenv("ONEBIT_SOCKETS_PER_PEER");
    const double plugin_rate = total / plugin_seconds, plain_rate = total / plain_seconds;
    std::printf("# onebit-net-bench: %d messages of %zu bytes, link %s\n", count, size, link_name.c_str());
    std::printf("#  %-34s %10s %12s %12s\n", "transfer", "GB/s", "÷ link rate", "÷ plain TCP");
    auto row = [&](const std::string& name, double rate) {
      std::printf("   %-34s %10.3f %12s %12.3f\n", name.c_str(), rate / 1e9,
                  link_rate > 0 ? std::to_string(rate * 8 / link_rate).substr(0, 5).c_str() : "-", rate / plain_rate);
    };
    row(std::string("NCCL net plugin, ") + (sockets ? sockets : "2") + " sockets", plugin_rate);
    row("one plain TCP stream", plain_rate);
  }
  return 0;
}
