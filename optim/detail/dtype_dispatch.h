// Internal: from a runtime DType to the storage type that optim's templated
// loops and kernels are instantiated on. One table for the host and the CUDA
// side, so both accept exactly the same dtypes and refuse the rest with the
// same message.
//
//   // zest-example
//   DType grad_dtype = DType::kBFloat16;
//   size_t element_bytes = 0;
//   detail::visit_float_dtype(grad_dtype, "AdamW", "gradients", [&](auto tag) {
//     using TG = typename decltype(tag)::type;  // float, fp16 or bf16
//     element_bytes = sizeof(TG);
//   });
#pragma once

#include <string_view>
#include <type_traits>

#include "zest/core/check.h"
#include "zest/core/dtype.h"

namespace zest::detail {

// Calls f(std::type_identity<T>{}) for the storage type T of fp32, fp16 or
// bf16. Any other dtype is a zest::Error: "<op>: <role> of dtype int32 are
// not supported (fp32, fp16 or bf16)".
template <typename F>
void visit_float_dtype(DType dtype, std::string_view op, std::string_view role, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(std::type_identity<float>{});
    case DType::kFloat16: return f(std::type_identity<fp16>{});
    case DType::kBFloat16: return f(std::type_identity<bf16>{});
    default: break;
  }
  ZEST_FAIL("{}: {} of dtype {} are not supported (fp32, fp16 or bf16)", op, role, dtype_name(dtype));
}

}  // namespace zest::detail
