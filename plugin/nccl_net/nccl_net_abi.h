// The NCCL_NET plugin ABI, versions 8 to 11, written from NCCL's documented layout (its ext-net
// documentation and the field lists of the net_vN.h examples), not copied from NCCL's headers: the
// plugin must build without them. Types are named here as NCCL names them so that the layout can be
// read side by side with NCCL's documentation; field order and types are the ABI, and the
// static_asserts below pin the sizes and offsets a mistake would move.
//
// Differences between versions, as far as this plugin sees them:
//   v8   init(logger); isend size int; irecv sizes int*; properties without forceFlush/vProps/max*Bytes
//   v9   isend size size_t; irecv sizes size_t*; properties + forceFlush, vProps, maxP2pBytes,
//        maxCollBytes; + makeVDevice
//   v10  init(logger, profiler); connect(dev, config, ...); isend/irecv take profiler handles
//   v11  init(&ctx, commId, config, logger, profiler) per communicator; listen/connect take ctx;
//        properties + maxMultiRequestSize; + finalize(ctx), setNetAttr(ctx, attr)
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,    // the network or the OS failed
  ncclInternalError = 3,  // misuse of the plugin
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6  // the peer went away
} ncclResult_t;

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

// Subsystem flags of the logger; NET is the one this plugin logs under.
enum : unsigned long { NCCL_INIT = 1, NCCL_NET = 16 };

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);
typedef ncclResult_t (*ncclProfilerCallback_t)(void** event_handle, int type, void* phandle, int64_t plugin_id,
                                               void* extra);

constexpr int NCCL_PTR_HOST = 0x1;
constexpr int NCCL_PTR_CUDA = 0x2;
constexpr int NCCL_PTR_DMABUF = 0x4;
constexpr std::size_t NCCL_NET_HANDLE_MAXSIZE = 128;
constexpr int NCCL_NET_MAX_REQUESTS = 32;  // outstanding requests per comm NCCL may post
constexpr int NCCL_NET_MAX_DEVS_PER_NIC = 4;

typedef enum { NCCL_NET_DEVICE_HOST = 0, NCCL_NET_DEVICE_UNPACK = 1 } ncclNetDeviceType;

typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_t;  // v7 to v11 alike

typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC];
} ncclNetVDeviceProps_t;  // v9 to v11 alike

typedef struct {
  int trafficClass;     // -1: undefined
} ncclNetCommConfig_t;  // v10, v11

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;  // Mbit/s
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v8_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
} ncclNetProperties_v9_t;  // and v10

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
} ncclNetProperties_v11_t;

typedef struct {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
} ncclNetCommAttr_t;

typedef struct {
  ncclNetCommAttr_t sendCommAttr;
  ncclNetCommAttr_t recvCommAttr;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
} ncclNetAttr_t;  // v11

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logger);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, void* handle, void** send_comm, ncclNetDeviceHandle_t** send_dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_t** recv_dev_comm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* send_comm, void* data, int size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* send_comm);
  ncclResult_t (*closeRecv)(void* recv_comm);
  ncclResult_t (*closeListen)(void* listen_comm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recv_comm, int n, void* request);
} ncclNet_v8_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logger);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, void* handle, void** send_comm, ncclNetDeviceHandle_t** send_dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_t** recv_dev_comm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* send_comm);
  ncclResult_t (*closeRecv)(void* recv_comm);
  ncclResult_t (*closeListen)(void* listen_comm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recv_comm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_t* props);
} ncclNet_v9_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logger, ncclProfilerCallback_t profiler);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_t* config, void* handle, void** send_comm,
                          ncclNetDeviceHandle_t** send_dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_t** recv_dev_comm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                        void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles,
                        void** request);
  ncclResult_t (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* send_comm);
  ncclResult_t (*closeRecv)(void* recv_comm);
  ncclResult_t (*closeListen)(void* listen_comm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recv_comm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_t* props);
} ncclNet_v10_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t comm_id, ncclNetCommConfig_t* config, ncclDebugLogger_t logger,
                       ncclProfilerCallback_t profiler);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** send_comm, ncclNetDeviceHandle_t** send_dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_t** recv_dev_comm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                        void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles,
                        void** request);
  ncclResult_t (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* send_comm);
  ncclResult_t (*closeRecv)(void* recv_comm);
  ncclResult_t (*closeListen)(void* listen_comm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recv_comm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_t* attr);
} ncclNet_v11_t;

}  // extern "C"

// The layout on x86-64 and aarch64 (LP64), where a mistake would hide. These values were checked once
// against NCCL's example plugin headers compiled side by side (docs/design/doors.md).
static_assert(sizeof(ncclNetDeviceHandle_t) == 32);
static_assert(sizeof(ncclNetVDeviceProps_t) == 20);
static_assert(offsetof(ncclNetProperties_v8_t, speed) == 32 && sizeof(ncclNetProperties_v8_t) == 64);
static_assert(offsetof(ncclNetProperties_v9_t, vProps) == 64 && offsetof(ncclNetProperties_v9_t, maxP2pBytes) == 88);
static_assert(sizeof(ncclNetProperties_v9_t) == 104);
static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104 && sizeof(ncclNetProperties_v11_t) == 112);
static_assert(sizeof(ncclNet_v8_t) == 19 * sizeof(void*) && sizeof(ncclNet_v9_t) == 20 * sizeof(void*));
static_assert(sizeof(ncclNet_v10_t) == 20 * sizeof(void*) && sizeof(ncclNet_v11_t) == 22 * sizeof(void*));
