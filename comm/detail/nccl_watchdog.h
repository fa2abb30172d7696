// Internal to the NCCL backend (nccl_comm.cpp): the state its user's thread
// and its watchdog thread share, and the watchdog itself (see Note
// [blocking collectives] below and Note [watching in order] in
// pending_collectives.h).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zest/comm/nccl_comm.h"
#include "zest/comm/detail/pending_collectives.h"
#include "zest/core/cuda_check.h"
#include "zest/core/deadline.h"
#include "zest/core/logging.h"
#include "zest/core/nccl_check.h"
#include "zest/core/rank_context.h"

namespace zest {
namespace nccl_detail {

// How often the watchdog looks at pending collectives: the resolution of
// the timeout, at a cost of one cudaEventQuery per stream with collectives
// pending (Note [watching in order]). With nothing pending or in progress it
// looks less often, for NCCL's asynchronous errors only.
inline constexpr std::chrono::milliseconds kWatchdogPeriod(10);
inline constexpr std::chrono::milliseconds kIdleWatchdogPeriod(100);

inline std::string nccl_text(ncclResult_t r) {
  const char* last = ncclGetLastError(nullptr);
  return fmt::format("NCCL error {} ({}){}{}", static_cast<int>(r), ncclGetErrorString(r),
                     (last != nullptr && *last != '\0') ? ": " : "", last != nullptr ? last : "");
}

inline std::string cuda_text(cudaError_t e) {
  std::string text = fmt::format("CUDA error {} ({}: {})", static_cast<int>(e), cudaGetErrorName(e),
                                 cudaGetErrorString(e));
  (void)cudaGetLastError();  // reported here; not again by the next check
  return text;
}

}  // namespace nccl_detail

// What the user's thread and the watchdog share.
struct NcclCommunicator::State {
  using milliseconds = std::chrono::milliseconds;

  State(ncclComm_t c, int r, int n, Device d, milliseconds t, milliseconds init_t)
      : rank(r), size(n), device(d), timeout(t), init_timeout(init_t), comm(c), admin(c) {}
  ~State() {
    for (const auto& w : watched.entries()) ZEST_CUDA_WARN(cudaEventDestroy(w.event));
    for (cudaEvent_t e : spare) ZEST_CUDA_WARN(cudaEventDestroy(e));
    if (barrier_event != nullptr) ZEST_CUDA_WARN(cudaEventDestroy(barrier_event));
    if (barrier_buf != nullptr) ZEST_CUDA_WARN(cudaFree(barrier_buf));
  }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  const int rank;
  const int size;
  const Device device;
  const milliseconds timeout;
  const milliseconds init_timeout;  // for the splits (CommOptions::init_timeout)

  // Note [blocking collectives]. `admin` is the communicator init or split
  // made, non-blocking, so that creating and splitting are polled against
  // the deadline. Where NCCL can split (2.18+), `comm`, which runs the
  // collectives, is a blocking child of it on the same ranks sharing its
  // resources: a collective returns once queued, with no polling of
  // ncclCommGetAsyncError after it (in non-blocking mode NCCL finishes each
  // enqueue on a thread of its own, and waiting for it costs tens of
  // microseconds per collective). A blocking call that does not return
  // (NCCL connecting to a rank that never comes) is registered in `in_call`
  // with its deadline, and the watchdog then aborts the communicators from
  // its own thread, which makes the call return with an error: the way
  // NCCL is unblocked (PyTorch's watchdog does the same). Without split,
  // `comm` is `admin` and every collective is polled as before.
  //
  // NCCL calls that return at once (non-blocking ones, and those inside an
  // open group, which only record the operation) hold nccl_mutex, so the
  // watchdog never aborts (and frees) the communicator in the middle of
  // one. A blocking call outside a group is made without it, so that the
  // watchdog can abort; the watchdog aborts during one only once its
  // deadline has passed, when the call is surely inside NCCL and stuck
  // there, as the only way to unblock it (PyTorch's watchdog does the same).
  // A collective whose kernel waits for a dead peer is aborted only between
  // calls: abort_if_failed waits while a call is in progress within its
  // deadline. With NCCL's connections made at creation (Note [eager NCCL
  // buffers]) a blocking enqueue has no peer to wait for, so the abort of
  // a call in progress is the last resort, not the usual path. Taken before
  // `mutex` where both are needed.
  std::mutex nccl_mutex;
  ncclComm_t comm;             // collectives; nullptr once aborted
  ncclComm_t admin;            // init's or split's, non-blocking; == comm without a blocking child
  bool blocking = false;       // comm is a blocking child of admin
  bool group_open = false;     // ncclGroupStart called, ncclGroupEnd not yet
  bool group_has_ops = false;  // our ops wait in the open group: no abort until it ends

  std::mutex mutex;
  std::condition_variable cv;
  struct InCall {
    CollectiveDesc desc;
    Deadline deadline;
    milliseconds limit;  // the deadline's timeout, for the message
  };
  PendingCollectives<cudaEvent_t> watched;  // events recorded after their collective
  std::optional<InCall> in_call;    // a blocking NCCL call in progress
  std::vector<cudaEvent_t> spare;   // completed, ready to record again
  CollectiveDesc last_watched;
  CommError::Reason failure_reason = CommError::Reason::kBackend;
  std::string failure;              // the first failure; empty while healthy
  bool stop = false;
  std::thread thread;

  // Only the user's thread touches these.
  std::vector<std::pair<CollectiveDesc, Stream>> group_ops;
  void* barrier_buf = nullptr;
  cudaEvent_t barrier_event = nullptr;

  std::string where() const { return fmt::format("rank {} of {} ({})", rank, size, device.str()); }

  std::string timeout_text(const CollectiveDesc& desc, milliseconds limit) const {
    return fmt::format("NCCL {} on {} did not complete within {} ms, so the communicator was "
                       "aborted. Another rank may have stopped issuing collectives, issued a "
                       "different one, or died; its log names its last collective",
                       desc.str(), where(), limit.count());
  }

  // Under `mutex`. The first failure is the one reported.
  void set_failure_locked(CommError::Reason reason, std::string message) {
    if (!failure.empty()) return;
    failure_reason = reason;
    failure = std::move(message);
    ZEST_LOG_ERROR("{}", failure);
  }

  void abort_if_failed() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (failure.empty()) return;
    }
    std::lock_guard<std::mutex> lock(nccl_mutex);
    if (comm == nullptr || group_has_ops) return;
    {
      // Note [blocking collectives]: not while a blocking call may be about
      // to enter NCCL; once its deadline has passed it is stuck inside.
      std::lock_guard<std::mutex> state_lock(mutex);
      if (in_call && !in_call->deadline.passed()) return;
    }
    abort_locked();
  }

  // Under nccl_mutex. Also stops NCCL's kernels that wait for ranks that
  // will not come, and makes a blocked call return.
  void abort_locked() {
    if (comm != nullptr) ZEST_NCCL_WARN(ncclCommAbort(comm));
    if (admin != nullptr && admin != comm) ZEST_NCCL_WARN(ncclCommAbort(admin));
    comm = nullptr;
    admin = nullptr;
  }

  void run_watchdog() {
    ScopedRank scoped(rank, size);
    ZEST_CUDA_WARN(cudaSetDevice(device.index()));
    std::unique_lock<std::mutex> lock(mutex);
    std::vector<PendingCollectives<cudaEvent_t>::Entry> probes;
    std::vector<cudaError_t> results;
    while (!stop) {
      const milliseconds period = watched.empty() && !in_call ? nccl_detail::kIdleWatchdogPeriod : nccl_detail::kWatchdogPeriod;
      cv.wait_for(lock, period, [&] { return stop; });
      if (stop) break;
      // Note [watching in order]: the oldest pending event of each stream,
      // queried without the mutex; a head that completed brings the next of
      // its stream up, queried at once.
      for (;;) {
        probes = watched.probes();
        lock.unlock();
        results.clear();
        for (const auto& p : probes) results.push_back(cudaEventQuery(p.event));
        lock.lock();
        bool retired = false;
        for (size_t i = 0; i < probes.size(); ++i) {
          const auto& p = probes[i];
          if (results[i] == cudaSuccess) {
            spare.push_back(watched.retire(p.id));
            retired = true;
          } else if (results[i] != cudaErrorNotReady) {
            set_failure_locked(CommError::Reason::kBackend,
                               fmt::format("NCCL {} on {} failed on the GPU: {}; the communicator "
                                           "was aborted",
                                           p.desc.str(), where(), nccl_detail::cuda_text(results[i])));
          } else if (p.deadline.passed()) {
            set_failure_locked(CommError::Reason::kTimeout, timeout_text(p.desc, p.limit));
          }
        }
        if (!retired || stop) break;
      }
      if (in_call && in_call->deadline.passed()) {
        set_failure_locked(CommError::Reason::kTimeout,
                           fmt::format("NCCL {} on {} did not return from NCCL within {} ms, so the "
                                       "communicator was aborted: NCCL was connecting to the other "
                                       "ranks, and one of them may not have issued it, or died",
                                       in_call->desc.str(), where(), in_call->limit.count()));
      }
      const bool healthy = failure.empty();
      const CollectiveDesc last = last_watched;
      lock.unlock();
      if (healthy) {
        std::lock_guard<std::mutex> nccl_lock(nccl_mutex);
        for (ncclComm_t c : {comm, admin == comm ? nullptr : admin}) {
          if (c == nullptr) continue;
          ncclResult_t state = ncclSuccess;
          const ncclResult_t r = ncclCommGetAsyncError(c, &state);
          if (r != ncclSuccess) state = r;
          if (state != ncclSuccess && state != ncclInProgress) {
            std::lock_guard<std::mutex> relock(mutex);
            set_failure_locked(CommError::Reason::kBackend,
                               fmt::format("NCCL reported an error on {} (last collective: {}): {}; "
                                           "the communicator was aborted",
                                           where(), last.seq == 0 ? "none" : last.str(),
                                           nccl_detail::nccl_text(state)));
          }
        }
      }
      abort_if_failed();
      lock.lock();
    }
  }
};

}  // namespace zest
