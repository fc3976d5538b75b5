// What onebit reads from other programs' environment variables: the launchers' (torchrun, Open
// MPI, Slurm) and NCCL's — every name onebit reads that is not its own ONEBIT_* (those are all in
// params.h). The names are listed once, in launcher_variables(), from which docs/env.md's second
// table is generated (onebit-info --env-markdown); the functions below are the only readers.
#pragma once

#include <string>
#include <vector>

namespace onebit {

// One foreign variable: its name, whose it is, and what onebit takes from it.
struct LauncherVariable {
  const char* name;
  const char* owner;
  const char* use;
};

// Every foreign variable onebit reads, in the order docs/env.md lists them.
const std::vector<LauncherVariable>& launcher_variables();

// docs/env.md's table of them (markdown).
std::string launcher_markdown_table();

// This process's rank, world size, ranks on this host and rank on this host, as the launcher gives
// them: the first of its variables that is set (torchrun's, then Open MPI's, then Slurm's), with
// that variable's name in `from`; -1 when none is. A value that is not a rank or a size (0 up to
// 2^24) is ONEBIT_INVALID_ARGUMENT naming the variable.
int launcher_rank(std::string* from);
int launcher_world_size(std::string* from);
int launcher_local_world_size(std::string* from);
int launcher_local_rank(std::string* from);

// MASTER_ADDR (torchrun's and most launchers' rendezvous host); empty when unset.
std::string launcher_master_addr();

// NCCL_SOCKET_IFNAME: NCCL's interface choice, which the NCCL_NET plugin follows when
// ONEBIT_SOCKET_IFNAME is unset; empty when unset.
std::string nccl_socket_ifname();

// NCCL_COMM_BLOCKING as NCCL reads it: 0 or 1 overrides every communicator's config; -1 when it
// is unset or anything else (each config decides).
int nccl_comm_blocking();

// The identity of this process's job and attempt, as its launcher gives it: the same text on every
// rank of one attempt of one job, a different one on any other job or attempt that could meet it
// on one host: "job <ONEBIT_JOB_ID>" when that is set (the user's word is the whole identity, for
// launchers whose variables differ between ranks); else each launcher's variables that are set,
// e.g. "torchrun run 3f2a restart 1, master 10.0.0.1:29500". Empty when none is set.
std::string launcher_job_identity();

}  // namespace onebit
