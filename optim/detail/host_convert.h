// Internal to optim/: arrays of fp32, fp16 and bf16 widened to float and
// narrowed back on the host, with core/float16.h's bits, in loops that
// vectorize for the widest instruction set the CPU has (host_kernels.h), and
// for fp16 with F16C's instructions where the CPU has them. The host loops of
// the optimizer and of the gradient ops work in float blocks of kHostBlock
// elements through these.
#pragma once

#include <cstddef>
#include <cstring>

#include "zest/core/float16.h"

namespace zest::detail {

// Small enough that a few float blocks stay in L1 while a loop works on
// them, large enough that the per-block overhead is negligible.
inline constexpr size_t kHostBlock = 2048;

void widen(const fp16* in, float* out, size_t n);
void widen(const bf16* in, float* out, size_t n);
void narrow(const float* in, fp16* out, size_t n);
void narrow(const float* in, bf16* out, size_t n);
// fp32: the bytes are the values (NaN payloads included).
inline void widen(const float* in, float* out, size_t n) {
  if (n > 0 && in != out) std::memcpy(out, in, n * sizeof(float));
}
inline void narrow(const float* in, float* out, size_t n) { widen(in, out, n); }

}  // namespace zest::detail
