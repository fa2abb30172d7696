#include "zest/launch/bootstrap.h"

#include <cstring>
#include <memory>
#include <vector>

#include "zest/launch/file_rendezvous.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/comm/mpi_comm.h"
#include "zest/comm/nccl_comm.h"
#include "zest/launch/rendezvous.h"
#include "zest/launch/tcp_rendezvous.h"
#include "zest/core/check.h"
#include "zest/core/logging.h"

#if ZEST_WITH_MPI
#include "zest/comm/detail/mpi_poll.h"
#include "zest/core/mpi_check.h"
#endif

namespace zest {
namespace {

using std::chrono::milliseconds;

// Rank 0 listens where MASTER_ADDR points when that is this host's loopback
// (a single-node job: nothing outside needs to reach it), else everywhere.
bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1" || host == "[::1]";
}

#if ZEST_WITH_MPI

void ensure_mpi(const LaunchEnv& env) {
  int initialized = 0;
  ZEST_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    // Ended at exit, after main's communicators are gone: with MPI_Finalize,
    // or MPI_Abort when an MPI operation was abandoned (MpiEnvironment).
    static MpiEnvironment started;
  }
  int rank = -1;
  int size = 0;
  ZEST_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  ZEST_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  ZEST_CHECK(rank == env.rank && size == env.world_size,
             "MPI says this process is rank {} of {}, but the launcher's environment says {}: "
             "start the job with mpirun (or srun with an MPI built for Slurm) so that both agree",
             rank, size, env.str());
}

// Nonblocking and polled, so that a rank that never calls init_distributed
// is a timeout instead of a hang. MPI cannot cancel the broadcast it then
// abandons: `data` lies in `owner`, which is kept until the process exits,
// and the abort is recorded so that whoever started MPI ends it with
// MPI_Abort, not an MPI_Finalize that would wait for the broadcast forever.
void bcast_from_rank0(std::shared_ptr<void> owner, void* data, size_t bytes,
                      const Deadline& deadline, const LaunchEnv& env) {
  MPI_Request request = MPI_REQUEST_NULL;
  ZEST_MPI_CHECK(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD, &request));
  if (mpi::poll_until(request, deadline)) return;
  const std::string message =
      fmt::format("MPI rendezvous (MPI_Ibcast on MPI_COMM_WORLD) timed out on {} after {} ms: "
                  "some rank did not reach init_distributed",
                  env.str(), deadline.elapsed().count());
  MpiEnvironment::keep_until_exit(std::move(owner));
  MpiEnvironment::record_abort(message);
  throw CommError(CommError::Reason::kTimeout, message, __FILE__, __LINE__);
}

std::string mpi_share(const LaunchEnv& env, std::string_view blob, milliseconds timeout) {
  ensure_mpi(env);
  const Deadline deadline(timeout);
  // On the heap: see bcast_from_rank0.
  auto length = std::make_shared<uint64_t>(blob.size());  // rank 0's; the others learn it first
  bcast_from_rank0(length, length.get(), sizeof(uint64_t), deadline, env);
  ZEST_CHECK(*length <= kMaxRendezvousBlob, "MPI rendezvous: rank 0 announced {} bytes", *length);
  auto out = std::make_shared<std::string>(env.rank == 0 ? std::string(blob)
                                                         : std::string(*length, '\0'));
  if (*length > 0) bcast_from_rank0(out, out->data(), out->size(), deadline, env);
  return *out;
}

#endif  // ZEST_WITH_MPI

}  // namespace

Device local_cuda_device(const LaunchEnv& env, int visible_gpus) {
  ZEST_CHECK(visible_gpus > 0, "{} asked for a GPU, but {}", env.str(),
             ZEST_WITH_CUDA ? "no CUDA device is visible to this process"
                            : "this build of ZEST has no CUDA (configure with -DZEST_CUDA=ON)");
  if (visible_gpus == 1) return Device::cuda(0);
  ZEST_CHECK(env.local_rank < visible_gpus,
             "{} would use cuda:{}, but this process sees {} GPUs: start at most {} processes per "
             "node, or give each its own GPU with CUDA_VISIBLE_DEVICES",
             env.str(), env.local_rank, visible_gpus, visible_gpus);
  return Device::cuda(env.local_rank);
}

std::string share_from_rank0(const LaunchEnv& env, const EnvLookup& lookup, std::string_view blob,
                             milliseconds timeout) {
  if (env.world_size == 1) return std::string(blob);
#if ZEST_WITH_MPI
  if (env.is_mpi_launch()) return mpi_share(env, blob, timeout);
#endif
  const RendezvousMember me{env.rank, env.world_size, env.job_id, timeout};
  if (!env.master_addr.empty()) {
    return tcp_rendezvous(env.master_addr, env.rendezvous_port, me, blob,
                          is_loopback(env.master_addr) ? env.master_addr : std::string());
  }
  const std::optional<std::string> path = lookup("ZEST_RENDEZVOUS_FILE");
  if (path && !path->empty()) return file_rendezvous(*path, me, blob);
  ZEST_FAIL("{} has no way to meet rank 0: set MASTER_ADDR and MASTER_PORT to rank 0's host and a "
            "free TCP port (under Slurm, e.g. MASTER_ADDR=$(scontrol show hostnames "
            "$SLURM_JOB_NODELIST | head -n1)), or ZEST_RENDEZVOUS_FILE to a path on a filesystem "
            "every rank sees{}",
            env.str(), env.is_mpi_launch() ? ", or build ZEST with MPI (-DZEST_MPI=ON)" : "");
}

std::unique_ptr<Communicator> init_distributed(Device device, CommOptions options) {
  return init_distributed(device, options, process_env());
}

std::unique_ptr<Communicator> init_distributed(Device device, CommOptions options,
                                               const EnvLookup& lookup) {
  const LaunchEnv env = detect_launch_env(lookup);
  check_comm_options(options);
  if (device.is_cuda()) {
    // Every rank fails alike here, before any rank waits for another.
    ZEST_CHECK(ZEST_WITH_NCCL, "init_distributed({}): this build of ZEST has no NCCL backend; "
                               "build with the CUDA toolkit (-DZEST_CUDA=ON) or use Device::host()",
               device.str());
    const Device gpu = local_cuda_device(env, cuda_device_count());
    check_device_available(gpu);
    if (device.index() != gpu.index()) {
      ZEST_LOG_DEBUG("init_distributed: {} uses {} (its local rank), not {}", env.str(), gpu.str(),
                     device.str());
    }
    NcclUniqueId id{};
    if (env.rank == 0) id = nccl_unique_id();
    const std::string shared =
        share_from_rank0(env, lookup, std::string_view(id.data(), id.size()),
                         options.init_timeout);  // part of creating the communicator
    ZEST_CHECK(shared.size() == id.size(), "the NCCL unique id from rank 0 has {} bytes, not {}",
               shared.size(), id.size());
    std::memcpy(id.data(), shared.data(), id.size());
    ZEST_LOG_DEBUG("init_distributed: NCCL on {} for {}", gpu.str(), env.str());
    return make_nccl_communicator(env.rank, env.world_size, id, gpu.index(), options);
  }

  if (env.world_size == 1) {
    std::vector<std::unique_ptr<Communicator>> group = make_inprocess_group(1, Device::host(), options);
    return std::move(group[0]);
  }
  ZEST_CHECK(env.launcher != "torchrun",
             "{}: host multi-process runs need the MPI backend, which torchrun cannot start; "
             "launch with mpirun -np {} instead",
             env.str(), env.world_size);
#if ZEST_WITH_MPI
  ensure_mpi(env);
  return make_mpi_world(options);
#else
  ZEST_FAIL("{}: host multi-process runs need the MPI backend, and this build of ZEST has none; "
            "install an MPI (Debian: libopenmpi-dev openmpi-bin) and configure with -DZEST_MPI=ON",
            env.str());
#endif
}

}  // namespace zest
