#include "zest/comm/detail/inprocess_data.h"

#include "zest/comm/host_reduce.h"
#include "zest/comm/detail/inprocess_data_cuda.h"

namespace zest::inprocess {

void reduce_into(const Stream& stream, const void* const* inputs, int num_inputs,
                 void* const* outputs, int num_outputs, size_t count, DType dtype, ReduceOp op) {
  if (stream.device().is_cuda()) {
    cuda_reduce_into(stream, inputs, num_inputs, outputs, num_outputs, count, dtype, op);
    return;
  }
  // All inputs of a block are read before any output of it is written, so
  // outputs may be inputs (host_reduce.h).
  host_reduce(inputs, num_inputs, outputs, num_outputs, count, dtype, op);
}

void synchronize(const Stream& stream) { stream.synchronize(); }

}  // namespace zest::inprocess
