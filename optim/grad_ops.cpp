// Host loops of accumulate and convert, and the checks and dispatch both
// backends share. The loops widen with core/float16.h's exact conversions,
// add in float and narrow once, round to nearest even, block by block
// through host_convert.h; grad_ops.cu does the same with CUDA's conversions,
// which round alike.
#include "zest/optim/grad_ops.h"

#include <algorithm>
#include <type_traits>

#include "zest/core/check.h"
#include "zest/core/host_queue.h"
#include "zest/memory/copy.h"
#include "zest/optim/detail/dtype_dispatch.h"
#include "zest/optim/detail/host_convert.h"
#include "zest/optim/detail/host_kernels.h"
#include "zest/optim/detail/optim_cuda.h"

namespace zest {
namespace {

using detail::kHostBlock;

// Not __restrict: accumulate may add a buffer into itself.
void add_into(float* acc, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += x[i];
}

template <typename TD, typename TS>
void accumulate_loop(TD* dst, const TS* src, size_t n) {
  if constexpr (std::is_same_v<TD, float> && std::is_same_v<TS, float>) {
    add_into(dst, src, n);
  } else {
    float a[kHostBlock];
    float b[kHostBlock];
    for (size_t base = 0; base < n; base += kHostBlock) {
      const size_t len = std::min(kHostBlock, n - base);
      float* acc = a;
      if constexpr (std::is_same_v<TD, float>) {
        acc = dst + base;  // added in place
      } else {
        detail::widen(dst + base, a, len);
      }
      if constexpr (std::is_same_v<TS, float>) {
        add_into(acc, src + base, len);
      } else {
        detail::widen(src + base, b, len);
        add_into(acc, b, len);
      }
      if constexpr (!std::is_same_v<TD, float>) detail::narrow(a, dst + base, len);
    }
  }
}

template <typename TS, typename TD>
void convert_loop(const TS* src, TD* dst, size_t n) {
  if constexpr (std::is_same_v<TS, float>) {
    detail::narrow(src, dst, n);
  } else if constexpr (std::is_same_v<TD, float>) {
    detail::widen(src, dst, n);
  } else {
    float block[kHostBlock];
    for (size_t base = 0; base < n; base += kHostBlock) {
      const size_t len = std::min(kHostBlock, n - base);
      detail::widen(src + base, block, len);
      detail::narrow(block, dst + base, len);
    }
  }
}

template <typename T>
void scale_loop(T* buf, float factor, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    for (size_t i = 0; i < n; ++i) buf[i] *= factor;
  } else {
    float block[kHostBlock];
    for (size_t base = 0; base < n; base += kHostBlock) {
      const size_t len = std::min(kHostBlock, n - base);
      detail::widen(buf + base, block, len);
      for (size_t i = 0; i < len; ++i) block[i] *= factor;
      detail::narrow(block, buf + base, len);
    }
  }
}

// Refuses a dtype other than fp32, fp16 or bf16 with the usual message.
void check_float_dtype(DType dtype, std::string_view op, std::string_view role) {
  detail::visit_float_dtype(dtype, op, role, [](auto) {});
}

}  // namespace

void accumulate(const Stream& stream, void* dst, const void* src, DType dtype, size_t n) {
  accumulate(stream, dst, dtype, src, dtype, n);
}

void accumulate(const Stream& stream, void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) {
  check_float_dtype(dst_dtype, "accumulate", "destinations");
  check_float_dtype(src_dtype, "accumulate", "sources");
  if (n == 0) return;
  ZEST_CHECK(dst != nullptr && src != nullptr,
             "accumulate: {} pointer is null for {} elements ({} into {}) on {}",
             dst == nullptr ? "the destination" : "the source", n, dtype_name(src_dtype), dtype_name(dst_dtype),
             stream.device().str());
  if (stream.device().is_cuda()) return detail::accumulate_cuda(stream, dst, dst_dtype, src, src_dtype, n);
  host_launch(stream, [=] {
    detail::visit_float_dtype(dst_dtype, "accumulate", "destinations", [&](auto to) {
      detail::visit_float_dtype(src_dtype, "accumulate", "sources", [&](auto from) {
        using TD = typename decltype(to)::type;
        using TS = typename decltype(from)::type;
        accumulate_loop(static_cast<TD*>(dst), static_cast<const TS*>(src), n);
      });
    });
  });
}

void convert(const Stream& stream, const void* src, DType src_dtype, void* dst, DType dst_dtype,
             size_t n) {
  check_float_dtype(src_dtype, "convert", "sources");
  check_float_dtype(dst_dtype, "convert", "destinations");
  if (n == 0) return;
  ZEST_CHECK(dst != nullptr && src != nullptr,
             "convert: {} pointer is null for {} elements ({} to {}) on {}",
             dst == nullptr ? "the destination" : "the source", n, dtype_name(src_dtype),
             dtype_name(dst_dtype), stream.device().str());
  // Nothing to round: the bytes are the values (NaN payloads included).
  if (src_dtype == dst_dtype) return copy_bytes(stream, dst, src, n * elem_size(src_dtype));
  if (stream.device().is_cuda()) {
    return detail::convert_cuda(stream, src, src_dtype, dst, dst_dtype, n);
  }
  host_launch(stream, [=] {
    detail::visit_float_dtype(src_dtype, "convert", "sources", [&](auto from) {
      detail::visit_float_dtype(dst_dtype, "convert", "destinations", [&](auto to) {
        using TS = typename decltype(from)::type;
        using TD = typename decltype(to)::type;
        convert_loop(static_cast<const TS*>(src), static_cast<TD*>(dst), n);
      });
    });
  });
}

void scale(const Stream& stream, void* buf, DType dtype, float factor, size_t n) {
  check_float_dtype(dtype, "scale", "buffers");
  if (n == 0) return;
  ZEST_CHECK(buf != nullptr, "scale: the buffer is null for {} elements ({}) on {}", n, dtype_name(dtype),
             stream.device().str());
  if (stream.device().is_cuda()) return detail::scale_cuda(stream, buf, dtype, factor, n);
  host_launch(stream, [=] {
    detail::visit_float_dtype(dtype, "scale", "buffers", [&](auto type) {
      using T = typename decltype(type)::type;
      scale_loop(static_cast<T*>(buf), factor, n);
    });
  });
}

bool any_non_finite_host(const void* values, DType dtype, size_t n) {
  ZEST_CHECK(values != nullptr || n == 0, "any_non_finite_host: null values for {} elements", n);
  const detail::HostKernels& k = detail::host_kernels();
  switch (dtype) {
    case DType::kFloat32:
      return k.any_non_finite32(static_cast<const uint32_t*>(values), n);
    case DType::kBFloat16:
      return k.any_non_finite16(static_cast<const uint16_t*>(values), n, 0x7f80u);
    case DType::kFloat16:
      return k.any_non_finite16(static_cast<const uint16_t*>(values), n, 0x7c00u);
    default:
      ZEST_CHECK(false, "any_non_finite_host: {} values (fp32, fp16 or bf16 only)", dtype_name(dtype));
      return false;
  }
}

}  // namespace zest
