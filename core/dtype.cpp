#include "zest/core/dtype.h"

#include <string>

#include "zest/core/check.h"

namespace zest {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
  }
  ZEST_INTERNAL_ASSERT(false, "unknown DType value {}", static_cast<int>(t));
}

DType parse_dtype(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType type;
  };
  static constexpr Alias kAliases[] = {
      {"fp32", DType::kFloat32},  {"float32", DType::kFloat32}, {"float", DType::kFloat32},
      {"fp16", DType::kFloat16},  {"float16", DType::kFloat16}, {"half", DType::kFloat16},
      {"bf16", DType::kBFloat16}, {"bfloat16", DType::kBFloat16},
      {"int32", DType::kInt32},   {"int64", DType::kInt64},     {"uint8", DType::kUInt8},
  };
  for (const Alias& a : kAliases) {
    if (a.name == name) return a.type;
  }
  ZEST_CHECK(false, "unknown dtype '{}'; expected one of fp32, fp16, bf16, int32, int64, uint8 "
                    "(or float32, float, float16, half, bfloat16)",
             name);
}

}  // namespace zest
