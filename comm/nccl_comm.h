// The NCCL backend: one process per GPU, buffers in that GPU's memory, work
// queued on the caller's stream.
//
//   // zest-example
//   int rank = 0, world = 1, local_rank = 0;
//   zest::NcclUniqueId id = zest::nccl_unique_id();  // on rank 0, then shared (bootstrap.h)
//   auto comm = zest::make_nccl_communicator(rank, world, id, local_rank);
//   zest::Stream stream = zest::Stream::default_for(comm->device());
//   float* grads = nullptr;  // n elements on this rank's GPU
//   size_t n = 0;
//   comm->all_reduce(grads, grads, n, DType::kBFloat16, ReduceOp::kAvg, stream);
//
// Most programs get one from init_distributed (bootstrap.h) instead.
//
// Hang protection. The communicator is created non-blocking (NCCL's
// config.blocking = 0), so creation and split are polled until NCCL reports
// them done or CommOptions::init_timeout passes; the constructor then runs
// one warm-up collective (Note [eager NCCL buffers] in nccl_comm.cpp: NCCL's
// buffers are allocated at creation, before the engine's). Collectives run
// on a blocking child of it (split sharing its resources on NCCL 2.18 and
// later; before that on the non-blocking communicator, each enqueue
// polled): a collective returns
// once queued, without the tens of microseconds a non-blocking enqueue
// costs the host. Once queued, a collective is followed by a CUDA event that
// a watchdog thread (one per communicator) polls along with
// ncclCommGetAsyncError; a blocking call that has not returned is watched by
// its deadline too. An event still pending after the timeout, a call stuck
// past it, or an error NCCL reports, makes the watchdog log it and abort the
// NCCL communicators (ncclCommAbort from the watchdog's thread, which also
// stops their kernels and makes a blocked call return), and the next call
// on this communicator, or check(), throws a CommError naming the collective
// (operation, sequence number, count), the rank and the timeout.
//
// Results follow NCCL's own arithmetic: fp16 and bf16 sums are rounded at
// each step of NCCL's algorithm, so they can differ in the last bits from the
// host and in-process backends (which round once), and max need not
// propagate NaN. Integer results and exact sums match bit for bit.
//
// In builds without CUDA (ZEST_WITH_NCCL == 0) the factories exist and throw
// a zest::Error saying how to get the backend.
#pragma once

#include <array>
#include <memory>

#include "zest/comm/communicator.h"

#if ZEST_WITH_NCCL
#include <nccl.h>
#endif

namespace zest {

// NCCL's ncclUniqueId, as bytes that any rendezvous can carry.
using NcclUniqueId = std::array<char, 128>;

// A new unique id (ncclGetUniqueId): made once, on rank 0, per communicator.
// It names a socket NCCL opens on this host for the ranks to meet at.
NcclUniqueId nccl_unique_id();

// Joins the communicator named by `unique_id_bytes` as `rank` of
// `world_size`, on CUDA device `device`, which becomes the calling thread's
// current device for good (set_current_device in core/device.h). Collective:
// every rank calls it with the same id. Throws CommError (kTimeout) when not
// every rank joins within options.init_timeout.
std::unique_ptr<Communicator> make_nccl_communicator(int rank, int world_size,
                                                     const NcclUniqueId& unique_id_bytes,
                                                     int device, CommOptions options = {});

#if ZEST_WITH_NCCL

class NcclCommunicator final : public Communicator {
 public:
  // Adopts `comm`, a non-blocking NCCL communicator that finished
  // initializing, of `size` ranks on `device`.
  NcclCommunicator(ncclComm_t comm, int rank, int size, Device device, CommOptions options);
  ~NcclCommunicator() override;

  std::string_view backend_name() const override { return "nccl"; }

  // Throws the CommError that aborted this communicator (a collective that
  // did not complete in time, or an error NCCL reported), if one did. Every
  // collective checks this first; call it to learn of a failure without
  // issuing one. Call from the thread that issues the collectives.
  void check();

  // The NCCL communicator, for the application's own NCCL calls on it;
  // nullptr once aborted.
  ncclComm_t native() const;

 protected:
  void do_all_reduce(const CollectiveDesc& desc, const void* send, void* recv,
                     const Stream& stream) override;
  void do_reduce_scatter(const CollectiveDesc& desc, const void* send, void* recv,
                         const Stream& stream) override;
  void do_all_gather(const CollectiveDesc& desc, const void* send, void* recv,
                     const Stream& stream) override;
  void do_broadcast(const CollectiveDesc& desc, const void* send, void* recv,
                    const Stream& stream) override;
  void do_barrier(const CollectiveDesc& desc, const Stream& stream) override;
  // ncclSend/ncclRecv inside one ncclGroupStart/End, each watched like a
  // collective. NCCL does not compare the two sides' descriptions (as it
  // compares no collective's): a send whose receive never comes, or whose
  // count differs, ends at the watchdog's timeout naming the transfer.
  void do_send_recv(std::span<const P2PCall> calls, const Stream& stream) override;
  void do_abort(const std::string& message) override;
  void do_group_start() override;
  void do_group_end() override;
  std::unique_ptr<Communicator> do_split(const CollectiveDesc& desc, int color, int key,
                                         bool share_resources) override;

 private:
  struct State;  // shared with the watchdog thread
  // Queues `call` and watches it: it must complete within `limit`.
  template <typename Call>
  void issue(const CollectiveDesc& desc, const Stream& stream, Call&& call,
             std::chrono::milliseconds limit);
  template <typename Call>
  void issue_data(const CollectiveDesc& desc, const Stream& stream, Call&& call);
  // Polls until NCCL has queued `desc` on the collectives' communicator (or,
  // `admin`, the non-blocking one that splits); at once for a blocking one.
  void wait_enqueued(const CollectiveDesc& desc, bool admin = false);
  void stop_watchdog();
  void make_blocking_child();
  void watch(const CollectiveDesc& desc, const Stream& stream, std::chrono::milliseconds limit);
  void run_barrier(const CollectiveDesc& desc, const Stream& stream, std::chrono::milliseconds limit);
  // Note [eager NCCL buffers]: one collective at creation, within init_timeout.
  void warm_up();
  [[noreturn]] void fail(CommError::Reason reason, const std::string& message);

  std::unique_ptr<State> state_;
};

#endif  // ZEST_WITH_NCCL

}  // namespace zest
