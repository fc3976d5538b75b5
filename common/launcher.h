// What onebit reads from the launchers' own environment variables (not ONEBIT_*, which are all in
// params.h): torchrun's TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT, Slurm's SLURM_JOB_ID
// and SLURM_STEP_ID, Open MPI's PMIX_NAMESPACE and OMPI_MCA_ess_base_jobid, and MASTER_ADDR and
// MASTER_PORT. (Rank and size variables are read in plugin/engine/communicator.cc.)
#pragma once

#include <string>

namespace onebit {

// The identity of this process's job and attempt, as its launcher gives it: the same text on every
// rank of one attempt of one job, a different one on any other job or attempt that could meet it
// on one host: "job <ONEBIT_JOB_ID>" when that is set (the user's word is the whole identity, for
// launchers whose variables differ between ranks); else each launcher's variables that are set,
// e.g. "torchrun run 3f2a restart 1, master 10.0.0.1:29500". Empty when none is set.
std::string launcher_job_identity();

}  // namespace onebit
