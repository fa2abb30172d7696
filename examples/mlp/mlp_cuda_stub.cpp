// Builds without CUDA: the device path's stand-ins. A CUDA engine cannot be
// made in such a build (the device check refuses cuda:N first), so run_on_device
// is not reached; a context on a host stream holds nothing, as with CUDA.
#include "mlp_cuda.h"
#include "zest/core/check.h"

namespace mlp {
namespace {

[[noreturn]] void no_cuda(const char* what, const zest::Stream& stream) {
  ZEST_FAIL("mlp: {} on {}: this build has no CUDA backend; reconfigure ZEST with -DZEST_CUDA=ON "
            "(the CUDA toolkit with cuBLAS) or run on the host (--device host)",
            what, stream.device().str());
}

}  // namespace

DeviceContext::DeviceContext(zest::CachingAllocator& allocator, zest::Stream stream)
    : allocator_(allocator), stream_(stream) {
  if (stream.device().is_cuda()) no_cuda("DeviceContext", stream);
}

DeviceContext::~DeviceContext() = default;

template <typename T>
float run_on_device(DeviceContext&, zest::Engine& engine, const Shape&, const Batch&, bool) {
  no_cuda("the device forward and backward", engine.stream());
}

template float run_on_device<float>(DeviceContext&, zest::Engine&, const Shape&, const Batch&, bool);
template float run_on_device<zest::fp16>(DeviceContext&, zest::Engine&, const Shape&, const Batch&, bool);
template float run_on_device<zest::bf16>(DeviceContext&, zest::Engine&, const Shape&, const Batch&, bool);

}  // namespace mlp
