// Note [the host's communication thread]. On a GPU, overlap_comm puts the
// reductions (and stage 3's gathers) on a stream of their own, and
// backward's kernels go on while they run. A host stream's work runs in the
// thread that issues it, so there each bucket's reduction stops backward,
// and of two ranks the faster waits for the slower at every bucket. With a
// thread of its own (HostWork::kOwnThread) the communication stream works
// as a CUDA stream does: backward queues a bucket and goes on, and the
// caller's thread waits only where the CUDA path's compute stream does
// (end_micro_step, a gathered unit's first use). The arithmetic is the
// same, element for element, so the bits are those of a run without it. The
// collectives keep their order (Note [issue order across threads] in
// comm/communicator.cpp); MPI needs MPI_THREAD_MULTIPLE for that.
//
// The thread is worth it only with a core to run on. On a host whose cores
// the ranks' arithmetic already fills (2 ranks of one thread on 2 cores:
// docs/BENCHMARKS.md, "The host's communication thread"), its reductions
// and gathers take their time from backward's, and the step was 7-11%
// slower with it than without. So by default each rank needs a core to
// spare: the CPUs this process may run on are at least twice the ranks
// sharing them (this process's ranks when the process is bound to fewer
// CPUs than the host has, every rank on the host otherwise).
// ZeroConfig::host_comm_thread decides instead when set, and then the
// environment's ZEST_HOST_COMM_THREAD (1 or 0), which runs a program's or a
// test suite's engines with the thread or without it on any machine.
#include "zest/engine/host_comm_thread.h"

#include <sched.h>
#include <unistd.h>

#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "zest/comm/gather_scalars.h"
#include "zest/core/env_flag.h"

namespace zest {
namespace {

int64_t host_id() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return 0;  // unnamed: one host for all such ranks
  return static_cast<int64_t>(std::hash<std::string>{}(name));
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return static_cast<int>(std::thread::hardware_concurrency());
  return CPU_COUNT(&set);
}

}  // namespace

bool use_host_comm_thread(const EngineConfig& config, const Communicator& comm, Communicator& control,
                          CachingAllocator& alloc, const Stream& stream) {
  if (!comm.device().is_host() || !config.zero.overlap() || comm.size() == 1 || !comm.supports_host_streams()) {
    return false;
  }
  // Counted whatever decides, so that every rank takes part in the exchange
  // even if their settings differ.
  const int64_t mine[2] = {host_id(), static_cast<int64_t>(::getpid())};
  const std::vector<int64_t> all = all_gather_int64(control, alloc, stream, mine);
  if (config.zero.host_comm_thread) return *config.zero.host_comm_thread;
  if (const std::optional<bool> env =
          env_flag("ZEST_HOST_COMM_THREAD", "set 1 for a communication thread on the host, 0 for none, or unset "
                                            "it for one only where each rank has a core to spare")) {
    return *env;
  }
  int on_host = 0;
  int in_process = 0;
  for (size_t r = 0; r + 1 < all.size(); r += 2) {
    if (all[r] != mine[0]) continue;
    ++on_host;
    if (all[r + 1] == mine[1]) ++in_process;
  }
  return core_to_spare(usable_cpus(), static_cast<int>(std::thread::hardware_concurrency()), in_process, on_host);
}

bool core_to_spare(int cpus, int host_cpus, int in_process, int on_host) {
  const bool bound = cpus < host_cpus;
  return cpus >= 2 * (bound ? in_process : on_host);
}

}  // namespace zest
