#include "zest/comm/host_reduce.h"

#include <cstdint>
#include <type_traits>

#include "zest/comm/reduce_element.h"
#include "zest/core/check.h"

namespace zest {
namespace {

template <typename T, typename A>
T store(A v) {
  return static_cast<T>(v);  // modular for integers (C++20), rounding for fp16/bf16
}

template <typename T>
void reduce_typed(const void* const* inputs, int n, void* out, size_t count, ReduceOp op) {
  using A = typename reduction::Acc<T>::type;
  T* o = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) {
    A acc = reduction::load(static_cast<const T*>(inputs[0])[i]);
    for (int k = 1; k < n; ++k) {
      const A x = reduction::load(static_cast<const T*>(inputs[k])[i]);
      acc = op == ReduceOp::kMax ? reduction::max<T>(acc, x) : reduction::add<T>(acc, x);
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
