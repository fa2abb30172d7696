// Raw allocators: where the caching allocator gets its segments. Each hands out
// whole segments and takes them back; all caching, splitting and statistics
// live above, in CachingAllocator, whatever the kind of memory.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "zest/core/device.h"

namespace zest {

struct RawMemoryInfo {
  size_t free_bytes = 0;   // what the device (or limit) has left
  size_t total_bytes = 0;  // what it has in all
};

class RawAllocator {
 public:
  virtual ~RawAllocator() = default;

  // The device the memory is addressable from (pinned host memory: the host).
  virtual Device device() const = 0;
  virtual std::string_view name() const = 0;

  // Returns nullptr when the memory is not there (the caller then frees its
  // cache and retries); throws zest::Error for any other failure.
  virtual void* allocate(size_t size_bytes) = 0;
  // `size_bytes` is the size given to allocate().
  virtual void deallocate(void* ptr, size_t size_bytes) noexcept = 0;

  virtual RawMemoryInfo memory_info() const = 0;
};

// Page-aligned host memory.
std::unique_ptr<RawAllocator> make_host_allocator();

// cudaMalloc / cudaFree on one device. Throws zest::Error in a build without
// CUDA or when the device is not there.
std::unique_ptr<RawAllocator> make_cuda_allocator(int device_index);

// Page-locked host memory (cudaHostAlloc), for fast and asynchronous copies.
std::unique_ptr<RawAllocator> make_cuda_pinned_allocator();

// Wraps another raw allocator and refuses allocations that would take its use
// past `capacity_bytes`, as a device of that size would. For tests of the
// out-of-memory path, and to model a smaller device.
std::unique_ptr<RawAllocator> make_limited_allocator(std::unique_ptr<RawAllocator> inner,
                                                     size_t capacity_bytes);

}  // namespace zest
