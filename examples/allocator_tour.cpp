// The caching allocator as a training loop sees it.
//
// A model's state is allocated once, tagged by what it is (parameters,
// gradients, fp32 master weights, optimizer moments); each step then churns
// through activations and communication buckets of the same sizes as the
// step before. After the first step every request is a cache hit: the raw
// allocator (cudaMalloc on a GPU) is not called again, which is the point.
//
//   allocator_tour [host|cuda:N] [parameters]
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "zest/core/check.h"
#include "zest/core/dtype.h"
#include "zest/core/stream.h"
#include "zest/core/units.h"
#include "zest/memory/caching_allocator.h"

namespace {

std::unique_ptr<zest::RawAllocator> raw_for(zest::Device device) {
  return device.is_host() ? zest::make_host_allocator() : zest::make_cuda_allocator(device.index());
}

void run(zest::Device device, size_t num_params) {
  using zest::MemoryCategory;
  zest::CachingAllocator alloc(raw_for(device));
  zest::OwnedStream compute(device);
  zest::OwnedStream comm(device);

  // Mixed-precision Adam, unsharded: 2 + 2 + 12 bytes per parameter.
  std::vector<zest::Buffer> state;
  state.push_back(alloc.allocate_buffer(num_params * sizeof(zest::bf16), compute, MemoryCategory::kParameters));
  state.push_back(alloc.allocate_buffer(num_params * sizeof(zest::bf16), compute, MemoryCategory::kGradients));
  state.push_back(alloc.allocate_buffer(num_params * sizeof(float), compute, MemoryCategory::kMasterWeights));
  state.push_back(alloc.allocate_buffer(2 * num_params * sizeof(float), compute, MemoryCategory::kOptimizerState));

  std::printf("step  raw allocs  reserved     peak allocated\n");
  for (int step = 0; step < 5; ++step) {
    std::vector<zest::Buffer> activations;
    for (size_t layer = 0; layer < 8; ++layer) {
      activations.push_back(alloc.allocate_buffer((layer + 1) * 256 * zest::kKiB, compute,
                                                  MemoryCategory::kWorkspace));
    }
    // Backward frees activations in reverse and fills gradient buckets that a
    // communication stream reduces: the allocator must not hand a bucket out
    // again until that stream is done with it.
    for (size_t layer = 8; layer-- > 0;) {
      activations.pop_back();
      zest::Buffer bucket = alloc.allocate_buffer(4 * zest::kMiB, compute, MemoryCategory::kCommBuffers);
      alloc.record_stream(bucket.data(), comm);
    }
    const zest::AllocatorStats s = alloc.stats();
    std::printf("%4d  %10lld  %-11s  %s\n", step, static_cast<long long>(s.num_raw_allocs),
                zest::format_bytes(at(s.reserved_bytes, zest::StatPool::kAggregate).current).c_str(),
                zest::format_bytes(at(s.allocated_bytes, zest::StatPool::kAggregate).peak).c_str());
  }
  std::printf("\n%s", alloc.summary().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const zest::Device device = zest::parse_device(argc > 1 ? argv[1] : "host");
    size_t num_params = 25'000'000;
    if (argc > 2) {
      char* end = nullptr;
      const unsigned long long n = std::strtoull(argv[2], &end, 10);
      ZEST_CHECK(end != argv[2] && *end == '\0' && n > 0 && n < (1ull << 36),
                 "parameters must be a whole number between 1 and 2^36, got '{}'", argv[2]);
      num_params = static_cast<size_t>(n);
    }
    run(device, num_params);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allocator_tour: %s\n", e.what());
    return 2;
  }
  return 0;
}
