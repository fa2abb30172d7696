// The NCCL watchdog's bookkeeping (comm/detail/pending_collectives.h), with fake
// events: which events it queries (Note [watching in order]) and which
// collective a passed deadline names.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "zest/comm/detail/pending_collectives.h"

using namespace zest;
using namespace std::chrono_literals;

namespace {

CollectiveDesc numbered(uint64_t seq) {
  CollectiveDesc d;
  d.kind = CollectiveKind::kAllReduce;
  d.count = 16;
  d.seq = seq;
  return d;
}

std::vector<int> probed_events(const PendingCollectives<int>& pending) {
  std::vector<int> out;
  for (const auto& p : pending.probes()) out.push_back(p.event);
  return out;
}

}  // namespace

TEST_CASE("the watchdog queries only the oldest pending collective of each stream") {
  int stream_a = 0, stream_b = 0;
  PendingCollectives<int> pending;
  CHECK(pending.probes().empty());
  // Events 100.. on stream a, 200.. on stream b, interleaved as issued.
  pending.add(100, &stream_a, numbered(1), 60s);
  pending.add(101, &stream_a, numbered(2), 60s);
  pending.add(200, &stream_b, numbered(3), 60s);
  pending.add(102, &stream_a, numbered(4), 60s);
  pending.add(201, &stream_b, numbered(5), 60s);
  CHECK(pending.size() == 5);
  // Two queries for five pending collectives: one per stream, oldest first.
  CHECK(probed_events(pending) == std::vector<int>{100, 200});

  // The head of a completes: its event comes back for reuse and the next of
  // a is probed; b's head stays.
  const auto probes = pending.probes();
  CHECK(pending.retire(probes[0].id) == 100);
  CHECK(probed_events(pending) == std::vector<int>{101, 200});
  CHECK(pending.probes()[0].desc.seq == 2);
  CHECK(pending.retire(pending.probes()[1].id) == 200);
  CHECK(probed_events(pending) == std::vector<int>{101, 201});
  CHECK(pending.retire(pending.probes()[0].id) == 101);
  CHECK(pending.retire(pending.probes()[0].id) == 102);
  CHECK(probed_events(pending) == std::vector<int>{201});
  CHECK(pending.retire(pending.probes()[0].id) == 201);
  CHECK(pending.empty());
  CHECK(pending.probes().empty());
}

TEST_CASE("a pending head whose deadline passed names its collective and its limit") {
  int stream = 0;
  PendingCollectives<int> pending;
  pending.add(1, &stream, numbered(7), 5ms);
  pending.add(2, &stream, numbered(8), 60s);
  std::this_thread::sleep_for(20ms);
  const auto probes = pending.probes();
  REQUIRE(probes.size() == 1);
  CHECK(probes[0].deadline.passed());
  CHECK(probes[0].desc.seq == 7);
  CHECK(probes[0].limit == 5ms);
  // The entries stay in order for teardown, which waits for all of them.
  REQUIRE(pending.entries().size() == 2);
  CHECK(pending.entries()[1].event == 2);
  CHECK_FALSE(pending.entries()[1].deadline.passed());
}

TEST_CASE("retiring a collective that is not pending is an internal error") {
  int stream = 0;
  PendingCollectives<int> pending;
  pending.add(1, &stream, numbered(1), 60s);
  const uint64_t id = pending.probes()[0].id;
  CHECK(pending.retire(id) == 1);
  CHECK_THROWS(pending.retire(id));
}
