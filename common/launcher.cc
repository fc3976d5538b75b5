#include "common/launcher.h"

#include <cstdlib>
#include <initializer_list>
#include <sstream>

#include "common/error.h"
#include "common/params.h"

namespace onebit {
namespace {

std::string variable(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

void add(std::string* identity, const std::string& part) {
  if (!part.empty()) *identity += (identity->empty() ? "" : ", ") + part;
}

// The first of `names` that is set, as a rank or a size; -1 if none.
int first_int(std::initializer_list<const char*> names, std::string* from) {
  for (const char* name : names) {
    const std::string text = variable(name);
    if (text.empty()) continue;
    char* end = nullptr;
    const long value = std::strtol(text.c_str(), &end, 10);
    ONEBIT_CHECK(*end == '\0' && value >= 0 && value < (1 << 24), ONEBIT_INVALID_ARGUMENT, name, "='", text,
                 "' is not a rank or size");
    *from = name;
    return static_cast<int>(value);
  }
  return -1;
}

}  // namespace

const std::vector<LauncherVariable>& launcher_variables() {
  static const std::vector<LauncherVariable> variables = {
      {"RANK", "torchrun", "this rank, when ONEBIT_RANK is unset"},
      {"OMPI_COMM_WORLD_RANK", "Open MPI", "this rank, when ONEBIT_RANK and RANK are unset"},
      {"SLURM_PROCID", "Slurm", "this rank, when none of the above is set"},
      {"WORLD_SIZE", "torchrun", "the number of ranks, when ONEBIT_WORLD_SIZE is unset"},
      {"OMPI_COMM_WORLD_SIZE", "Open MPI", "the number of ranks, when ONEBIT_WORLD_SIZE and WORLD_SIZE are unset"},
      {"SLURM_NTASKS", "Slurm", "the number of ranks, when none of the above is set"},
      {"LOCAL_WORLD_SIZE", "torchrun", "ranks per host for hierarchical compression, when ONEBIT_LOCAL_SIZE is unset"},
      {"LOCAL_RANK", "torchrun", "checks that the ranks are numbered host by host before compressing hierarchically"},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI", "as LOCAL_RANK"},
      {"SLURM_LOCALID", "Slurm", "as LOCAL_RANK"},
      {"MASTER_ADDR", "torchrun",
       "the bootstrap host (with ONEBIT_ROOT_PORT) when ONEBIT_ROOT is unset; part of the "
       "job identity"},
      {"MASTER_PORT", "torchrun", "part of the job identity (never the bootstrap port)"},
      {"TORCHELASTIC_RUN_ID", "torchrun", "the job identity: the run"},
      {"TORCHELASTIC_RESTART_COUNT", "torchrun", "the job identity: the attempt"},
      {"SLURM_JOB_ID", "Slurm", "the job identity: the job"},
      {"SLURM_STEP_ID", "Slurm", "the job identity: the step"},
      {"PMIX_NAMESPACE", "Open MPI", "the job identity"},
      {"OMPI_MCA_ess_base_jobid", "Open MPI", "the job identity, when PMIX_NAMESPACE is unset"},
      {"NCCL_SOCKET_IFNAME", "NCCL", "the NCCL_NET plugin's interfaces when ONEBIT_SOCKET_IFNAME is unset"},
      {"NCCL_COMM_BLOCKING", "NCCL",
       "0: every NCCL communicator is non-blocking, and the ncclAllReduce door forwards "
       "its calls uncompressed; 1: none is (NCCL's override of each config)"},
  };
  return variables;
}

std::string launcher_markdown_table() {
  std::ostringstream out;
  out << "| variable | whose | what onebit takes from it |\n";
  out << "| --- | --- | --- |\n";
  for (const LauncherVariable& v : launcher_variables())
    out << "| `" << v.name << "` | " << v.owner << " | " << v.use << " |\n";
  return out.str();
}

int launcher_rank(std::string* from) { return first_int({"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}, from); }

int launcher_world_size(std::string* from) {
  return first_int({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}, from);
}

int launcher_local_world_size(std::string* from) { return first_int({"LOCAL_WORLD_SIZE"}, from); }

int launcher_local_rank(std::string* from) {
  return first_int({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}, from);
}

std::string launcher_master_addr() { return variable("MASTER_ADDR"); }

std::string nccl_socket_ifname() { return variable("NCCL_SOCKET_IFNAME"); }

int nccl_comm_blocking() {
  // As NCCL reads it: an integer (strtoll, so "00" is 0); only 0 and 1 override a config.
  const std::string value = variable("NCCL_COMM_BLOCKING");
  if (value.empty()) return -1;
  char* end = nullptr;
  const long long parsed = std::strtoll(value.c_str(), &end, 0);
  if (end == value.c_str()) return -1;
  return parsed == 0 || parsed == 1 ? static_cast<int>(parsed) : -1;
}

std::string launcher_job_identity() {
  if (!param::JobId().empty()) return "job " + param::JobId();  // the user's word is the whole identity
  std::string identity;
  const std::string run = variable("TORCHELASTIC_RUN_ID");
  if (!run.empty()) add(&identity, "torchrun run " + run + " restart " + variable("TORCHELASTIC_RESTART_COUNT"));
  const std::string slurm_job = variable("SLURM_JOB_ID");
  if (!slurm_job.empty()) add(&identity, "slurm job " + slurm_job + "." + variable("SLURM_STEP_ID"));
  std::string mpi = variable("PMIX_NAMESPACE");
  if (mpi.empty()) mpi = variable("OMPI_MCA_ess_base_jobid");
  if (!mpi.empty()) add(&identity, "mpi job " + mpi);
  const std::string master = variable("MASTER_ADDR");
  if (!master.empty()) add(&identity, "master " + master + ":" + variable("MASTER_PORT"));
  return identity;
}

}  // namespace onebit
