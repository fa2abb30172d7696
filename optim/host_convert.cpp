// The host conversions of host_convert.h: the loops of the HostKernels table
// for this CPU (host_kernels.h).
#include "zest/optim/detail/host_convert.h"

#include "zest/optim/detail/host_kernels.h"

namespace zest::detail {

void widen(const fp16* in, float* out, size_t n) { host_kernels().widen_fp16(in, out, n); }
void widen(const bf16* in, float* out, size_t n) { host_kernels().widen_bf16(in, out, n); }
void narrow(const float* in, fp16* out, size_t n) { host_kernels().narrow_fp16(in, out, n); }
void narrow(const float* in, bf16* out, size_t n) { host_kernels().narrow_bf16(in, out, n); }

}  // namespace zest::detail
