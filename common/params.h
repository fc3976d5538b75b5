// Every ONEBIT_* environment variable, in one place. Each is typed, has a default, is read once
// (on first use, thread-safely) and is logged at INFO when the environment sets it. docs/env.md is
// generated from this list (`onebit-info --env-markdown`) and a test keeps the two in sync.
//
// X(Name, type, "SUFFIX", default, "documentation")  — the variable is ONEBIT_<SUFFIX>, read with
// onebit::param::Name(). Types: Int (int64_t) or Str (std::string).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#define ONEBIT_PARAMS(X)                                                                           \
  X(Debug, Str, "DEBUG", "WARN",                                                                   \
    "Log level: NONE, WARN, INFO or TRACE (case-insensitive). Lines go to stderr as "              \
    "`host:pid:tid onebit LEVEL message`.")                                                        \
  X(DebugFile, Str, "DEBUG_FILE", "",                                                              \
    "Write the log to this file instead of stderr. `%h` is replaced by the host name and `%p` "    \
    "by the process id, so each rank can have its own file.")                                      \
  X(NetStatsFile, Str, "NET_STATS_FILE", "",                                                       \
    "The NCCL_NET plugin (libnccl-net-onebit.so) appends one line to this file per closed "        \
    "connection: `host:pid closeSend|closeRecv peer=ADDRESS bytes=N messages=M`, the payload "     \
    "bytes and messages it moved (measured, not modelled). `%h` and `%p` as in "                   \
    "ONEBIT_DEBUG_FILE. Empty: no file; the same numbers go to NCCL's log at INFO.")               \
  X(Simd, Str, "SIMD", "",                                                                         \
    "CPU kernel set: `scalar`, `avx2` or `avx512`. Empty: the best one this CPU runs. Naming a "   \
    "set the CPU cannot run is an error (ONEBIT_INVALID_ARGUMENT), not a crash.")                  \
  X(Rank, Int, "RANK", "-1",                                                                       \
    "This process's rank for onebit_comm_init_env. -1: take it from the launcher (RANK, "          \
    "OMPI_COMM_WORLD_RANK, SLURM_PROCID).")                                                        \
  X(WorldSize, Int, "WORLD_SIZE", "-1",                                                            \
    "Number of ranks for onebit_comm_init_env. -1: from the launcher (WORLD_SIZE, "                \
    "OMPI_COMM_WORLD_SIZE, SLURM_NTASKS).")                                                        \
  X(LocalSize, Int, "LOCAL_SIZE", "-1",                                                            \
    "Ranks per host, for hierarchical compression: the ranks of a host (h*L ... h*L+L-1, "         \
    "torchrun's order) average a tagged buffer in fp32 among themselves and only the hosts "       \
    "exchange 1-bit messages, one stream per host link instead of L. -1: torchrun's "              \
    "LOCAL_WORLD_SIZE if set, else 1. 1 (or the whole world on one host): flat compression. "      \
    "Applies to communicators of the job's whole world; every rank must use the same value.")      \
  X(Shm, Int, "SHM", "1",                                                                          \
    "1: the ranks of a host exchange the hierarchical call's fp32 inputs through a shared-"        \
    "memory segment in /dev/shm (sized like the tagged buffer per rank; if it cannot be made, "    \
    "a warning and the transport instead). 0: through the transport.")                             \
  X(Root, Str, "ROOT", "",                                                                         \
    "host:port where rank 0 serves the bootstrap of the job's whole world: onebit_comm_init_env, " \
    "the torch backend's default group, the Gloo door's world context (subgroups take a free "     \
    "port). Empty: MASTER_ADDR and ONEBIT_ROOT_PORT for the C API, a free port on MASTER_ADDR "    \
    "for the torch doors.")                                                                        \
  X(RootPort, Int, "ROOT_PORT", "29511",                                                           \
    "Bootstrap port used with MASTER_ADDR when ONEBIT_ROOT is unset. Not MASTER_PORT (29500 by "   \
    "default), which the framework's own store holds, and not torchrun's 29400.")                  \
  X(TimeoutMs, Int, "TIMEOUT_MS", "300000",                                                        \
    "How long a rank waits for a peer (bootstrap, connections, every collective) before the "      \
    "call fails with ONEBIT_TIMEOUT naming that peer. A peer that exits is noticed at once.")      \
  X(SocketsPerPeer, Int, "SOCKETS_PER_PEER", "2",                                                  \
    "TCP connections between each pair of ranks, and per NCCL_NET plugin connection (1..64); "     \
    "messages of 256 KiB (plugin: 64 KiB) and more are striped over all of them. Every rank "      \
    "must use the same value. Each rank holds (W-1) x this many sockets: 1022 at 512 ranks "       \
    "and 2, which with the rest of the process passes the usual soft open-files limit of "         \
    "1024; onebit then raises it to the hard limit (docs/reliability.md).")                        \
  X(SocketIfname, Str, "SOCKET_IFNAME", "",                                                        \
    "Interface for data connections, as NCCL_SOCKET_IFNAME: a name prefix (`eth`), `=eth0` for "   \
    "an exact name, `^docker` to exclude. Empty: the interface that reaches the root.")            \
  X(Enable, Int, "ENABLE", "1",                                                                    \
    "0: the LD_PRELOAD front doors forward every call to the real implementation, tagged or "      \
    "not — onebit stays loaded but does nothing.")                                                 \
  X(Transport, Str, "TRANSPORT", "gloo",                                                           \
    "What onebit's collectives run over. The Gloo front door: `gloo`, the intercepted "            \
    "gloo::Context's own pairs, nothing to configure; `tcp`, onebit's TCP mesh (several "          \
    "sockets per peer, striping), bootstrapped over the gloo context on the first tagged call; "   \
    "`ibverbs`, onebit's verbs transport (InfiniBand or RoCE), bootstrapped the same way. "        \
    "onebit's own communicators (the C API, the torch backend, onebit-bench): `ibverbs` selects "  \
    "the verbs transport, anything else onebit's TCP mesh.")                                       \
  X(IbHca, Str, "IB_HCA", "",                                                                      \
    "The RDMA device (and port) of ONEBIT_TRANSPORT=ibverbs, as NCCL_IB_HCA names one: "           \
    "`mlx5_0` or `mlx5_0:1`. Empty: the first device with an active port.")                        \
  X(IbGidIndex, Int, "IB_GID_INDEX", "-1",                                                         \
    "GID index for ONEBIT_TRANSPORT=ibverbs, as NCCL_IB_GID_INDEX. -1: on RoCE the first RoCE "    \
    "v2 GID that holds an IPv4 address (then any RoCE v2, then any); on InfiniBand routing by "    \
    "LID. Every rank must reach the others through the GID it picks.")                             \
  X(IbTimeout, Int, "IB_TIMEOUT", "18",                                                            \
    "Verbs acknowledgement timeout exponent (1..31), as NCCL_IB_TIMEOUT: a lost packet is "        \
    "retried after 4.096 us * 2^value, 7 times, before the transfer fails with the peer named. "   \
    "18: about 1 s per try. A peer that exits is noticed at once through its set-up socket.")      \
  X(UnexpectedMb, Int, "UNEXPECTED_MB", "4096",                                                    \
    "Most memory, in MiB, that one peer's messages may take while they wait for their receive "    \
    "(they arrive early when that peer is ahead, a call or two at most). Past it the sender is "   \
    "taken for a broken or hostile peer: the transport fails with ONEBIT_REMOTE_ERROR naming it "  \
    "and this variable. The largest legitimate amount: hierarchical compression without shared "   \
    "memory (ONEBIT_SHM=0) sends each local peer its whole shard at once, the tagged buffer's "    \
    "bytes / ranks per host. 1..1048576.")                                                         \
  X(FreezeStep, Int, "FREEZE_STEP", "-1",                                                          \
    "Overrides the optimizer shims' freeze_step (OnebitAdam and OnebitLamb, Python and C++): the " \
    "first step of the compression stage, so an existing script is tuned without edits. -1: the "  \
    "script's value. 0/1 Adam's var_freeze_step is not affected.")                                 \
  X(AuthKey, Str, "AUTH_KEY", "",                                                                  \
    "A secret the launcher gives every rank. It keys every communicator's bootstrap (with the "    \
    "random secret the torch backend and the Gloo door draw for each group): a rank without "      \
    "it, or with another, is refused and named, and overhearing the bootstrap is not enough "      \
    "to join. Without it, communicators made from the environment keep out other jobs and "        \
    "attempts but not a process that knows the job's identity (docs/reliability.md). Every "       \
    "rank must have the same value. Never logged.")                                                \
  X(JobId, Str, "JOB_ID", "",                                                                      \
    "This job's identity, for communicators that onebit_comm_init* makes without a job_id: "       \
    "text every rank of the job is given and no other job is. A rank of another identity is "      \
    "refused at the bootstrap, naming both. Empty: the launcher's (torchrun's run id and "         \
    "restart count, Slurm's job and step, Open MPI's job, MASTER_ADDR:MASTER_PORT).")              \
  X(Library, Str, "LIBRARY", "",                                                                   \
    "Read by the Python shim only: the libonebit.so that onebit's torch.distributed backend "      \
    "loads (pip's PyTorch). Empty: the checkout's build/release, then the loader's path.")

namespace onebit::param {

using Int = std::int64_t;
using Str = std::string;

#define ONEBIT_DECLARE_PARAM(name, type, suffix, def, doc) const type& name();
ONEBIT_PARAMS(ONEBIT_DECLARE_PARAM)
#undef ONEBIT_DECLARE_PARAM

// The values each int variable may take. A value outside is refused at its first use with
// ONEBIT_INVALID_ARGUMENT naming the variable, the value and the range: a timeout the clock cannot
// add, a port or a count that cannot be. (A test checks every int variable has a row.)
struct Range {
  const char* env;
  Int min;
  Int max;
};
inline constexpr Range kRanges[] = {
    {"ONEBIT_RANK", -1, (1 << 24) - 1},
    {"ONEBIT_WORLD_SIZE", -1, 1 << 24},
    {"ONEBIT_LOCAL_SIZE", -1, 1 << 24},
    {"ONEBIT_SHM", 0, 1},
    {"ONEBIT_ROOT_PORT", 1, 65535},
    {"ONEBIT_TIMEOUT_MS", 1, Int{366} * 24 * 3600 * 1000},  // a year: far from the clock's limits
    {"ONEBIT_SOCKETS_PER_PEER", 1, 64},
    {"ONEBIT_ENABLE", 0, 1},
    {"ONEBIT_IB_GID_INDEX", -1, 255},
    {"ONEBIT_IB_TIMEOUT", 1, 31},
    {"ONEBIT_UNEXPECTED_MB", 1, 1 << 20},
    {"ONEBIT_FREEZE_STEP", -1, Int{1} << 53},
};

struct Description {
  const char* env;           // "ONEBIT_DEBUG"
  const char* type;          // "int" or "string"
  const char* default_text;  // the default as text
  const char* doc;
};
// The documented list, in declaration order.
const std::vector<Description>& descriptions();

// Whether the variable `env` holds a secret (ONEBIT_AUTH_KEY): its value is never printed — not in
// a log line at any level, an error's text or a diagnostic (onebit-info) — only that it is set.
bool secret(const char* env);
// What a log line or a diagnostic shows of variable `env` set to `value`: the value, or for a
// secret "(set; not shown)".
std::string shown(const char* env, const char* value);

// A Markdown table of descriptions(): the body of docs/env.md.
std::string markdown_table();

}  // namespace onebit::param
