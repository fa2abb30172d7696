// One element of a reduction, compiled for both the host (host_reduce.cpp)
// and the GPU (inprocess_data.cu): sharing these keeps the two bit for bit
// alike. Internal to the comm layer.
//
// fp16 and bf16 accumulate in float and are rounded once by the caller's
// final conversion; integer sums wrap around (on a wider or unsigned type, so
// that no step is undefined behaviour, then narrowed modulo 2^n); max
// propagates NaN.
#pragma once

#include <cstdint>
#include <type_traits>

#include "zest/core/float16.h"
#include "zest/core/platform.h"

namespace zest::reduction {

// How each storage type is accumulated.
template <typename T> struct Acc { using type = T; };
template <> struct Acc<fp16> { using type = float; };
template <> struct Acc<bf16> { using type = float; };
template <> struct Acc<int32_t> { using type = int64_t; };
template <> struct Acc<int64_t> { using type = uint64_t; };  // wraps, no UB
template <> struct Acc<uint8_t> { using type = uint32_t; };

template <typename T>
ZEST_HOST_DEVICE typename Acc<T>::type load(const T& v) {
  if constexpr (std::is_same_v<T, int64_t>) {
    return static_cast<uint64_t>(v);
  } else {
    return static_cast<typename Acc<T>::type>(v);
  }
}

// acc + x, in T's accumulator type.
template <typename T>
ZEST_HOST_DEVICE typename Acc<T>::type add(typename Acc<T>::type acc, typename Acc<T>::type x) {
  return static_cast<typename Acc<T>::type>(acc + x);
}

// The larger of acc and x, compared as T's values (int64_t's accumulator is
// unsigned); NaN in, NaN out.
template <typename T>
ZEST_HOST_DEVICE typename Acc<T>::type max(typename Acc<T>::type acc, typename Acc<T>::type x) {
  if constexpr (std::is_floating_point_v<typename Acc<T>::type>) {
    return (x > acc || x != x) ? x : acc;
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return static_cast<int64_t>(x) > static_cast<int64_t>(acc) ? x : acc;
  } else {
    return x > acc ? x : acc;
  }
}

}  // namespace zest::reduction
