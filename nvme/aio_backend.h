// The NVMe tier's asynchronous I/O engine: reads and writes of aligned host
// buffers at file offsets, submitted now and waited for later, so that the
// caller computes while the drive works.
//
//   // zest-example: run
//   std::filesystem::create_directories("swap");
//   zest::SwapFile file = zest::SwapFile::create("swap", {.bytes = 1 << 20});
//   std::unique_ptr<zest::AioBackend> io = zest::make_aio_backend(zest::AioConfig{});
//   zest::AlignedHostBuffer buf(1 << 20, file.alignment());
//   zest::AioHandle w = io->submit({zest::AioOp::kWrite, file.fd(), buf.data(), buf.size(), 0});
//   zest::check_io(io->wait(w), file, zest::AioOp::kWrite, 0, buf.size());
//
// Two back ends, chosen at start-up (make_aio_backend): io_uring (liburing)
// where the build has it and the kernel lets this process set up a ring (an
// old kernel, seccomp or a container answer ENOSYS/EPERM), else a pool of
// intra_op_parallelism threads doing pread/pwrite. The choice is logged once
// per process. Both cut a transfer into AioConfig::block_size requests and
// keep at most queue_depth of them in flight (the pool: as many as its
// threads).
//
// A back end serves one caller thread at a time (the ring or the optimizer
// step that owns it); its handles are that caller's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "zest/nvme/aio_config.h"

namespace zest {

class RawAllocator;
class SwapFile;

enum class AioOp { kRead, kWrite };
const char* aio_op_name(AioOp op);  // "read", "write"

struct AioRequest {
  AioOp op = AioOp::kRead;
  int fd = -1;
  void* buffer = nullptr;
  size_t bytes = 0;
  uint64_t offset = 0;
};

using AioHandle = uint64_t;

// What a finished transfer did: all its bytes, or the first failure.
struct AioResult {
  int error = 0;           // errno of the first failed request; 0 if none
  uint64_t error_offset = 0;  // the file offset of that request
  size_t bytes = 0;        // bytes transferred; < requested for a short read
  bool ok(size_t requested) const { return error == 0 && bytes == requested; }
};

class AioBackend {
 public:
  virtual ~AioBackend() = default;
  virtual std::string_view name() const = 0;  // "io_uring", "thread pool"
  // Queues the transfer; the buffer must stay valid until wait() returns.
  virtual AioHandle submit(const AioRequest& request) = 0;
  // Blocks until the transfer is done; each handle is waited for once.
  virtual AioResult wait(AioHandle handle) = 0;
};

enum class AioBackendKind { kAuto, kIoUring, kThreadPool };

struct AioBackendOptions {
  // kAuto: io_uring where it works, else the thread pool. kIoUring: an
  // error where it does not. kThreadPool: the pool.
  AioBackendKind kind = AioBackendKind::kAuto;
  // Test seam: act as if io_uring_queue_init answered -errno (EPERM,
  // ENOSYS), as a kernel or a seccomp filter that refuses it would.
  int simulate_io_uring_refusal = 0;
};

// Throws zest::Error for an invalid config (naming the key) and, for
// kIoUring, when io_uring is refused or not built.
std::unique_ptr<AioBackend> make_aio_backend(const AioConfig& config, const AioBackendOptions& options = {});

// Whether this build has the io_uring back end (ZEST_WITH_IO_URING).
bool aio_io_uring_built();

// Throws zest::Error unless `result` is the whole transfer: names the file,
// the operation, the offset and the bytes, and the errno text, "short read
// (N of M bytes)" or "short write".
void check_io(const AioResult& result, const SwapFile& file, AioOp op, uint64_t offset, size_t bytes);

// Test seam: a back end that forwards to `inner` but fails its
// `fail_at`-th submitted transfer (0-based): with `error` (EIO, ENOSPC), or,
// when error is 0, short by `short_by` bytes (the transfer still runs, so a
// read's buffer holds what the drive returned).
struct AioFault {
  uint64_t fail_at = 0;
  int error = 0;
  size_t short_by = 0;
};
std::unique_ptr<AioBackend> make_faulty_aio_backend(std::unique_ptr<AioBackend> inner, AioFault fault);

// Host memory aligned to `alignment` (a power of two), for direct I/O. Its
// size is rounded up to the alignment. From `allocator` (e.g. pinned host
// memory, whose addresses must then meet the alignment: checked), else from
// the host allocator (memory/raw_allocator.h, page-aligned), else, for an
// alignment above a page, aligned_alloc.
class AlignedHostBuffer {
 public:
  AlignedHostBuffer() = default;
  AlignedHostBuffer(size_t bytes, size_t alignment, RawAllocator* allocator = nullptr);
  AlignedHostBuffer(AlignedHostBuffer&& other) noexcept;
  AlignedHostBuffer& operator=(AlignedHostBuffer&& other) noexcept;
  AlignedHostBuffer(const AlignedHostBuffer&) = delete;
  AlignedHostBuffer& operator=(const AlignedHostBuffer&) = delete;
  ~AlignedHostBuffer();

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void release() noexcept;

  std::byte* data_ = nullptr;
  size_t size_ = 0;
  RawAllocator* allocator_ = nullptr;  // nullptr: aligned_alloc's
  std::shared_ptr<RawAllocator> owned_;  // the default host allocator
};

namespace detail {
// The back ends, for make_aio_backend and the tests.
std::unique_ptr<AioBackend> make_thread_pool_backend(const AioConfig& config);
// nullptr with `error` set where io_uring_queue_init fails.
std::unique_ptr<AioBackend> make_io_uring_backend(const AioConfig& config, int& error);
}  // namespace detail

}  // namespace zest
