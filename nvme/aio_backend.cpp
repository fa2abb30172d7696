#include "zest/nvme/aio_backend.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <cerrno>
#include <cstdlib>
#include <utility>

#include <fmt/format.h>

#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/core/system_error.h"
#include "zest/memory/raw_allocator.h"
#include "zest/nvme/detail/aio_pieces.h"
#include "zest/nvme/swap_file.h"
#include "zest_generated/build_config.h"

namespace zest {
namespace {

constexpr int kMaxQueueDepth = 1 << 16;
constexpr int kMaxThreads = 1024;

void validate(const AioConfig& c) {
  ZEST_CHECK(c.block_size >= 4096 && c.block_size % 4096 == 0 && c.block_size <= (int64_t{1} << 30),
             "aio.block_size is {}: it must be a multiple of 4096 bytes from 4096 to 1 GiB (DeepSpeed's default is "
             "1048576)", c.block_size);
  ZEST_CHECK(c.queue_depth >= 1 && c.queue_depth <= kMaxQueueDepth,
             "aio.queue_depth is {}: it must be 1 to {} (DeepSpeed's default is 8)", c.queue_depth, kMaxQueueDepth);
  ZEST_CHECK(c.intra_op_parallelism >= 1 && c.intra_op_parallelism <= kMaxThreads,
             "aio.intra_op_parallelism is {}: it must be 1 to {} (DeepSpeed's default is 1)",
             c.intra_op_parallelism, kMaxThreads);
  ZEST_CHECK(!c.use_gds, "aio.use_gds is true: GPUDirect Storage is not supported; set it to false");
}

// Logs the back end chosen, once per process (each rank builds one).
void log_choice_once(const std::string& line) {
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) ZEST_LOG_INFO("{}", line);
}

class FaultyBackend final : public AioBackend {
 public:
  FaultyBackend(std::unique_ptr<AioBackend> inner, AioFault fault) : inner_(std::move(inner)), fault_(fault) {}
  std::string_view name() const override { return inner_->name(); }
  AioHandle submit(const AioRequest& request) override {
    const AioHandle h = inner_->submit(request);
    if (count_++ == fault_.fail_at) {
      faulted_ = h;
      faulted_offset_ = request.offset;
    }
    return h;
  }
  AioResult wait(AioHandle handle) override {
    AioResult r = inner_->wait(handle);
    if (faulted_ && *faulted_ == handle) {
      faulted_.reset();
      if (fault_.error != 0) {
        r.error = fault_.error;
        r.error_offset = faulted_offset_;
      } else {
        r.bytes -= std::min(r.bytes, fault_.short_by);
      }
    }
    return r;
  }

 private:
  std::unique_ptr<AioBackend> inner_;
  AioFault fault_;
  uint64_t count_ = 0;
  std::optional<AioHandle> faulted_;
  uint64_t faulted_offset_ = 0;
};

}  // namespace

namespace detail {

PieceOutcome transfer_all(AioOp op, int fd, std::byte* buffer, size_t bytes, uint64_t offset) {
  PieceOutcome out;
  while (out.bytes < bytes) {
    const ssize_t n = op == AioOp::kRead
                          ? ::pread(fd, buffer + out.bytes, bytes - out.bytes, static_cast<off_t>(offset + out.bytes))
                          : ::pwrite(fd, buffer + out.bytes, bytes - out.bytes, static_cast<off_t>(offset + out.bytes));
    if (n < 0) {
      if (errno == EINTR) continue;
      out.error = errno;
      return out;
    }
    if (n == 0) return out;  // the end of the file: short
    out.bytes += static_cast<size_t>(n);
  }
  return out;
}

}  // namespace detail

const char* aio_op_name(AioOp op) { return op == AioOp::kRead ? "read" : "write"; }

bool aio_io_uring_built() {
#if ZEST_WITH_IO_URING
  return true;
#else
  return false;
#endif
}

std::unique_ptr<AioBackend> make_aio_backend(const AioConfig& config, const AioBackendOptions& options) {
  validate(config);
  if (options.kind == AioBackendKind::kThreadPool) return detail::make_thread_pool_backend(config);
  std::string why;
  if (!aio_io_uring_built()) {
    why = "this build has no liburing (configure with liburing-dev installed)";
  } else {
    int error = options.simulate_io_uring_refusal;
    std::unique_ptr<AioBackend> ring = error == 0 ? detail::make_io_uring_backend(config, error) : nullptr;
    if (ring) {
      log_choice_once(fmt::format("NVMe I/O: io_uring, queue depth {}, {}-byte requests, {} submission",
                                  config.queue_depth, config.block_size, config.single_submit ? "single" : "batched"));
      return ring;
    }
    why = fmt::format("io_uring_queue_init failed: {}{}", errno_text(error),
                      error == EPERM || error == ENOSYS
                          ? " (an old kernel, a seccomp filter or a container that refuses io_uring)"
                          : "");
  }
  ZEST_CHECK(options.kind != AioBackendKind::kIoUring, "the io_uring back end was asked for but {}", why);
  log_choice_once(fmt::format("NVMe I/O: the thread pool ({} pread/pwrite threads), since {}",
                              config.intra_op_parallelism, why));
  return detail::make_thread_pool_backend(config);
}

void check_io(const AioResult& result, const SwapFile& file, AioOp op, uint64_t offset, size_t bytes) {
  if (result.ok(bytes)) return;
  const char* name = aio_op_name(op);
  if (result.error != 0) {
    ZEST_FAIL("NVMe swap file {}: {} of {} bytes at offset {} failed at offset {}: {}{}", file.path(), name, bytes,
              offset, result.error_offset, errno_text(result.error),
              result.error == ENOSPC || result.error == EDQUOT
                  ? "; free space on its file system, or point nvme_path at a larger drive"
                  : "");
  }
  ZEST_FAIL("NVMe swap file {}: short {} at offset {} ({} of {} bytes): the file is shorter than expected or the "
            "drive failed",
            file.path(), name, offset, result.bytes, bytes);
}

std::unique_ptr<AioBackend> make_faulty_aio_backend(std::unique_ptr<AioBackend> inner, AioFault fault) {
  return std::make_unique<FaultyBackend>(std::move(inner), fault);
}

AlignedHostBuffer::AlignedHostBuffer(size_t bytes, size_t alignment, RawAllocator* allocator) {
  ZEST_INTERNAL_ASSERT(alignment > 0 && (alignment & (alignment - 1)) == 0, "alignment {}", alignment);
  size_ = (bytes + alignment - 1) / alignment * alignment;
  if (size_ == 0) return;
  if (!allocator && alignment <= 4096) {
    owned_ = std::shared_ptr<RawAllocator>(make_host_allocator());
    allocator = owned_.get();
  }
  allocator_ = allocator;
  void* p = allocator ? allocator->allocate(size_) : std::aligned_alloc(alignment, size_);
  ZEST_CHECK(p != nullptr, "cannot allocate {} bytes of host memory for the NVMe tier's buffers; lower "
             "buffer_count or buffer_size", size_);
  data_ = static_cast<std::byte*>(p);
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(p);
    release();
    ZEST_FAIL("the host allocator gave address {:#x}, not aligned to the {} bytes direct I/O needs", address,
              alignment);
  }
}

AlignedHostBuffer::AlignedHostBuffer(AlignedHostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      allocator_(std::exchange(other.allocator_, nullptr)),
      owned_(std::move(other.owned_)) {}

AlignedHostBuffer& AlignedHostBuffer::operator=(AlignedHostBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    allocator_ = std::exchange(other.allocator_, nullptr);
    owned_ = std::move(other.owned_);
  }
  return *this;
}

AlignedHostBuffer::~AlignedHostBuffer() { release(); }

void AlignedHostBuffer::release() noexcept {
  if (data_) {
    if (allocator_) {
      allocator_->deallocate(data_, size_);
    } else {
      std::free(data_);
    }
  }
  data_ = nullptr;
  size_ = 0;
}

}  // namespace zest
