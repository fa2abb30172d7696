// Internal to the in-process backend: the reduction in one rank's part of a
// collective, on the host or on the GPU that all ranks share (its copies are
// memory/copy.h's). The host version finishes before returning; the CUDA
// version queues on `stream`, which the rank synchronizes before it leaves
// the collective, because the other ranks may reuse their buffers as soon as
// it has.
#pragma once

#include <cstddef>

#include "zest/comm/collective.h"
#include "zest/core/stream.h"

namespace zest::inprocess {

// outputs[j][i] = op over k of inputs[k][i], for i < count and every j.
void reduce_into(const Stream& stream, const void* const* inputs, int num_inputs,
                 void* const* outputs, int num_outputs, size_t count, DType dtype, ReduceOp op);

// Makes the host wait for `stream` (a no-op on the host).
void synchronize(const Stream& stream);

}  // namespace zest::inprocess
