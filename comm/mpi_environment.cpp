// MPI's start and end for the process, and what abandoned MPI operations
// (aborted communicators, a rendezvous that timed out) leave behind.
#include "zest/comm/mpi_comm.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <vector>

#include "zest/core/exit_deadline.h"
#include "zest/core/logging.h"
#include "zest/core/rank_context.h"
#include "zest/core/mpi_check.h"

namespace zest {
namespace {

// Process-wide, like MPI's own state.
struct AbortRecord {
  std::mutex mutex;
  std::string first_reason;
  // Never freed: an abandoned non-blocking operation may write into these
  // whenever MPI makes progress, up to the end of the process.
  std::vector<std::shared_ptr<void>> kept;
};

AbortRecord& abort_record() {
  static AbortRecord* record = new AbortRecord;  // outlives every static destructor
  return *record;
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

void check_thread_level() {
  int level = MPI_THREAD_SINGLE;
  ZEST_MPI_CHECK(MPI_Query_thread(&level));
  // The thread that drives a communicator need not be the one that
  // initialized MPI, so FUNNELED is not enough.
  ZEST_CHECK(level >= MPI_THREAD_SERIALIZED,
             "MPI runs at {}, but ZEST calls MPI from whichever thread uses a communicator and "
             "needs at least MPI_THREAD_SERIALIZED (MPI_THREAD_MULTIPLE when several threads use "
             "communicators at once). Initialize MPI with MPI_Init_thread asking for "
             "MPI_THREAD_MULTIPLE, or let zest::MpiEnvironment do it, with an MPI built with "
             "thread support",
             thread_level_name(level));
}

bool mpi_running() {
  int initialized = 0;
  int finalized = 0;
  return MPI_Initialized(&initialized) == MPI_SUCCESS && initialized &&
         MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized;
}

// An exception nobody caught: the job ends now, saying why, instead of this
// rank dying while the others wait for it in a collective.
[[noreturn]] void terminate_job() {
  std::string what = "std::terminate was called without an exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (...) {
      what = "uncaught exception: " + current_exception_text();
    }
  }
  const RankContext ctx = this_rank();
  MpiEnvironment::abort_job(ctx.rank >= 0 ? fmt::format("[rank {}] {}", ctx.rank, what) : what);
}

}  // namespace

void MpiEnvironment::abort_job(std::string_view message) {
  std::fprintf(stderr, "%.*s\n", static_cast<int>(message.size()), message.data());
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi_running()) {
    std::fprintf(stderr, "ending the MPI job with MPI_Abort\n");
    std::fflush(stderr);
    bound_mpi_abort();
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::_Exit(1);
}

MpiEnvironment::MpiEnvironment(int* argc, char*** argv)
    : uncaught_at_start_(std::uncaught_exceptions()) {
  int initialized = 0;
  int finalized = 0;
  ZEST_MPI_CHECK(MPI_Initialized(&initialized));
  ZEST_MPI_CHECK(MPI_Finalized(&finalized));
  ZEST_CHECK(!finalized,
             "MPI was already finalized in this process and cannot be started again; create one "
             "zest::MpiEnvironment at the top of main and keep it until the end");
  if (!initialized) {
    int provided = MPI_THREAD_SINGLE;
    ZEST_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    initialized_here_ = true;
  }
  try {
    check_thread_level();
  } catch (...) {
    // The destructor does not run for a constructor that throws.
    if (initialized_here_) ZEST_MPI_WARN(MPI_Finalize());
    throw;
  }
  ZEST_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  ZEST_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  std::set_terminate(terminate_job);
}

MpiEnvironment::~MpiEnvironment() {
  if (std::uncaught_exceptions() > uncaught_at_start_ && mpi_running()) {
    // Unwinding: this rank failed, and its exception (not to be had here)
    // is on its way out of main; MPI_Finalize would wait for the others,
    // who wait for this rank.
    abort_job(fmt::format("[rank {}] an exception is passing through the zest::MpiEnvironment "
                          "of this rank: ending the job, which cannot finish without it",
                          rank_));
  }
  const std::string reason = abort_reason();
  if (!initialized_here_) {
    if (!reason.empty()) {
      ZEST_LOG_WARN("an MPI operation was abandoned ({}); MPI_Finalize could wait forever on "
                    "it, so whoever initialized MPI should end the job with MPI_Abort instead",
                    reason);
    }
    return;
  }
  if (!reason.empty()) {
    ZEST_LOG_ERROR("ending the MPI job with MPI_Abort instead of MPI_Finalize, which could wait "
                   "forever on an MPI operation that was abandoned unfinished; it was abandoned "
                   "because: {}", reason);
    std::fflush(stdout);
    std::fflush(stderr);
    bound_mpi_abort();
    ZEST_MPI_WARN(MPI_Abort(MPI_COMM_WORLD, 1));
    return;
  }
  int finalized = 0;
  ZEST_MPI_WARN(MPI_Finalized(&finalized));
  if (finalized) {
    ZEST_LOG_WARN("MPI was finalized by someone else before zest::MpiEnvironment, which "
                  "initialized it, ended");
    return;
  }
  ZEST_MPI_WARN(MPI_Finalize());
}

std::string MpiEnvironment::abort_reason() {
  AbortRecord& r = abort_record();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.first_reason;
}

void MpiEnvironment::check_usable() {
  int initialized = 0;
  int finalized = 0;
  ZEST_MPI_CHECK(MPI_Initialized(&initialized));
  ZEST_MPI_CHECK(MPI_Finalized(&finalized));
  ZEST_CHECK(initialized && !finalized,
             "MPI is {}; create a zest::MpiEnvironment at the top of main (or call "
             "MPI_Init_thread) before making MPI communicators, and destroy them before MPI ends",
             finalized ? "already finalized" : "not initialized");
  check_thread_level();
}

void MpiEnvironment::record_abort(const std::string& reason) {
  AbortRecord& r = abort_record();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.first_reason.empty()) r.first_reason = reason.empty() ? "unknown failure" : reason;
}

void MpiEnvironment::keep_until_exit(std::shared_ptr<void> buffers) {
  AbortRecord& r = abort_record();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.kept.push_back(std::move(buffers));
}

}  // namespace zest
