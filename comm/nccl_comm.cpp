// The NCCL backend (its watchdog: nccl_watchdog.h). Failures inside a collective are
// reported as CommError (so that Communicator refuses every later call) and
// abort the NCCL communicator; elsewhere the ZEST_CUDA_/ZEST_NCCL_ checks
// apply, and destructors only warn.
#include "zest/comm/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "zest/comm/detail/nccl_watchdog.h"
#include "zest/core/cuda_check.h"
#include "zest/core/cuda_stream.h"
#include "zest/core/deadline.h"
#include "zest/core/logging.h"
#include "zest/core/nccl_check.h"

namespace zest {
namespace {

using std::chrono::milliseconds;
using nccl_detail::cuda_text;
using nccl_detail::nccl_text;

static_assert(sizeof(ncclUniqueId) == sizeof(NcclUniqueId),
              "NCCL's unique id is no longer 128 bytes; update NcclUniqueId");

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
  }
  ZEST_INTERNAL_ASSERT(false, "unhandled dtype {}", static_cast<int>(t));
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  ZEST_INTERNAL_ASSERT(false, "unhandled reduce op {}", static_cast<int>(op));
  return ncclSum;
}

// Waits for a poll that usually succeeds within microseconds without
// burning a core when it does not: yields first, then sleeps longer each time
// up to a millisecond.
class Backoff {
 public:
  void wait() {
    if (n_ < 64) {
      ++n_;
      std::this_thread::yield();
      return;
    }
    const int shift = std::min(n_++ - 64, 7);
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 8 << shift)));
  }

 private:
  int n_ = 0;
};

// Polls a non-blocking communicator until it leaves ncclInProgress or the
// deadline passes (ncclInProgress then). Returns the state, or the error of
// the query itself. Never throws: destructors use it.
ncclResult_t poll_ready(ncclComm_t comm, const Deadline& deadline) {
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress || deadline.passed()) return state;
    backoff.wait();
  }
}

// Note [shared resources]. Whether a split builds on its parent's resources
// (connections, channels, buffers, proxy) is decided by the PARENT's
// config.splitShare: NCCL's child initialization reads parent->config, not
// the config passed for the child. Every NcclCommunicator splits a blocking
// child of its own that should share (Note [blocking collectives]), so every
// non-blocking communicator made here, by init or by split, is created with
// splitShare = 1: its blocking child and every split from it (the engine's
// control communicator) then share its resources instead of building their
// own (about 3x the creation time and the buffers otherwise).
ncclConfig_t admin_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a rank that never comes is a timeout, not a hang
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  config.splitShare = 1;  // ncclCommSplit came with it; older NCCL cannot split at all
#endif
  return config;
}

// Note [eager NCCL buffers]. Since 2.22 NCCL connects the ranks and
// allocates its buffers at the first collective that needs them
// (NCCL_RUNTIME_CONNECT=1, its default): in a training step, after the
// caching allocator has taken the memory the model needs, so that near
// capacity the first step fails inside NCCL. Unless the user set it, the
// first communicator made here sets NCCL_RUNTIME_CONNECT=0, which has NCCL
// connect every algorithm at creation, bounded by init_timeout, before the
// engine allocates; the constructor then runs one warm-up collective, which
// also finishes whatever NCCL still defers. The estimator keeps a reserve
// for these buffers and the CUDA context (estimate/memory_estimate.h).
void prefer_eager_connection() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (::setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0) != 0) {
      ZEST_LOG_WARN("could not set NCCL_RUNTIME_CONNECT=0 ({}); NCCL may allocate its buffers at "
                    "the first collective instead of at creation", std::strerror(errno));
    }
  });
}

}  // namespace


NcclCommunicator::NcclCommunicator(ncclComm_t comm, int rank, int size, Device device,
                                   CommOptions options)
    : Communicator(rank, size, device, options) {
  ZEST_CHECK(comm != nullptr, "NcclCommunicator needs an initialized ncclComm_t, got nullptr");
  ZEST_CHECK(device.is_cuda(), "an NCCL communicator works on a CUDA device, not {}", device.str());
  try {
    state_ = std::make_unique<State>(comm, rank, size, device, options.timeout, options.init_timeout);
    DeviceGuard guard(device);
    ZEST_CUDA_CHECK(cudaMalloc(&state_->barrier_buf, sizeof(int32_t)));
    ZEST_CUDA_CHECK(cudaMemset(state_->barrier_buf, 0, sizeof(int32_t)));
    ZEST_CUDA_CHECK(cudaEventCreateWithFlags(&state_->barrier_event, cudaEventDisableTiming));
    state_->thread = std::thread([s = state_.get()] { s->run_watchdog(); });
    make_blocking_child();
    warm_up();
  } catch (...) {
    if (state_) {
      stop_watchdog();
      std::lock_guard<std::mutex> lock(state_->nccl_mutex);
      state_->abort_locked();
      state_.reset();
    } else {
      ZEST_NCCL_WARN(ncclCommAbort(comm));
    }
    throw;
  }
}

void NcclCommunicator::stop_watchdog() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->cv.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
}

// Note [blocking collectives]: the blocking child that runs the collectives,
// where NCCL can split. The split is a collective over admin's ranks, which
// every rank's constructor issues; whether NCCL makes the call itself block
// depends on its version, so it is registered as a call in progress (the
// watchdog aborts it at the deadline) and then polled.
void NcclCommunicator::make_blocking_child() {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  int version = 0;
  ZEST_NCCL_CHECK(ncclGetVersion(&version));
  if (version < NCCL_VERSION(2, 18, 0)) return;  // collectives stay non-blocking, polled
  CollectiveDesc desc;  // "split #0": made by the constructor, before any collective
  desc.kind = CollectiveKind::kSplit;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  config.splitShare = 0;  // it never splits; it shares admin's resources (Note [shared resources])
  // As in do_split: NCCL may write the handle after a timeout gave up on it.
  auto slot = std::make_unique<ncclComm_t>(nullptr);
  ncclComm_t admin = nullptr;
  {
    std::lock_guard<std::mutex> nccl_lock(state_->nccl_mutex);
    admin = state_->admin;
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->in_call = State::InCall{desc, Deadline(state_->init_timeout), state_->init_timeout};
  }
  const ncclResult_t r = ncclCommSplit(admin, 0, rank(), slot.get(), &config);
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->in_call.reset();
  }
  if (r != ncclSuccess && r != ncclInProgress) {
    (void)slot.release();
    check();  // a timeout the watchdog found comes first
    throw CommError(CommError::Reason::kBackend,
                    fmt::format("NCCL {} (the blocking communicator for collectives) failed on {}: {}",
                                desc.str(), state_->where(), nccl_text(r)),
                    __FILE__, __LINE__);
  }
  try {
    wait_enqueued(desc, /*admin=*/true);
  } catch (...) {
    (void)slot.release();
    throw;
  }
  const ncclComm_t child = *slot;
  ZEST_INTERNAL_ASSERT(child != nullptr, "ncclCommSplit returned no communicator");
  const ncclResult_t ready = poll_ready(child, Deadline(state_->init_timeout));
  if (ready != ncclSuccess) {
    const std::string text = nccl_text(ready);
    ZEST_NCCL_WARN(ncclCommAbort(child));
    throw CommError(ready == ncclInProgress ? CommError::Reason::kTimeout : CommError::Reason::kBackend,
                    fmt::format("NCCL {} on {}: the blocking communicator for collectives {}: {}",
                                desc.str(), state_->where(),
                                ready == ncclInProgress
                                    ? fmt::format("was not ready within {} ms", state_->init_timeout.count())
                                    : std::string("failed"),
                                text),
                    __FILE__, __LINE__);
  }
  std::lock_guard<std::mutex> nccl_lock(state_->nccl_mutex);
  state_->comm = child;
  state_->blocking = true;
#endif
}

// Note [eager NCCL buffers]. Like a barrier, but not a numbered collective
// of the Communicator: every rank's constructor runs it, before any. Bounded
// by init_timeout, since without eager connection it is where NCCL connects.
void NcclCommunicator::warm_up() {
  CollectiveDesc desc;  // "barrier #0"
  desc.kind = CollectiveKind::kBarrier;
  desc.dtype = DType::kInt32;
  desc.count = 1;
  run_barrier(desc, Stream::default_for(device()), state_->init_timeout);
}

// Communicator::abort() on this rank (after close_group_after_abort ended an
// open group): the NCCL communicators are aborted now, from the thread that
// issues the collectives, so no call of ours is inside NCCL, and their
// pending collectives are dropped: nothing waits for them any more, neither
// a later call (refused) nor the destructor (which finds them aborted).
void NcclCommunicator::do_abort(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->set_failure_locked(CommError::Reason::kAborted, message);
  }
  std::lock_guard<std::mutex> nccl_lock(state_->nccl_mutex);
  state_->abort_locked();
}

NcclCommunicator::~NcclCommunicator() {
  stop_watchdog();

  std::lock_guard<std::mutex> nccl_lock(state_->nccl_mutex);
  if (state_->comm == nullptr) return;  // aborted: nothing left to wait for
  // Aborted without an NCCL failure (a group that failed to start): the
  // collectives may wait for ranks that are gone, so do not wait for them.
  if (aborted()) {
    state_->abort_locked();
    return;
  }
  if (state_->blocking) {
    // The blocking child: destroyed once the collectives queued on it have
    // completed (their events), by the deadline; a blocking finalize could
    // wait for ranks that are gone.
    bool quiet = state_->failure.empty();
    const Deadline deadline(state_->timeout);
    Backoff backoff;
    for (const auto& w : state_->watched.entries()) {
      cudaError_t q = cudaErrorNotReady;
      while (quiet && (q = cudaEventQuery(w.event)) == cudaErrorNotReady && !deadline.passed()) backoff.wait();
      quiet = quiet && q == cudaSuccess;
    }
    if (quiet) {
      ZEST_NCCL_WARN(ncclCommDestroy(state_->comm));
    } else {
      ZEST_LOG_WARN("collectives on {} were still pending or failed at teardown; aborting its NCCL "
                    "communicators", state_->where());
      state_->abort_locked();
      return;
    }
    state_->comm = state_->admin;
    state_->blocking = false;
  }
  ncclComm_t comm = std::exchange(state_->comm, nullptr);
  state_->admin = nullptr;
  bool done = false;
  if (state_->failure.empty()) {
    // Finalize flushes the collectives still queued, then destroy frees the
    // rest; if that does not finish in time, abort.
    const ncclResult_t r = ncclCommFinalize(comm);
    ZEST_NCCL_WARN(r);
    if (r == ncclSuccess || r == ncclInProgress) {
      const ncclResult_t state = poll_ready(comm, Deadline(state_->timeout));
      if (state == ncclSuccess) {
        ZEST_NCCL_WARN(ncclCommDestroy(comm));
        done = true;
      } else {
        ZEST_LOG_WARN("finalizing the NCCL communicator on {} did not finish within {} ms ({}); "
                      "aborting it", state_->where(), state_->timeout.count(), nccl_text(state));
      }
    }
  }
  if (!done) ZEST_NCCL_WARN(ncclCommAbort(comm));
}

ncclComm_t NcclCommunicator::native() const {
  std::lock_guard<std::mutex> lock(state_->nccl_mutex);
  return state_->comm;
}

void NcclCommunicator::check() {
  CommError::Reason reason{};
  std::string message;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->failure.empty()) return;
    reason = state_->failure_reason;
    message = state_->failure;
  }
  mark_aborted(message);
  throw CommError(reason, message, __FILE__, __LINE__);
}

void NcclCommunicator::fail(CommError::Reason reason, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->set_failure_locked(reason, message);
  }
  state_->abort_if_failed();
  check();  // throws the first failure, which may be the watchdog's
  throw CommError(reason, message, __FILE__, __LINE__);
}

template <typename Call>
void NcclCommunicator::issue(const CollectiveDesc& desc, const Stream& stream, Call&& call,
                             milliseconds limit) {
  check();
  // Stream handle 0 is the legacy stream of whichever device is current.
  DeviceGuard guard(device());
  ncclResult_t r = ncclSuccess;
  std::string error;
  bool in_group = false;
  ncclComm_t blocking_comm = nullptr;  // Note [blocking collectives]: called without the lock
  {
    std::lock_guard<std::mutex> lock(state_->nccl_mutex);
    if (state_->comm == nullptr) {
      error = "the communicator was aborted";
    } else if (state_->blocking && !state_->group_open) {
      blocking_comm = state_->comm;
      std::lock_guard<std::mutex> state_lock(state_->mutex);
      state_->in_call = State::InCall{desc, Deadline(limit), limit};
    } else {
      r = call(state_->comm);
      if (r != ncclSuccess && r != ncclInProgress) error = nccl_text(r);
      in_group = state_->group_open;
      if (in_group && error.empty()) state_->group_has_ops = true;
    }
  }
  if (blocking_comm != nullptr) {
    r = call(blocking_comm);  // returns once queued, or with an error once aborted
    {
      std::lock_guard<std::mutex> state_lock(state_->mutex);
      state_->in_call.reset();
    }
    if (r != ncclSuccess) error = nccl_text(r);
  }
  if (!error.empty()) {
    fail(CommError::Reason::kBackend,
         fmt::format("NCCL {} failed on {}: {}", desc.str(), state_->where(), error));
  }
  if (in_group) {  // queued when the group ends
    state_->group_ops.emplace_back(desc, stream);
    return;
  }
  wait_enqueued(desc);
  watch(desc, stream, limit);
}

// A collective on the caller's buffers: refused once aborted, like every
// call, even when there is nothing to queue (no elements: every rank skips
// it alike).
template <typename Call>
void NcclCommunicator::issue_data(const CollectiveDesc& desc, const Stream& stream, Call&& call) {
  if (desc.count == 0) {
    check();  // issue() checks otherwise
    return;
  }
  issue(desc, stream, std::forward<Call>(call), state_->timeout);
}

void NcclCommunicator::wait_enqueued(const CollectiveDesc& desc, bool admin) {
  // A blocking communicator's calls return once queued.
  if (state_->blocking && !admin) return;
  // The admin communicator's calls are splits, bounded by init_timeout.
  const milliseconds limit = admin ? state_->init_timeout : state_->timeout;
  const Deadline deadline(limit);
  Backoff backoff;
  for (;;) {
    check();
    ncclResult_t state = ncclInternalError;
    {
      std::lock_guard<std::mutex> lock(state_->nccl_mutex);
      ncclComm_t c = admin ? state_->admin : state_->comm;
      if (c != nullptr) {
        const ncclResult_t r = ncclCommGetAsyncError(c, &state);
        if (r != ncclSuccess) state = r;
      }
    }
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      fail(CommError::Reason::kBackend, fmt::format("NCCL reported an error queueing {} on {}: {}",
                                                    desc.str(), state_->where(), nccl_text(state)));
    }
    if (deadline.passed()) {
      fail(CommError::Reason::kTimeout,
           fmt::format("NCCL {} on {} was not even queued within {} ms, so the communicator was "
                       "aborted: NCCL was still connecting to the other ranks, and one of them "
                       "may not have issued it, or died",
                       desc.str(), state_->where(), limit.count()));
    }
    backoff.wait();
  }
}

// Callers hold a DeviceGuard for the communicator's device (issue() says why).
void NcclCommunicator::watch(const CollectiveDesc& desc, const Stream& stream, milliseconds limit) {
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->spare.empty()) {
      event = state_->spare.back();
      state_->spare.pop_back();
    }
  }
  if (event == nullptr) {
    const cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      fail(CommError::Reason::kBackend,
           fmt::format("NCCL {} on {}: cudaEventCreateWithFlags failed: {}", desc.str(),
                       state_->where(), cuda_text(e)));
    }
  }
  const cudaError_t e = cudaEventRecord(event, cuda_stream(stream));
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (e != cudaSuccess) {
    state_->spare.push_back(event);
    state_->set_failure_locked(CommError::Reason::kBackend,
                               fmt::format("NCCL {} on {}: cudaEventRecord failed: {}", desc.str(),
                                           state_->where(), cuda_text(e)));
    return;  // the next call (or check()) reports it
  }
  state_->watched.add(event, cuda_stream(stream), desc, limit);
  state_->last_watched = desc;
}

void NcclCommunicator::do_all_reduce(const CollectiveDesc& desc, const void* send, void* recv,
                                     const Stream& stream) {
  issue_data(desc, stream, [&](ncclComm_t c) {
    return ncclAllReduce(send, recv, desc.count, nccl_type(desc.dtype), nccl_op(desc.op), c,
                         cuda_stream(stream));
  });
}

void NcclCommunicator::do_reduce_scatter(const CollectiveDesc& desc, const void* send, void* recv,
                                         const Stream& stream) {
  issue_data(desc, stream, [&](ncclComm_t c) {
    return ncclReduceScatter(send, recv, desc.count, nccl_type(desc.dtype), nccl_op(desc.op), c,
                             cuda_stream(stream));
  });
}

void NcclCommunicator::do_all_gather(const CollectiveDesc& desc, const void* send, void* recv,
                                     const Stream& stream) {
  issue_data(desc, stream, [&](ncclComm_t c) {
    return ncclAllGather(send, recv, desc.count, nccl_type(desc.dtype), c, cuda_stream(stream));
  });
}

void NcclCommunicator::do_broadcast(const CollectiveDesc& desc, const void* send, void* recv,
                                    const Stream& stream) {
  issue_data(desc, stream, [&](ncclComm_t c) {
    return ncclBroadcast(send, recv, desc.count, nccl_type(desc.dtype), desc.root, c,
                         cuda_stream(stream));
  });
}

void NcclCommunicator::do_barrier(const CollectiveDesc& desc, const Stream& stream) {
  run_barrier(desc, stream, state_->timeout);
}

void NcclCommunicator::do_send_recv(std::span<const P2PCall> calls, const Stream& stream) {
  check();
  // One NCCL group, whatever the number of sides: NCCL launches them
  // together at its end, so neighbours that send to each other do not wait
  // on each other's receive (NCCL's point-to-point documentation).
  do_group_start();
  try {
    for (const P2PCall& c : calls) {
      if (c.desc.count == 0) continue;  // the peer, agreeing on the count, skips it too
      issue(c.desc, stream, [&](ncclComm_t comm) {
        return c.desc.kind == CollectiveKind::kSend
                   ? ncclSend(c.buffer, c.desc.count, nccl_type(c.desc.dtype), c.desc.root, comm,
                              cuda_stream(stream))
                   : ncclRecv(c.buffer, c.desc.count, nccl_type(c.desc.dtype), c.desc.root, comm,
                              cuda_stream(stream));
      }, state_->timeout);
    }
  } catch (...) {
    try {
      do_group_end();  // NCCL's group is per thread: never left open
    } catch (...) {
      // The first failure is the one reported.
    }
    throw;
  }
  do_group_end();
}

// A barrier bounded by `limit`: the host waits for its completion.
void NcclCommunicator::run_barrier(const CollectiveDesc& desc, const Stream& stream,
                                   milliseconds limit) {
  check();
  ZEST_CHECK(!state_->group_open,
             "{}: a barrier waits for its own completion, which cannot happen inside "
             "group_start/group_end; call it outside the group",
             desc.str());
  DeviceGuard guard(device());  // for the event record below (issue() says why)
  void* buf = state_->barrier_buf;
  issue(
      desc, stream,
      [&](ncclComm_t c) { return ncclAllReduce(buf, buf, 1, ncclInt32, ncclSum, c, cuda_stream(stream)); },
      limit);
  const cudaError_t e = cudaEventRecord(state_->barrier_event, cuda_stream(stream));
  if (e != cudaSuccess) {
    fail(CommError::Reason::kBackend, fmt::format("NCCL {} on {}: cudaEventRecord failed: {}",
                                                  desc.str(), state_->where(), cuda_text(e)));
  }
  // The host waits, by the same deadline as the watchdog, and never longer.
  const Deadline deadline(limit);
  Backoff backoff;
  for (;;) {
    check();
    const cudaError_t q = cudaEventQuery(state_->barrier_event);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) {
      fail(CommError::Reason::kBackend,
           fmt::format("NCCL {} on {} failed on the GPU: {}", desc.str(), state_->where(), cuda_text(q)));
    }
    if (deadline.passed()) fail(CommError::Reason::kTimeout, state_->timeout_text(desc, limit));
    backoff.wait();
  }
}

void NcclCommunicator::do_group_start() {
  std::lock_guard<std::mutex> lock(state_->nccl_mutex);
  ZEST_NCCL_CHECK(ncclGroupStart());
  state_->group_open = true;
}

void NcclCommunicator::do_group_end() {
  DeviceGuard guard(device());  // the group's work is queued now (issue() says why)
  std::vector<std::pair<CollectiveDesc, Stream>> ops = std::move(state_->group_ops);
  state_->group_ops.clear();
  ncclResult_t r = ncclSuccess;
  // Always ended, even after a failure: the group is NCCL's per-thread
  // state, and left open it would swallow this thread's later NCCL calls.
  bool blocking_end = false;
  {
    std::lock_guard<std::mutex> lock(state_->nccl_mutex);
    blocking_end = state_->blocking && state_->comm != nullptr && !ops.empty();
    if (blocking_end) {
      // Note [blocking collectives]: the group's launch may block; from here
      // the watchdog may abort it, after the deadline.
      state_->group_has_ops = false;
      std::lock_guard<std::mutex> state_lock(state_->mutex);
      state_->in_call = State::InCall{ops.back().first, Deadline(state_->timeout), state_->timeout};
    } else {
      r = ncclGroupEnd();
      state_->group_open = false;
      state_->group_has_ops = false;
    }
  }
  if (blocking_end) {
    r = ncclGroupEnd();
    std::lock_guard<std::mutex> lock(state_->nccl_mutex);
    state_->group_open = false;
    std::lock_guard<std::mutex> state_lock(state_->mutex);
    state_->in_call.reset();
  }
  if (r != ncclSuccess && r != ncclInProgress) {
    fail(CommError::Reason::kBackend,
         fmt::format("NCCL group of {} collectives{} failed on {}: {}", ops.size(),
                     ops.empty() ? "" : " ending with " + ops.back().first.str(), state_->where(),
                     nccl_text(r)));
  }
  state_->abort_if_failed();  // an abort the open group held back
  check();
  if (ops.empty()) return;
  wait_enqueued(ops.back().first);
  for (const auto& [desc, stream] : ops) watch(desc, stream, state_->timeout);
}

std::unique_ptr<Communicator> NcclCommunicator::do_split(const CollectiveDesc& desc, int color,
                                                         int key, bool share_resources) {
  check();
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  int version = 0;
  ZEST_NCCL_CHECK(ncclGetVersion(&version));
  ZEST_CHECK(version >= NCCL_VERSION(2, 18, 0),
             "split needs NCCL 2.18 or later (ncclCommSplit), but this process loaded NCCL {}",
             version);
  // The child shares this communicator's resources whatever
  // `share_resources` says, since this one was created sharing (Note
  // [shared resources]); the child is created sharing too, for its own
  // blocking child.
  (void)share_resources;
  ncclConfig_t config = admin_config();
  // A non-blocking parent has NCCL write the child's handle when the split
  // completes, which may be after a timeout has given up on it here: the
  // slot is then left allocated for good (8 bytes), never written after free.
  auto slot = std::make_unique<ncclComm_t>(nullptr);
  const int nccl_color = color >= 0 ? color : NCCL_SPLIT_NOCOLOR;
  // Not issue(): there is no stream and no event, only the parent's state.
  ncclResult_t r = ncclSuccess;
  {
    std::lock_guard<std::mutex> lock(state_->nccl_mutex);
    r = state_->admin == nullptr ? ncclInvalidUsage
                                 : ncclCommSplit(state_->admin, nccl_color, key, slot.get(), &config);
  }
  if (r != ncclSuccess && r != ncclInProgress) {
    fail(CommError::Reason::kBackend,
         fmt::format("NCCL {} (color {}, key {}) failed on {}: {}", desc.str(), color, key,
                     state_->where(), nccl_text(r)));
  }
  try {
    wait_enqueued(desc, /*admin=*/true);
  } catch (...) {
    (void)slot.release();
    throw;
  }
  const ncclComm_t child = *slot;
  if (color < 0) {
    if (child != nullptr) ZEST_NCCL_WARN(ncclCommAbort(child));  // NCCL promises NULL
    return nullptr;
  }
  ZEST_INTERNAL_ASSERT(child != nullptr, "ncclCommSplit with color {} returned no communicator", color);
  const ncclResult_t state = poll_ready(child, Deadline(state_->init_timeout));
  int child_rank = -1;
  int child_size = 0;
  ncclResult_t info = ncclSuccess;
  if (state == ncclSuccess) {
    info = ncclCommUserRank(child, &child_rank);
    if (info == ncclSuccess) info = ncclCommCount(child, &child_size);
  }
  if (state != ncclSuccess || info != ncclSuccess) {
    const std::string text = nccl_text(state != ncclSuccess ? state : info);
    ZEST_NCCL_WARN(ncclCommAbort(child));
    fail(state == ncclInProgress ? CommError::Reason::kTimeout : CommError::Reason::kBackend,
         fmt::format("NCCL {} (color {}, key {}) on {}: the new communicator {}: {}", desc.str(),
                     color, key, state_->where(),
                     state == ncclInProgress
                         ? fmt::format("was not ready within {} ms", state_->init_timeout.count())
                         : std::string("failed"),
                     text));
  }
  return std::make_unique<NcclCommunicator>(child, child_rank, child_size, device(), options());
#else
  (void)color;
  (void)key;
  (void)share_resources;
  ZEST_FAIL("{}: split needs NCCL 2.18 or later (ncclCommSplit); this build has NCCL {}.{}",
            desc.str(), NCCL_MAJOR, NCCL_MINOR);
#endif
}

NcclUniqueId nccl_unique_id() {
  ncclUniqueId id;
  ZEST_NCCL_CHECK(ncclGetUniqueId(&id));
  NcclUniqueId bytes{};
  std::memcpy(bytes.data(), id.internal, bytes.size());
  return bytes;
}

std::unique_ptr<Communicator> make_nccl_communicator(int rank, int world_size,
                                                     const NcclUniqueId& unique_id_bytes,
                                                     int device, CommOptions options) {
  ZEST_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
             "make_nccl_communicator: rank {} is not a rank of a world of {}", rank, world_size);
  check_comm_options(options);
  const Device dev = Device::cuda(device);
  check_device_available(dev);
  // NCCL binds the communicator to the current device; the rank keeps it
  // current for good (set_current_device says why).
  set_current_device(dev);
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id_bytes.data(), sizeof(id.internal));
  prefer_eager_connection();
  ncclConfig_t config = admin_config();
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    const std::string text = nccl_text(r);
    if (comm != nullptr) ZEST_NCCL_WARN(ncclCommAbort(comm));
    ZEST_FAIL("creating the NCCL communicator failed on rank {} of {} ({}): {}", rank, world_size,
              dev.str(), text);
  }
  const ncclResult_t state = poll_ready(comm, Deadline(options.init_timeout));
  if (state != ncclSuccess) {
    const std::string text = nccl_text(state);
    ZEST_NCCL_WARN(ncclCommAbort(comm));
    if (state == ncclInProgress) {
      throw CommError(CommError::Reason::kTimeout,
                      fmt::format("creating the NCCL communicator timed out on rank {} of {} ({}) "
                                  "after {} ms: not every rank joined. Check that all {} ranks "
                                  "started and got the same unique id, and that NCCL can reach "
                                  "the other hosts (NCCL_SOCKET_IFNAME; NCCL_DEBUG=INFO says more)",
                                  rank, world_size, dev.str(), options.init_timeout.count(),
                                  world_size),
                      __FILE__, __LINE__);
    }
    throw CommError(CommError::Reason::kBackend,
                    fmt::format("creating the NCCL communicator failed on rank {} of {} ({}): {}",
                                rank, world_size, dev.str(), text),
                    __FILE__, __LINE__);
  }
  return std::make_unique<NcclCommunicator>(comm, rank, world_size, dev, options);
}

}  // namespace zest
