// The MPI backend: one process per rank, buffers in host memory.
//
//   // zest-example: needs=mpi
//   int main(int argc, char** argv) {
//     zest::MpiEnvironment mpi(&argc, &argv);
//     std::unique_ptr<zest::Communicator> world = zest::make_mpi_world();
//     // the per-rank program, with world->rank() in 0..world->size()-1
//   }
//
//   mpirun -np 4 ./trainer
//
// Collectives are non-blocking MPI messages, polled until CommOptions::timeout,
// so that a rank that never arrives ends in a CommError instead of a hang;
// the error names the ranks that did not come (world rank, host, pid) and
// what those that answered are in. A rank that leaves (finalizes MPI on its
// way out of the program) fails the others' calls within 2 s, naming it
// (Note [the presence channel] in mpi_presence.h).
// Each one starts with an exchange of its CollectiveDesc, so ranks that
// diverged (different operations, sizes or numbering) get a CommError naming
// every rank's call before any data is used; a call of at most 4 KiB per
// message carries its data on that exchange, so it costs one round of
// messages, as MPI's own would (Note [one exchange per collective] in
// mpi_exchange.h; the root of such a broadcast returns once its messages
// are out, as MPI_Bcast's does, and checks the others' calls at its next
// call: Note [the broadcast root does not wait]), and a larger one then
// moves its data point to point on
// the caller's buffers (Note [the data phase in point-to-point messages] in
// mpi_transfer.h). Reductions give the in-process
// backend's bits at every world size, floats included: MPI moves the
// elements, and each rank combines its part in rank order with the
// in-process backend's code (fp16 and bf16 accumulate in float and round
// once, integer sums wrap, max propagates NaN), sending what a ring
// reduce-scatter sends (a carried all_reduce sends its whole buffer to every
// rank, which reduces all of it: more bytes, one round; so does every
// all_reduce of two ranks, where that is the same bytes).
//
// ZEST calls MPI only from the thread that is using a communicator, so
// MPI_THREAD_SERIALIZED is enough as long as no two threads use MPI
// communicators at the same time; using different communicators from
// different threads concurrently needs MPI_THREAD_MULTIPLE, which
// MpiEnvironment asks for.
//
// In builds without MPI (ZEST_WITH_MPI == 0) MpiEnvironment and make_mpi_world
// exist and fail with an error saying how to get the backend.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zest/comm/communicator.h"

#if ZEST_WITH_MPI
#include <mpi.h>
#endif

namespace zest::mpi {
class Exchange;
class Round;
struct Block;
struct Part;
struct PollPlan;
}  // namespace zest::mpi

namespace zest {

// Initializes MPI for the process unless it already is, and ends it at scope
// exit if it was the one to start it. Create one at the top of main and keep
// it until the end, after every communicator is gone.
//
// When a communicator was aborted (a timeout or a divergence), or another
// MPI operation of ZEST's was abandoned (init_distributed's rendezvous), MPI
// still holds that unfinished operation (MPI cannot cancel a collective) and
// MPI_Finalize would wait for it forever, so the destructor logs the reason
// and ends the whole job with MPI_Abort (exit code 1 on every rank) instead.
// Until then MPI may still write into the buffers of the call that timed
// out: a program that catches the CommError should end, not reuse them.
//
// The record of such aborts is the process's, not an environment's: it is
// kept whoever started MPI, so a program that called MPI_Init itself learns
// of them from abort_reason() and should end with MPI_Abort then.
//
// A rank that fails should end the job, not return from main: its
// MPI_Finalize would wait for the others, which learn that it left only
// when they next wait for it in a collective (they then fail within 2 s,
// and it ends the job), or, without make_mpi_world's presence channel, when
// their collectives time out (10 minutes by default). So an exception that
// nobody catches ends the job through MPI_Abort (the environment installs a
// std::terminate handler that prints it first), an environment destroyed by
// an exception passing through its scope does the same, and main's own
// catch block should call abort_job():
//
//   // zest-example: needs=mpi
//   int main(int argc, char** argv) {
//     zest::MpiEnvironment mpi(&argc, &argv);
//     try {
//       auto world = zest::make_mpi_world();  // and the training
//     } catch (const std::exception& e) {
//       zest::MpiEnvironment::abort_job(fmt::format("trainer: {}", e.what()));
//     }
//   }
class MpiEnvironment {
 public:
  MpiEnvironment() : MpiEnvironment(nullptr, nullptr) {}
  MpiEnvironment(int* argc, char*** argv);
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  // False when MPI was already initialized by someone else, who then also
  // finalizes it.
  bool initialized_here() const { return initialized_here_; }
  // This process's rank in MPI_COMM_WORLD, and the world's size.
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Why the first abandoned MPI operation of this process (an aborted
  // communicator's, or a rendezvous') was abandoned; empty when none was.
  static std::string abort_reason();

  // For code that abandons a pending MPI operation at a deadline (ZEST's
  // communicators and rendezvous, or the application's own): records why,
  // once per process (the first reason is kept), so that MPI is ended with
  // MPI_Abort, not MPI_Finalize; and keeps the operation's buffers alive
  // until the process ends, since MPI may write into them at any time.
  static void record_abort(const std::string& reason);
  static void keep_until_exit(std::shared_ptr<void> buffers);

  // Ends the job after a failure on this process: prints `message` to
  // stderr, then ends every rank through MPI_Abort on MPI_COMM_WORLD (exit
  // code 1) while MPI is running, or this process with exit code 1 when it
  // is not (or the build has no MPI).
  [[noreturn]] static void abort_job(std::string_view message);

 private:
  friend class MpiCommunicator;
  // Throws unless MPI is initialized, not finalized, and at a thread level
  // ZEST can use.
  static void check_usable();

  bool initialized_here_ = false;
  int uncaught_at_start_ = 0;  // std::uncaught_exceptions() when constructed
  int rank_ = 0;
  int size_ = 1;
};

// A communicator over every process of the job (a duplicate of
// MPI_COMM_WORLD, so ZEST's traffic never matches the application's own).
// Collective: every process calls it.
std::unique_ptr<Communicator> make_mpi_world(CommOptions options = {});

#if ZEST_WITH_MPI

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `comm` (collective over it, and like a collective it ends in
  // a CommError if a rank does not take part within options.timeout) and
  // owns the duplicate; `comm` stays the caller's. Failures of MPI calls on
  // the duplicate are returned to ZEST (MPI_ERRORS_RETURN) and reported as
  // CommError.
  explicit MpiCommunicator(MPI_Comm comm, CommOptions options = {});
  ~MpiCommunicator() override;

  std::string_view backend_name() const override { return "mpi"; }
  // At MPI_THREAD_MULTIPLE only: a host stream's thread calls MPI while the
  // issuing thread calls it on other communicators.
  bool supports_host_streams() const override;
  // The owned MPI communicator, for the application's own MPI calls.
  MPI_Comm native() const { return owned_.comm; }

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
  // mpi_p2p.cpp: Note [point-to-point over MPI].
  void do_send_recv(std::span<const P2PCall> calls, const Stream& stream) override;
  std::unique_ptr<Communicator> do_split(const CollectiveDesc& desc, int color, int key,
                                         bool share_resources) override;
  // MPI cannot end a collective on the other processes short of ending
  // them: prints the reason and calls MPI_Abort on this communicator.
  void do_abort(const std::string& message) override;

 private:
  // The MPI objects a communicator owns, freed with it; held apart from the
  // communicator so that a constructor that fails half-way still frees them.
  struct Owned {
    MPI_Comm comm = MPI_COMM_NULL;
    bool keep = false;  // set once aborted: MPI may still use them
    Owned() = default;
    explicit Owned(MPI_Comm adopted);
    Owned(Owned&& other) noexcept;
    Owned& operator=(Owned&&) = delete;
    ~Owned();
  };
  MpiCommunicator(Owned owned, CommOptions options);
  static Owned duplicate(MPI_Comm comm, const CommOptions& options);

  // What a call sends to each peer on its exchange (Note [one exchange per
  // collective] in mpi_exchange.h).
  using PartFor = std::function<mpi::Part(int peer)>;
  // Exchanges the call's CollectiveDesc with every member (with part_for's
  // payload, when given) and fails with a CommError naming every rank's call
  // unless all are the same.
  // `meanwhile`, when given, runs while the messages are on their way.
  // `leave_pending`: return once the messages are on their way, the check
  // owed until the next agreement (Note [the broadcast root does not wait]
  // in mpi_exchange.h).
  // `expect(peer)`: the payload bytes a peer making the same call sends this
  // rank; by default what part_for gives it.
  using ExpectFrom = std::function<size_t(int peer)>;
  void agree(const CollectiveDesc& desc, const PartFor& part_for, const std::function<void()>& meanwhile = nullptr,
             bool leave_pending = false, const ExpectFrom& expect = nullptr);
  void check_agreed(const CollectiveDesc& desc, mpi::Round& round);
  // Completes and checks pending rounds, oldest first, until `keep` are left.
  void settle_pending(size_t keep);
  bool carried(size_t bytes) const;
  const void* own_input(const void* mine, const void* out, size_t bytes, char* spare);
  void combine_carried(const CollectiveDesc& desc, const void* mine, size_t count, void* out);
  mpi::PollPlan poll_plan(const CollectiveDesc& desc, bool moving_data, bool carrying) const;
  // `carrying`: an exchange with data on it.
  void wait(const CollectiveDesc& desc, std::span<MPI_Request> requests, MPI_Status* statuses,
            bool moving_data, bool carrying, std::shared_ptr<void> buffers);
  void wait_data(const CollectiveDesc& desc, std::span<MPI_Request> requests, std::shared_ptr<void> buffers);
  // One step of the data phase (mpi_transfer.h): send_to(peer)'s elements to
  // every peer, recv_from(peer)'s from each.
  using BlockFor = std::function<mpi::Block(int peer)>;
  void transfer(const CollectiveDesc& desc, MPI_Datatype type, const BlockFor& send_to, const BlockFor& recv_from);
  // Polls a transfer's requests until done, the deadline, or a peer's
  // departure; fails naming the peers otherwise (mpi_p2p.cpp).
  void wait_p2p(std::span<const P2PCall> calls, std::span<MPI_Request> requests, bool moving_data,
                std::shared_ptr<void> buffers);
  // For a timeout's message: which members are missing, and where they are.
  std::string whereabouts(const CollectiveDesc& desc, bool moving_data);
  template <typename Fn>
  void guard(const CollectiveDesc& desc, Fn&& fn);
  template <typename Local, typename Fn>
  void move_data(const CollectiveDesc& desc, Local&& local, Fn&& fn);
  struct ReduceScratch;
  // out = the reduction, in rank order, of `count` elements at `own` (this
  // rank's) and at copy_of(peer) (each peer's copy).
  using CopyAt = std::function<const void*(int peer)>;
  void combine(const CollectiveDesc& desc, const void* own, const CopyAt& copy_of, size_t count, void* out);
  [[noreturn]] void fail(CommError::Reason reason, const std::string& message);

  // How long a member that left may take to finish the call it is in (its
  // part may be on the way), and how long a timeout waits for the members'
  // answers (Note [the presence channel] in mpi_presence.h).
  static constexpr std::chrono::milliseconds kDepartedGrace{2000};
  static constexpr std::chrono::milliseconds kAskGrace{1000};
  // How long the data phase keeps testing without sleeping.
  static constexpr std::chrono::milliseconds kDataBusy{100};

  Owned owned_;
  std::vector<int> world_ranks_;  // the members' ranks in MPI_COMM_WORLD
  std::shared_ptr<mpi::Exchange> exchange_;
  CollectiveDesc last_agreed_;
  std::shared_ptr<ReduceScratch> scratch_;
};

#endif  // ZEST_WITH_MPI

}  // namespace zest
