// libnccl-net-onebit.so through its ABI, as NCCL loads and drives it: dlopen, the exported tables
// of every version, then two processes doing what NCCL's proxy does — listen, connect and accept
// with retries, up to 32 outstanding isend/irecv per comm, grouped receives, sizes from 0 to 1 GiB,
// close — with every byte checked. Plus failures: a peer killed mid-transfer, a forged handle,
// CUDA memory on a host-only network.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdarg>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "plugin/nccl_net/nccl_net_abi.h"
#include "tests/support/multiprocess.h"
#include "transport/tcp/connection.h"
#include "transport/tcp/net_comm.h"

namespace onebit::testing {
namespace {

// Every WARN line the plugin gave this process, in order (tests check what the messages name).
std::vector<std::string>& warnings() {
  static std::vector<std::string> lines;
  return lines;
}

bool warned(const std::string& text) {
  for (const std::string& line : warnings()) {
    if (line.find(text) != std::string::npos) return true;
  }
  return false;
}

// Every INFO line, in order.
std::vector<std::string>& infos() {
  static std::vector<std::string> lines;
  return lines;
}

void quiet_logger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  if (level != NCCL_LOG_WARN && level != NCCL_LOG_INFO) return;
  char line[2048];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(line, sizeof(line), fmt, args);
  va_end(args);
  if (level == NCCL_LOG_INFO) {
    infos().push_back(line);
    return;
  }
  std::fprintf(stderr, "[nccl logger] %s\n", line);
  warnings().push_back(line);
}

void* plugin_library() {
  static void* library = dlopen(ONEBIT_NCCL_NET_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  return library;
}

template <typename Table>
const Table* table(const char* symbol) {
  void* library = plugin_library();
  return library == nullptr ? nullptr : static_cast<const Table*>(dlsym(library, symbol));
}

// The byte at offset i of message `id`: every message different, every offset checked.
inline std::uint8_t pattern(std::size_t id, std::size_t i) {
  return static_cast<std::uint8_t>((i * 131 + id * 7919) >> 3);
}

void fill(std::vector<std::uint8_t>& buffer, std::size_t id, std::size_t size) {
  for (std::size_t i = 0; i < size; ++i) buffer[i] = pattern(id, i);
}

bool intact(const std::vector<std::uint8_t>& buffer, std::size_t id, std::size_t size) {
  for (std::size_t i = 0; i < size; ++i) {
    if (buffer[i] != pattern(id, i)) {
      std::fprintf(stderr, "message %zu: byte %zu of %zu is %d, expected %d\n", id, i, size, buffer[i], pattern(id, i));
      return false;
    }
  }
  return true;
}

// A pipe for the handle, the way NCCL's bootstrap carries it from the listener to the connector.
struct HandlePipe {
  int fds[2];
  HandlePipe() { EXPECT_EQ(::pipe(fds), 0); }
  ~HandlePipe() { ::close(fds[0]), ::close(fds[1]); }
  void send(const char* handle) {
    EXPECT_EQ(::write(fds[1], handle, NCCL_NET_HANDLE_MAXSIZE), (ssize_t)NCCL_NET_HANDLE_MAXSIZE);
  }
  bool receive(char* handle) {
    return ::read(fds[0], handle, NCCL_NET_HANDLE_MAXSIZE) == (ssize_t)NCCL_NET_HANDLE_MAXSIZE;
  }
};

// Polls a request to completion as NCCL's proxy does; the result of the first failing test().
ncclResult_t wait(const ncclNet_v11_t* net, void* request, int* sizes) {
  int done = 0;
  while (!done) {
    const ncclResult_t r = net->test(request, &done, sizes);
    if (r != ncclSuccess) return r;
  }
  return ncclSuccess;
}

using Side = std::function<int(const ncclNet_v11_t* net, void* ctx, HandlePipe& pipe)>;

// The receiver (rank 0) and the sender (rank 1) as two processes, each with the v11 table
// initialized, and a pipe to carry the handle from the first to the second.
void run_pair(const Side& receiver, const Side& sender, int sender_exit = 0,
              std::chrono::seconds deadline = std::chrono::seconds(120)) {
  HandlePipe pipe;
  auto outcomes = run_ranks(
      2,
      [&](int rank) -> int {
        const auto* net = table<ncclNet_v11_t>("ncclNetPlugin_v11");
        void* ctx = nullptr;
        RANK_FAILS_IF(net == nullptr || net->init(&ctx, 7, nullptr, quiet_logger, nullptr) != ncclSuccess, 2);
        return rank == 0 ? receiver(net, ctx, pipe) : sender(net, ctx, pipe);
      },
      deadline);
  EXPECT_EQ(outcomes[0].exit_code, 0) << "receiver";
  EXPECT_EQ(outcomes[1].exit_code, sender_exit) << "sender";
}

// Listens, hands the handle over and accepts with retries, as NCCL does; null on failure.
void* accept_one(const ncclNet_v11_t* net, void* ctx, HandlePipe& pipe, void** listen_comm) {
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  if (net->listen(ctx, 0, handle, listen_comm) != ncclSuccess) return nullptr;
  pipe.send(handle);
  void* recv_comm = nullptr;
  while (recv_comm == nullptr) {
    if (net->accept(*listen_comm, &recv_comm, nullptr) != ncclSuccess) return nullptr;
  }
  return recv_comm;
}

// Closes what accept_one opened; false if either close fails.
bool close_receiver(const ncclNet_v11_t* net, void* recv_comm, void* listen_comm) {
  return net->closeRecv(recv_comm) == ncclSuccess && net->closeListen(listen_comm) == ncclSuccess;
}

// Connects with retries to `handle`; null on failure.
void* connect_to(const ncclNet_v11_t* net, void* ctx, char* handle) {
  void* send_comm = nullptr;
  while (send_comm == nullptr) {
    if (net->connect(ctx, 0, handle, &send_comm, nullptr) != ncclSuccess) return nullptr;
  }
  return send_comm;
}

TEST(NcclNetPlugin, ExportsEveryVersionWithCompleteTables) {
  ASSERT_NE(plugin_library(), nullptr) << dlerror();
  const auto* v8 = table<ncclNet_v8_t>("ncclNetPlugin_v8");
  const auto* v9 = table<ncclNet_v9_t>("ncclNetPlugin_v9");
  const auto* v10 = table<ncclNet_v10_t>("ncclNetPlugin_v10");
  const auto* v11 = table<ncclNet_v11_t>("ncclNetPlugin_v11");
  ASSERT_TRUE(v8 && v9 && v10 && v11);
  EXPECT_EQ(table<void>("ncclNetPlugin_v7"), nullptr) << "v7 is not offered";
  auto complete = [](const void* t, std::size_t bytes, const char* name) {
    const auto* entries = static_cast<void* const*>(t);
    EXPECT_STREQ(static_cast<const char*>(entries[0]), "onebit") << name;
    for (std::size_t i = 1; i < bytes / sizeof(void*); ++i) EXPECT_NE(entries[i], nullptr) << name << " entry " << i;
  };
  complete(v8, sizeof(*v8), "v8");
  complete(v9, sizeof(*v9), "v9");
  complete(v10, sizeof(*v10), "v10");
  complete(v11, sizeof(*v11), "v11");

  void* ctx = nullptr;
  ncclNetCommConfig_t config{-1};
  ASSERT_EQ(v11->init(&ctx, 42, &config, quiet_logger, nullptr), ncclSuccess);
  ASSERT_EQ(v8->init(quiet_logger), ncclSuccess);  // a second init is harmless
  int ndev = 0;
  ASSERT_EQ(v11->devices(&ndev), ncclSuccess);
  ASSERT_GE(ndev, 1);
  ncclNetProperties_v11_t p11;
  ASSERT_EQ(v11->getProperties(0, &p11), ncclSuccess);
  EXPECT_NE(p11.name, nullptr);
  EXPECT_EQ(p11.ptrSupport, NCCL_PTR_HOST) << "host memory only: CUDA memory must not be claimed";
  EXPECT_EQ(p11.maxRecvs, 8);
  EXPECT_GT(p11.speed, 0);
  EXPECT_EQ(p11.maxMultiRequestSize, 1);
  EXPECT_EQ(p11.vProps.ndevs, 1);
  EXPECT_EQ(p11.netDeviceType, NCCL_NET_DEVICE_HOST);
  ncclNetProperties_v9_t p9;
  ASSERT_EQ(v9->getProperties(0, &p9), ncclSuccess);
  EXPECT_EQ(p9.maxP2pBytes, p11.maxP2pBytes);
  EXPECT_STREQ(p9.name, p11.name);
  ncclNetProperties_v8_t p8;
  ASSERT_EQ(v8->getProperties(0, &p8), ncclSuccess);
  EXPECT_EQ(p8.speed, p11.speed);
  EXPECT_EQ(p8.maxRecvs, 8);
  EXPECT_EQ(v11->getProperties(ndev, &p11), ncclInvalidArgument) << "a device that does not exist";
  int vdev = -1;
  ncclNetVDeviceProps_t one{1, {0}};
  EXPECT_EQ(v11->makeVDevice(&vdev, &one), ncclSuccess);
  EXPECT_EQ(vdev, 0);
  ncclNetVDeviceProps_t two{2, {0, 0}};
  EXPECT_EQ(v11->makeVDevice(&vdev, &two), ncclInvalidArgument);
  EXPECT_EQ(v11->finalize(ctx), ncclSuccess);
}

// The receiving side (rank 0) and the sending side (rank 1) of the proxy-style exchange.
TEST(NcclNetPlugin, TwoProcessesExchangeEverySizeAndPattern) {
  const std::vector<std::size_t> sizes = {0, 1, 7, 4096, 65535, 65536, (1u << 20) + 3, (64u << 20) + 5, 1u << 30};
  constexpr int kOutstanding = 32;
  constexpr std::size_t kOutstandingBytes = 300000;
  const int tags[4] = {10, 11, 12, 13};
  const std::size_t multi_sizes[4] = {100, 0, 250000, 3};
  auto receiver = [&](const ncclNet_v11_t* net, void* ctx, HandlePipe& pipe) -> int {
    void* mh = nullptr;
    void* listen_comm = nullptr;
    void* recv_comm = accept_one(net, ctx, pipe, &listen_comm);
    RANK_FAILS_IF(recv_comm == nullptr, 4);
    std::vector<std::uint8_t> buffer(1u << 30);
    RANK_FAILS_IF(net->regMr(recv_comm, buffer.data(), buffer.size(), NCCL_PTR_HOST, &mh) != ncclSuccess, 5);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      void* data = buffer.data();
      std::size_t capacity = buffer.size();
      int tag = 1;
      void* request = nullptr;
      RANK_FAILS_IF(net->irecv(recv_comm, 1, &data, &capacity, &tag, &mh, nullptr, &request) != ncclSuccess || !request,
                    6);
      int got = -1;
      RANK_FAILS_IF(wait(net, request, &got) != ncclSuccess, 7);
      RANK_FAILS_IF(got != static_cast<int>(sizes[k]) || !intact(buffer, k, sizes[k]), 8);
    }
    // 32 receives outstanding at once, then completed in any order.
    std::vector<std::vector<std::uint8_t>> many(kOutstanding, std::vector<std::uint8_t>(kOutstandingBytes));
    std::vector<void*> requests(kOutstanding);
    for (int i = 0; i < kOutstanding; ++i) {
      void* data = many[i].data();
      std::size_t capacity = kOutstandingBytes;
      int tag = 5;
      if (net->irecv(recv_comm, 1, &data, &capacity, &tag, &mh, nullptr, &requests[i]) != ncclSuccess || !requests[i])
        return 9;
    }
    for (int i = kOutstanding - 1; i >= 0; --i) {
      int got = -1;
      RANK_FAILS_IF(wait(net, requests[i], &got) != ncclSuccess || got != static_cast<int>(kOutstandingBytes), 10);
      RANK_FAILS_IF(!intact(many[i], 1000 + i, kOutstandingBytes), 11);
    }
    // One grouped receive of 4 tagged messages.
    std::vector<std::vector<std::uint8_t>> parts(4, std::vector<std::uint8_t>(300000));
    void* datas[4];
    std::size_t capacities[4];
    int group_tags[4];
    void* handles[4] = {mh, mh, mh, mh};
    for (int i = 0; i < 4; ++i) datas[i] = parts[i].data(), capacities[i] = 300000, group_tags[i] = tags[i];
    void* request = nullptr;
    RANK_FAILS_IF(net->irecv(recv_comm, 4, datas, capacities, group_tags, handles, nullptr, &request) != ncclSuccess,
                  12);
    int got[4] = {-1, -1, -1, -1};
    RANK_FAILS_IF(wait(net, request, got) != ncclSuccess, 13);
    for (int i = 0; i < 4; ++i) {
      RANK_FAILS_IF(got[i] != static_cast<int>(multi_sizes[i]) || !intact(parts[i], 2000 + i, multi_sizes[i]), 14);
    }
    void* flush = &flush;
    RANK_FAILS_IF(net->iflush(recv_comm, 1, datas, got, handles, &flush) != ncclSuccess || flush != nullptr, 15);
    RANK_FAILS_IF(net->deregMr(recv_comm, mh) != ncclSuccess, 16);
    RANK_FAILS_IF(!close_receiver(net, recv_comm, listen_comm), 17);
    return net->finalize(ctx) == ncclSuccess ? 0 : 18;
  };
  auto sender = [&](const ncclNet_v11_t* net, void* ctx, HandlePipe& pipe) -> int {
    char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
    void* mh = nullptr;
    RANK_FAILS_IF(!pipe.receive(handle), 20);
    void* send_comm = connect_to(net, ctx, handle);
    RANK_FAILS_IF(send_comm == nullptr, 21);
    std::vector<std::uint8_t> buffer(1u << 30);
    RANK_FAILS_IF(net->regMr(send_comm, buffer.data(), buffer.size(), NCCL_PTR_HOST, &mh) != ncclSuccess, 22);
    RANK_FAILS_IF(net->regMr(send_comm, buffer.data(), buffer.size(), NCCL_PTR_CUDA, &mh) != ncclInvalidArgument, 23);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      fill(buffer, k, sizes[k]);
      void* request = nullptr;
      RANK_FAILS_IF(net->isend(send_comm, buffer.data(), sizes[k], 1, mh, nullptr, &request) != ncclSuccess || !request,
                    24);
      int sent = -1;
      RANK_FAILS_IF(wait(net, request, &sent) != ncclSuccess || sent != static_cast<int>(sizes[k]), 25);
    }
    std::vector<std::vector<std::uint8_t>> many(kOutstanding, std::vector<std::uint8_t>(kOutstandingBytes));
    std::vector<void*> requests(kOutstanding);
    for (int i = 0; i < kOutstanding; ++i) {
      fill(many[i], 1000 + i, kOutstandingBytes);
      if (net->isend(send_comm, many[i].data(), kOutstandingBytes, 5, mh, nullptr, &requests[i]) != ncclSuccess ||
          !requests[i])
        return 26;
    }
    void* extra = &extra;  // a 33rd request: no slot, so NULL (NCCL retries later)
    RANK_FAILS_IF(net->isend(send_comm, many[0].data(), 1, 5, mh, nullptr, &extra) != ncclSuccess || extra != nullptr,
                  27);
    for (int i = 0; i < kOutstanding; ++i) {
      RANK_FAILS_IF(wait(net, requests[i], nullptr) != ncclSuccess, 28);
    }
    std::vector<std::vector<std::uint8_t>> parts(4, std::vector<std::uint8_t>(300000));
    std::vector<void*> part_requests(4);
    for (int i = 0; i < 4; ++i) {
      fill(parts[i], 2000 + i, multi_sizes[i]);
      if (net->isend(send_comm, parts[i].data(), multi_sizes[i], tags[i], mh, nullptr, &part_requests[i]) !=
          ncclSuccess)
        return 29;
    }
    for (void* r : part_requests) {
      RANK_FAILS_IF(wait(net, r, nullptr) != ncclSuccess, 30);
    }
    RANK_FAILS_IF(net->closeSend(send_comm) != ncclSuccess, 31);
    return net->finalize(ctx) == ncclSuccess ? 0 : 32;
  };
  run_pair(receiver, sender, 0, std::chrono::seconds(300));
}

TEST(NcclNetPlugin, Version8AdaptersCarryIntSizes) {
  HandlePipe pipe;
  auto outcomes = run_ranks(2, [&](int rank) -> int {
    const auto* net = table<ncclNet_v8_t>("ncclNetPlugin_v8");
    RANK_FAILS_IF(net == nullptr || net->init(quiet_logger) != ncclSuccess, 2);
    char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
    std::vector<std::uint8_t> buffer(1 << 20);
    void* mh = nullptr;
    if (rank == 0) {
      void *listen_comm = nullptr, *recv_comm = nullptr;
      RANK_FAILS_IF(net->listen(0, handle, &listen_comm) != ncclSuccess, 3);
      pipe.send(handle);
      while (recv_comm == nullptr) {
        RANK_FAILS_IF(net->accept(listen_comm, &recv_comm, nullptr) != ncclSuccess, 4);
      }
      net->regMr(recv_comm, buffer.data(), buffer.size(), NCCL_PTR_HOST, &mh);
      void* data = buffer.data();
      int capacity = 1 << 20, tag = 3, done = 0, got = -1;
      void* request = nullptr;
      // Nine buffers, one more than maxRecvs: the message must say so, not "NULL".
      RANK_FAILS_IF(net->irecv(recv_comm, 9, &data, &capacity, &tag, &mh, &request) != ncclInvalidArgument, 8);
      RANK_FAILS_IF(!warned("irecv of 9 buffers; this plugin groups 1 to 8"), 9);
      RANK_FAILS_IF(net->irecv(recv_comm, 1, &data, &capacity, &tag, &mh, &request) != ncclSuccess, 5);
      while (!done) {
        RANK_FAILS_IF(net->test(request, &done, &got) != ncclSuccess, 6);
      }
      RANK_FAILS_IF(got != 777777 || !intact(buffer, 9, 777777), 7);
      net->closeRecv(recv_comm);
      net->closeListen(listen_comm);
      return 0;
    }
    RANK_FAILS_IF(!pipe.receive(handle), 10);
    void* send_comm = nullptr;
    while (send_comm == nullptr) {
      RANK_FAILS_IF(net->connect(0, handle, &send_comm, nullptr) != ncclSuccess, 11);
    }
    fill(buffer, 9, 777777);
    void* request = nullptr;
    int done = 0;
    RANK_FAILS_IF(net->isend(send_comm, buffer.data(), -1, 3, mh, &request) != ncclInvalidArgument, 12);
    RANK_FAILS_IF(net->isend(send_comm, buffer.data(), 777777, 3, mh, &request) != ncclSuccess, 13);
    while (!done) {
      RANK_FAILS_IF(net->test(request, &done, nullptr) != ncclSuccess, 14);
    }
    return net->closeSend(send_comm) == ncclSuccess ? 0 : 15;
  });
  EXPECT_EQ(outcomes[0].exit_code, 0) << "receiver";
  EXPECT_EQ(outcomes[1].exit_code, 0) << "sender";
}

// Measured, not modelled: each comm counts the payload bytes and messages it finished, says so at
// close in NCCL's log, and appends a line to ONEBIT_NET_STATS_FILE (%p: one file per process).
TEST(NcclNetPlugin, CountsBytesAndMessagesPerComm) {
  const std::vector<std::size_t> sizes = {0, 1, 1000, 200000, 1u << 20};
  const std::size_t group_sizes[2] = {300, 5000};
  const std::string expected = "bytes=1254877 messages=7";  // the sum of all seven, each buffer a message
  char dir[] = "/tmp/onebit-net-stats-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string pattern = std::string(dir) + "/stats-%p.txt";
  ::setenv("ONEBIT_NET_STATS_FILE", pattern.c_str(), 1);  // read at the children's first close
  auto said = [&](const char* call) {
    for (const std::string& line : infos()) {
      if (line.find(std::string(call) + " peer=") != std::string::npos && line.find(expected) != std::string::npos)
        return true;
    }
    return false;
  };
  auto receiver = [&](const ncclNet_v11_t* net, void* ctx, HandlePipe& pipe) -> int {
    void* listen_comm = nullptr;
    void* recv_comm = accept_one(net, ctx, pipe, &listen_comm);
    RANK_FAILS_IF(recv_comm == nullptr, 4);
    std::vector<std::uint8_t> buffer(1u << 20), second(8192);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      void* data = buffer.data();
      std::size_t capacity = buffer.size();
      int tag = static_cast<int>(k), got = -1;
      void* request = nullptr;
      RANK_FAILS_IF(net->irecv(recv_comm, 1, &data, &capacity, &tag, nullptr, nullptr, &request) != ncclSuccess, 5);
      RANK_FAILS_IF(wait(net, request, &got) != ncclSuccess || got != static_cast<int>(sizes[k]), 6);
    }
    void* datas[2] = {buffer.data(), second.data()};
    std::size_t capacities[2] = {buffer.size(), second.size()};
    int tags[2] = {10, 11}, got[2] = {-1, -1};
    void* request = nullptr;
    RANK_FAILS_IF(net->irecv(recv_comm, 2, datas, capacities, tags, nullptr, nullptr, &request) != ncclSuccess, 7);
    RANK_FAILS_IF(wait(net, request, got) != ncclSuccess || got[0] != 300 || got[1] != 5000, 8);
    RANK_FAILS_IF(!close_receiver(net, recv_comm, listen_comm), 9);
    RANK_FAILS_IF(!said("closeRecv"), 10);
    return net->finalize(ctx) == ncclSuccess ? 0 : 11;
  };
  auto sender = [&](const ncclNet_v11_t* net, void* ctx, HandlePipe& pipe) -> int {
    char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
    RANK_FAILS_IF(!pipe.receive(handle), 20);
    void* send_comm = connect_to(net, ctx, handle);
    RANK_FAILS_IF(send_comm == nullptr, 21);
    std::vector<std::uint8_t> buffer(1u << 20);
    for (std::size_t k = 0; k < sizes.size() + 2; ++k) {
      const std::size_t size = k < sizes.size() ? sizes[k] : group_sizes[k - sizes.size()];
      const int tag = k < sizes.size() ? static_cast<int>(k) : static_cast<int>(10 + k - sizes.size());
      void* request = nullptr;
      RANK_FAILS_IF(net->isend(send_comm, buffer.data(), size, tag, nullptr, nullptr, &request) != ncclSuccess, 22);
      RANK_FAILS_IF(wait(net, request, nullptr) != ncclSuccess, 23);
    }
    RANK_FAILS_IF(net->closeSend(send_comm) != ncclSuccess, 24);
    RANK_FAILS_IF(!said("closeSend"), 25);
    return net->finalize(ctx) == ncclSuccess ? 0 : 26;
  };
  run_pair(receiver, sender);
  ::unsetenv("ONEBIT_NET_STATS_FILE");
  // One file per process, one line per closed comm: `host:pid closeSend peer=… bytes=… messages=…`.
  std::string lines;
  const std::string listing = std::string("cat ") + dir + "/stats-*.txt";
  if (std::FILE* cat = ::popen(listing.c_str(), "r")) {
    char chunk[512];
    while (std::fgets(chunk, sizeof(chunk), cat) != nullptr) lines += chunk;
    ::pclose(cat);
  }
  std::system((std::string("rm -rf ") + dir).c_str());
  EXPECT_NE(lines.find(" closeSend peer="), std::string::npos) << lines;
  EXPECT_NE(lines.find(" closeRecv peer="), std::string::npos) << lines;
  std::size_t counted = 0;
  for (std::size_t at = lines.find(expected); at != std::string::npos; at = lines.find(expected, at + 1)) ++counted;
  EXPECT_EQ(counted, 2u) << lines;
}

TEST(NcclNetPlugin, AKilledPeerFailsTheReceiveInsteadOfHanging) {
  // The sender puts part of a 64 MiB message on the wire (as much as the socket buffers take while
  // nobody reads), says so, and is killed; only then does the receiver post its receive: it gets
  // the part, then the end of the stream.
  std::vector<std::uint8_t> buffer(64 << 20);
  HandlePipe part_sent;
  auto receiver = [&](const ncclNet_v11_t* net, void* ctx, HandlePipe& pipe) -> int {
    void* listen_comm = nullptr;
    void* recv_comm = accept_one(net, ctx, pipe, &listen_comm);
    RANK_FAILS_IF(recv_comm == nullptr, 4);
    char note[NCCL_NET_HANDLE_MAXSIZE];
    RANK_FAILS_IF(!part_sent.receive(note), 8);
    void* data = buffer.data();
    std::size_t capacity = buffer.size();
    int tag = 0;
    void* request = nullptr;
    RANK_FAILS_IF(net->irecv(recv_comm, 1, &data, &capacity, &tag, nullptr, nullptr, &request) != ncclSuccess, 5);
    RANK_FAILS_IF(wait(net, request, nullptr) != ncclRemoteError, 6);  // the peer is gone: not success, not a hang
    int done = 0;
    RANK_FAILS_IF(net->test(request, &done, nullptr) != ncclRemoteError, 7);  // and it stays failed
    return close_receiver(net, recv_comm, listen_comm) ? 0 : 19;
  };
  auto sender = [&](const ncclNet_v11_t* net, void* ctx, HandlePipe& pipe) -> int {
    char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
    RANK_FAILS_IF(!pipe.receive(handle), 10);
    void* send_comm = connect_to(net, ctx, handle);
    RANK_FAILS_IF(send_comm == nullptr, 11);
    void* request = nullptr;
    RANK_FAILS_IF(net->isend(send_comm, buffer.data(), buffer.size(), 0, nullptr, nullptr, &request) != ncclSuccess,
                  12);
    int done = 0;
    for (int i = 0; i < 100 && !done; ++i) net->test(request, &done, nullptr);  // until the buffers are full
    RANK_FAILS_IF(done, 14);  // 64 MiB cannot fit in socket buffers nobody reads
    char note[NCCL_NET_HANDLE_MAXSIZE] = "part sent";
    part_sent.send(note);
    ::kill(::getpid(), SIGKILL);
    return 13;
  };
  run_pair(receiver, sender, 128 + SIGKILL);
}

TEST(NcclNetPlugin, AForgedHandleIsRefusedAndTheRealOneStillConnects) {
  auto receiver = [&](const ncclNet_v11_t* net, void* ctx, HandlePipe& pipe) -> int {
    void* listen_comm = nullptr;
    void* recv_comm = accept_one(net, ctx, pipe, &listen_comm);  // the forged connection never completes
    RANK_FAILS_IF(recv_comm == nullptr, 4);
    std::vector<std::uint8_t> buffer(16);
    void* data = buffer.data();
    std::size_t capacity = buffer.size();
    int tag = 0, got = -1;
    void* request = nullptr;
    RANK_FAILS_IF(net->irecv(recv_comm, 1, &data, &capacity, &tag, nullptr, nullptr, &request) != ncclSuccess, 5);
    RANK_FAILS_IF(wait(net, request, &got) != ncclSuccess || got != 5 || std::memcmp(buffer.data(), "real", 5) != 0, 6);
    return close_receiver(net, recv_comm, listen_comm) ? 0 : 19;
  };
  auto sender = [&](const ncclNet_v11_t* net, void* ctx, HandlePipe& pipe) -> int {
    char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
    RANK_FAILS_IF(!pipe.receive(handle), 10);
    char garbage[NCCL_NET_HANDLE_MAXSIZE];
    std::memcpy(garbage, handle, sizeof(garbage));
    garbage[0] ^= 0x55;  // not a onebit handle at all
    void* send_comm = nullptr;
    RANK_FAILS_IF(net->connect(ctx, 0, garbage, &send_comm, nullptr) != ncclInvalidArgument, 11);
    char forged[NCCL_NET_HANDLE_MAXSIZE];
    std::memcpy(forged, handle, sizeof(forged));
    forged[28] ^= 0x01;  // the address is right, the secret is not: the listener must refuse it
    void* forged_comm = connect_to(net, ctx, forged);  // completes on this side: it only sends hellos
    send_comm = connect_to(net, ctx, handle);
    RANK_FAILS_IF(forged_comm == nullptr || send_comm == nullptr, 13);
    void* request = nullptr;
    RANK_FAILS_IF(net->isend(send_comm, const_cast<char*>("real"), 5, 0, nullptr, nullptr, &request) != ncclSuccess,
                  14);
    RANK_FAILS_IF(wait(net, request, nullptr) != ncclSuccess, 15);
    net->closeSend(forged_comm);
    return net->closeSend(send_comm) == ncclSuccess ? 0 : 16;
  };
  run_pair(receiver, sender);
}

// The body of IncompleteConnectionsAreDropped, in a process of its own started with
// ONEBIT_TIMEOUT_MS=300 (parameters are read once per process). A peer that proves itself with
// the handle's secret and then dies after one of its two sockets must not hold that socket for the
// listener's lifetime: accept drops the group after the timeout, and the socket sees the close.
TEST(NcclNetPluginInChild, DISABLED_IncompleteConnectionIsDropped) {
  const auto* net = table<ncclNet_v11_t>("ncclNetPlugin_v11");
  ASSERT_NE(net, nullptr);
  void* ctx = nullptr;
  ASSERT_EQ(net->init(&ctx, 1, nullptr, quiet_logger, nullptr), ncclSuccess);
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* listen_comm = nullptr;
  ASSERT_EQ(net->listen(ctx, 0, handle, &listen_comm), ncclSuccess);
  const transport::tcp::NetHandle h = transport::tcp::decode_handle(reinterpret_cast<const std::uint8_t*>(handle));
  ASSERT_EQ(h.sockets, 2) << "ONEBIT_SOCKETS_PER_PEER=2 for this test";
  transport::tcp::Address address;
  unsigned length = 0;
  wire::from_wire(h.address, &address.storage, &length);
  address.length = length;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  transport::tcp::Fd half = transport::tcp::connect_to(address, deadline, "the listener");
  SipKey key;
  std::memcpy(key.data(), h.secret, sizeof(h.secret));
  wire::Hello hello;
  hello.socket_index = 0;
  hello.sockets_per_peer = 2;
  hello.job_id = 77;
  const auto bytes = transport::tcp::signed_hello(hello, key);
  transport::tcp::write_all(half.get(), bytes.data(), bytes.size(), deadline, "the listener");
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() < deadline) {
    void* recv_comm = nullptr;
    ASSERT_EQ(net->accept(listen_comm, &recv_comm, nullptr), ncclSuccess);
    ASSERT_EQ(recv_comm, nullptr) << "one socket of two is no connection";
    pollfd p{half.get(), POLLIN, 0};
    if (::poll(&p, 1, 50) == 1) {
      char byte;
      closed = ::recv(half.get(), &byte, 1, 0) == 0;
    }
  }
  EXPECT_TRUE(closed) << "the listener kept the half connection open past ONEBIT_TIMEOUT_MS";
  EXPECT_TRUE(warned("dropped an incomplete connection")) << "and said so";
  EXPECT_TRUE(warned("1 of 2 sockets"));
  EXPECT_EQ(net->closeListen(listen_comm), ncclSuccess);
  EXPECT_EQ(net->finalize(ctx), ncclSuccess);
}

TEST(NcclNetPlugin, IncompleteConnectionsAreDropped) {
  auto outcomes = run_ranks(1, [](int) -> int {
    ::setenv("ONEBIT_TIMEOUT_MS", "300", 1);
    ::setenv("ONEBIT_SOCKETS_PER_PEER", "2", 1);
    ::execl("/proc/self/exe", "onebit_nccl_net_tests", "--gtest_also_run_disabled_tests",
            "--gtest_filter=NcclNetPluginInChild.DISABLED_IncompleteConnectionIsDropped", static_cast<char*>(nullptr));
    return 98;  // exec failed
  });
  EXPECT_EQ(outcomes[0].exit_code, 0);
}

}  // namespace
}  // namespace onebit::testing
