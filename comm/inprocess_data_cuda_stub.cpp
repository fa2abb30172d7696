// Builds without CUDA: in-process groups on a GPU cannot be created (the
// device check refuses them first), so these are never reached.
#include "zest/comm/detail/inprocess_data_cuda.h"
#include "zest/core/check.h"

namespace zest::inprocess {

void cuda_reduce_into(const Stream&, const void* const*, int, void* const*, int, size_t, DType, ReduceOp) {
  ZEST_FAIL("in-process collectives on a GPU need a build with -DZEST_CUDA=ON");
}

}  // namespace zest::inprocess
