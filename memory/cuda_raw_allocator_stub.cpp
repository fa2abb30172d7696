// Builds without CUDA: the CUDA raw allocators exist but say how to get them.
#include "zest/core/check.h"
#include "zest/memory/raw_allocator.h"

namespace zest {

std::unique_ptr<RawAllocator> make_cuda_allocator(int device_index) {
  ZEST_FAIL("cuda:{} memory requested but this build of ZEST has no CUDA backend; reconfigure "
            "with -DZEST_CUDA=ON", device_index);
}

std::unique_ptr<RawAllocator> make_cuda_pinned_allocator() {
  ZEST_FAIL("pinned host memory requested but this build of ZEST has no CUDA backend; "
            "reconfigure with -DZEST_CUDA=ON");
}

}  // namespace zest
