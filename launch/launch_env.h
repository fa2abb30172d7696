// Who this process is in a multi-process job, read from the launcher's
// environment: its rank, the world size, its rank on this node, and where rank
// 0 can be reached.
//
//   torchrun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   Open MPI   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   MPICH      PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
//   Slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and SLURM_NTASKS_PER_NODE
//              (or SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE with SLURM_NODEID)
//
// The first launcher whose rank variable is set wins, in that order: a
// torchrun or mpirun started inside a Slurm allocation inherits the
// allocation's SLURM_* variables, which must not override its own. Under
// Open MPI, MPICH and Slurm, MASTER_ADDR and MASTER_PORT are used when set
// (Slurm does not say which host runs rank 0, so a job that wants the TCP
// rendezvous exports them, e.g. the first host of SLURM_JOB_NODELIST, see
// docs/LAUNCH.md). No launcher at all: a single process, rank 0 of 1.
//
// Malformed values (not a number, a rank outside the world, a port outside
// 1..65535, a rank variable without its size) are a zest::Error naming the
// variable, its value and what was expected: a job that cannot agree on who
// is who would otherwise hang in its first collective.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace zest {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the processes of this node
  int local_world_size = 1;  // processes on this node
  std::string master_addr;   // MASTER_ADDR; empty when not set
  int master_port = 0;       // MASTER_PORT; 0 when not set
  // "torchrun", "openmpi", "mpich", "slurm" or "none".
  std::string launcher = "none";

  // The port ZEST's own TCP rendezvous uses at master_addr: ZEST_MASTER_PORT
  // when set; else master_port, except under torchrun when its agent already
  // serves its own store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True):
  // then master_port + 1. 0 when there is none.
  int rendezvous_port = 0;
  // Names this run, so that a rendezvous never takes another run's data:
  // ZEST_JOB_ID, else TORCHELASTIC_RUN_ID (torchrun), SLURM_JOB_ID.SLURM_STEP_ID
  // (Slurm) or PMIX_NAMESPACE (Open MPI); empty when none is set.
  std::string job_id;

  // Started by mpirun/mpiexec (Open MPI or MPICH), so MPI can be initialized.
  bool is_mpi_launch() const { return launcher == "openmpi" || launcher == "mpich"; }
  // "rank 3 of 8 (local 3 of 4, torchrun)"
  std::string str() const;
};

// How a variable is looked up: its value, or nullopt when it is not set. An
// empty value counts as not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process's own environment (getenv).
EnvLookup process_env();
// A fixed set of variables, for tests and tools that must not touch the
// process's environment.
EnvLookup env_from_map(std::map<std::string, std::string> vars);

LaunchEnv detect_launch_env(const EnvLookup& env);
inline LaunchEnv detect_launch_env() { return detect_launch_env(process_env()); }

}  // namespace zest
