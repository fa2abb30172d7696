#include <doctest/doctest.h>

#include "zest/core/check.h"
#include "zest/core/dtype.h"

using zest::DType;

TEST_CASE("dtype sizes and names round-trip") {
  CHECK(zest::elem_size(DType::kFloat32) == 4);
  CHECK(zest::elem_size(DType::kFloat16) == 2);
  CHECK(zest::elem_size(DType::kBFloat16) == 2);
  CHECK(zest::elem_size(DType::kInt32) == 4);
  CHECK(zest::elem_size(DType::kInt64) == 8);
  CHECK(zest::elem_size(DType::kUInt8) == 1);
  for (DType t : zest::kAllDTypes) {
    CHECK(zest::parse_dtype(zest::dtype_name(t)) == t);
  }
  CHECK(zest::parse_dtype("bfloat16") == DType::kBFloat16);
  CHECK(zest::parse_dtype("half") == DType::kFloat16);
  CHECK(zest::is_floating(DType::kBFloat16));
  CHECK_FALSE(zest::is_floating(DType::kInt64));
  static_assert(zest::dtype_of_v<zest::bf16> == DType::kBFloat16);
  static_assert(zest::dtype_of_v<float> == DType::kFloat32);
}

TEST_CASE("an unknown dtype name is an error listing the accepted names") {
  try {
    (void)zest::parse_dtype("fp8");
    FAIL("no error");
  } catch (const zest::Error& e) {
    CHECK(e.message() == "unknown dtype 'fp8'; expected one of fp32, fp16, bf16, int32, int64, "
                         "uint8 (or float32, float, float16, half, bfloat16)");
  }
}
