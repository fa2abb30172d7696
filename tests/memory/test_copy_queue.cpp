// CopyQueue on the host: copies run in order on the queue's own thread,
// marks wait for exactly the copies before them, errors reach the caller.
#include <doctest/doctest.h>

#include <numeric>
#include <vector>

#include "zest/core/check.h"
#include "zest/memory/copy_queue.h"

using namespace zest;

TEST_CASE("CopyQueue: copies run in the order queued, and a mark waits for those before it") {
  CopyQueue q(Device::host(), /*timing=*/true);
  std::vector<int> src(1 << 16), mid(src.size()), dst(src.size(), -1);
  std::iota(src.begin(), src.end(), 0);
  // The second copy reads what the first wrote: only in order is dst == src.
  q.copy(mid.data(), src.data(), src.size() * sizeof(int));
  q.copy(dst.data(), mid.data(), src.size() * sizeof(int));
  const CopyQueue::Mark m = q.mark();
  q.synchronize(m);
  CHECK(dst == src);
  CHECK(q.take_busy_ms() >= 0.0);
  CHECK(q.take_busy_ms() == 0.0);  // taken
  // A mark with nothing after it, and one from before, return at once.
  q.synchronize(q.mark());
  q.synchronize(m);
}

TEST_CASE("CopyQueue: a failed copy is rethrown at the next synchronize, and later copies are skipped") {
  CopyQueue q(Device::host());
  std::vector<char> a(64, 'a'), b(64, 'b');
  // Overlapping ranges: copy_bytes refuses them, on the queue's thread.
  q.copy(a.data() + 1, a.data(), 32);
  q.copy(b.data(), a.data(), 64);
  CHECK_THROWS_WITH_AS(q.synchronize(), doctest::Contains("overlap"), Error);
  CHECK(b[0] == 'b');
  CHECK_THROWS_AS(q.copy(nullptr, a.data(), 8), Error);
}

TEST_CASE("CopyQueue: join on a host stream waits for the copies, destruction finishes them") {
  std::vector<double> src(1 << 15, 2.5), dst(src.size());
  {
    CopyQueue q(Device::host());
    q.wait_for(Stream::default_for(Device::host()));
    q.copy(dst.data(), src.data(), src.size() * sizeof(double));
    q.join(Stream::default_for(Device::host()));
    CHECK(dst == src);
    dst.assign(dst.size(), 0.0);
    q.copy(dst.data(), src.data(), src.size() * sizeof(double));
  }
  CHECK(dst == src);
}
