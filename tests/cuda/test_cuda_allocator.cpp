// The caching allocator over real CUDA memory and real CUDA events: the host
// tests (tests/memory) check every policy with simulated events; these check
// that the same policies hold when cudaMalloc, cudaHostAlloc and cudaEvent
// are underneath.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cuda/stream_gate.h"
#include "memory/allocator_fixture.h"
#include "zest/core/cuda_check.h"

using namespace zest;
using namespace zest::test;

namespace {

constexpr Device kCuda0 = Device::cuda(0);

cudaStream_t native(const Stream& s) { return static_cast<cudaStream_t>(s.native()); }

cudaMemoryType memory_type(const void* p) {
  cudaPointerAttributes attr{};
  ZEST_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  return attr.type;
}

}  // namespace

TEST_CASE("a freed cudaMalloc block is handed out again without calling cudaMalloc") {
  CachingAllocator alloc(make_cuda_allocator(0), AllocatorConfig{});
  OwnedStream stream(kCuda0);
  CHECK(alloc.device() == kCuda0);
  void* p = alloc.allocate(1000, stream);
  AllocatorStats s = alloc.stats();
  CHECK(current(s.allocated_bytes) == 1024);
  CHECK(current(s.reserved_bytes) == MiB(2));
  CHECK(s.num_raw_allocs == 1);
  CHECK(memory_type(p) == cudaMemoryTypeDevice);

  alloc.free(p);
  void* q = alloc.allocate(1000, stream);
  CHECK(q == p);
  s = alloc.stats();
  CHECK(s.num_raw_allocs == 1);
  CHECK(current(s.allocated_bytes) == 1024);
  alloc.free(q);

  alloc.empty_cache();
  s = alloc.stats();
  CHECK(current(s.reserved_bytes) == 0);
  CHECK(s.num_raw_frees == 1);
}

TEST_CASE("blocks split from one cudaMalloc segment are distinct, usable device memory") {
  CachingAllocator alloc(make_cuda_allocator(0), AllocatorConfig{});
  OwnedStream stream(kCuda0);
  constexpr size_t kCount = 3 * kMiB / sizeof(int);  // large pool: both share a 20 MiB segment
  Buffer a = alloc.allocate_buffer(kCount * sizeof(int), stream);
  Buffer b = alloc.allocate_buffer(kCount * sizeof(int), stream);
  CHECK(offset(a.data(), b.data()) == MiB(3));
  CHECK(alloc.stats().num_raw_allocs == 1);

  std::vector<int> host(kCount);
  std::iota(host.begin(), host.end(), -12345);
  std::vector<int> back(kCount, 0);
  // Through b by a device-to-device copy, so both blocks are touched by the GPU.
  ZEST_CUDA_CHECK(cudaMemcpy(a.data(), host.data(), kCount * sizeof(int), cudaMemcpyHostToDevice));
  ZEST_CUDA_CHECK(cudaMemcpy(b.data(), a.data(), kCount * sizeof(int), cudaMemcpyDeviceToDevice));
  ZEST_CUDA_CHECK(cudaMemcpy(back.data(), b.data(), kCount * sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(back == host);
}

TEST_CASE("a block used on another stream is reused only after that stream's CUDA event") {
  CachingAllocator alloc(make_cuda_allocator(0), AllocatorConfig{});
  OwnedStream compute(kCuda0);
  OwnedStream comm(kCuda0);
  StreamGate gate;  // declared after the allocator: opened before it is destroyed

  void* p = alloc.allocate(4096, compute);
  gate.hold(native(comm));
  ZEST_CUDA_CHECK(cudaMemsetAsync(p, 0, 4096, native(comm)));  // comm's use, held by the gate
  alloc.record_stream(p, comm);
  alloc.free(p);
  CHECK(alloc.stats().num_deferred_frees == 1);
  CHECK(current(alloc.stats().active) == 1);

  void* q = alloc.allocate(4096, compute);
  CHECK(q != p);  // comm's event cannot have completed: the gate is closed

  gate.open();
  comm.get().synchronize();
  alloc.free(q);
  void* r = alloc.allocate(4096, compute);
  CHECK(r == p);
  alloc.free(r);
  const AllocatorStats s = alloc.stats();
  CHECK(s.num_deferred_frees == 1);
  CHECK(s.num_sync_all_streams == 0);  // the host never had to wait
  CHECK(current(s.active) == 0);
}

TEST_CASE("a request beyond the GPU's memory throws OutOfMemoryError, the allocator stays usable") {
  CachingAllocator alloc(make_cuda_allocator(0), AllocatorConfig{});
  OwnedStream stream(kCuda0);
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  ZEST_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t request = total_bytes + kGiB;

  std::string message;
  try {
    (void)alloc.allocate(request, stream);
    FAIL("no error");
  } catch (const OutOfMemoryError& e) {
    message = e.message();
    CHECK(e.requested_bytes() == request);
  }
  // Everything but the device's free memory, which other processes change.
  const auto bytes = [](size_t n) { return format_bytes(static_cast<int64_t>(n)); };
  const std::string head = "out of memory on cuda:0 (cudaMalloc): tried to allocate " +
                           bytes(request) + " for other (a " + bytes(round_up(request, 2 * kMiB)) +
                           " segment). The device has " + bytes(total_bytes) + " in all and ";
  const std::string tail =
      " free; this allocator holds 0 B reserved, of which 0 B allocated and 0 B reserved but "
      "unallocated; the largest free cached block is 0 B (fragmentation 0%). Reduce the batch "
      "size, or use a higher ZeRO stage or more ranks to shard more of the model state.";
  CHECK(message.starts_with(head));
  CHECK(message.ends_with(tail));
  // cudaMalloc's failure was consumed, so it does not resurface in later checks.
  CHECK(cudaGetLastError() == cudaSuccess);

  const AllocatorStats s = alloc.stats();
  CHECK(s.num_ooms == 1);
  CHECK(s.num_alloc_retries == 1);
  CHECK(s.num_raw_allocs == 0);
  void* p = alloc.allocate(size_t(MiB(1)), stream);
  CHECK(memory_type(p) == cudaMemoryTypeDevice);
  alloc.free(p);
}

TEST_CASE("pinned memory is host-accessible, copies asynchronously, is reused after CUDA events") {
  CachingAllocator pinned(make_cuda_pinned_allocator(), AllocatorConfig{});
  CachingAllocator device(make_cuda_allocator(0), AllocatorConfig{});
  CHECK(pinned.device() == Device::host());
  const Stream host = Stream::default_for(Device::host());
  OwnedStream copy(kCuda0);
  StreamGate gate;

  constexpr size_t kCount = 1 << 16;
  constexpr size_t kBytes = kCount * sizeof(float);
  Buffer src = pinned.allocate_buffer(kBytes, host);
  Buffer dst = pinned.allocate_buffer(kBytes, host);
  Buffer dev = device.allocate_buffer(kBytes, copy);
  CHECK(memory_type(src.data()) == cudaMemoryTypeHost);
  for (size_t i = 0; i < kCount; ++i) src.as<float>()[i] = static_cast<float>(i) * 0.5f;
  std::memset(dst.data(), 0xff, kBytes);

  ZEST_CUDA_CHECK(
      cudaMemcpyAsync(dev.data(), src.data(), kBytes, cudaMemcpyHostToDevice, native(copy)));
  ZEST_CUDA_CHECK(
      cudaMemcpyAsync(dst.data(), dev.data(), kBytes, cudaMemcpyDeviceToHost, native(copy)));
  copy.get().synchronize();
  CHECK(std::memcmp(dst.data(), src.data(), kBytes) == 0);

  // A pinned block read by a copy still queued on a CUDA stream must not be
  // handed out again until the copy is done, though it belongs to the host.
  void* staged = src.data();
  gate.hold(native(copy));
  ZEST_CUDA_CHECK(
      cudaMemcpyAsync(dev.data(), staged, kBytes, cudaMemcpyHostToDevice, native(copy)));
  pinned.record_stream(staged, copy);
  src.reset();
  CHECK(pinned.stats().num_deferred_frees == 1);
  Buffer other = pinned.allocate_buffer(kBytes, host);
  CHECK(other.data() != staged);
  gate.open();
  copy.get().synchronize();
  other.reset();
  Buffer again = pinned.allocate_buffer(kBytes, host);
  CHECK(again.data() == staged);
}

TEST_CASE("a capacity-limited cudaMalloc allocator reports fragmentation as the host one does") {
  // The scenario and message of tests/memory/test_allocator_oom.cpp, on cuda:0.
  CachingAllocator alloc(make_limited_allocator(make_cuda_allocator(0), 64 * kMiB),
                         AllocatorConfig{});
  OwnedStream stream(kCuda0);
  std::vector<void*> blocks;
  for (int i = 0; i < 15; ++i) blocks.push_back(alloc.allocate(size_t(MiB(4)), stream));
  CHECK(current(alloc.stats().reserved_bytes) == MiB(60));
  const auto is_hole_index = [](int i) { return i % 5 == 1 || i % 5 == 3; };
  for (int i = 0; i < 15; ++i) {
    if (is_hole_index(i)) alloc.free(blocks[i]);
  }
  std::string message;
  try {
    (void)alloc.allocate(size_t(MiB(12)), stream, MemoryCategory::kWorkspace);
    FAIL("no error");
  } catch (const OutOfMemoryError& e) {
    message = e.message();
    CHECK(e.requested_bytes() == size_t(MiB(12)));
  }
  CHECK(message ==
        "out of memory on cuda:0 (limited): tried to allocate 12.00 MiB for workspace (a 12.00 "
        "MiB segment). The device has 64.00 MiB in all and 4.00 MiB free; this allocator holds "
        "60.00 MiB reserved, of which 36.00 MiB allocated and 24.00 MiB reserved but "
        "unallocated; the largest free cached block is 4.00 MiB (fragmentation 83%). Reserved "
        "but unallocated memory is large: setting ZEST_ALLOC_CONF=max_split_size_mb:N (N > 20) "
        "limits fragmentation.");
  const AllocatorStats s = alloc.stats();
  CHECK(s.num_ooms == 1);
  CHECK(current(s.allocated_bytes) == MiB(36));
  CHECK(current(s.reserved_bytes) == MiB(60));

  void* hole = alloc.allocate(size_t(MiB(4)), stream);
  bool is_hole = false;
  for (int i = 0; i < 15; ++i) is_hole |= is_hole_index(i) && hole == blocks[i];
  CHECK(is_hole);
  alloc.free(hole);
  for (int i = 0; i < 15; ++i) {
    if (!is_hole_index(i)) alloc.free(blocks[i]);
  }
}

TEST_CASE("a stream created at a destroyed stream's address is another stream") {
  // The driver often hands the destroyed handle out again; identity (and so
  // the allocator's per-stream pools) must not follow the address.
  std::vector<uint64_t> ids;
  bool reused = false;
  void* last = nullptr;
  for (int i = 0; i < 8; ++i) {
    OwnedStream s(kCuda0);
    reused = reused || s.get().native() == last;
    last = s.get().native();
    ids.push_back(s.get().id());
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    CHECK(ids[i] != 0);
    for (size_t j = 0; j < i; ++j) CHECK(ids[i] != ids[j]);
  }
  MESSAGE("the driver reused a handle: " << reused);
}
