#include "zest/comm/mpi_reduction.h"

#include <cstdlib>

#include "zest/core/float16.h"
#include "zest/core/logging.h"
#include "zest/core/mpi_check.h"

namespace zest::mpi {
namespace {

// MPI calls this with `in` holding the lower ranks' partial result and
// `inout` the higher ranks' (the operation is declared non-commutative), and
// wants in ∘ inout in `inout`. Only ever registered for MPI_FLOAT.
void nan_max_fn(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* earlier = static_cast<const float*>(in);
  auto* later = static_cast<float*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = later[i];
    later[i] = (x > earlier[i] || x != x) ? x : earlier[i];
  }
}

// Integer sums that wrap around, on the unsigned types reduction_type picks.
template <typename T>
void add_into(const void* in, void* inout, int len) {
  const auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < len; ++i) b[i] = static_cast<T>(a[i] + b[i]);
}

void wrapping_sum_fn(void* in, void* inout, int* len, MPI_Datatype* type) {
  if (*type == MPI_UINT8_T) return add_into<uint8_t>(in, inout, *len);
  if (*type == MPI_UINT32_T) return add_into<uint32_t>(in, inout, *len);
  if (*type == MPI_UINT64_T) return add_into<uint64_t>(in, inout, *len);
  // Called from inside MPI, where an exception cannot pass.
  ZEST_LOG_ERROR("internal error in ZEST: wrapping sum called on an MPI type it does not handle");
  std::abort();
}

}  // namespace

MPI_Datatype reduction_type(DType t, ReduceOp op) {
  const bool sum = op != ReduceOp::kMax;
  switch (t) {
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16: return MPI_FLOAT;
    case DType::kInt32: return sum ? MPI_UINT32_T : MPI_INT32_T;
    case DType::kInt64: return sum ? MPI_UINT64_T : MPI_INT64_T;
    case DType::kUInt8: return MPI_UINT8_T;
  }
  ZEST_INTERNAL_ASSERT(false, "unhandled dtype {}", dtype_name(t));
  return MPI_DATATYPE_NULL;
}

MPI_Op reduction_op(DType t, ReduceOp op, MPI_Op nan_max, MPI_Op wrapping_sum) {
  if (op == ReduceOp::kMax) return is_floating(t) ? nan_max : MPI_MAX;
  return is_floating(t) ? MPI_SUM : wrapping_sum;  // avg divides the sum afterwards
}

MPI_Datatype copy_type(DType t) {
  switch (elem_size(t)) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    case 8: return MPI_UINT64_T;
    default: break;
  }
  ZEST_INTERNAL_ASSERT(false, "no MPI type of {} bytes for {}", elem_size(t), dtype_name(t));
  return MPI_DATATYPE_NULL;
}

MPI_Op make_nan_max() {
  MPI_Op op = MPI_OP_NULL;
  // Non-commutative, so MPI combines in rank order: the last NaN if any,
  // else the first of the largest values, the host reduction's very bits
  // (NaN payload and the sign of a zero included).
  ZEST_MPI_CHECK(MPI_Op_create(&nan_max_fn, /*commute=*/0, &op));
  return op;
}

MPI_Op make_wrapping_sum() {
  MPI_Op op = MPI_OP_NULL;
  ZEST_MPI_CHECK(MPI_Op_create(&wrapping_sum_fn, /*commute=*/1, &op));
  return op;
}

void widen(const void* src, DType t, float* dst, size_t count) {
  ZEST_INTERNAL_ASSERT(reduces_in_float(t));
  if (t == DType::kFloat16) {
    const auto* s = static_cast<const fp16*>(src);
    for (size_t i = 0; i < count; ++i) dst[i] = static_cast<float>(s[i]);
  } else {
    const auto* s = static_cast<const bf16*>(src);
    for (size_t i = 0; i < count; ++i) dst[i] = static_cast<float>(s[i]);
  }
}

void narrow(const float* src, DType t, void* dst, size_t count) {
  ZEST_INTERNAL_ASSERT(reduces_in_float(t));
  if (t == DType::kFloat16) {
    auto* d = static_cast<fp16*>(dst);
    for (size_t i = 0; i < count; ++i) d[i] = fp16(src[i]);
  } else {
    auto* d = static_cast<bf16*>(dst);
    for (size_t i = 0; i < count; ++i) d[i] = bf16(src[i]);
  }
}

void divide(float* data, size_t count, int ranks) {
  const auto n = static_cast<float>(ranks);
  for (size_t i = 0; i < count; ++i) data[i] /= n;
}

}  // namespace zest::mpi
