#include "zest/engine/detail/offload_swap.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>

#include "zest/core/check.h"

namespace zest {
namespace {

std::function<std::shared_ptr<AioBackend>()>& swap_io_for_tests() {
  static std::function<std::shared_ptr<AioBackend>()> make;
  return make;
}

std::shared_ptr<AioBackend> io_for(const OffloadSwapConfig& config) {
  if (config.io) return config.io;
  return make_swap_io(config.aio);
}

// The record size before the file's alignment is known: the fields only.
size_t fields_bytes(size_t chunk, int state_buffers, DType master, DType state) {
  return chunk * elem_size(master) + static_cast<size_t>(state_buffers) * chunk * elem_size(state);
}

// The ring's block of host memory: buffer_count records and room to align
// them (Note [swap ring in the host allocator]). Refuses a file system whose
// direct I/O alignment the records do not meet first: the ring's buffers
// would be larger than a record.
Buffer ring_memory(CachingAllocator& host, const SwapFile& file, size_t record_bytes, int buffer_count) {
  ZEST_CHECK(record_bytes % file.alignment() == 0,
             "NVMe swap file {}: the file system's direct I/O alignment is {} bytes, which the optimizer's records "
             "of {} bytes do not meet; use a drive with 4096-byte alignment, or offload_optimizer.device \"cpu\"",
             file.path(), file.alignment(), record_bytes);
  ZEST_CHECK(buffer_count >= 1, "offload_optimizer.buffer_count is {}: it must be at least 1 (DeepSpeed's default "
             "is 4; 2 or more overlap I/O with the update)", buffer_count);
  const size_t bytes = static_cast<size_t>(buffer_count) * record_bytes + file.alignment();
  return host.allocate_buffer(bytes, Stream::default_for(Device::host()), MemoryCategory::kCommBuffers);
}

std::span<std::byte> aligned_part(const Buffer& memory, size_t alignment) {
  auto* p = memory.as<std::byte>();
  const size_t skip = (alignment - reinterpret_cast<uintptr_t>(p) % alignment) % alignment;
  return {p + skip, memory.size_bytes() - skip};
}

}  // namespace

OffloadSwap::OffloadSwap(const OffloadSwapConfig& config, CachingAllocator& host, size_t numel, size_t chunk_numel,
                         int state_buffers, DType master, DType state)
    : numel_(numel),
      chunk_(chunk_numel),
      buffers_(1 + state_buffers),
      master_(master),
      state_(state),
      record_bytes_(round_up(fields_bytes(chunk_numel, state_buffers, master, state), kAssumedSwapAlignment)),
      records_(chunk_numel == 0 ? 0 : (numel + chunk_numel - 1) / chunk_numel),
      region_bytes_(static_cast<uint64_t>(record_bytes_) * records_),
      io_(io_for(config)),
      file_(SwapFile::create(config.nvme_path, {.bytes = 2 * region_bytes_, .rank = config.rank})),
      memory_(ring_memory(host, file_, record_bytes_, config.buffer_count)),
      ring_(file_, *io_, {.buffer_count = config.buffer_count, .buffer_size = record_bytes_},
            aligned_part(memory_, file_.alignment())),
      staging_(ring_.buffer(0).data()) {
  ZEST_INTERNAL_ASSERT(state_buffers >= 0 && state_buffers <= 2, "{} state buffers", state_buffers);
  field_[0] = 0;
  for (int s = 0; s < state_buffers; ++s) {
    field_[static_cast<size_t>(s) + 1] = chunk_ * elem_size(master) + static_cast<size_t>(s) * chunk_ * elem_size(state);
  }
  // The file is preallocated: it reads as zeros, the state's first values
  // and the master's until the engine writes it.
}

void set_offload_swap_io(std::function<std::shared_ptr<AioBackend>()> make) { swap_io_for_tests() = std::move(make); }

std::shared_ptr<AioBackend> make_swap_io(const AioConfig& aio) {
  if (swap_io_for_tests()) return swap_io_for_tests()();
  return make_aio_backend(aio);
}

void OffloadSwap::update(const std::function<void(size_t chunk, const Chunk& buffers)>& update) {
  if (records_ == 0) return;
  can_roll_back_ = false;
  const int next = 1 - current_;
  ring_.stream_to(region(current_), region(next), region_bytes_,
                  [&](int64_t k, uint64_t, std::span<std::byte> data) {
                    Chunk c{};
                    for (int b = 0; b < buffers_; ++b) c[static_cast<size_t>(b)] = data.data() + field(b);
                    update(static_cast<size_t>(k), c);
                  });
  current_ = next;
  can_roll_back_ = true;
}

void OffloadSwap::roll_back() {
  if (records_ == 0) return;
  ZEST_INTERNAL_ASSERT(can_roll_back_, "NVMe swap file {}: a roll back with no update to undo", file_.path());
  current_ = 1 - current_;
  can_roll_back_ = false;
}

void OffloadSwap::transfer(AioOp op, size_t record) {
  const uint64_t offset = region(current_) + static_cast<uint64_t>(record) * record_bytes_;
  const AioHandle h = io_->submit({op, file_.fd(), staging_, record_bytes_, offset});
  check_io(io_->wait(h), file_, op, offset, record_bytes_);
}

template <typename Fn>
void OffloadSwap::each_record(int buffer, size_t a, size_t b, Fn&& fn) {
  ZEST_INTERNAL_ASSERT(buffer >= 0 && buffer < buffers_ && a <= b && b <= numel_,
                       "swap buffer {} elements [{}, {}) of {}", buffer, a, b, numel_);
  for (size_t i = a; i < b;) {
    const size_t r = i / chunk_;
    const size_t n = std::min(b, (r + 1) * chunk_) - i;
    fn(r, i, n, staging_ + field(buffer) + (i - r * chunk_) * esize(buffer));
    i += n;
  }
}

void OffloadSwap::read(int buffer, size_t a, size_t b, std::byte* out) {
  each_record(buffer, a, b, [&](size_t r, size_t i, size_t n, const std::byte* at) {
    transfer(AioOp::kRead, r);
    std::memcpy(out + (i - a) * esize(buffer), at, n * esize(buffer));
  });
}

void OffloadSwap::write(int buffer, size_t a, size_t b, const std::byte* in) {
  can_roll_back_ = false;
  // Whole records go to the file: the rest of each record is read first.
  each_record(buffer, a, b, [&](size_t r, size_t i, size_t n, std::byte* at) {
    transfer(AioOp::kRead, r);
    std::memcpy(at, in + (i - a) * esize(buffer), n * esize(buffer));
    transfer(AioOp::kWrite, r);
  });
}

}  // namespace zest
