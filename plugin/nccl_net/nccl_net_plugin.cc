// libnccl-net-onebit.so: onebit's TCP connections as an NCCL network (NCCL_NET_PLUGIN=onebit).
// Exports ncclNetPlugin_v8 … v11 (NCCL 2.28 tries v11 first). Every entry point runs inside
// nccl_guard (plugin/capi/nccl_guard.h): onebit::Error becomes NCCL's code by the table the ncclAllReduce
// front door uses too, with a "NET/onebit" line through NCCL's logger; nothing throws across the ABI.
//
// Memory: host only (ptrSupport = NCCL_PTR_HOST). NCCL then stages CUDA buffers through host
// memory for this network, as it does for its own socket transport; registering CUDA or DMA-BUF
// memory is refused with ncclInternalError, which is what NCCL expects from a host-only network.
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/params.h"
#include "plugin/capi/nccl_guard.h"
#include "plugin/nccl_net/nccl_net_abi.h"
#include "transport/tcp/net_comm.h"

namespace onebit::front::nccl_net {
namespace {

using namespace ::onebit::transport::tcp;  // the connections: transport/tcp/net_comm.h

struct Plugin {
  std::mutex mutex;
  ncclDebugLogger_t logger = nullptr;
  std::vector<NetDevice> devices;  // set once by init and kept: getProperties hands out their names
  bool initialized = false;
};

Plugin& plugin() {
  static Plugin* instance = new Plugin();  // leaked: NCCL may call in from its proxy thread at exit
  return *instance;
}

void log_line(ncclDebugLogLevel level, const std::string& text) {
  ncclDebugLogger_t logger = plugin().logger;
  if (logger != nullptr) {
    logger(level, NCCL_NET, __FILE__, __LINE__, "NET/onebit : %s", text.c_str());
  } else if (level == NCCL_LOG_WARN) {
    ONEBIT_LOG(WARN, "NET/onebit : ", text);
  } else {
    ONEBIT_LOG(INFO, "NET/onebit : ", text);
  }
}

// Every entry point's body runs here: one line through NCCL's logger, and the shared code table.
template <typename Body>
ncclResult_t guard(const char* call, Body&& body) {
  return nccl_guard<ncclResult_t>(
      call, [](bool warning, const std::string& text) { log_line(warning ? NCCL_LOG_WARN : NCCL_LOG_INFO, text); },
      std::forward<Body>(body));
}

const NetDevice& device_at(int dev) {
  Plugin& p = plugin();
  ONEBIT_CHECK(p.initialized, ONEBIT_INVALID_ARGUMENT, "the plugin is not initialized (init was not called)");
  ONEBIT_CHECK(dev >= 0 && dev < static_cast<int>(p.devices.size()), ONEBIT_INVALID_ARGUMENT, "device ", dev,
               " does not exist (", p.devices.size(), " devices)");
  return p.devices[dev];
}

ncclResult_t init_common(ncclDebugLogger_t logger) {
  Plugin& p = plugin();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (logger != nullptr) p.logger = logger;
  set_log_sink([](bool warning, const std::string& text) { log_line(warning ? NCCL_LOG_WARN : NCCL_LOG_INFO, text); });
  return guard("init", [&] {
    if (p.initialized) return;
    p.devices = find_devices();
    p.initialized = true;
    std::string list;
    for (std::size_t i = 0; i < p.devices.size(); ++i) {
      list +=
          (i ? ", " : "") + std::to_string(i) + ":" + p.devices[i].name + "<" + p.devices[i].address.to_string() + ">";
    }
    log_line(NCCL_LOG_INFO, "using " + list + ", " + std::to_string(param::SocketsPerPeer()) +
                                " sockets per connection (ONEBIT_SOCKETS_PER_PEER)");
  });
}

ncclResult_t net_devices(int* ndev) {
  return guard("devices", [&] {
    ONEBIT_CHECK(ndev != nullptr, ONEBIT_INVALID_ARGUMENT, "ndev is NULL");
    ONEBIT_CHECK(plugin().initialized, ONEBIT_INVALID_ARGUMENT, "the plugin is not initialized");
    *ndev = static_cast<int>(plugin().devices.size());
  });
}

// The properties every version shares, filled into the newest layout.
void fill_properties(int dev, ncclNetProperties_v11_t* props) {
  ONEBIT_CHECK(props != nullptr, ONEBIT_INVALID_ARGUMENT, "props is NULL");
  const NetDevice& d = device_at(dev);
  *props = ncclNetProperties_v11_t{};
  // NCCL reads these strings, never writes them; the device list lives as long as the process.
  props->name = const_cast<char*>(d.name.c_str());
  props->pciPath = d.pci_path.empty() ? nullptr : const_cast<char*>(d.pci_path.c_str());
  props->guid = static_cast<uint64_t>(dev);
  props->ptrSupport = NCCL_PTR_HOST;
  props->regIsGlobal = 0;
  props->forceFlush = 0;
  props->speed = d.speed_mbps;
  props->port = 0;
  props->latency = 0;  // NCCL's defaults
  props->maxComms = 65536;
  props->maxRecvs = kMaxRecvs;
  props->netDeviceType = NCCL_NET_DEVICE_HOST;
  props->netDeviceVersion = 0;
  props->vProps.ndevs = 1;
  props->vProps.devs[0] = dev;
  props->maxP2pBytes = INT32_MAX;  // test() reports sizes as int
  props->maxCollBytes = INT32_MAX;
  props->maxMultiRequestSize = 1;
}

ncclResult_t properties_v11(int dev, ncclNetProperties_v11_t* props) {
  return guard("getProperties", [&] { fill_properties(dev, props); });
}

ncclResult_t properties_v9(int dev, ncclNetProperties_v9_t* props) {
  return guard("getProperties", [&] {
    ncclNetProperties_v11_t all;
    fill_properties(dev, &all);
    ONEBIT_CHECK(props != nullptr, ONEBIT_INVALID_ARGUMENT, "props is NULL");
    std::memcpy(props, &all, sizeof(*props));  // v9's layout is v11's without the last field
  });
}

ncclResult_t properties_v8(int dev, ncclNetProperties_v8_t* props) {
  return guard("getProperties", [&] {
    ncclNetProperties_v11_t all;
    fill_properties(dev, &all);
    ONEBIT_CHECK(props != nullptr, ONEBIT_INVALID_ARGUMENT, "props is NULL");
    *props = ncclNetProperties_v8_t{all.name,        all.pciPath,  all.guid,          all.ptrSupport,
                                    all.regIsGlobal, all.speed,    all.port,          all.latency,
                                    all.maxComms,    all.maxRecvs, all.netDeviceType, all.netDeviceVersion};
  });
}

ncclResult_t net_listen(int dev, void* handle, void** listen_comm) {
  return guard("listen", [&] {
    ONEBIT_CHECK(handle != nullptr && listen_comm != nullptr, ONEBIT_INVALID_ARGUMENT, "handle or listenComm is NULL");
    auto made = std::make_unique<NetListener>(device_at(dev), static_cast<int>(param::SocketsPerPeer()));
    static_assert(kHandleBytes == NCCL_NET_HANDLE_MAXSIZE);
    encode_handle(made->handle(), static_cast<std::uint8_t*>(handle));
    log_line(NCCL_LOG_INFO, "listening on " + describe(made->handle()));
    *listen_comm = made.release();
  });
}

ncclResult_t net_connect(int dev, void* handle, void** send_comm, ncclNetDeviceHandle_t** send_dev_comm) {
  return guard("connect", [&] {
    ONEBIT_CHECK(handle != nullptr && send_comm != nullptr, ONEBIT_INVALID_ARGUMENT, "handle or sendComm is NULL");
    device_at(dev);
    ONEBIT_CHECK(send_dev_comm == nullptr || *send_dev_comm == nullptr, ONEBIT_INVALID_ARGUMENT,
                 "device offload was requested; this network is host-only");
    *send_comm = nullptr;
    NetHandle h = decode_handle(static_cast<const std::uint8_t*>(handle));
    std::unique_ptr<NetComm> comm = connect_step(h);
    encode_handle(h, static_cast<std::uint8_t*>(handle));  // the pending connect lives in NCCL's copy
    if (comm) {
      log_line(NCCL_LOG_INFO, "connected to " + comm->peer());
      *send_comm = comm.release();
    }
  });
}

ncclResult_t net_accept(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_t** recv_dev_comm) {
  return guard("accept", [&] {
    ONEBIT_CHECK(listen_comm != nullptr && recv_comm != nullptr, ONEBIT_INVALID_ARGUMENT,
                 "listenComm or recvComm is NULL");
    ONEBIT_CHECK(recv_dev_comm == nullptr || *recv_dev_comm == nullptr, ONEBIT_INVALID_ARGUMENT,
                 "device offload was requested; this network is host-only");
    *recv_comm = nullptr;
    std::unique_ptr<NetComm> comm = static_cast<NetListener*>(listen_comm)->accept();
    if (comm) {
      log_line(NCCL_LOG_INFO, "accepted a connection from " + comm->peer());
      *recv_comm = comm.release();
    }
  });
}

int memory_handle_token;  // every registration's handle: host memory needs no state

ncclResult_t reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return guard("regMr", [&] {
    ONEBIT_CHECK(comm != nullptr && mhandle != nullptr, ONEBIT_INVALID_ARGUMENT, "comm or mhandle is NULL");
    ONEBIT_CHECK(type == NCCL_PTR_HOST, ONEBIT_INVALID_ARGUMENT, "memory of type ", type, " at ", data, " (", size,
                 " bytes): this network handles host memory only (ptrSupport = NCCL_PTR_HOST)");
    *mhandle = &memory_handle_token;
  });
}

ncclResult_t reg_mr_dmabuf(void*, void*, size_t, int, uint64_t, int, void**) {
  return guard("regMrDmaBuf", [] {
    ::onebit::fail(ONEBIT_INVALID_ARGUMENT, "DMA-BUF memory: this network handles host memory only");
  });
}

ncclResult_t dereg_mr(void*, void*) { return ncclSuccess; }

ncclResult_t isend_sized(void* send_comm, void* data, size_t size, int tag, void** request) {
  return guard("isend", [&] {
    ONEBIT_CHECK(send_comm != nullptr && request != nullptr, ONEBIT_INVALID_ARGUMENT, "sendComm or request is NULL");
    ONEBIT_CHECK(data != nullptr || size == 0, ONEBIT_INVALID_ARGUMENT, "data is NULL for ", size, " bytes");
    *request = static_cast<NetComm*>(send_comm)->isend(data, size, tag);
  });
}

ncclResult_t irecv_sized(void* recv_comm, int n, void** data, const size_t* sizes, int* tags, void** request) {
  return guard("irecv", [&] {
    ONEBIT_CHECK(recv_comm != nullptr && request != nullptr && data != nullptr && sizes != nullptr,
                 ONEBIT_INVALID_ARGUMENT, "recvComm, request, data or sizes is NULL");
    ONEBIT_CHECK(n >= 1 && n <= kMaxRecvs, ONEBIT_INVALID_ARGUMENT, "irecv of ", n,
                 " buffers; this plugin groups 1 to ", kMaxRecvs, " (maxRecvs)");
    *request = static_cast<NetComm*>(recv_comm)->irecv(n, data, sizes, tags);
  });
}

ncclResult_t isend_v10(void* send_comm, void* data, size_t size, int tag, void*, void*, void** request) {
  return isend_sized(send_comm, data, size, tag, request);
}
ncclResult_t isend_v9(void* send_comm, void* data, size_t size, int tag, void*, void** request) {
  return isend_sized(send_comm, data, size, tag, request);
}
ncclResult_t isend_v8(void* send_comm, void* data, int size, int tag, void*, void** request) {
  if (size < 0) return guard("isend", [&] { ::onebit::fail(ONEBIT_INVALID_ARGUMENT, "size ", size, " is negative"); });
  return isend_sized(send_comm, data, static_cast<size_t>(size), tag, request);
}

ncclResult_t irecv_v10(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void**, void**, void** request) {
  return irecv_sized(recv_comm, n, data, sizes, tags, request);
}
ncclResult_t irecv_v9(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void**, void** request) {
  return irecv_sized(recv_comm, n, data, sizes, tags, request);
}
ncclResult_t irecv_v8(void* recv_comm, int n, void** data, int* sizes, int* tags, void**, void** request) {
  size_t wide[kMaxRecvs];
  // Out of range or NULL: irecv_sized names the problem.
  if (n < 1 || n > kMaxRecvs || sizes == nullptr)
    return irecv_sized(recv_comm, n, data, sizes == nullptr ? nullptr : wide, tags, request);
  for (int i = 0; i < n; ++i) wide[i] = sizes[i] < 0 ? 0 : static_cast<size_t>(sizes[i]);
  return irecv_sized(recv_comm, n, data, wide, tags, request);
}

ncclResult_t iflush(void*, int, void**, int*, void**, void** request) {
  if (request != nullptr) *request = nullptr;  // host memory: nothing to flush
  return ncclSuccess;
}

ncclResult_t net_test(void* request, int* done, int* sizes) {
  return guard("test", [&] {
    ONEBIT_CHECK(request != nullptr && done != nullptr, ONEBIT_INVALID_ARGUMENT, "request or done is NULL");
    auto* r = static_cast<NetRequest*>(request);
    *done = r->comm->test(r, sizes) ? 1 : 0;
  });
}

// What a comm moved, measured: one INFO line at its close, and a line in ONEBIT_NET_STATS_FILE when set.
void report_close(const char* call, NetComm* comm) {
  const NetCommStats stats = comm->stats();
  const std::string text = std::string(call) + " peer=" + comm->peer() + " bytes=" + std::to_string(stats.bytes) +
                           " messages=" + std::to_string(stats.messages);
  log_line(NCCL_LOG_INFO, text);
  const std::string& pattern = param::NetStatsFile();
  if (pattern.empty()) return;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  const std::string path = expand_file_pattern(pattern);
  std::FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr) {
    log_line(NCCL_LOG_WARN, "ONEBIT_NET_STATS_FILE='" + pattern + "': cannot open '" + path + "'");
    return;
  }
  std::fprintf(file, "%s %s\n", expand_file_pattern("%h:%p").c_str(), text.c_str());
  std::fclose(file);
}

ncclResult_t close_send(void* send_comm) {
  return guard("closeSend", [&] {
    if (send_comm != nullptr) report_close("closeSend", static_cast<NetComm*>(send_comm));
    delete static_cast<NetComm*>(send_comm);
  });
}
ncclResult_t close_recv(void* recv_comm) {
  return guard("closeRecv", [&] {
    if (recv_comm != nullptr) report_close("closeRecv", static_cast<NetComm*>(recv_comm));
    delete static_cast<NetComm*>(recv_comm);
  });
}
ncclResult_t close_listen(void* listen_comm) {
  return guard("closeListen", [&] { delete static_cast<NetListener*>(listen_comm); });
}

ncclResult_t get_device_mr(void*, void*, void**) {
  return guard("getDeviceMr", [] { ::onebit::fail(ONEBIT_INVALID_ARGUMENT, "no device offload on this network"); });
}
ncclResult_t irecv_consumed(void*, int, void*) { return ncclSuccess; }

ncclResult_t make_vdevice(int* d, ncclNetVDeviceProps_t* props) {
  return guard("makeVDevice", [&] {
    ONEBIT_CHECK(d != nullptr && props != nullptr, ONEBIT_INVALID_ARGUMENT, "d or props is NULL");
    ONEBIT_CHECK(props->ndevs == 1, ONEBIT_INVALID_ARGUMENT, "a virtual device of ", props->ndevs,
                 " NICs: this network does not merge devices (NCCL_NET_MERGE_LEVEL)");
    device_at(props->devs[0]);
    *d = props->devs[0];
  });
}

// v10 and v11 per-communicator pieces.
struct Context {
  uint64_t comm_id = 0;
  int traffic_class = -1;
};

ncclResult_t init_v8(ncclDebugLogger_t logger) { return init_common(logger); }
ncclResult_t init_v10(ncclDebugLogger_t logger, ncclProfilerCallback_t) { return init_common(logger); }
ncclResult_t init_v11(void** ctx, uint64_t comm_id, ncclNetCommConfig_t* config, ncclDebugLogger_t logger,
                      ncclProfilerCallback_t) {
  const ncclResult_t result = init_common(logger);
  if (result != ncclSuccess) return result;
  return guard("init", [&] {
    ONEBIT_CHECK(ctx != nullptr, ONEBIT_INVALID_ARGUMENT, "ctx is NULL");
    auto* context = new Context;
    context->comm_id = comm_id;
    if (config != nullptr) context->traffic_class = config->trafficClass;
    *ctx = context;
  });
}
ncclResult_t finalize_v11(void* ctx) {
  return guard("finalize", [&] { delete static_cast<Context*>(ctx); });
}
ncclResult_t set_net_attr_v11(void*, ncclNetAttr_t*) { return ncclSuccess; }  // hints; TCP has no knobs for them
ncclResult_t listen_v11(void*, int dev, void* handle, void** listen_comm) {
  return net_listen(dev, handle, listen_comm);
}
ncclResult_t connect_v11(void*, int dev, void* handle, void** send_comm, ncclNetDeviceHandle_t** dev_comm) {
  return net_connect(dev, handle, send_comm, dev_comm);
}
ncclResult_t connect_v10(int dev, ncclNetCommConfig_t*, void* handle, void** send_comm,
                         ncclNetDeviceHandle_t** dev_comm) {
  return net_connect(dev, handle, send_comm, dev_comm);
}

}  // namespace
}  // namespace onebit::front::nccl_net

using namespace onebit::front::nccl_net;

extern "C" {

__attribute__((visibility("default"))) extern const ncclNet_v11_t ncclNetPlugin_v11;
__attribute__((visibility("default"))) extern const ncclNet_v10_t ncclNetPlugin_v10;
__attribute__((visibility("default"))) extern const ncclNet_v9_t ncclNetPlugin_v9;
__attribute__((visibility("default"))) extern const ncclNet_v8_t ncclNetPlugin_v8;

const ncclNet_v11_t ncclNetPlugin_v11 = {
    "onebit",      init_v11,      net_devices,    properties_v11, listen_v11,   connect_v11,     net_accept, reg_mr,
    reg_mr_dmabuf, dereg_mr,      isend_v10,      irecv_v10,      iflush,       net_test,        close_send, close_recv,
    close_listen,  get_device_mr, irecv_consumed, make_vdevice,   finalize_v11, set_net_attr_v11};

const ncclNet_v10_t ncclNetPlugin_v10 = {"onebit",    init_v10,     net_devices,   properties_v9,  net_listen,
                                         connect_v10, net_accept,   reg_mr,        reg_mr_dmabuf,  dereg_mr,
                                         isend_v10,   irecv_v10,    iflush,        net_test,       close_send,
                                         close_recv,  close_listen, get_device_mr, irecv_consumed, make_vdevice};

const ncclNet_v9_t ncclNetPlugin_v9 = {"onebit",    init_v8,      net_devices,   properties_v9,  net_listen,
                                       net_connect, net_accept,   reg_mr,        reg_mr_dmabuf,  dereg_mr,
                                       isend_v9,    irecv_v9,     iflush,        net_test,       close_send,
                                       close_recv,  close_listen, get_device_mr, irecv_consumed, make_vdevice};

const ncclNet_v8_t ncclNetPlugin_v8 = {"onebit",    init_v8,      net_devices,   properties_v8, net_listen,
                                       net_connect, net_accept,   reg_mr,        reg_mr_dmabuf, dereg_mr,
                                       isend_v8,    irecv_v8,     iflush,        net_test,      close_send,
                                       close_recv,  close_listen, get_device_mr, irecv_consumed};

}  // extern "C"
