#include "zest/comm/host_reduce.h"

#include <cstdint>

#include "zest/core/check.h"

namespace zest {
namespace {

// How each storage type is accumulated.
template <typename T> struct Acc { using type = T; };
template <> struct Acc<fp16> { using type = float; };
template <> struct Acc<bf16> { using type = float; };
template <> struct Acc<int32_t> { using type = int64_t; };
template <> struct Acc<int64_t> { using type = uint64_t; };  // wraps, no UB
template <> struct Acc<uint8_t> { using type = uint32_t; };

template <typename T>
typename Acc<T>::type load(const T& v) {
  if constexpr (std::is_same_v<T, int64_t>) {
    return static_cast<uint64_t>(v);
  } else {
    return static_cast<typename Acc<T>::type>(v);
  }
}

template <typename T, typename A>
T store(A v) {
  return static_cast<T>(v);  // modular for integers (C++20), rounding for fp16/bf16
}

template <typename T>
void reduce_typed(const void* const* inputs, int n, void* out, size_t count, ReduceOp op) {
  using A = typename Acc<T>::type;
  T* o = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) {
    A acc = load(static_cast<const T*>(inputs[0])[i]);
    for (int k = 1; k < n; ++k) {
      const A x = load(static_cast<const T*>(inputs[k])[i]);
      if (op == ReduceOp::kMax) {
        if constexpr (std::is_floating_point_v<A>) {
          acc = (x > acc || x != x) ? x : acc;  // NaN in, NaN out
        } else if constexpr (std::is_same_v<T, int64_t>) {
          acc = static_cast<int64_t>(x) > static_cast<int64_t>(acc) ? x : acc;
        } else {
          acc = x > acc ? x : acc;
        }
      } else {
        acc = static_cast<A>(acc + x);
      }
    }
    if constexpr (std::is_floating_point_v<A>) {
      if (op == ReduceOp::kAvg) acc /= static_cast<A>(n);
    }
    o[i] = store<T>(acc);
  }
}

}  // namespace

void host_reduce(const void* const* inputs, int num_inputs, void* out, size_t count, DType dtype,
                 ReduceOp op) {
  ZEST_INTERNAL_ASSERT(num_inputs >= 1);
  ZEST_CHECK(op != ReduceOp::kAvg || is_floating(dtype), "avg of {} is not defined", dtype_name(dtype));
  switch (dtype) {
    case DType::kFloat32: return reduce_typed<float>(inputs, num_inputs, out, count, op);
    case DType::kFloat16: return reduce_typed<fp16>(inputs, num_inputs, out, count, op);
    case DType::kBFloat16: return reduce_typed<bf16>(inputs, num_inputs, out, count, op);
    case DType::kInt32: return reduce_typed<int32_t>(inputs, num_inputs, out, count, op);
    case DType::kInt64: return reduce_typed<int64_t>(inputs, num_inputs, out, count, op);
    case DType::kUInt8: return reduce_typed<uint8_t>(inputs, num_inputs, out, count, op);
  }
  ZEST_INTERNAL_ASSERT(false, "unhandled dtype {}", dtype_name(dtype));
}

}  // namespace zest
