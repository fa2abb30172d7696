// Checks for MPI calls. Include only from code compiled with MPI.
//
//   // zest-example: needs=mpi
//   double local = 1.0, total = 0.0;
//   ZEST_MPI_CHECK(MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
//
// MPI's default handler aborts the job on error; ZEST's communicators switch
// their communicators to MPI_ERRORS_RETURN so that failures come back here and
// are reported with the expression, MPI's error string, rank and file:line.
#pragma once

#include <mpi.h>

#include "zest/core/check.h"

namespace zest::detail {
[[noreturn]] void throw_mpi_error(int code, const char* expr, const char* file, int line);
void warn_mpi_error(int code, const char* expr, const char* file, int line);
}  // namespace zest::detail

#define ZEST_MPI_CHECK(expr)                                                    \
  do {                                                                          \
    const int zest_mpi_rc_ = (expr);                                            \
    if (ZEST_UNLIKELY(zest_mpi_rc_ != MPI_SUCCESS)) {                           \
      ::zest::detail::throw_mpi_error(zest_mpi_rc_, #expr, __FILE__, __LINE__); \
    }                                                                           \
  } while (0)

#define ZEST_MPI_WARN(expr)                                                     \
  do {                                                                          \
    const int zest_mpi_rc_ = (expr);                                            \
    if (ZEST_UNLIKELY(zest_mpi_rc_ != MPI_SUCCESS)) {                           \
      ::zest::detail::warn_mpi_error(zest_mpi_rc_, #expr, __FILE__, __LINE__);  \
    }                                                                           \
  } while (0)
