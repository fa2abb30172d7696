// The CUDA side of the in-process backend: ranks sharing one GPU reduce
// straight between each other's device buffers.
//
// The reduction is host_reduce.cpp's, element for element and from the same
// code (reduce_element.h): inputs in rank order, fp16 and bf16 accumulated in
// float and rounded once (with ZEST's own conversions, which the host uses
// too), integer sums wrapping, max propagating NaN, avg dividing the float
// sum by the number of inputs. Float adds and divides are IEEE
// round-to-nearest on both sides (nvcc keeps denormals and exact division
// unless told otherwise, and nothing here can be contracted into an FMA), so
// the bits are the host's. The one exception is the payload of a NaN that an
// add or a divide creates or passes on: x86 keeps an operand's payload, the
// GPU returns its canonical NaN. Which elements are NaN always agrees, and
// max passes its NaN on unchanged.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "zest/comm/detail/inprocess_data_cuda.h"
#include "zest/comm/detail/reduce_element.h"
#include "zest/core/cuda_check.h"
#include "zest/core/cuda_stream.h"
#include "zest/core/device.h"
#include "zest/core/dtype.h"
#include "zest/core/float16.h"

namespace zest::inprocess {
namespace {

// Pointers travel in the kernel's parameters (1 KiB of the 4 KiB allowed),
// which is what bounds the ranks; more would need a device-side table.
constexpr int kMaxRanks = 64;

struct Pointers {
  const void* in[kMaxRanks];
  void* out[kMaxRanks];
};

template <typename T, ReduceOp kOp>
__global__ void reduce_kernel(Pointers p, int num_inputs, int num_outputs, size_t count) {
  using A = typename reduction::Acc<T>::type;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    A acc = reduction::load(static_cast<const T*>(p.in[0])[i]);
    for (int k = 1; k < num_inputs; ++k) {
      const A x = reduction::load(static_cast<const T*>(p.in[k])[i]);
      if constexpr (kOp == ReduceOp::kMax) {
        acc = reduction::max<T>(acc, x);
      } else {
        acc = reduction::add<T>(acc, x);
      }
    }
    if constexpr (kOp == ReduceOp::kAvg && std::is_floating_point_v<A>) {
      acc /= static_cast<A>(num_inputs);
    }
    // Every input of element i is read before any output of it is written:
    // outputs may alias inputs (in-place collectives).
    const T v = static_cast<T>(acc);
    for (int j = 0; j < num_outputs; ++j) static_cast<T*>(p.out[j])[i] = v;
  }
}

template <typename T, ReduceOp kOp>
void launch(const Pointers& p, int num_inputs, int num_outputs, size_t count, cudaStream_t stream) {
  constexpr unsigned kThreads = 256;
  // Enough blocks to fill any current GPU; the grid-stride loop does the rest.
  constexpr size_t kMaxBlocks = 4096;
  const size_t blocks = std::min(kMaxBlocks, (count + kThreads - 1) / kThreads);
  reduce_kernel<T, kOp><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, num_inputs,
                                                                               num_outputs, count);
  ZEST_CUDA_KERNEL_CHECK();
}

template <typename T>
void launch_op(ReduceOp op, const Pointers& p, int num_inputs, int num_outputs, size_t count,
               cudaStream_t stream) {
  switch (op) {
    case ReduceOp::kSum: return launch<T, ReduceOp::kSum>(p, num_inputs, num_outputs, count, stream);
    case ReduceOp::kAvg: return launch<T, ReduceOp::kAvg>(p, num_inputs, num_outputs, count, stream);
    case ReduceOp::kMax: return launch<T, ReduceOp::kMax>(p, num_inputs, num_outputs, count, stream);
  }
  ZEST_INTERNAL_ASSERT(false, "unhandled reduce op {}", static_cast<int>(op));
}

}  // namespace

void cuda_reduce_into(const Stream& stream, const void* const* inputs, int num_inputs,
                      void* const* outputs, int num_outputs, size_t count, DType dtype, ReduceOp op) {
  ZEST_CHECK(num_inputs >= 1 && num_inputs <= kMaxRanks && num_outputs >= 1 && num_outputs <= kMaxRanks,
             "in-process collectives on a GPU support 1 to {} ranks, got {} inputs and {} outputs; "
             "use fewer ranks, or the host, or the NCCL backend",
             kMaxRanks, num_inputs, num_outputs);
  ZEST_CHECK(op != ReduceOp::kAvg || is_floating(dtype), "avg of {} is not defined", dtype_name(dtype));
  if (count == 0) return;
  Pointers p{};
  for (int k = 0; k < num_inputs; ++k) p.in[k] = inputs[k];
  for (int j = 0; j < num_outputs; ++j) p.out[j] = outputs[j];
  DeviceGuard guard(stream.device());  // a kernel runs on the current device
  const auto s = cuda_stream(stream);
  switch (dtype) {
    case DType::kFloat32: return launch_op<float>(op, p, num_inputs, num_outputs, count, s);
    case DType::kFloat16: return launch_op<fp16>(op, p, num_inputs, num_outputs, count, s);
    case DType::kBFloat16: return launch_op<bf16>(op, p, num_inputs, num_outputs, count, s);
    case DType::kInt32: return launch_op<int32_t>(op, p, num_inputs, num_outputs, count, s);
    case DType::kInt64: return launch_op<int64_t>(op, p, num_inputs, num_outputs, count, s);
    case DType::kUInt8: return launch_op<uint8_t>(op, p, num_inputs, num_outputs, count, s);
  }
  ZEST_INTERNAL_ASSERT(false, "unhandled dtype {}", dtype_name(dtype));
}

}  // namespace zest::inprocess
