// A process that is ending and must end, even when what is meant to end it
// hangs.
//
// Note [MPI_Abort can hang]: MPI_Abort asks the launcher's daemon on this
// host to end the job, and Open MPI's waits for it. Across hosts, when the
// link to mpirun is cut or drops every packet, that request is never
// answered and the rank would hang in MPI_Abort with its error printed,
// holding its GPU or memory, until TCP gives up (15 minutes by default).
// So every MPI_Abort of ZEST is preceded by exit_after(kMpiAbortWait, ...):
// when MPI_Abort has not ended the process by then, the process exits with
// status 1 itself (the other ranks end by their own timeouts, or by mpirun).
#pragma once

#include <chrono>
#include <string>

namespace zest {

inline constexpr std::chrono::milliseconds kMpiAbortWait{10000};

// Starts a detached thread that, `wait` from now, prints `why` to stderr and
// ends the process with std::_Exit(1) (no destructors: the process is
// already on its way out, and they could hang too). For a process about to
// call something that should end it; never returns an error (a thread that
// cannot be started is reported on stderr, and the call goes on without
// it).
void exit_after(std::chrono::milliseconds wait, std::string why);

// exit_after(kMpiAbortWait) with the message for an MPI_Abort that hangs:
// called right before MPI_Abort.
void bound_mpi_abort();

}  // namespace zest
