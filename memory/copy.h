// Stream-ordered byte operations on buffers of either backend: the copies and
// zero fills that the engine queues between its kernels and collectives.
//
// On a CUDA stream the work is queued (cudaMemcpyAsync / cudaMemsetAsync) and
// ordered after everything queued on that stream before it; on a host stream
// it runs now, or is queued on the stream's own thread where it has one
// (see core/stream.h).
//
//   // zest-example: prelude=buffers
//   copy_bytes(stream, shard, host_weights.data(), numel * sizeof(float));
//   fill_zero(stream, grads, n * sizeof(float));
//
// Ranges must not overlap, except that dst == src is a no-op (memcpy and
// cudaMemcpy both leave overlap undefined, so it is refused, not guessed at).
// Zero bytes is always a no-op, whatever the pointers; a null pointer with a
// nonzero size is a zest::Error.
#pragma once

#include <cstddef>

#include "zest/core/stream.h"

namespace zest {

// Copies `bytes` from src to dst, ordered on `stream`. On a CUDA stream either
// side may be host memory or memory of the stream's device (cudaMemcpyDefault
// works out the direction). A copy from or to pageable host memory makes the
// call wait for the stream's earlier work; pinned memory keeps it
// asynchronous. On a host stream both must be host memory.
void copy_bytes(const Stream& stream, void* dst, const void* src, size_t bytes);

// Sets `bytes` bytes at dst to zero, ordered on `stream`. On a CUDA stream dst
// must be memory the stream's device can write (its own memory, or mapped
// pinned host memory).
void fill_zero(const Stream& stream, void* dst, size_t bytes);

}  // namespace zest
