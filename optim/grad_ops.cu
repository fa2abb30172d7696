// CUDA kernels of accumulate, scale and convert: grid-stride loops over the
// elements (eight at a time in 16-byte loads where aligned), widening to float and narrowing once with CUDA's conversions
// (cuda_elementwise.cuh), which round to nearest even like the host's loops
// in grad_ops.cpp. A single float add cannot be contracted, so the sums are
// the host's bits (NaN payloads aside).
#include "zest/core/cuda_check.h"
#include "zest/core/cuda_stream.h"
#include "zest/core/device.h"
#include "zest/optim/detail/cuda_elementwise.cuh"
#include "zest/optim/detail/dtype_dispatch.h"
#include "zest/optim/detail/optim_cuda.h"

namespace zest::detail {
namespace {

// kVector: Note [16-byte vectors] (vector_lanes.h); the same one-element
// arithmetic either way.
template <bool kVector, typename TD, typename TS>
__global__ void accumulate_kernel(TD* dst, const TS* src, size_t n) {
  const auto one = [&](size_t i) { store_float(dst, i, load_float(dst, i) + load_float(src, i)); };
  if constexpr (kVector) {
    const auto eight = [&](size_t i) {
      float a[kVecElems], b[kVecElems];
      load8(dst, i, a);
      load8(src, i, b);
      for (unsigned k = 0; k < kVecElems; ++k) a[k] = a[k] + b[k];
      store8(dst, i, a);
    };
    for_each_vector(n, first_index(), grid_stride(), eight, one);
  } else {
    for (size_t i = first_index(); i < n; i += grid_stride()) one(i);
  }
}

template <bool kVector, typename TS, typename TD>
__global__ void convert_kernel(const TS* src, TD* dst, size_t n) {
  const auto one = [&](size_t i) { store_float(dst, i, load_float(src, i)); };
  if constexpr (kVector) {
    const auto eight = [&](size_t i) {
      float a[kVecElems];
      load8(src, i, a);
      store8(dst, i, a);
    };
    for_each_vector(n, first_index(), grid_stride(), eight, one);
  } else {
    for (size_t i = first_index(); i < n; i += grid_stride()) one(i);
  }
}

template <bool kVector, typename T>
__global__ void scale_kernel(T* buf, float factor, size_t n) {
  const auto one = [&](size_t i) { store_float(buf, i, load_float(buf, i) * factor); };
  if constexpr (kVector) {
    const auto eight = [&](size_t i) {
      float a[kVecElems];
      load8(buf, i, a);
      for (unsigned k = 0; k < kVecElems; ++k) a[k] = a[k] * factor;
      store8(buf, i, a);
    };
    for_each_vector(n, first_index(), grid_stride(), eight, one);
  } else {
    for (size_t i = first_index(); i < n; i += grid_stride()) one(i);
  }
}

}  // namespace

void scale_cuda(const Stream& stream, void* buf, DType dtype, float factor, size_t n) {
  DeviceGuard guard(stream.device());
  const auto native = cuda_stream(stream);
  visit_float_dtype(dtype, "scale", "buffers", [&](auto type) {
    using T = typename decltype(type)::type;
    if (vector_aligned({buf})) {
      scale_kernel<true, T><<<vector_blocks(n), kElementwiseThreads, 0, native>>>(static_cast<T*>(buf), factor, n);
    } else {
      scale_kernel<false, T><<<elementwise_blocks(n), kElementwiseThreads, 0, native>>>(static_cast<T*>(buf),
                                                                                         factor, n);
    }
    ZEST_CUDA_KERNEL_CHECK();
  });
}

void accumulate_cuda(const Stream& stream, void* dst, DType dst_dtype, const void* src, DType src_dtype,
                     size_t n) {
  DeviceGuard guard(stream.device());  // a kernel runs on the current device
  const auto native = cuda_stream(stream);
  visit_float_dtype(dst_dtype, "accumulate", "destinations", [&](auto to) {
    visit_float_dtype(src_dtype, "accumulate", "sources", [&](auto from) {
      using TD = typename decltype(to)::type;
      using TS = typename decltype(from)::type;
      if (vector_aligned({dst, src})) {
        accumulate_kernel<true, TD, TS><<<vector_blocks(n), kElementwiseThreads, 0, native>>>(
            static_cast<TD*>(dst), static_cast<const TS*>(src), n);
      } else {
        accumulate_kernel<false, TD, TS><<<elementwise_blocks(n), kElementwiseThreads, 0, native>>>(
            static_cast<TD*>(dst), static_cast<const TS*>(src), n);
      }
      ZEST_CUDA_KERNEL_CHECK();
    });
  });
}

void convert_cuda(const Stream& stream, const void* src, DType src_dtype, void* dst, DType dst_dtype,
                  size_t n) {
  DeviceGuard guard(stream.device());
  const auto native = cuda_stream(stream);
  visit_float_dtype(src_dtype, "convert", "sources", [&](auto from) {
    visit_float_dtype(dst_dtype, "convert", "destinations", [&](auto to) {
      using TS = typename decltype(from)::type;
      using TD = typename decltype(to)::type;
      if (vector_aligned({src, dst})) {
        convert_kernel<true, TS, TD><<<vector_blocks(n), kElementwiseThreads, 0, native>>>(
            static_cast<const TS*>(src), static_cast<TD*>(dst), n);
      } else {
        convert_kernel<false, TS, TD><<<elementwise_blocks(n), kElementwiseThreads, 0, native>>>(
            static_cast<const TS*>(src), static_cast<TD*>(dst), n);
      }
      ZEST_CUDA_KERNEL_CHECK();
    });
  });
}

}  // namespace zest::detail
