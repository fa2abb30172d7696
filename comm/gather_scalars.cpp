#include "zest/comm/gather_scalars.h"

#include "zest/memory/copy.h"

namespace zest {

std::vector<int64_t> all_gather_int64(Communicator& comm, CachingAllocator& alloc, const Stream& stream,
                                      std::span<const int64_t> mine) {
  const size_t n = mine.size();
  const size_t w = static_cast<size_t>(comm.size());
  std::vector<int64_t> out(n * w);
  if (n == 0) return out;
  Buffer buf = alloc.allocate_buffer(8 * n * (w + 1), stream, MemoryCategory::kCommBuffers);
  copy_bytes(stream, buf.as<int64_t>() + n * w, mine.data(), 8 * n);
  comm.all_gather(buf.as<int64_t>() + n * w, buf.data(), n, DType::kInt64, stream);
  copy_bytes(stream, out.data(), buf.data(), 8 * n * w);
  stream.synchronize();
  return out;
}

}  // namespace zest
