// The MPI backend's collectives: agree on the call, then move the data, each
// step a non-blocking MPI operation polled until the deadline.
#include "zest/comm/mpi_comm.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <utility>
#include <vector>

#include "zest/comm/mpi_poll.h"
#include "zest/comm/mpi_reduction.h"
#include "zest/core/logging.h"
#include "zest/core/mpi_check.h"

namespace zest {
namespace {

// A CollectiveDesc as fixed-size words, so that one all-gather shows every
// rank's call to every rank.
constexpr int kDescWords = 6;
using DescWords = std::array<uint64_t, kDescWords>;

DescWords encode(const CollectiveDesc& d) {
  return {static_cast<uint64_t>(d.kind),  static_cast<uint64_t>(d.dtype),
          static_cast<uint64_t>(d.op),    static_cast<uint64_t>(static_cast<int64_t>(d.root)),
          d.count,                        d.seq};
}

CollectiveDesc decode(const uint64_t* w) {
  CollectiveDesc d;
  d.kind = static_cast<CollectiveKind>(w[0]);
  d.dtype = static_cast<DType>(w[1]);
  d.op = static_cast<ReduceOp>(w[2]);
  d.root = static_cast<int32_t>(static_cast<int64_t>(w[3]));
  d.count = w[4];
  d.seq = w[5];
  return d;
}

// Every rank's call, from the words all-gathered in rank order.
std::string mismatch_message(const std::vector<uint64_t>& all, int size) {
  std::vector<std::pair<int, CollectiveDesc>> calls;
  for (int r = 0; r < size; ++r) {
    calls.emplace_back(r, decode(all.data() + static_cast<size_t>(r) * kDescWords));
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

}  // namespace

struct MpiCommunicator::DescExchange {
  DescWords mine{};
  std::vector<uint64_t> all;  // kDescWords per rank, in rank order
};

MpiCommunicator::Owned::Owned(MPI_Comm adopted) : Owned() {
  // Delegated: from here on the destructor frees whatever was set, should a
  // call below throw.
  comm = adopted;
  ZEST_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  nan_max = mpi::make_nan_max();
  wrapping_sum = mpi::make_wrapping_sum();
}

MpiCommunicator::Owned::Owned(Owned&& other) noexcept
    : comm(std::exchange(other.comm, MPI_COMM_NULL)),
      nan_max(std::exchange(other.nan_max, MPI_OP_NULL)),
      wrapping_sum(std::exchange(other.wrapping_sum, MPI_OP_NULL)),
      keep(other.keep) {}

MpiCommunicator::Owned::~Owned() {
  if (keep || (comm == MPI_COMM_NULL && nan_max == MPI_OP_NULL && wrapping_sum == MPI_OP_NULL)) {
    return;
  }
  int finalized = 0;
  ZEST_MPI_WARN(MPI_Finalized(&finalized));
  if (finalized) {
    ZEST_LOG_WARN("an MPI communicator outlived MPI_Finalize and could not be freed; destroy "
                  "communicators before the zest::MpiEnvironment");
    return;
  }
  if (nan_max != MPI_OP_NULL) ZEST_MPI_WARN(MPI_Op_free(&nan_max));
  if (wrapping_sum != MPI_OP_NULL) ZEST_MPI_WARN(MPI_Op_free(&wrapping_sum));
  if (comm != MPI_COMM_NULL) ZEST_MPI_WARN(MPI_Comm_free(&comm));
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
  if (!mpi::poll_until(request, Deadline(options.timeout))) {
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
    : MpiCommunicator(duplicate(comm, options), options) {}

MpiCommunicator::MpiCommunicator(Owned owned, CommOptions options)
    : Communicator(rank_of(owned.comm), size_of(owned.comm), Device::host(), options),
      owned_(std::move(owned)),
      exchange_(std::make_shared<DescExchange>()) {
  exchange_->all.resize(static_cast<size_t>(size()) * kDescWords);
}

MpiCommunicator::~MpiCommunicator() {
  // An aborted communicator may have an operation MPI cannot cancel still
  // pending on it; freeing the communicator under it would be erroneous. The
  // process is meant to end with MPI_Abort (see MpiEnvironment).
  if (aborted()) owned_.keep = true;
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

void MpiCommunicator::wait(const CollectiveDesc& desc, MPI_Request& request, bool moving_data,
                           std::shared_ptr<void> buffers) {
  if (mpi::poll_until(request, Deadline(options().timeout))) return;
  // MPI cannot cancel a collective: it stays pending and may still write
  // into its buffers whenever MPI makes progress.
  if (buffers) MpiEnvironment::keep_until_exit(std::move(buffers));
  const auto ms = options().timeout.count();
  if (moving_data) {
    fail(CommError::Reason::kTimeout,
         fmt::format("MPI {} timed out after {} ms on rank {} of {} while moving its data: every "
                     "rank had called it, so one has died or stalled inside MPI",
                     desc.str(), ms, rank(), size()));
  }
  const std::string reached = last_agreed_.seq == 0
                                  ? std::string("it is the first collective on this communicator")
                                  : fmt::format("every rank reached {}", last_agreed_.str());
  fail(CommError::Reason::kTimeout,
       fmt::format("MPI {} timed out after {} ms on rank {} of {}: not every rank called it; the "
                   "ranks that have not are unknown (MPI does not say whom a pending all-gather "
                   "still waits for); {}. A rank that skipped this call, died, or is busy "
                   "elsewhere leaves the others waiting here",
                   desc.str(), ms, rank(), size(), reached));
}

void MpiCommunicator::agree(const CollectiveDesc& desc) {
  guard(desc, [&] {
    DescExchange& ex = *exchange_;
    ex.mine = encode(desc);
    MPI_Request request = MPI_REQUEST_NULL;
    ZEST_MPI_CHECK(MPI_Iallgather(ex.mine.data(), kDescWords, MPI_UINT64_T, ex.all.data(),
                                  kDescWords, MPI_UINT64_T, owned_.comm, &request));
    wait(desc, request, /*moving_data=*/false, exchange_);
  });
  const DescExchange& ex = *exchange_;
  for (int r = 0; r < size(); ++r) {
    if (!std::equal(ex.mine.begin(), ex.mine.end(), ex.all.begin() + r * kDescWords)) {
      fail(CommError::Reason::kMismatch, mismatch_message(ex.all, size()));
    }
  }
  last_agreed_ = desc;
}

// fp16 and bf16, which MPI cannot add: a float copy of all `send_count`
// elements is reduced in place (accumulating in float, rounded once at the
// end, as the other backends do) by start(MPI_IN_PLACE, buffer, &request),
// which leaves this rank's result at the start of the buffer (MPI_Iallreduce
// and MPI_Ireduce_scatter_block alike).
template <typename Start>
void MpiCommunicator::reduce_in_float(const CollectiveDesc& desc, const void* send, void* recv,
                                      size_t send_count, Start&& start) {
  auto staged = std::make_shared<std::vector<float>>(send_count);
  mpi::widen(send, desc.dtype, staged->data(), send_count);
  MPI_Request request = MPI_REQUEST_NULL;
  start(MPI_IN_PLACE, staged->data(), &request);
  wait(desc, request, /*moving_data=*/true, staged);
  if (desc.op == ReduceOp::kAvg) mpi::divide(staged->data(), desc.count, size());
  mpi::narrow(staged->data(), desc.dtype, recv, desc.count);
}

// The collectives that move data: agreed on, refused alike on every rank when
// too large for MPI, then fn(n), n being the count as MPI takes it.
template <typename Fn>
void MpiCommunicator::move_data(const CollectiveDesc& desc, Fn&& fn) {
  agree(desc);
  const int n = mpi_count(desc);
  if (n == 0) return;
  guard(desc, [&] { fn(n); });
}

// all_reduce and reduce_scatter alike: MPI's type and operation for the
// call, fp16 and bf16 staged through float, and the average. They differ in
// the MPI call, start(in, out, n, type, op, &request), and in how they go in
// place: direct(reduce_now) runs the reduction of the other types, each
// reduce_now(in, out) starting the MPI call and waiting for it.
template <typename Start, typename Direct>
void MpiCommunicator::reduce(const CollectiveDesc& desc, const void* send, void* recv,
                             size_t send_count, Start&& start, Direct&& direct) {
  move_data(desc, [&](int n) {
    const MPI_Datatype type = mpi::reduction_type(desc.dtype, desc.op);
    const MPI_Op op = mpi::reduction_op(desc.dtype, desc.op, owned_.nan_max, owned_.wrapping_sum);
    auto start_n = [&](const void* in, void* out, MPI_Request* request) {
      start(in, out, n, type, op, request);
    };
    if (mpi::reduces_in_float(desc.dtype)) {
      return reduce_in_float(desc, send, recv, send_count, start_n);
    }
    direct([&](const void* in, void* out) {
      MPI_Request request = MPI_REQUEST_NULL;
      start_n(in, out, &request);
      wait(desc, request, /*moving_data=*/true, nullptr);
    });
    if (desc.op == ReduceOp::kAvg) mpi::divide(static_cast<float*>(recv), desc.count, size());
  });
}

void MpiCommunicator::do_all_reduce(const CollectiveDesc& desc, const void* send, void* recv,
                                    const Stream& /*stream*/) {
  reduce(
      desc, send, recv, desc.count,
      [&](const void* in, void* out, int n, MPI_Datatype type, MPI_Op op, MPI_Request* request) {
        ZEST_MPI_CHECK(MPI_Iallreduce(in, out, n, type, op, owned_.comm, request));
      },
      [&](auto&& reduce_now) { reduce_now(send == recv ? MPI_IN_PLACE : send, recv); });
}

void MpiCommunicator::do_reduce_scatter(const CollectiveDesc& desc, const void* send, void* recv,
                                        const Stream& /*stream*/) {
  reduce(
      desc, send, recv, desc.count * static_cast<size_t>(size()),
      [&](const void* in, void* out, int n, MPI_Datatype type, MPI_Op op, MPI_Request* request) {
        ZEST_MPI_CHECK(MPI_Ireduce_scatter_block(in, out, n, type, op, owned_.comm, request));
      },
      [&](auto&& reduce_now) {
        const size_t part = desc.count * elem_size(desc.dtype);
        char* whole = static_cast<char*>(recv) - static_cast<size_t>(rank()) * part;
        if (whole != send) return reduce_now(send, recv);
        // MPI's in-place form reduces the whole send buffer and leaves this
        // rank's part at its start: what was there goes back afterwards, so
        // that only recv changes, as with the other backends.
        std::vector<char> first_part;
        if (rank() != 0) first_part.assign(whole, whole + part);
        reduce_now(MPI_IN_PLACE, whole);
        if (!first_part.empty()) {
          std::memcpy(recv, whole, part);
          std::memcpy(whole, first_part.data(), part);
        }
      });
}

void MpiCommunicator::do_all_gather(const CollectiveDesc& desc, const void* send, void* recv,
                                    const Stream& /*stream*/) {
  move_data(desc, [&](int n) {
    const MPI_Datatype type = mpi::copy_type(desc.dtype);
    const size_t part = desc.count * elem_size(desc.dtype);
    const bool in_place =
        static_cast<const char*>(recv) + static_cast<size_t>(rank()) * part == send;
    MPI_Request request = MPI_REQUEST_NULL;
    if (in_place) {
      ZEST_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, type,
                                    owned_.comm, &request));
    } else {
      ZEST_MPI_CHECK(MPI_Iallgather(send, n, type, recv, n, type, owned_.comm, &request));
    }
    wait(desc, request, /*moving_data=*/true, nullptr);
  });
}

void MpiCommunicator::do_broadcast(const CollectiveDesc& desc, const void* send, void* recv,
                                   const Stream& /*stream*/) {
  move_data(desc, [&](int n) {
    if (rank() == desc.root && send != recv) {
      std::memcpy(recv, send, desc.count * elem_size(desc.dtype));
    }
    MPI_Request request = MPI_REQUEST_NULL;
    ZEST_MPI_CHECK(
        MPI_Ibcast(recv, n, mpi::copy_type(desc.dtype), desc.root, owned_.comm, &request));
    wait(desc, request, /*moving_data=*/true, nullptr);
  });
}

void MpiCommunicator::do_barrier(const CollectiveDesc& desc, const Stream& /*stream*/) {
  // The agreement is a barrier already: no rank's all-gather completes
  // before every rank has contributed to it.
  agree(desc);
}

std::unique_ptr<Communicator> MpiCommunicator::do_split(const CollectiveDesc& desc, int color,
                                                        int key) {
  agree(desc);
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
