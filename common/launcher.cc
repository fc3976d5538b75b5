#include "common/launcher.h"

#include <cstdlib>

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

}  // namespace

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
