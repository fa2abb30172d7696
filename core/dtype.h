// Element types of the buffers ZEST stores and communicates: the floating
// types of mixed-precision training, and integer types for counters and flags.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zest/core/float16.h"

namespace zest {

enum class DType : uint8_t {
  kFloat32,
  kFloat16,
  kBFloat16,
  kInt32,
  kInt64,
  kUInt8,
};

inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                       DType::kInt32,   DType::kInt64,   DType::kUInt8};

constexpr size_t elem_size(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

// Short names as users write them in configs: "fp32", "fp16", "bf16", "int32", ...
std::string_view dtype_name(DType t);

// Accepts the short names and the common aliases ("float32", "float", "half",
// "float16", "bfloat16"); anything else is a zest::Error listing the names.
DType parse_dtype(std::string_view name);

// The DType of a C++ storage type, for typed views of untyped buffers.
template <typename T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::kFloat32; };
template <> struct dtype_of<fp16> { static constexpr DType value = DType::kFloat16; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::kBFloat16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::kInt64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::kUInt8; };
template <typename T>
inline constexpr DType dtype_of_v = dtype_of<T>::value;

}  // namespace zest
