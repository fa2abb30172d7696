// Raw allocators over the CUDA runtime: device memory and pinned host memory.
#include "zest/core/cuda_check.h"
#include "zest/core/detail/cuda_runtime.h"
#include "zest/memory/raw_allocator.h"

namespace zest {
namespace {

class CudaRawAllocator final : public RawAllocator {
 public:
  explicit CudaRawAllocator(int device) : device_(Device::cuda(device)) {
    check_device_available(device_);
  }
  Device device() const override { return device_; }
  std::string_view name() const override { return "cudaMalloc"; }

  void* allocate(size_t size_bytes) override {
    DeviceGuard guard(device_);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, size_bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // consumed: the caller's out-of-memory path takes over
      return nullptr;
    }
    ZEST_CUDA_CHECK(err);
    return p;
  }
  void deallocate(void* ptr, size_t) noexcept override {
    const int previous = [] {
      int d = 0;
      return cudaGetDevice(&d) == cudaSuccess ? d : -1;
    }();
    if (previous != device_.index()) ZEST_CUDA_WARN(cudaSetDevice(device_.index()));
    ZEST_CUDA_WARN(cudaFree(ptr));
    if (previous >= 0 && previous != device_.index()) ZEST_CUDA_WARN(cudaSetDevice(previous));
  }
  RawMemoryInfo memory_info() const override {
    const cuda_rt::MemInfo m = cuda_rt::mem_info(device_.index());
    return {m.free_bytes, m.total_bytes};
  }

 private:
  Device device_;
};

class CudaPinnedRawAllocator final : public RawAllocator {
 public:
  Device device() const override { return Device::host(); }
  std::string_view name() const override { return "cudaHostAlloc"; }

  void* allocate(size_t size_bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, size_bytes, cudaHostAllocDefault);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    ZEST_CUDA_CHECK(err);
    return p;
  }
  void deallocate(void* ptr, size_t) noexcept override { ZEST_CUDA_WARN(cudaFreeHost(ptr)); }
  RawMemoryInfo memory_info() const override { return make_host_allocator()->memory_info(); }
};

}  // namespace

std::unique_ptr<RawAllocator> make_cuda_allocator(int device_index) {
  return std::make_unique<CudaRawAllocator>(device_index);
}

std::unique_ptr<RawAllocator> make_cuda_pinned_allocator() {
  ZEST_CHECK(cuda_device_count() > 0, "pinned host memory needs a CUDA device; none is visible");
  return std::make_unique<CudaPinnedRawAllocator>();
}

}  // namespace zest
