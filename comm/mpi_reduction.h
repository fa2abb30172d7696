// How ZEST's element types and reductions map onto MPI's. Internal to the MPI
// backend.
//
// MPI has no fp16 or bf16: those are widened to float, reduced as float and
// rounded once at the end, like the host reduction does. Two reductions use
// operations of ZEST's own instead of MPI's:
// - integer sums, which must wrap around like the host reduction's and
//   NCCL's; MPI leaves overflow to the implementation, and Open MPI 4.1's
//   vectorized kernels saturate 8- and 16-bit sums instead
//   (open-mpi/ompi#8045). They run on the unsigned type of the same width,
//   whose wrap-around gives the same bits as the signed one's.
// - float max, which must propagate NaN; MPI_MAX leaves NaN to the
//   implementation.
#pragma once

#include <mpi.h>

#include <cstddef>

#include "zest/comm/collective.h"
#include "zest/core/dtype.h"

namespace zest::mpi {

// fp16 and bf16: staged through a float buffer.
constexpr bool reduces_in_float(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

// The MPI type a reduction of `t` with `op` runs on (float for the staged
// types).
MPI_Datatype reduction_type(DType t, ReduceOp op);

// ZEST's own operations, created for each communicator and freed with it
// (MPI_Op_free).
MPI_Op make_nan_max();
MPI_Op make_wrapping_sum();

// The MPI operation for `op` on `t`, given the communicator's instances of
// the two above.
MPI_Op reduction_op(DType t, ReduceOp op, MPI_Op nan_max, MPI_Op wrapping_sum);

// An MPI type of `t`'s size that moves elements bit for bit, for gathers and
// broadcasts.
MPI_Datatype copy_type(DType t);

// fp16/bf16 <-> float for the staged reductions.
void widen(const void* src, DType t, float* dst, size_t count);
void narrow(const float* src, DType t, void* dst, size_t count);

// An average is the float sum divided by the number of ranks, as in the host
// reduction.
void divide(float* data, size_t count, int ranks);

}  // namespace zest::mpi
