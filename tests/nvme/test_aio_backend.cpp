// The I/O engine's back ends: bit-for-bit round trips of transfers larger
// than a block with many in flight, errors with the file and offset, and
// the fallback to the thread pool when io_uring is refused.
#include <doctest/doctest.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "nvme/nvme_test_util.h"
#include "zest/core/check.h"
#include "zest/nvme/aio_backend.h"
#include "zest/nvme/swap_file.h"

using namespace zest;
using zest::test::TempDir;

TEST_CASE("AioBackend: transfers of many blocks, many in flight, round trip bit for bit on every back end") {
  for (AioBackendKind kind : test::backend_kinds()) {
    for (bool single_submit : {false, true}) {
      CAPTURE(test::kind_name(kind));
      CAPTURE(single_submit);
      TempDir dir;
      constexpr size_t kTransfer = (64 << 10) + 3 * 4096;  // 16 blocks and a part
      constexpr int kTransfers = 12;
      SwapFile file = SwapFile::create(dir.str(), {.bytes = kTransfer * kTransfers});
      AioConfig config{.block_size = 4096, .queue_depth = 4, .intra_op_parallelism = 3,
                       .single_submit = single_submit};
      std::unique_ptr<AioBackend> io = make_aio_backend(config, {.kind = kind});
      CHECK(io->name() == test::kind_name(kind));
      std::vector<AlignedHostBuffer> out, in;
      std::vector<AioHandle> handles;
      for (int t = 0; t < kTransfers; ++t) {
        out.emplace_back(kTransfer, file.alignment());
        const std::vector<std::byte> p = test::pattern(kTransfer, static_cast<uint32_t>(t));
        std::memcpy(out.back().data(), p.data(), kTransfer);
        handles.push_back(io->submit({AioOp::kWrite, file.fd(), out.back().data(), kTransfer, t * kTransfer}));
      }
      // Waited for out of order: each handle is its own transfer.
      for (int t = kTransfers - 1; t >= 0; --t) {
        check_io(io->wait(handles[static_cast<size_t>(t)]), file, AioOp::kWrite, t * kTransfer, kTransfer);
      }
      handles.clear();
      for (int t = 0; t < kTransfers; ++t) {
        in.emplace_back(kTransfer, file.alignment());
        handles.push_back(io->submit({AioOp::kRead, file.fd(), in.back().data(), kTransfer, t * kTransfer}));
      }
      for (int t = 0; t < kTransfers; ++t) {
        const AioResult r = io->wait(handles[static_cast<size_t>(t)]);
        CHECK(r.error == 0);
        CHECK(r.bytes == kTransfer);
        CHECK(std::memcmp(in[static_cast<size_t>(t)].data(), out[static_cast<size_t>(t)].data(), kTransfer) == 0);
      }
    }
  }
}

TEST_CASE("AioBackend: a read past the end of the file is a short read, and a bad descriptor an error, with the "
          "file, offset and bytes") {
  for (AioBackendKind kind : test::backend_kinds()) {
    CAPTURE(test::kind_name(kind));
    TempDir dir;
    SwapFile file = SwapFile::create(dir.str(), {.bytes = 8192});
    std::unique_ptr<AioBackend> io = make_aio_backend({.block_size = 4096}, {.kind = kind});
    AlignedHostBuffer buf(16384, file.alignment());
    AioResult r = io->wait(io->submit({AioOp::kRead, file.fd(), buf.data(), 16384, 0}));
    CHECK(r.error == 0);
    CHECK(r.bytes == 8192);
    try {
      check_io(r, file, AioOp::kRead, 0, 16384);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.message() == fmt::format("NVMe swap file {}: short read at offset 0 (8192 of 16384 bytes): the file is "
                                       "shorter than expected or the drive failed",
                                       file.path()));
    }
    r = io->wait(io->submit({AioOp::kWrite, 1000000, buf.data(), 8192, 4096}));
    CHECK(r.error == EBADF);
    CHECK(r.error_offset == 4096);
    try {
      check_io(r, file, AioOp::kWrite, 4096, 8192);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.message() == fmt::format("NVMe swap file {}: write of 8192 bytes at offset 4096 failed at offset 4096: "
                                       "Bad file descriptor",
                                       file.path()));
    }
  }
}

TEST_CASE("AioBackend: io_uring refused by the kernel (EPERM, ENOSYS) falls back to the thread pool") {
  for (int err : {EPERM, ENOSYS}) {
    std::unique_ptr<AioBackend> io = make_aio_backend({}, {.simulate_io_uring_refusal = err});
    CHECK(io->name() == "thread pool");
    try {
      make_aio_backend({}, {.kind = AioBackendKind::kIoUring, .simulate_io_uring_refusal = err});
      FAIL("no error");
    } catch (const Error& e) {
      if (aio_io_uring_built()) {
        CHECK(e.message() == fmt::format("the io_uring back end was asked for but io_uring_queue_init failed: {} (an "
                                         "old kernel, a seccomp filter or a container that refuses io_uring)",
                                         err == EPERM ? "Operation not permitted" : "Function not implemented"));
      } else {
        CHECK(e.message() == "the io_uring back end was asked for but this build has no liburing (configure with "
                             "liburing-dev installed)");
      }
    }
  }
  // Unrefused, the automatic choice is io_uring wherever the build and the
  // kernel have it.
  const bool uring = test::backend_kinds().size() == 2;
  CHECK(make_aio_backend({})->name() == (uring ? "io_uring" : "thread pool"));
}

TEST_CASE("AioBackend: the aio settings are validated, naming the key") {
  auto msg = [](AioConfig c) {
    try {
      make_aio_backend(c);
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("(no error)");
  };
  CHECK(msg({.block_size = 1000}) == "aio.block_size is 1000: it must be a multiple of 4096 bytes from 4096 to 1 GiB "
                                     "(DeepSpeed's default is 1048576)");
  CHECK(msg({.queue_depth = 0}) == "aio.queue_depth is 0: it must be 1 to 65536 (DeepSpeed's default is 8)");
  CHECK(msg({.intra_op_parallelism = 0}) ==
        "aio.intra_op_parallelism is 0: it must be 1 to 1024 (DeepSpeed's default is 1)");
  CHECK(msg({.use_gds = true}) == "aio.use_gds is true: GPUDirect Storage is not supported; set it to false");
}
