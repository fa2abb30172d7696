// libtorch's host tensors of 2 MiB and more in huge pages, cached between
// steps (memory/huge_page_cache.cpp's Note [huge pages for libtorch's host
// tensors]): one call at the start of main(), before other threads use
// libtorch (libtorch swaps its allocator without synchronizing). The smaller
// tensors keep libtorch's own allocator; so do tensors made before the call,
// each freed by the allocator that made it.
//
//   // zest-example: run
//   #include <torch/torch.h>
//   #include "zest/core/check.h"
//   zest::use_huge_page_host_tensors();
//   torch::Tensor a = torch::ones({1024, 1024});          // 4 MiB: a cached block
//   a = torch::Tensor();                                   // kept for the next 4 MiB tensor
//   torch::Tensor b = torch::zeros({1024, 1024});
//   const zest::HugePageCache::Stats s = zest::host_tensor_memory();
//   ZEST_CHECK(s.hits >= 1 && s.in_use_bytes >= b.nbytes(), "b reused a's block");
//
// The training step's arithmetic is unchanged (it is where the bytes live,
// not what is computed), and with it the bits. Process-wide and for good:
// libtorch keeps one host allocator, which tensors outlive. What the cache
// holds, in use and idle, is named in the examples' memory report, and is
// never more than the most the process has had in use at once.
#pragma once

#include "zest/memory/huge_page_cache.h"

namespace zest {

// Makes libtorch's host allocator serve tensors of 2 MiB and more from a
// HugePageCache. Idempotent and thread-safe. ZEST_HOST_TENSOR_CACHE=0 in the
// environment makes it a no-op (libtorch's allocator stays), for comparisons.
// Returns whether the cache serves libtorch now.
bool use_huge_page_host_tensors();

// The cache's figures; zeros before use_huge_page_host_tensors().
HugePageCache::Stats host_tensor_memory();

// Gives the cache's idle blocks back to the system (torch.cuda.empty_cache()
// for these host tensors); the next step maps them again.
void release_idle_host_tensors();

}  // namespace zest
