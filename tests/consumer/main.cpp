// Uses a little of each installed layer through the public include paths.
#include <zest/core/float16.h>
#include <zest/core/logging.h>
#include <zest/memory/caching_allocator.h>

#include <cstdio>

int main() {
  zest::CachingAllocator alloc(zest::make_host_allocator());
  const zest::Stream stream = zest::Stream::default_for(zest::Device::host());
  zest::Buffer buf = alloc.allocate_buffer(1000 * sizeof(zest::bf16), stream,
                                           zest::MemoryCategory::kParameters);
  buf.as<zest::bf16>()[0] = zest::bf16(1.5f);
  const float back = static_cast<float>(buf.as<zest::bf16>()[0]);
  const auto used = alloc.stats().category_requested(zest::MemoryCategory::kParameters).current;
  std::printf("zest consumer ok: %.1f, %lld parameter bytes\n", back, static_cast<long long>(used));
  return (back == 1.5f && used == 2000) ? 0 : 1;
}
