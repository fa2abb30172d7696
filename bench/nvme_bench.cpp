// The NVMe tier's I/O speed: the ring (nvme/swap_ring.h) writing and
// reading a region of a swap file through each back end, against a raw
// O_DIRECT pwrite/pread loop over the same bytes, in the same run and on the
// same file. Target (issue 21): the ring at >= 80% of raw.
//
// raw: one thread, one buffer_size pwrite/pread at a time, synchronous (what
// a program without an I/O engine would do). The ring: buffer_count buffers
// of buffer_size, each transfer cut into block_size requests with up to
// queue_depth in flight (io_uring) or spread over intra_op_parallelism
// threads (the pool); the callback does nothing, so the figures are the
// I/O's. Every figure is the median of --repeat runs.
//
//   nvme_bench [--dir D] [--mb N] [--buffer-mb N] [--buffers N] [--block-kb N] [--queue-depth N]
//              [--threads N] [--single-submit] [--repeat N] [--backend all|io_uring|thread-pool]
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/cli.h"
#include "zest/core/check.h"
#include "zest/core/system_error.h"
#include "zest/nvme/aio_backend.h"
#include "zest/nvme/swap_file.h"
#include "zest/nvme/swap_ring.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string dir = "/tmp";
  int64_t mb = 1024;
  int64_t buffer_mb = 8;
  int buffers = 4;
  int64_t block_kb = 1024;
  int queue_depth = 32;
  int threads = 4;
  bool single_submit = false;
  int repeat = 3;
  std::string backend = "all";
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename Fn>
double seconds(Fn&& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One buffer_size synchronous pwrite/pread after another, straight to the
// system calls.
void raw_io(const zest::SwapFile& file, zest::AioOp op, uint64_t bytes, zest::AlignedHostBuffer& buf) {
  for (uint64_t at = 0; at < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), bytes - at));
    const ssize_t done = op == zest::AioOp::kWrite ? ::pwrite(file.fd(), buf.data(), n, static_cast<off_t>(at))
                                                   : ::pread(file.fd(), buf.data(), n, static_cast<off_t>(at));
    ZEST_CHECK(done > 0, "raw {} of {} bytes at offset {} of {}: {}", zest::aio_op_name(op), n, at, file.path(),
               done < 0 ? zest::errno_text(errno) : std::string("end of file"));
    at += static_cast<uint64_t>(done);
  }
}

Options parse(int argc, char** argv, std::string& usage) {
  Options o;
  cli::App app("nvme_bench: the NVMe tier's read and write GB/s against raw O_DIRECT I/O", "nvme_bench");
  app.add_option("--dir", o.dir, "directory of the swap file (on the drive to measure)");
  app.add_option("--mb", o.mb, "MiB written and read")->check(cli::Range(int64_t{1}, int64_t{1} << 22));
  app.add_option("--buffer-mb", o.buffer_mb, "MiB of each ring buffer (and of each raw pwrite/pread)")
      ->check(cli::Range(int64_t{1}, int64_t{1} << 12));
  app.add_option("--buffers", o.buffers, "ring buffers (buffer_count)")->check(cli::Range(1, 1024));
  app.add_option("--block-kb", o.block_kb, "KiB of one I/O request (aio.block_size)")
      ->check(cli::Range(int64_t{4}, int64_t{1} << 20));
  app.add_option("--queue-depth", o.queue_depth, "requests in flight (aio.queue_depth)")->check(cli::Range(1, 65536));
  app.add_option("--threads", o.threads, "thread-pool threads (aio.intra_op_parallelism)")->check(cli::Range(1, 1024));
  app.add_flag("--single-submit", o.single_submit, "one io_uring_submit per request (aio.single_submit)");
  app.add_option("--repeat", o.repeat, "runs of each measurement (median)")->check(cli::Range(1, 100));
  app.add_option("--backend", o.backend, "all, io_uring or thread-pool")
      ->check(cli::IsMember({"all", "io_uring", "thread-pool"}));
  usage = app.help();
  cli::parse(app, argc, argv);
  if (o.block_kb % 4 != 0) cli::usage_error("--block-kb {} is not a multiple of 4", o.block_kb);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  std::string usage;
  try {
    opt = parse(argc, argv, usage);
  } catch (const cli::UsageError& e) {
    return cli::usage_exit("nvme_bench", e, usage);
  }
  try {
    const uint64_t bytes = static_cast<uint64_t>(opt.mb) << 20;
    const size_t buffer = static_cast<size_t>(opt.buffer_mb) << 20;
    zest::SwapFile file = zest::SwapFile::create(opt.dir, {.bytes = bytes});
    const zest::AioConfig aio{.block_size = opt.block_kb << 10, .queue_depth = opt.queue_depth,
                              .intra_op_parallelism = opt.threads, .single_submit = opt.single_submit};
    fmt::print("nvme_bench: {} MiB in {} x {} MiB buffers, {} KiB requests, queue depth {}, {} pool thread(s), {} "
               "submission, {} I/O on {} ({} runs, median; {} build)\n",
               opt.mb, opt.buffers, opt.buffer_mb, opt.block_kb, opt.queue_depth, opt.threads,
               opt.single_submit ? "single" : "batched", file.direct() ? "O_DIRECT" : "buffered (no O_DIRECT here)",
               file.path(), opt.repeat, ZEST_BENCH_BUILD_TYPE);
    zest::AlignedHostBuffer raw_buf(buffer, file.alignment());
    std::memset(raw_buf.data(), 0x5a, raw_buf.size());
    std::vector<zest::AioBackendKind> kinds;
    if (opt.backend != "thread-pool" && zest::aio_io_uring_built()) kinds.push_back(zest::AioBackendKind::kIoUring);
    if (opt.backend != "io_uring") kinds.push_back(zest::AioBackendKind::kThreadPool);
    ZEST_CHECK(!kinds.empty(), "--backend io_uring: this build has no liburing");
    fmt::print("{:>12} | {:>11} {:>11} {:>6} | {:>11} {:>11} {:>6}\n", "back end", "write", "raw", "ratio", "read",
               "raw", "ratio");
    const double gb = static_cast<double>(bytes) / 1e9;
    auto noop = [](int64_t, uint64_t, std::span<std::byte>) {};
    for (zest::AioBackendKind kind : kinds) {
      std::unique_ptr<zest::AioBackend> io;
      try {
        io = zest::make_aio_backend(aio, {.kind = kind});
      } catch (const zest::Error& e) {
        fmt::print("{:>12} | not measured: {}\n", "io_uring", e.message());  // refused by this kernel
        continue;
      }
      zest::SwapRing ring(file, *io, {.buffer_count = opt.buffers, .buffer_size = buffer});
      std::vector<double> w, rw, r, rr;
      // Interleaved, so that a drive's slow moments touch both sides alike.
      for (int i = 0; i < opt.repeat; ++i) {
        rw.push_back(seconds([&] { raw_io(file, zest::AioOp::kWrite, bytes, raw_buf); }));
        w.push_back(seconds([&] { ring.stream(0, bytes, zest::StreamMode::kWrite, noop); }));
        rr.push_back(seconds([&] { raw_io(file, zest::AioOp::kRead, bytes, raw_buf); }));
        r.push_back(seconds([&] { ring.stream(0, bytes, zest::StreamMode::kRead, noop); }));
      }
      const double wg = gb / median(w), rwg = gb / median(rw), rg = gb / median(r), rrg = gb / median(rr);
      fmt::print("{:>12} | {:7.2f}GB/s {:7.2f}GB/s {:5.0f}% | {:7.2f}GB/s {:7.2f}GB/s {:5.0f}%\n", io->name(), wg, rwg,
                 100 * wg / rwg, rg, rrg, 100 * rg / rrg);
    }
    fmt::print("ratio: the ring's GB/s / raw's (target >= 80%)\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvme_bench: %s\n", e.what());
    return 1;
  }
}
