// The one interface every backend implements: NCCL (CUDA device buffers),
// MPI (host buffers across processes) and in-process ranks (threads of one
// process, host buffers or device buffers on one GPU).
//
//   // zest-example: prelude=buffers
//   comm.reduce_scatter(grads, grad_shard, shard_numel, DType::kFloat32, ReduceOp::kAvg, stream);
//   comm.all_gather(param_shard, params, shard_numel, DType::kBFloat16, stream);
//
// Buffers are untyped pointers with a DType and an element count, on the
// communicator's device, ordered on `stream` (device backends queue the work
// there; host backends finish it before returning, or, on a host stream with
// its own thread, queue it there: Note [issue order across threads]).
// In-place use follows NCCL's convention:
//   all_reduce      send == recv
//   reduce_scatter  send == recv - rank * recv_count   (recv is this rank's part of send)
//   all_gather      send == recv + rank * send_count   (send is this rank's part of recv)
//   broadcast       send == recv
// An in-place reduce_scatter writes this rank's part only; the other parts of
// the send buffer are left as they were.
//
// Every collective has a sequence number. A rank that never arrives, or ranks
// that call different operations or sizes, end in a CommError on the others
// within CommOptions::timeout naming the operation, its number, its count and
// the ranks involved; the communicator is then aborted and every later call
// fails at once with the same reason. No collective waits forever. A rank
// that left instead (its run_inprocess function returned; its process
// finalized MPI) is named to the others within seconds, without waiting for
// the timeout: at once in-process, within 2 s over MPI.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zest/comm/collective.h"
#include "zest/comm/comm_counters.h"
#include "zest/comm/p2p.h"
#include "zest/core/check.h"
#include "zest/core/device.h"
#include "zest/core/lifetime.h"
#include "zest/core/stream.h"

namespace zest {

// CommOptions::timeout's default: the environment variable ZEST_COMM_TIMEOUT
// in seconds (decimals allowed, e.g. 30 or 2.5) when it is set, else 10
// minutes. Throws a zest::Error naming the variable when its value is not a
// number of seconds from 0.001 to 1e6.
std::chrono::milliseconds default_comm_timeout();

// CommOptions::init_timeout's default: ZEST_COMM_INIT_TIMEOUT in seconds when
// it is set (the same format), else 10 minutes. Throws like
// default_comm_timeout.
std::chrono::milliseconds default_comm_init_timeout();

struct CommOptions {
  // How long a collective may wait for the other ranks before the
  // communicator is aborted. Long enough for a slow rank's forward pass;
  // tests use seconds. Programs take it from ZEST_COMM_TIMEOUT (above) and
  // the examples from --timeout SECONDS.
  std::chrono::milliseconds timeout = default_comm_timeout();
  // How long a rank waiting for the others (the in-process hand-off, an MPI
  // request) polls without sleeping before it sleeps in growing steps. Once
  // the others are there a poll answers within a microsecond, while a sleep
  // costs tens (Linux rounds a short sleep up). 0 sleeps at once, kinder to
  // a machine with more ranks than cores; the in-process backend does not
  // spin when its group has more ranks than the machine has hardware
  // threads. The timeout counts from the start of the wait, spin included.
  std::chrono::microseconds spin = std::chrono::microseconds(50);
  // How long creating a communicator and split may take: NCCL then connects
  // the ranks, allocates its buffers and builds its blocking child, which on
  // a busy machine (tests in parallel on one GPU) takes seconds, far longer
  // than a collective once running; and a rank may still be loading when
  // the others arrive. A short `timeout` meant for collectives must not
  // bound that. NCCL's creation, its splits and the rendezvous that shares
  // its id use this; the host backends' splits are exchanges like any
  // collective and use `timeout`. From ZEST_COMM_INIT_TIMEOUT (above).
  std::chrono::milliseconds init_timeout = default_comm_init_timeout();
};

// Throws a zest::Error unless `options` can be used. Every communicator checks
// this; factories that wait for other ranks before one exists check it first,
// so that a bad option fails at once instead of after that wait.
void check_comm_options(const CommOptions& options);

class CommError : public Error {
 public:
  enum class Reason { kTimeout, kMismatch, kAborted, kBackend };
  CommError(Reason reason, std::string message, const char* file, int line)
      : Error(std::move(message), file, line), reason_(reason) {}
  Reason reason() const { return reason_; }

 private:
  Reason reason_;
};

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  Device device() const { return device_; }
  const CommOptions& options() const { return options_; }
  virtual std::string_view backend_name() const = 0;

  // `tag` says what the call is for (CollectiveDesc::tag): ranks whose tags
  // differ have diverged, and fail like ranks calling different sizes. The
  // in-process and MPI backends compare every call; NCCL compares none.
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                  const Stream& stream, uint64_t tag = 0);
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op,
                      const Stream& stream, uint64_t tag = 0);
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                  const Stream& stream, uint64_t tag = 0);
  void broadcast(const void* send, void* recv, size_t count, DType dtype, int root,
                 const Stream& stream, uint64_t tag = 0);
  void barrier(const Stream& stream);

  // Typed forms: the dtype and counts come from the spans.
  template <typename T>
  void all_reduce(std::span<const T> send, std::span<T> recv, ReduceOp op, const Stream& stream) {
    ZEST_CHECK(send.size() == recv.size(), "all_reduce: send has {} elements but recv has {}",
               send.size(), recv.size());
    all_reduce(send.data(), recv.data(), send.size(), dtype_of_v<T>, op, stream);
  }
  template <typename T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op, const Stream& stream) {
    ZEST_CHECK(send.size() == recv.size() * static_cast<size_t>(size_),
               "reduce_scatter: send has {} elements, which is not {} ranks x recv's {}",
               send.size(), size_, recv.size());
    reduce_scatter(send.data(), recv.data(), recv.size(), dtype_of_v<T>, op, stream);
  }
  template <typename T>
  void all_gather(std::span<const T> send, std::span<T> recv, const Stream& stream) {
    ZEST_CHECK(recv.size() == send.size() * static_cast<size_t>(size_),
               "all_gather: recv has {} elements, which is not {} ranks x send's {}",
               recv.size(), size_, send.size());
    all_gather(send.data(), recv.data(), send.size(), dtype_of_v<T>, stream);
  }

  // Point-to-point transfers (p2p.h): `count` elements of `dtype` from this
  // rank to `peer`, or from `peer` into `buffer`. The peer's side must agree
  // on dtype, count and tag, message by message in order; a disagreement, a
  // peer that does not come within CommOptions::timeout, or one that left,
  // is a CommError naming both ranks, and aborts the communicator as a
  // failed collective does. Device backends (NCCL) queue the transfer on
  // `stream`; the host backends return once it is complete, so a lone send
  // waits for the peer's recv: two ranks that must exchange at once (a
  // pipeline's neighbours) pass both sides to send_recv instead. These are
  // not collectives: they take no number of the communicator's sequence()
  // and only the two ranks take part. Not inside group_start/group_end.
  void send(const void* buffer, size_t count, DType dtype, int peer, const Stream& stream,
            uint64_t tag = 0);
  void recv(void* buffer, size_t count, DType dtype, int peer, const Stream& stream,
            uint64_t tag = 0);
  // Several sends and receives, to and from any peers, started together and
  // complete together when this returns (host backends) or when the work
  // queued on `stream` is (NCCL: one ncclGroupStart/End around them), so a
  // ring of ranks each sending to the next and receiving from the previous
  // cannot deadlock. Messages to one peer in one direction keep the order
  // of `ops`. A receive buffer must not overlap another op's buffer.
  void send_recv(std::span<const P2POp> ops, const Stream& stream);
  template <typename T>
  void send(std::span<const T> buffer, int peer, const Stream& stream, uint64_t tag = 0) {
    send(buffer.data(), buffer.size(), dtype_of_v<T>, peer, stream, tag);
  }
  template <typename T>
  void recv(std::span<T> buffer, int peer, const Stream& stream, uint64_t tag = 0) {
    recv(buffer.data(), buffer.size(), dtype_of_v<T>, peer, stream, tag);
  }

  // Operations between group_start() and group_end() may be launched together
  // (one NCCL group). Host backends run each when it is issued; for
  // collectives issued in the same order on every rank the result is the same.
  // A failure that aborts the communicator closes an open group with it (the
  // backend's side is ended at once), so group_start and group_end then fail
  // like any other call, with the abort reason; a group_end that fails
  // aborts the communicator, since what it launched may have reached some
  // ranks and not others.
  void group_start();
  void group_end();

  // A communicator over the ranks that pass the same `color` (>= 0), ordered
  // by `key` then by rank; collective over this communicator (every rank must
  // call it). Ranks passing a negative color get nullptr. For a data-parallel
  // group inside a job that also does tensor or pipeline parallelism.
  // `share_resources` asks the backend to build the child on the parent's
  // resources where it can (no new connections, channels or buffers; the two
  // communicators' work then goes through the same resources, in the order
  // it is issued). NCCL decides that by the parent's configuration, and
  // every NCCL communicator is created sharing (nccl_comm.cpp, Note [shared
  // resources]), so its children always share. The host backends have
  // nothing to share and ignore it.
  std::unique_ptr<Communicator> split(int color, int key, bool share_resources = false);

  // Communication volume so far (see comm_counters.h).
  const CommCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = CommCounters{}; }

  // Number of collectives issued so far; the next one gets sequence() + 1.
  uint64_t sequence() const { return seq_; }

  // Ends the communicator's group after a failure on this rank outside the
  // communicator (an exception in the training loop): the other ranks'
  // pending and later collectives fail at once, with a CommError (kAborted)
  // whose message contains "rank R failed: <reason>", instead of waiting out
  // the timeout for a rank that will not come; this communicator refuses
  // every later call. run_inprocess calls it for a rank that throws.
  //   in-process: the group and every group split from it;
  //   MPI: MPI cannot end a collective on other processes, so this prints
  //        the reason and ends the job with MPI_Abort (exit code 1);
  //   NCCL: this rank's communicator only: its NCCL communicators are
  //        aborted (ncclCommAbort) and its pending collectives dropped, so
  //        its destructor waits for nothing; its later calls are refused.
  //        The others fail at their timeout unless the launcher ends them
  //        when this process exits (torchrun and mpirun do). Call it from
  //        the thread that issues the collectives.
  void abort(std::string_view reason) noexcept;

  // True once a failure (here or on another rank) aborted the communicator.
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // Set once, before aborted() turns true; empty until then.
  const std::string& abort_reason() const { return abort_reason_; }

  // Whether collectives may be queued on a host stream's own thread
  // (HostWork::kOwnThread), which runs them while the issuing thread uses
  // other communicators: MPI only when it runs at MPI_THREAD_MULTIPLE.
  virtual bool supports_host_streams() const { return !device_.is_cuda(); }

  // Expires when this communicator is destroyed, for what borrows it (an
  // Engine) to refuse its use afterwards with an error instead of a crash.
  std::weak_ptr<const void> lifetime() const { return lifetime_.watch(); }

 protected:
  Communicator(int rank, int size, Device device, CommOptions options);

  // Backends implement these; the public functions have already checked the
  // arguments, counted the call and numbered it (desc.seq). A backend that
  // fails throws CommError after calling mark_aborted() (a CommError out of a
  // collective marks it too). Any other exception leaves the communicator
  // usable, for refusals every rank makes alike before moving data; a
  // backend for which it is fatal calls mark_aborted() first.
  virtual void do_all_reduce(const CollectiveDesc& desc, const void* send, void* recv,
                             const Stream& stream) = 0;
  virtual void do_reduce_scatter(const CollectiveDesc& desc, const void* send, void* recv,
                                 const Stream& stream) = 0;
  virtual void do_all_gather(const CollectiveDesc& desc, const void* send, void* recv,
                             const Stream& stream) = 0;
  virtual void do_broadcast(const CollectiveDesc& desc, const void* send, void* recv,
                            const Stream& stream) = 0;
  virtual void do_barrier(const CollectiveDesc& desc, const Stream& stream) = 0;
  // Every side of `calls` started together, complete (host) or queued
  // (device) on return. The base has checked the arguments and numbered
  // each call per peer and direction (P2PCall). Every backend of ZEST's
  // implements it; a communicator of the program's own (a test double)
  // that does not refuses transfers, naming itself.
  virtual void do_send_recv(std::span<const P2PCall> calls, const Stream& stream);
  // Spreads abort(): `message` is "rank R failed: <reason>". Called once the
  // communicator is marked aborted.
  virtual void do_abort(const std::string& /*message*/) {}
  virtual void do_group_start() {}
  virtual void do_group_end() {}
  // `color` < 0: return nullptr after taking part in the exchange.
  virtual std::unique_ptr<Communicator> do_split(const CollectiveDesc& desc, int color, int key,
                                                 bool share_resources) = 0;

  void mark_aborted(const std::string& reason);

  // Waits for the collectives this communicator queued on a host stream's
  // thread. Backends call it first in their destructors: the queued work
  // uses them.
  void finish_queued() noexcept;

  // The message of the exception being handled (Error::message() for ZEST's
  // own, without rank and location), for abort reasons. Call in a catch block.
  static std::string current_exception_message();

 private:
  CollectiveDesc begin(CollectiveKind kind, DType dtype, ReduceOp op, int root, size_t count,
                       const Stream& stream, uint64_t tag = 0);
  template <typename Fn>
  void run(const CollectiveDesc& desc, const Stream& stream, Fn&& fn);
  // Note [issue order across threads]: before a call that is not queued
  // behind the last queued collective, on the same host stream, waits for it.
  void wait_for_queued(const Stream& stream);
  // Throws CommError (kAborted) naming `what` and the abort reason, if aborted.
  void refuse_if_aborted(std::string_view what) const;
  // Once aborted: ends the backend's side of an open group, which can no
  // longer complete, and forgets the group.
  void close_group_after_abort() noexcept;

  const int rank_;
  const int size_;
  const Device device_;
  const CommOptions options_;
  uint64_t seq_ = 0;
  // The last message's number per peer: sent to it, received from it.
  std::vector<uint64_t> sent_seq_;
  std::vector<uint64_t> received_seq_;
  std::vector<P2PCall> p2p_calls_;  // send_recv's, kept to allocate nothing per call
  int group_depth_ = 0;
  CommCounters counters_;
  // Set by whichever thread meets the failure (a host stream's too).
  std::mutex abort_mutex_;
  std::string abort_reason_;
  std::atomic<bool> aborted_{false};
  // The host stream's queue holding the last collective queued there, and
  // its ticket.
  std::shared_ptr<HostQueue> queued_on_;
  uint64_t queued_ticket_ = 0;
  Lifetime lifetime_;
};

}  // namespace zest
