// SwapRing: regions larger than the ring stream through it bit for bit in
// every mode, in the overlapped order of Note [swap ring order], and a
// failed transfer stops the stream with the chunks before it done and none
// after.
#include <doctest/doctest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <algorithm>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "nvme/nvme_test_util.h"
#include "zest/core/check.h"
#include "zest/nvme/swap_ring.h"
#include "zest/nvme/swap_file.h"

using namespace zest;
using zest::test::TempDir;

namespace {

// Writes `data` through the ring (kWrite), transforms it in place
// (kReadWrite: every byte + chunk + 1), and reads it back (kRead).
void round_trip(SwapRing& ring, uint64_t offset, const std::vector<std::byte>& data) {
  const size_t n = data.size();
  ring.stream(offset, n, StreamMode::kWrite, [&](int64_t, uint64_t at, std::span<std::byte> chunk) {
    std::memcpy(chunk.data(), data.data() + (at - offset), chunk.size());
  });
  ring.stream(offset, n, StreamMode::kReadWrite, [&](int64_t k, uint64_t, std::span<std::byte> chunk) {
    for (std::byte& b : chunk) b = static_cast<std::byte>(static_cast<unsigned>(b) + static_cast<unsigned>(k) + 1);
  });
  std::vector<std::byte> back(n);
  std::vector<int64_t> seen;
  ring.stream(offset, n, StreamMode::kRead, [&](int64_t k, uint64_t at, std::span<std::byte> chunk) {
    seen.push_back(k);
    std::memcpy(back.data() + (at - offset), chunk.data(), chunk.size());
  });
  std::vector<std::byte> want = data;
  for (size_t i = 0; i < n; ++i) {
    want[i] = static_cast<std::byte>(static_cast<unsigned>(want[i]) + i / ring.buffer_size() + 1);
  }
  CHECK(back == want);
  REQUIRE(seen.size() == (n + ring.buffer_size() - 1) / ring.buffer_size());
  for (size_t k = 0; k < seen.size(); ++k) CHECK(seen[k] == static_cast<int64_t>(k));
}

}  // namespace

TEST_CASE("SwapRing: regions of many buffers round trip bit for bit, with 1 to 4 buffers, on every back end") {
  for (AioBackendKind kind : test::backend_kinds()) {
    for (int count : {1, 2, 3, 4}) {
      CAPTURE(test::kind_name(kind));
      CAPTURE(count);
      TempDir dir;
      SwapFile file = SwapFile::create(dir.str(), {.bytes = 1 << 20});
      std::unique_ptr<AioBackend> io =
          make_aio_backend({.block_size = 8192, .queue_depth = 3, .intra_op_parallelism = 2}, {.kind = kind});
      SwapRing ring(file, *io, {.buffer_count = count, .buffer_size = 5 * 4096});
      // 17 chunks and a tail of 1000 bytes, at an offset.
      round_trip(ring, 8 * 4096, test::pattern(17 * 5 * 4096 + 1000, static_cast<uint32_t>(count)));
      // A region of less than one buffer.
      round_trip(ring, 0, test::pattern(100, 7));
    }
  }
}

TEST_CASE("SwapRing: reads run buffer_count - 1 chunks ahead of the computation and writes one behind") {
  TempDir dir;
  SwapFile file = SwapFile::create(dir.str(), {.bytes = 5 * 4096});
  std::unique_ptr<AioBackend> io = make_aio_backend({}, {.kind = AioBackendKind::kThreadPool});
  SwapRing ring(file, *io, {.buffer_count = 3, .buffer_size = 4096});
  std::vector<RingEvent> trace;
  ring.set_trace(&trace);
  ring.stream(0, 5 * 4096, StreamMode::kReadWrite, [](int64_t, uint64_t, std::span<std::byte>) {});
  using E = RingEvent;
  const std::vector<RingEvent> want = {
      {E::kSubmitRead, 0}, {E::kSubmitRead, 1},
      {E::kWaitRead, 0}, {E::kCompute, 0}, {E::kSubmitWrite, 0}, {E::kSubmitRead, 2},
      {E::kWaitRead, 1}, {E::kCompute, 1}, {E::kSubmitWrite, 1}, {E::kWaitWrite, 0}, {E::kSubmitRead, 3},
      {E::kWaitRead, 2}, {E::kCompute, 2}, {E::kSubmitWrite, 2}, {E::kWaitWrite, 1}, {E::kSubmitRead, 4},
      {E::kWaitRead, 3}, {E::kCompute, 3}, {E::kSubmitWrite, 3},
      {E::kWaitRead, 4}, {E::kCompute, 4}, {E::kSubmitWrite, 4},
      {E::kWaitWrite, 2}, {E::kWaitWrite, 3}, {E::kWaitWrite, 4}};
  CHECK(trace == want);
  // Writing only: a buffer is refilled once its previous write is done.
  trace.clear();
  ring.stream(0, 4 * 4096, StreamMode::kWrite, [](int64_t, uint64_t, std::span<std::byte>) {});
  const std::vector<RingEvent> want_write = {
      {E::kCompute, 0}, {E::kSubmitWrite, 0}, {E::kCompute, 1}, {E::kSubmitWrite, 1},
      {E::kCompute, 2}, {E::kSubmitWrite, 2}, {E::kWaitWrite, 0}, {E::kCompute, 3}, {E::kSubmitWrite, 3},
      {E::kWaitWrite, 1}, {E::kWaitWrite, 2}, {E::kWaitWrite, 3}};
  CHECK(trace == want_write);
}

TEST_CASE("SwapRing: an I/O error, a full disk or a short read stops the stream with the file, offset and bytes") {
  struct Case {
    const char* what;
    AioFault fault;
    StreamMode mode;
    std::string message;  // {} is the file's path
    std::vector<int64_t> computed;
  };
  // Transfers in submission order, kReadWrite with 3 buffers: read 0, read 1,
  // write 0, read 2, write 1, read 3, ... (Note [swap ring order]).
  const std::vector<Case> cases = {
      {"EIO on read 2", {.fail_at = 3, .error = EIO}, StreamMode::kReadWrite,
       "NVMe swap file {}: read of 4096 bytes at offset 8192 failed at offset 8192: Input/output error", {0, 1}},
      {"ENOSPC on write 1", {.fail_at = 4, .error = ENOSPC}, StreamMode::kReadWrite,
       "NVMe swap file {}: write of 4096 bytes at offset 4096 failed at offset 4096: No space left on device; free "
       "space on its file system, or point nvme_path at a larger drive",
       {0, 1, 2}},
      {"short read 3", {.fail_at = 5, .short_by = 512}, StreamMode::kReadWrite,
       "NVMe swap file {}: short read at offset 12288 (3584 of 4096 bytes): the file is shorter than expected or the "
       "drive failed",
       {0, 1, 2}},
      {"short read 0", {.fail_at = 0, .short_by = 4096}, StreamMode::kRead,
       "NVMe swap file {}: short read at offset 0 (0 of 4096 bytes): the file is shorter than expected or the drive "
       "failed",
       {}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    TempDir dir;
    SwapFile file = SwapFile::create(dir.str(), {.bytes = 6 * 4096});
    std::unique_ptr<AioBackend> io =
        make_faulty_aio_backend(make_aio_backend({}, {.kind = AioBackendKind::kThreadPool}), c.fault);
    SwapRing ring(file, *io, {.buffer_count = 3, .buffer_size = 4096});
    std::vector<int64_t> computed;
    try {
      ring.stream(0, 6 * 4096, c.mode, [&](int64_t k, uint64_t, std::span<std::byte>) { computed.push_back(k); });
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.message() == fmt::format(fmt::runtime(c.message), file.path()));
    }
    CHECK(computed == c.computed);
    // The ring is usable again: every transfer in flight was drained.
    std::vector<int64_t> again;
    ring.stream(0, 6 * 4096, StreamMode::kRead, [&](int64_t k, uint64_t, std::span<std::byte>) { again.push_back(k); });
    CHECK(again == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  }
}

TEST_CASE("SwapRing: stream_to writes the new values to another region and leaves the one it read whole") {
  for (const bool fail : {false, true}) {
    CAPTURE(fail);
    TempDir dir;
    SwapFile file = SwapFile::create(dir.str(), {.bytes = 16 * 4096});
    std::unique_ptr<AioBackend> plain = make_aio_backend({}, {.kind = AioBackendKind::kThreadPool});
    const std::vector<std::byte> before = test::pattern(8 * 4096 - 100, 3);
    {
      SwapRing ring(file, *plain, {.buffer_count = 3, .buffer_size = 4096});
      ring.stream(0, before.size(), StreamMode::kWrite, [&](int64_t, uint64_t at, std::span<std::byte> chunk) {
        std::memcpy(chunk.data(), before.data() + at, chunk.size());
      });
    }
    // Transfers: reads 0 and 1, write 0, read 2, write 1 (the 5th) fails.
    std::unique_ptr<AioBackend> io =
        fail ? make_faulty_aio_backend(make_aio_backend({}, {.kind = AioBackendKind::kThreadPool}),
                                       {.fail_at = 4, .error = EIO})
             : make_aio_backend({}, {.kind = AioBackendKind::kThreadPool});
    SwapRing ring(file, *io, {.buffer_count = 3, .buffer_size = 4096});
    std::vector<uint64_t> offsets;
    const auto invert = [&](int64_t, uint64_t at, std::span<std::byte> chunk) {
      offsets.push_back(at);
      for (std::byte& b : chunk) b = ~b;
    };
    if (fail) {
      CHECK_THROWS_AS(ring.stream_to(0, 8 * 4096, before.size(), invert), Error);
    } else {
      ring.stream_to(0, 8 * 4096, before.size(), invert);
      CHECK(offsets == std::vector<uint64_t>{0, 4096, 2 * 4096, 3 * 4096, 4 * 4096, 5 * 4096, 6 * 4096, 7 * 4096});
    }
    const auto read = [&](uint64_t offset) {
      std::vector<std::byte> out(before.size());
      ring.stream(offset, out.size(), StreamMode::kRead, [&](int64_t, uint64_t at, std::span<std::byte> chunk) {
        std::memcpy(out.data() + (at - offset), chunk.data(), chunk.size());
      });
      return out;
    };
    CHECK(read(0) == before);
    if (!fail) {
      std::vector<std::byte> want = before;
      for (std::byte& b : want) b = ~b;
      CHECK(read(8 * 4096) == want);
    }
  }
  TempDir dir;
  SwapFile file = SwapFile::create(dir.str(), {.bytes = 16 * 4096});
  std::unique_ptr<AioBackend> io = make_aio_backend({});
  SwapRing ring(file, *io, {.buffer_count = 2, .buffer_size = 4096});
  const std::string message = test::error_of([&] { ring.stream_to(0, 4096, 3 * 4096, [](int64_t, uint64_t, std::span<std::byte>) {}); });
  CHECK(message == fmt::format("cannot stream 12288 bytes of the NVMe swap file {} from offset 0 to offset 4096: the "
                               "regions overlap",
                               file.path()));
}

TEST_CASE("SwapRing: an exception from the computation drains the ring and reaches the caller") {
  TempDir dir;
  SwapFile file = SwapFile::create(dir.str(), {.bytes = 8 * 4096});
  std::unique_ptr<AioBackend> io = make_aio_backend({});
  SwapRing ring(file, *io, {.buffer_count = 4, .buffer_size = 4096});
  CHECK_THROWS_WITH_AS(ring.stream(0, 8 * 4096, StreamMode::kReadWrite,
                                   [](int64_t k, uint64_t, std::span<std::byte>) {
                                     if (k == 2) throw std::runtime_error("update failed");
                                   }),
                       "update failed", std::runtime_error);
  std::vector<int64_t> again;
  ring.stream(0, 8 * 4096, StreamMode::kRead, [&](int64_t k, uint64_t, std::span<std::byte>) { again.push_back(k); });
  CHECK(again.size() == 8);
}

TEST_CASE("SwapRing: a region outside the file or at an unaligned offset is refused, naming both") {
  TempDir dir;
  SwapFile file = SwapFile::create(dir.str(), {.bytes = 4 * 4096});
  std::unique_ptr<AioBackend> io = make_aio_backend({});
  SwapRing ring(file, *io, {.buffer_count = 2, .buffer_size = 4096});
  auto noop = [](int64_t, uint64_t, std::span<std::byte>) {};
  const std::string tail = fmt::format(" of the NVMe swap file {} (16384 bytes): the offset must be a multiple of {} "
                                       "and the region inside the file",
                                       file.path(), file.alignment());
  CHECK(test::error_of([&] { ring.stream(100, 4096, StreamMode::kRead, noop); }) ==
        "cannot stream 4096 bytes at offset 100" + tail);
  CHECK(test::error_of([&] { ring.stream(4096, 12289, StreamMode::kRead, noop); }) ==
        "cannot stream 12289 bytes at offset 4096" + tail);
  CHECK(test::error_of([&] { SwapRing(file, *io, {.buffer_count = 0}); }) ==
        "the NVMe tier's buffer_count is 0: it must be at least 1 (DeepSpeed's default is 4; 2 or more overlap I/O "
        "with compute)");
}

TEST_CASE("SwapRing: times() splits a stream into waits for reads, the computation and waits for writes") {
  TempDir dir;
  SwapFile file = SwapFile::create(dir.str(), {.bytes = 4 * 4096});
  std::unique_ptr<AioBackend> io = make_aio_backend({}, {.kind = AioBackendKind::kThreadPool});
  SwapRing ring(file, *io, {.buffer_count = 2, .buffer_size = 4096});
  ring.stream(0, 4 * 4096, StreamMode::kReadWrite, [](int64_t, uint64_t, std::span<std::byte>) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  CHECK(ring.times().compute >= 4 * 0.005);
  CHECK(ring.times().wait_read >= 0.0);
  CHECK(ring.times().wait_write >= 0.0);
  // Reset by the next stream: reading alone waits for no write.
  ring.stream(0, 4 * 4096, StreamMode::kRead, [](int64_t, uint64_t, std::span<std::byte>) {});
  CHECK(ring.times().compute < 4 * 0.005);
  CHECK(ring.times().wait_write == 0.0);
}

namespace {

// A drive of one transfer at a time, `each` long: a transfer finishes
// `each` after the later of its submission and the previous one's end.
class OneAtATime : public AioBackend {
 public:
  explicit OneAtATime(std::chrono::microseconds each)
      : inner_(make_aio_backend({}, {.kind = AioBackendKind::kThreadPool})), each_(each) {}
  std::string_view name() const override { return "one at a time"; }
  AioHandle submit(const AioRequest& r) override {
    last_ = std::max(last_, std::chrono::steady_clock::now()) + each_;
    const AioHandle h = inner_->submit(r);
    done_at_[h] = last_;
    return h;
  }
  AioResult wait(AioHandle h) override {
    const AioResult r = inner_->wait(h);
    std::this_thread::sleep_until(done_at_.at(h));
    done_at_.erase(h);
    return r;
  }

 private:
  std::unique_ptr<AioBackend> inner_;
  std::chrono::microseconds each_;
  std::chrono::steady_clock::time_point last_{};
  std::map<AioHandle, std::chrono::steady_clock::time_point> done_at_;
};

}  // namespace

TEST_CASE("SwapRing: compute_overlapped is the computation a busy drive hid, none where the drive waited for it") {
  TempDir dir;
  SwapFile file = SwapFile::create(dir.str(), {.bytes = 16 * 4096});
  const auto sleep_ms = [](int ms) {
    return [ms](int64_t, uint64_t, std::span<std::byte>) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  };
  {
    INFO("the drive the bound: 8 ms a transfer, 1 ms a chunk, 4 buffers");
    OneAtATime slow(std::chrono::milliseconds(8));
    SwapRing ring(file, slow, {.buffer_count = 4, .buffer_size = 4096});
    ring.stream_to(0, 8 * 4096, 8 * 4096, sleep_ms(1));
    // Every chunk ran while a transfer submitted before it was in flight
    // (the last one too: the writes before it are still queued).
    CHECK(ring.times().compute_overlapped == ring.times().compute);
    CHECK(ring.times().compute >= 8 * 0.001);
  }
  {
    INFO("the computation the bound: 5 ms a chunk, transfers of microseconds");
    std::unique_ptr<AioBackend> io = make_aio_backend({}, {.kind = AioBackendKind::kThreadPool});
    SwapRing ring(file, *io, {.buffer_count = 4, .buffer_size = 4096});
    ring.stream_to(0, 8 * 4096, 8 * 4096, sleep_ms(5));
    // A transfer done during the chunk returns at once; a wait that a busy
    // machine preempted past 50 us may count one chunk, not most.
    CHECK(ring.times().compute_overlapped < ring.times().compute / 2);
  }
}
