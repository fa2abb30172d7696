#include "zest/comm/inprocess_data.h"

#include <cstring>

#include "zest/comm/host_reduce.h"
#include "zest/comm/inprocess_data_cuda.h"

namespace zest::inprocess {

void reduce_into(const Stream& stream, const void* const* inputs, int num_inputs,
                 void* const* outputs, int num_outputs, size_t count, DType dtype, ReduceOp op) {
  if (stream.device().is_cuda()) {
    cuda_reduce_into(stream, inputs, num_inputs, outputs, num_outputs, count, dtype, op);
    return;
  }
  // Reduce once into the first output, then copy: all inputs of an element
  // are read before any output of it is written, so outputs may alias inputs.
  host_reduce(inputs, num_inputs, outputs[0], count, dtype, op);
  const size_t bytes = count * elem_size(dtype);
  for (int j = 1; j < num_outputs; ++j) {
    if (outputs[j] != outputs[0]) std::memcpy(outputs[j], outputs[0], bytes);
  }
}

void synchronize(const Stream& stream) { stream.synchronize(); }

}  // namespace zest::inprocess
