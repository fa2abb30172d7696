// One call from a training program's main to its world communicator,
// whatever started the processes:
//
//   // zest-example
//   auto comm = zest::init_distributed(zest::Device::cuda(0));   // or Device::host()
//
//   mpirun -np 8 ./trainer
//   torchrun --nproc_per_node 8 --no-python ./trainer
//   srun -n 8 ./trainer                        (with MASTER_ADDR/MASTER_PORT or ZEST_RENDEZVOUS_FILE)
//   ./trainer                                  (one process: rank 0 of 1)
//
// On a CUDA device: NCCL on cuda:(local rank) — the index of the Device
// passed is not used, since each rank's GPU follows from its place on the
// node (a process that sees exactly one GPU uses it). Rank 0 makes the NCCL
// unique id and it reaches the other ranks over MPI when mpirun started the
// job and ZEST has MPI, else over TCP at MASTER_ADDR (port: see
// LaunchEnv::rendezvous_port), else through the file ZEST_RENDEZVOUS_FILE.
//
// On the host: one process is a 1-rank in-process communicator; several need
// the MPI backend (mpirun, or srun with an MPI that Slurm can start).
//
// When init_distributed has to start MPI itself it keeps it until the
// process exits; create a zest::MpiEnvironment at the top of main first to
// decide that yourself.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "zest/comm/communicator.h"
#include "zest/launch/launch_env.h"

namespace zest {

std::unique_ptr<Communicator> init_distributed(Device device, CommOptions options = {});
// The same with an explicit environment (tests, tools).
std::unique_ptr<Communicator> init_distributed(Device device, CommOptions options,
                                               const EnvLookup& env);

// The GPU of this rank: cuda:(local_rank), or cuda:0 when the process sees
// exactly one GPU (its launcher gave each process its own, e.g. through
// CUDA_VISIBLE_DEVICES). Throws when the local rank has no GPU.
Device local_cuda_device(const LaunchEnv& env, int visible_gpus);

// Rank 0's `blob` on every rank of the job `env` describes (the others'
// `blob` is ignored): over MPI when mpirun started the job and this build
// has MPI, else TCP at env.master_addr:env.rendezvous_port, else the file
// ZEST_RENDEZVOUS_FILE (looked up in `lookup`). Throws, saying what to set,
// when the job has none of them.
std::string share_from_rank0(const LaunchEnv& env, const EnvLookup& lookup, std::string_view blob,
                             std::chrono::milliseconds timeout);

}  // namespace zest
