// Internal: the CUDA side of inprocess_data.h, for ranks sharing one GPU.
// Implemented in inprocess_data.cu, or by a stub that reports the build has
// no CUDA.
#pragma once

#include <cstddef>

#include "zest/comm/collective.h"
#include "zest/core/stream.h"

namespace zest::inprocess {

void cuda_reduce_into(const Stream& stream, const void* const* inputs, int num_inputs,
                      void* const* outputs, int num_outputs, size_t count, DType dtype, ReduceOp op);

}  // namespace zest::inprocess
