// The MPI backend's collectives: agree on the call (a small call's data
// riding along), then move a large call's data, each step non-blocking MPI
// operations polled until the deadline.
#include "zest/comm/mpi_comm.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/ranges.h>

#include "zest/comm/host_reduce.h"
#include "zest/comm/detail/mpi_exchange.h"
#include "zest/comm/detail/mpi_poll.h"
#include "zest/comm/detail/mpi_presence.h"
#include "zest/comm/detail/mpi_transfer.h"
#include "zest/core/exit_deadline.h"
#include "zest/core/logging.h"
#include "zest/core/mpi_check.h"

namespace zest {
namespace {

using mpi::DescWords;
using mpi::kDescWords;


// Every rank's call, from the words all-gathered in rank order.
std::string mismatch_message(const std::vector<uint64_t>& all, int size) {
  std::vector<std::pair<int, CollectiveDesc>> calls;
  for (int r = 0; r < size; ++r) {
    calls.emplace_back(r, mpi::decode_desc(all.data() + static_cast<size_t>(r) * kDescWords));
  }
  return divergence_message("MPI", calls);
}

int rank_of(MPI_Comm comm) {
  int rank = 0;
  ZEST_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  return rank;
}

int size_of(MPI_Comm comm) {
  int size = 0;
  ZEST_MPI_CHECK(MPI_Comm_size(comm, &size));
  return size;
}

// Checked after the ranks agreed on the call, so every rank refuses it alike
// and the communicator stays usable.
int mpi_count(const CollectiveDesc& desc) {
  ZEST_CHECK(desc.count <= static_cast<uint64_t>(INT_MAX),
             "{}: MPI takes at most {} elements per rank in one call; split the buffer into "
             "calls of at most that many elements",
             desc.str(), INT_MAX);
  return static_cast<int>(desc.count);
}

// An MPI type of `t`'s size: MPI only moves ZEST's elements, bit for bit
// (Note [reductions over MPI]).
MPI_Datatype mpi_copy_type(DType t) {
  switch (elem_size(t)) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    case 8: return MPI_UINT64_T;
    default: break;
  }
  ZEST_INTERNAL_ASSERT(false, "no MPI type of {} bytes for {}", elem_size(t), dtype_name(t));
  return MPI_DATATYPE_NULL;
}

// Whether [a, a + a_bytes) and [b, b + b_bytes) share no byte.
bool apart(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  return x + a_bytes <= y || y + b_bytes <= x;
}

}  // namespace

// The reductions' buffers (Note [reductions over MPI]) and the data phase's
// requests, kept between calls so that a collective allocates only to grow
// them, and shared so that a call that times out can leave all of them to
// MPI, which may still read and write them.
struct MpiCommunicator::ReduceScratch {
  explicit ReduceScratch(int ranks) : inputs(static_cast<size_t>(ranks)) {}
  // At least `bytes` of room for every rank's copy of this rank's part.
  char* copies_of(size_t bytes) {
    if (copies.size() < bytes) copies.resize(bytes);
    return copies.data();
  }
  std::vector<char> copies;
  std::vector<const void*> inputs;  // combine()'s
  std::vector<MPI_Request> requests;  // the data phase's (Note [the data phase in point-to-point messages])
};

MpiCommunicator::Owned::Owned(MPI_Comm adopted) : Owned() {
  // Delegated: from here on the destructor frees whatever was set, should a
  // call below throw.
  comm = adopted;
  ZEST_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
}

MpiCommunicator::Owned::Owned(Owned&& other) noexcept
    : comm(std::exchange(other.comm, MPI_COMM_NULL)), keep(other.keep) {}

MpiCommunicator::Owned::~Owned() {
  if (keep || comm == MPI_COMM_NULL) return;
  int finalized = 0;
  ZEST_MPI_WARN(MPI_Finalized(&finalized));
  if (finalized) {
    ZEST_LOG_WARN("an MPI communicator outlived MPI_Finalize and could not be freed; destroy "
                  "communicators before the zest::MpiEnvironment");
    return;
  }
  ZEST_MPI_WARN(MPI_Comm_free(&comm));
}

MpiCommunicator::Owned MpiCommunicator::duplicate(MPI_Comm comm, const CommOptions& options) {
  MpiEnvironment::check_usable();
  ZEST_CHECK(comm != MPI_COMM_NULL,
             "MpiCommunicator: the MPI communicator is MPI_COMM_NULL; pass one this process "
             "belongs to, such as MPI_COMM_WORLD");
  // The base class checks this too, but only after the duplicate exists,
  // and waiting for that takes the timeout.
  check_comm_options(options);
  int inter = 0;
  ZEST_MPI_CHECK(MPI_Comm_test_inter(comm, &inter));
  ZEST_CHECK(!inter, "MpiCommunicator: collectives over an inter-communicator are not "
                     "supported; pass an intra-communicator (MPI_Intercomm_merge makes one)");
  // Non-blocking, so that a process that never creates its communicator
  // times the others out as a collective would, instead of hanging them.
  auto dup = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  MPI_Request request = MPI_REQUEST_NULL;
  ZEST_MPI_CHECK(MPI_Comm_idup(comm, dup.get(), &request));
  if (!mpi::poll_until(request, Deadline(options.timeout), options.spin)) {
    const std::string message = fmt::format(
        "creating an MPI communicator (MPI_Comm_idup) timed out after {} ms on rank {} of {}: "
        "not every process of the communicator it duplicates took part; every process must "
        "create it (make_mpi_world is collective)",
        options.timeout.count(), rank_of(comm), size_of(comm));
    MpiEnvironment::keep_until_exit(dup);  // MPI writes the handle if the others ever come
    MpiEnvironment::record_abort(message);
    throw CommError(CommError::Reason::kTimeout, message, __FILE__, __LINE__);
  }
  return Owned(*dup);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, CommOptions options)
    : MpiCommunicator(duplicate(comm, options), options) {
  // Over the whole world, so collective over every process: the moment to
  // open the process's presence channel, if it is not open yet.
  int same = MPI_UNEQUAL;
  ZEST_MPI_CHECK(MPI_Comm_compare(comm, MPI_COMM_WORLD, &same));
  if (same == MPI_IDENT || same == MPI_CONGRUENT) {
    mpi::open_presence(Deadline(options.timeout), options.spin);
  }
}

MpiCommunicator::MpiCommunicator(Owned owned, CommOptions options)
    : Communicator(rank_of(owned.comm), size_of(owned.comm), Device::host(), options),
      owned_(std::move(owned)),
      world_ranks_(mpi::world_ranks_of(owned_.comm)),
      exchange_(std::make_shared<mpi::Exchange>(rank(), size())),
      scratch_(std::make_shared<ReduceScratch>(size())) {}

bool MpiCommunicator::supports_host_streams() const {
  int level = MPI_THREAD_SINGLE;
  return MPI_Query_thread(&level) == MPI_SUCCESS && level == MPI_THREAD_MULTIPLE;
}

MpiCommunicator::~MpiCommunicator() {
  finish_queued();
  // A broadcast's root may have left its last exchanges pending (Note [the
  // broadcast root does not wait] in mpi_exchange.h): their check is still
  // owed, and MPI must be done with their buffers before they go. A failure
  // cannot be thrown from here: it is printed, and recorded so that the
  // MpiEnvironment ends the job with MPI_Abort.
  if (!aborted() && exchange_->pending() > 0) {
    try {
      settle_pending(0);
    } catch (...) {
      std::fprintf(stderr, "[rank %d of %d] closing the MPI communicator: %s\n", rank(), size(),
                   current_exception_text().c_str());
      std::fflush(stderr);
    }
  }
  // An aborted communicator may have an operation MPI cannot cancel still
  // pending on it; freeing the communicator under it would be erroneous. The
  // process is meant to end with MPI_Abort (see MpiEnvironment).
  if (aborted()) owned_.keep = true;
}

void MpiCommunicator::do_abort(const std::string& message) {
  std::fprintf(stderr, "[rank %d of %d] %s; ending the MPI job with MPI_Abort\n", rank(), size(),
               message.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  bound_mpi_abort();
  MPI_Abort(owned_.comm, 1);
  std::_Exit(1);  // MPI_Abort does not return; should it, the job must end anyway
}

[[noreturn]] void MpiCommunicator::fail(CommError::Reason reason, const std::string& message) {
  MpiEnvironment::record_abort(message);
  mark_aborted(message);
  throw CommError(reason, message, __FILE__, __LINE__);
}

template <typename Fn>
void MpiCommunicator::guard(const CollectiveDesc& desc, Fn&& fn) {
  try {
    fn();
  } catch (const CommError&) {
    throw;
  } catch (const Error& e) {
    // A failed MPI call leaves unknown state behind (a half-started
    // operation on some ranks), so the communicator cannot be used again.
    const std::string message =
        fmt::format("MPI {} failed on rank {} of {}: {}", desc.str(), rank(), size(), e.message());
    MpiEnvironment::record_abort(message);
    mark_aborted(message);
    throw CommError(CommError::Reason::kBackend, message, e.file(), e.line());
  }
}

// A non-blocking operation moves its data only inside MPI_Test (Open MPI has
// no progress thread by default): sleeping between tests would stall a
// transfer a fragment at a time. So a wait that moves data (the data phase,
// or an exchange carrying a small call's data) spins for CommOptions::spin
// plus the time its bytes take at 1 GB/s, a rate every transport beats; the
// data phase then keeps testing for kDataBusy more, as MPI's blocking calls
// would (Note [one exchange per collective] in
// mpi_exchange.h). Only a longer wait (a rank that is late, or a stalled
// one) backs off into sleeping.
mpi::PollPlan MpiCommunicator::poll_plan(const CollectiveDesc& desc, bool moving_data, bool carrying) const {
  mpi::PollPlan plan{options().spin, std::chrono::microseconds(0), nullptr};
  if (!moving_data && !carrying) return plan;
  const bool whole = desc.kind == CollectiveKind::kAllReduce || desc.kind == CollectiveKind::kBroadcast;
  const uint64_t bytes = desc.count * elem_size(desc.dtype) * (whole ? 1u : static_cast<uint64_t>(size()));
  const auto transfer = std::chrono::microseconds(static_cast<int64_t>(std::min<uint64_t>(bytes / 1000, INT32_MAX)));
  plan.spin += transfer;
  if (moving_data) plan.busy = kDataBusy + transfer;
  return plan;
}

// Note [the presence channel]: while it waits past its spin, a rank reads
// the channel (answering the others, learning who left). A member that left
// fails the call after a short grace (the call may have been its last, its
// part already on the way); a timeout asks the members where they are.
void MpiCommunicator::wait(const CollectiveDesc& desc, std::span<MPI_Request> requests, MPI_Status* statuses,
                           bool moving_data, bool carrying, std::shared_ptr<void> buffers) {
  std::string what;  // desc.str(), made once the wait is long enough to read the channel
  std::optional<mpi::Departure> departed;
  std::optional<Deadline> departed_grace;
  const auto between = [&] {
    if (what.empty()) what = desc.str();
    mpi::serve_presence(mpi::WaitingIn{what, rank(), size(), moving_data});
    if (!departed) {
      departed = mpi::departed_among(world_ranks_);
      if (departed) {
        departed_grace.emplace(std::min<std::chrono::milliseconds>(kDepartedGrace, options().timeout));
      }
    }
    return departed_grace && departed_grace->passed();
  };
  bool done = false;
  try {
    mpi::PollPlan plan = poll_plan(desc, moving_data, carrying);
    plan.between = between;
    done = mpi::poll_until(requests, statuses, Deadline(options().timeout), plan);
  } catch (...) {
    // A failed MPI call (on the request or the presence channel) leaves the
    // operation pending, its buffers in MPI's hands.
    if (buffers) MpiEnvironment::keep_until_exit(std::move(buffers));
    throw;
  }
  if (done) return;
  // MPI cannot cancel a collective: it stays pending and may still write
  // into its buffers whenever MPI makes progress.
  if (buffers) MpiEnvironment::keep_until_exit(std::move(buffers));
  if (departed_grace && departed_grace->passed()) {
    mpi::object_to_departure(departed->world_rank, mpi::WaitingIn{what, rank(), size(), moving_data});
    const auto it = std::find(world_ranks_.begin(), world_ranks_.end(), departed->world_rank);
    fail(CommError::Reason::kAborted,
         fmt::format("MPI {} cannot complete on rank {} of {}: rank {} ({}) {} while this rank "
                     "waited for it {}; the job cannot go on without it",
                     desc.str(), rank(), size(), it - world_ranks_.begin(),
                     mpi::describe_world_rank(departed->world_rank), departed->how,
                     moving_data ? "to move this call's data" : "to call it"));
  }
  const auto ms = options().timeout.count();
  const std::string where = whereabouts(desc, moving_data);
  if (moving_data) {
    fail(CommError::Reason::kTimeout,
         fmt::format("MPI {} timed out after {} ms on rank {} of {} while moving its data: every "
                     "rank had called it, so one has died or stalled inside MPI; {}",
                     desc.str(), ms, rank(), size(), where));
  }
  const std::string reached = last_agreed_.seq == 0
                                  ? std::string("it is the first collective on this communicator")
                                  : fmt::format("every rank reached {}", last_agreed_.str());
  fail(CommError::Reason::kTimeout,
       fmt::format("MPI {} timed out after {} ms on rank {} of {}: not every rank called it; {}; "
                   "{}. A rank that skipped this call, died, or is busy elsewhere leaves the "
                   "others waiting here",
                   desc.str(), ms, rank(), size(), where, reached));
}

void MpiCommunicator::wait_data(const CollectiveDesc& desc, std::span<MPI_Request> requests,
                                std::shared_ptr<void> buffers) {
  wait(desc, requests, MPI_STATUSES_IGNORE, /*moving_data=*/true, /*carrying=*/false, std::move(buffers));
}

// Note [the data phase in point-to-point messages]. The scratch is left to
// MPI should the wait be given up (the caller's buffers cannot be).
void MpiCommunicator::transfer(const CollectiveDesc& desc, MPI_Datatype type, const BlockFor& send_to,
                               const BlockFor& recv_from) {
  ReduceScratch& s = *scratch_;
  wait_data(desc, mpi::start_transfer(s.requests, owned_.comm, rank(), size(), type, send_to, recv_from), scratch_);
}

// Who is where, from the members' answers (Note [the presence channel]).
std::string MpiCommunicator::whereabouts(const CollectiveDesc& desc, bool moving_data) {
  if (!mpi::presence_open()) {
    return "which ranks it waits for is unknown (MPI does not say, and this process has no "
           "presence channel to ask: make_mpi_world opens one)";
  }
  const std::string what = desc.str();
  const auto grace = std::min<std::chrono::milliseconds>(kAskGrace, options().timeout);
  const std::vector<std::optional<mpi::Answer>> answers =
      mpi::ask_members(world_ranks_, mpi::WaitingIn{what, rank(), size(), moving_data}, grace);
  std::vector<int> here;
  std::vector<std::string> missing;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    const auto& a = answers[static_cast<size_t>(r)];
    const std::string who =
        fmt::format("rank {} ({})", r, mpi::describe_world_rank(world_ranks_[static_cast<size_t>(r)]));
    if (!a) {
      missing.push_back(fmt::format("{} did not answer within {} ms (stopped, busy outside ZEST's "
                                    "collectives, or dead)", who, grace.count()));
    } else if (a->what == what && a->comm_size == size()) {
      here.push_back(r);
    } else {
      missing.push_back(fmt::format("{} is {} {} on a communicator of {} ranks", who,
                                    a->moving_data ? "moving the data of" : "waiting in", a->what,
                                    a->comm_size));
    }
  }
  if (missing.empty()) {
    return fmt::format("every other rank says it is in this call ({})", rank_list(here));
  }
  if (here.empty()) return fmt::format("{}; no other rank is in this call", fmt::join(missing, "; "));
  return fmt::format("{}; {} {} in this call too", fmt::join(missing, "; "), rank_list(here),
                     here.size() == 1 ? "is" : "are");
}

// Note [one exchange per collective]. With `leave_pending` (the root of a
// carried broadcast), the exchange is only started, unless it completes at
// once (Note [the broadcast root does not wait] in mpi_exchange.h).
void MpiCommunicator::agree(const CollectiveDesc& desc, const PartFor& part_for,
                            const std::function<void()>& meanwhile, bool leave_pending, const ExpectFrom& expect) {
  mpi::Exchange& ex = *exchange_;
  settle_pending(leave_pending ? ex.max_pending() - 1 : 0);
  const DescWords mine = mpi::encode_desc(desc);
  const PartFor none = [](int) { return mpi::Part{}; };
  const PartFor& parts = part_for ? part_for : none;
  // What a peer making the same call sends this rank: what this rank sends
  // it, unless the call says otherwise (a broadcast).
  const ExpectFrom symmetric = [&](int peer) { return parts(peer).bytes; };
  bool complete = true;
  mpi::Round* round = nullptr;
  guard(desc, [&] {
    round = &ex.start(owned_.comm, mine, parts, expect ? expect : symmetric);
    if (meanwhile) meanwhile();
    if (leave_pending) {
      int done = 0;
      ZEST_MPI_CHECK(MPI_Testall(static_cast<int>(round->requests().size()), round->requests().data(), &done,
                                 round->statuses()));
      complete = done != 0;
    } else {
      wait(desc, round->requests(), round->statuses(), /*moving_data=*/false,
           /*carrying=*/static_cast<bool>(part_for), exchange_);
    }
    if (complete) ex.finish(*round);
  });
  if (!complete) {
    ex.leave_pending();
    return;
  }
  check_agreed(desc, *round);
}

// Fails with every rank's call unless all are `desc`; then waits for the
// round's tails (Note [exchange messages stay eager] in mpi_exchange.h).
void MpiCommunicator::check_agreed(const CollectiveDesc& desc, mpi::Round& round) {
  const std::vector<uint64_t>& all = round.all();
  for (int r = 0; r < size(); ++r) {
    if (!std::equal(round.mine(), round.mine() + kDescWords, all.begin() + r * kDescWords)) {
      // Tails this rank expected may never come, or come later.
      if (!round.tail_requests().empty()) MpiEnvironment::keep_until_exit(exchange_);
      fail(CommError::Reason::kMismatch, mismatch_message(all, size()));
    }
  }
  last_agreed_ = desc;
  if (round.tail_requests().empty()) return;
  guard(desc, [&] {
    wait(desc, round.tail_requests(), round.tail_statuses(), /*moving_data=*/true, /*carrying=*/true, exchange_);
    exchange_->finish_tails(round);
  });
}

// Waits for and checks the oldest pending rounds until at most `keep` are
// left, failing, as their call would have, with that call's description.
void MpiCommunicator::settle_pending(size_t keep) {
  mpi::Exchange& ex = *exchange_;
  while (ex.pending() > keep) {
    mpi::Round& round = *ex.oldest_pending();
    const CollectiveDesc desc = mpi::decode_desc(round.mine());
    guard(desc, [&] {
      wait(desc, round.requests(), round.statuses(), /*moving_data=*/false, /*carrying=*/true, exchange_);
      ex.finish(round);
    });
    ex.settled_oldest();
    check_agreed(desc, round);
  }
}

// Whether a call's data rides on its exchange: `bytes`, the most one rank
// sends to another, fit a message (the same answer on every rank that made
// the same call; ranks that did not learn so from the exchange itself).
bool MpiCommunicator::carried(size_t bytes) const { return bytes <= exchange_->payload_limit(); }

// The collectives whose data is not carried: agreed on, refused alike on
// every rank when too large for MPI, then fn(n), n being the count as MPI
// takes it. `local`, this rank's share of the work that needs no other rank
// (copying its own part), runs while the exchange is on its way; it writes
// only this rank's buffers, within its own call's sizes.
template <typename Local, typename Fn>
void MpiCommunicator::move_data(const CollectiveDesc& desc, Local&& local, Fn&& fn) {
  const bool fits = desc.count > 0 && desc.count <= static_cast<uint64_t>(INT_MAX);
  agree(desc, nullptr, fits ? std::function<void()>(local) : nullptr);
  const int n = mpi_count(desc);
  if (n == 0) return;
  guard(desc, [&] { fn(n); });
}

// This rank's own input to a reduction: `mine` itself, or its copy at
// `spare` when the output partly overlaps it (host_reduce reads its inputs
// while it writes the output, each element before it writes it, so an
// output that is exactly an input is fine).
const void* MpiCommunicator::own_input(const void* mine, const void* out, size_t bytes, char* spare) {
  if (mine == out || apart(mine, bytes, out, bytes)) return mine;
  std::memcpy(spare, mine, bytes);
  return spare;
}

// out = the reduction, in rank order, of this rank's `mine` and every peer's
// payload of the exchange, `count` elements each.
void MpiCommunicator::combine_carried(const CollectiveDesc& desc, const void* mine, size_t count, void* out) {
  const size_t bytes = count * elem_size(desc.dtype);
  const mpi::Round& ex = exchange_->current();
  const auto carried = [&](int r) -> const void* {
    ZEST_INTERNAL_ASSERT(ex.payload_bytes(r) == bytes, "rank {} carried {} bytes, not {}", r, ex.payload_bytes(r),
                         bytes);
    return ex.payload(r);
  };
  combine(desc, own_input(mine, out, bytes, scratch_->copies_of(bytes)), carried, count, out);
}

// Note [reductions over MPI]: MPI moves the bytes, ZEST does the arithmetic.
// Each rank receives every rank's copy of the elements it reduces (an
// all-to-all) and combines them in rank order with host_reduce, the
// in-process backend's code. So a reduction has the in-process bits at every
// world size, whatever algorithm MPI picks (MPI_Allreduce adds in an order of
// its own, which changes with the message size and the number of ranks);
// fp16 and bf16 travel as themselves and accumulate in float; integer sums
// wrap and max propagates NaN without operations of MPI's. It sends what a
// ring reduce-scatter sends, (W-1)/W of the buffer, into a buffer of W
// copies of this rank's part, one of which lands in the output itself when
// the output is apart from the input: it is then reduced in place while the
// transfer has left it in the caches, and is not written cold afterwards
// (with two processes, 1 MiB took 34 us instead of 41 with Open MPI's
// single-copy transport and 60 instead of 69 without).

void MpiCommunicator::combine(const CollectiveDesc& desc, const void* own, const CopyAt& copy_of, size_t count,
                              void* out) {
  std::vector<const void*>& inputs = scratch_->inputs;
  for (int r = 0; r < size(); ++r) inputs[static_cast<size_t>(r)] = r == rank() ? own : copy_of(r);
  host_reduce(inputs.data(), size(), out, count, desc.dtype, desc.op);
}

// Note [reductions over MPI]: rank r reduces the r-th of W nearly equal
// chunks (the in-process split), then every rank gathers every chunk. Two
// ranks exchange their whole buffers instead and each reduces all of it: as
// many bytes sent as the two phases send, one data phase instead of two, and
// no read of memory the peer has just written (which the gather phase does,
// and which costs here what a whole reduce-scatter does). A 1-4 MiB
// all_reduce took 0.52-0.56x MPI_Allreduce's time instead of 1.08-1.14x with
// the single-copy transport, 0.92-1.00x instead of about 0.9x without.
void MpiCommunicator::do_all_reduce(const CollectiveDesc& desc, const void* send, void* recv,
                                    const Stream& /*stream*/) {
  const size_t bytes = desc.count * elem_size(desc.dtype);
  if (carried(bytes)) {
    // Every rank sends its whole buffer to every other and reduces all of it:
    // one exchange, the same bits (the reduction is element by element).
    agree(desc, [&](int) { return mpi::Part{send, bytes}; });
    guard(desc, [&] { combine_carried(desc, send, desc.count, recv); });
    return;
  }
  if (size() == 2) {
    // The peer's buffer lands in recv when recv is apart from send (recv is
    // then reduced in place, warm from the transfer), else (in place: the
    // API allows no partial overlap) in scratch.
    const bool to_out = apart(send, bytes, recv, bytes);
    void* theirs = nullptr;
    const auto local = [&] {
      if (!to_out) theirs = scratch_->copies_of(bytes);
    };
    move_data(desc, local, [&](int n) {
      void* into = to_out ? recv : theirs;
      transfer(desc, mpi_copy_type(desc.dtype), [&](int) { return mpi::Block{send, n}; },
               [&](int) { return mpi::Block{into, n}; });
      combine(desc, send, [&](int) { return into; }, desc.count, recv);
    });
    return;
  }
  // Offsets and counts within desc.count <= INT_MAX elements (move_data
  // refuses more), so they fit MPI's ints.
  const size_t es = elem_size(desc.dtype);
  const ReduceChunk mine = all_reduce_chunk(desc.count, size(), rank());
  const size_t mine_bytes = mine.count * es;
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  char* copies = nullptr;  // every rank's copy of this rank's chunk, in rank order (its own unused)
  const void* own = nullptr;
  const auto local = [&] {
    copies = scratch_->copies_of(mine_bytes * static_cast<size_t>(size()));
    own = own_input(in + mine.begin * es, out + mine.begin * es, mine_bytes,
                    copies + static_cast<size_t>(rank()) * mine_bytes);
  };
  // As in reduce_scatter: one peer's copy lands in the output's chunk when
  // the output is apart from the input.
  const int into_out = apart(send, bytes, recv, bytes) ? (rank() + 1) % size() : -1;
  const auto landing = [&](int peer) {
    return peer == into_out ? out + mine.begin * es : copies + static_cast<size_t>(peer) * mine_bytes;
  };
  move_data(desc, local, [&](int /*n*/) {
    const MPI_Datatype type = mpi_copy_type(desc.dtype);
    const auto chunk_of = [&](const char* base, int r) {
      const ReduceChunk c = all_reduce_chunk(desc.count, size(), r);
      return mpi::Block{base + c.begin * es, static_cast<int>(c.count)};
    };
    transfer(desc, type, [&](int peer) { return chunk_of(in, peer); },
             [&](int peer) { return mpi::Block{landing(peer), static_cast<int>(mine.count)}; });
    // The send buffer is read: an in-place call may overwrite it now.
    if (mine.count > 0) combine(desc, own, landing, mine.count, out + mine.begin * es);
    transfer(desc, type, [&](int) { return chunk_of(out, rank()); }, [&](int peer) { return chunk_of(out, peer); });
  });
}

// Note [reductions over MPI]. In place or not, only recv changes: the copies
// are taken from the whole send buffer before recv is written.
void MpiCommunicator::do_reduce_scatter(const CollectiveDesc& desc, const void* send, void* recv,
                                        const Stream& /*stream*/) {
  const size_t part = desc.count * elem_size(desc.dtype);
  if (carried(part)) {
    const char* in = static_cast<const char*>(send);
    agree(desc, [&](int peer) { return mpi::Part{in + static_cast<size_t>(peer) * part, part}; });
    guard(desc, [&] { combine_carried(desc, in + static_cast<size_t>(rank()) * part, desc.count, recv); });
    return;
  }
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  // One peer's copy lands in recv when recv is apart from the whole send
  // buffer (recv is then reduced in place, warm from the transfer).
  const size_t whole = part * static_cast<size_t>(size());
  const int into_recv = apart(send, whole, recv, part) ? (rank() + 1) % size() : -1;
  char* copies = nullptr;  // every rank's copy of this rank's part, in rank order (its own unused)
  const void* own = nullptr;
  const auto local = [&] {
    copies = scratch_->copies_of(whole);
    own = own_input(in + static_cast<size_t>(rank()) * part, recv, part, copies + static_cast<size_t>(rank()) * part);
  };
  const auto landing = [&](int peer) { return peer == into_recv ? out : copies + static_cast<size_t>(peer) * part; };
  move_data(desc, local, [&](int n) {
    transfer(desc, mpi_copy_type(desc.dtype),
             [&](int peer) { return mpi::Block{in + static_cast<size_t>(peer) * part, n}; },
             [&](int peer) { return mpi::Block{landing(peer), n}; });
    combine(desc, own, landing, desc.count, recv);
  });
}

void MpiCommunicator::do_all_gather(const CollectiveDesc& desc, const void* send, void* recv,
                                    const Stream& /*stream*/) {
  const size_t part = desc.count * elem_size(desc.dtype);
  char* out = static_cast<char*>(recv);
  const bool in_place = out + static_cast<size_t>(rank()) * part == send;
  if (carried(part)) {
    agree(desc, [&](int) { return mpi::Part{send, part}; });
    const mpi::Round& ex = exchange_->current();
    for (int r = 0; r < size(); ++r) {
      char* to = out + static_cast<size_t>(r) * part;
      if (r != rank()) {
        ZEST_INTERNAL_ASSERT(ex.payload_bytes(r) == part, "rank {} carried {} bytes, not {}", r,
                             ex.payload_bytes(r), part);
        std::memcpy(to, ex.payload(r), part);
      } else if (!in_place && part > 0) {
        std::memcpy(to, send, part);
      }
    }
    return;
  }
  move_data(desc, [] {}, [&](int n) {
    transfer(desc, mpi_copy_type(desc.dtype), [&](int) { return mpi::Block{send, n}; },
             [&](int peer) { return mpi::Block{out + static_cast<size_t>(peer) * part, n}; });
    // This rank's own part after the transfer, as MPI_Allgather places it,
    // not while the exchange is on its way: with Open MPI's single-copy
    // transport, copying it first took a 1-4 MiB all_gather from raw MPI's
    // time to 1.3-1.5x (docs/BENCHMARKS.md, 2026-11-28).
    if (!in_place) std::memcpy(out + static_cast<size_t>(rank()) * part, send, part);
  });
}

void MpiCommunicator::do_broadcast(const CollectiveDesc& desc, const void* send, void* recv,
                                   const Stream& /*stream*/) {
  const size_t bytes = desc.count * elem_size(desc.dtype);
  const bool root = rank() == desc.root;
  if (root && send != recv && bytes > 0) std::memcpy(recv, send, bytes);
  if (carried(bytes)) {
    // The root returns once its messages are on their way (Note [the
    // broadcast root does not wait] in mpi_exchange.h); its part is copied
    // into the round's slots already.
    agree(desc, [&](int) { return root ? mpi::Part{send, bytes} : mpi::Part{}; }, nullptr, /*leave_pending=*/root,
          [&](int peer) { return peer == desc.root ? bytes : size_t{0}; });
    const mpi::Round& ex = exchange_->current();
    if (!root && bytes > 0) {
      ZEST_INTERNAL_ASSERT(ex.payload_bytes(desc.root) == bytes, "the root carried {} bytes, not {}",
                           ex.payload_bytes(desc.root), bytes);
      std::memcpy(recv, ex.payload(desc.root), bytes);
    }
    return;
  }
  move_data(desc, [] {}, [&](int n) {
    // A binomial tree, a step per doubling: in the step of `reach`, the ranks
    // within `reach` of the root (counting from it) that have the data send
    // it `reach` further on. One step on 2 ranks; log2(W) steps, the root
    // sending log2(W) copies, not W-1.
    const MPI_Datatype type = mpi_copy_type(desc.dtype);
    const int w = size();
    const int me = (rank() - desc.root + w) % w;  // counted from the root
    const auto actual = [&](int v) { return (v + desc.root) % w; };
    for (int reach = 1; reach < w; reach *= 2) {
      if (me >= 2 * reach) continue;  // not yet reached, and not sending
      const int to = me < reach && me + reach < w ? actual(me + reach) : -1;
      const int from = me >= reach ? actual(me - reach) : -1;
      transfer(desc, type, [&](int peer) { return peer == to ? mpi::Block{recv, n} : mpi::Block{}; },
               [&](int peer) { return peer == from ? mpi::Block{recv, n} : mpi::Block{}; });
    }
  });
}

void MpiCommunicator::do_barrier(const CollectiveDesc& desc, const Stream& /*stream*/) {
  // The agreement is a barrier already: no rank's exchange completes before
  // every rank has sent its message.
  agree(desc, nullptr, nullptr);
}

std::unique_ptr<Communicator> MpiCommunicator::do_split(const CollectiveDesc& desc, int color,
                                                        int key, bool /*share_resources*/) {
  agree(desc, nullptr, nullptr);
  MPI_Comm child = MPI_COMM_NULL;
  guard(desc, [&] {
    // Blocking, without a deadline, but every rank is known to have called
    // it, so it does not wait for a rank that never comes.
    ZEST_MPI_CHECK(MPI_Comm_split(owned_.comm, color < 0 ? MPI_UNDEFINED : color, key, &child));
  });
  if (child == MPI_COMM_NULL) return nullptr;
  return std::unique_ptr<Communicator>(new MpiCommunicator(Owned(child), options()));
}

std::unique_ptr<Communicator> make_mpi_world(CommOptions options) {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, options);
}

}  // namespace zest
