// The cudaStream_t behind a zest::Stream, spelled once. Include only from
// code compiled with the CUDA toolkit (ZEST_WITH_CUDA).
#pragma once

#include <cuda_runtime.h>

#include "zest/core/stream.h"

namespace zest {

inline cudaStream_t cuda_stream(const Stream& stream) { return static_cast<cudaStream_t>(stream.native()); }

}  // namespace zest
