// Host streams with a thread of their own (HostWork::kOwnThread): work runs
// there in the order issued while the caller goes on; events, waits and
// synchronize order the caller and other streams after it; a failure is
// sticky (Note [a failed host stream]). Each case holds the stream's thread
// at a gate to see what has not run yet, so nothing here depends on timing.
#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/stream_gate.h"
#include "zest/core/check.h"
#include "zest/core/host_queue.h"
#include "zest/core/stream.h"
#include "zest/memory/copy.h"

using zest::Device;
using zest::Event;
using zest::HostWork;
using zest::OwnedStream;
using zest::Stream;

TEST_CASE("a host stream with its own thread runs its work there, in order, while the caller goes on") {
  OwnedStream stream(Device::host(), HostWork::kOwnThread);
  REQUIRE(stream.get().host_queue() != nullptr);
  CHECK(OwnedStream(Device::host()).get().host_queue() == nullptr);
  zest::test::StreamGate gate;
  gate.hold(stream);
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 100; ++i) {
    zest::host_launch(stream, [&order, &threads, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    });
  }
  CHECK_FALSE(stream.get().query());  // held at the gate: nothing ran
  gate.open();
  stream.get().synchronize();
  CHECK(stream.get().query());
  REQUIRE(order.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(order[static_cast<size_t>(i)] == i);
  for (const std::thread::id& id : threads) CHECK(id != std::this_thread::get_id());
}

TEST_CASE("copies and fills on a host stream with its own thread are queued there") {
  OwnedStream stream(Device::host(), HostWork::kOwnThread);
  std::vector<uint8_t> src(4096, 7), dst(4096, 1), zeroed(4096, 9);
  zest::test::StreamGate gate;
  gate.hold(stream);
  zest::copy_bytes(stream, dst.data(), src.data(), src.size());
  zest::fill_zero(stream, zeroed.data(), zeroed.size());
  Event done(Device::host());
  done.record(stream);
  CHECK_FALSE(done.query());
  CHECK(dst[0] == 1);  // not yet copied: the thread is at the gate
  CHECK(zeroed[0] == 9);
  gate.open();
  done.synchronize();
  CHECK(done.query());
  CHECK(dst == src);
  CHECK(zeroed == std::vector<uint8_t>(4096, 0));
}

TEST_CASE("waiting for an event on a host stream with its own thread orders the waiter after it") {
  OwnedStream first(Device::host(), HostWork::kOwnThread);
  OwnedStream second(Device::host(), HostWork::kOwnThread);
  zest::test::StreamGate gate;
  gate.hold(first);
  std::atomic<int> written{0};
  zest::host_launch(first, [&] { written = 42; });
  Event after_write(Device::host());
  after_write.record(first);

  // Another thread's stream: its next work waits for the event.
  second.get().wait(after_write);
  int seen = -1;
  zest::host_launch(second, [&] { seen = written.load(); });
  Event seen_event(Device::host());
  seen_event.record(second);
  CHECK_FALSE(seen_event.query());  // behind first's gate

  // An inline stream's later work is the caller's: the caller waits, so a
  // helper opens the gate while this thread waits.
  std::thread opener([&] { gate.open(); });
  Stream::default_for(Device::host()).wait(after_write);
  CHECK(written.load() == 42);
  opener.join();
  second.get().synchronize();
  CHECK(seen == 42);

  // An event recorded on an inline stream is complete when recorded.
  Event inline_event(Device::host());
  inline_event.record(Stream::default_for(Device::host()));
  CHECK(inline_event.query());
  first.get().wait(inline_event);  // nothing to wait for
  first.get().synchronize();
}

TEST_CASE("a failed task fails its host stream for good, and the work after it is skipped") {
  OwnedStream stream(Device::host(), HostWork::kOwnThread);
  int ran_after = 0;
  zest::host_launch(stream, [] { throw std::runtime_error("the reduction failed"); });
  zest::host_launch(stream, [&] { ++ran_after; });
  Event e(Device::host());
  e.record(stream);
  e.synchronize_quietly();  // reached, failure or not
  CHECK(e.query());
  CHECK_THROWS_WITH_AS(e.synchronize(), "the reduction failed", std::runtime_error);
  CHECK_THROWS_WITH_AS(stream.get().synchronize(), "the reduction failed", std::runtime_error);
  CHECK_THROWS_WITH_AS(Stream::default_for(Device::host()).wait(e), "the reduction failed", std::runtime_error);
  // Still failed, and still skipping.
  zest::host_launch(stream, [&] { ++ran_after; });
  CHECK_THROWS_WITH_AS(stream.get().synchronize(), "the reduction failed", std::runtime_error);
  CHECK(ran_after == 0);

  // A stream that waits for the failed one fails too: its work would read
  // what the failed work did not write.
  OwnedStream waiter(Device::host(), HostWork::kOwnThread);
  waiter.get().wait(e);
  zest::host_launch(waiter, [&] { ++ran_after; });
  CHECK_THROWS_WITH_AS(waiter.get().synchronize(), "the reduction failed", std::runtime_error);
  CHECK(ran_after == 0);
}

TEST_CASE("destroying a host stream with its own thread runs what was queued first") {
  std::atomic<int> count{0};
  {
    OwnedStream stream(Device::host(), HostWork::kOwnThread);
    zest::test::StreamGate gate;
    gate.hold(stream);
    for (int i = 0; i < 1000; ++i) zest::host_launch(stream, [&] { ++count; });
    gate.open();
  }
  CHECK(count.load() == 1000);

  // Moved, the queue goes with the stream; an event outlives both.
  Event e(Device::host());
  {
    OwnedStream a(Device::host(), HostWork::kOwnThread);
    OwnedStream b = std::move(a);
    zest::host_launch(b, [&] { ++count; });
    e.record(b);
  }
  CHECK(e.query());
  CHECK(count.load() == 1001);
}

TEST_CASE("timing events on a host stream with its own thread time the stream's work, not the caller's") {
  OwnedStream stream(Device::host(), HostWork::kOwnThread);
  Event start(Device::host(), true), end(Device::host(), true);
  zest::test::StreamGate gate;
  gate.hold(stream);
  start.record(stream);
  zest::host_launch(stream, [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  end.record(stream);
  CHECK_THROWS_WITH_AS(start.elapsed_ms(end), doctest::Contains("not yet done"), zest::Error);
  gate.open();
  end.synchronize();
  // At least the sleep (a lower bound the clock guarantees); the caller
  // spent no time between the two records.
  CHECK(start.elapsed_ms(end) >= 19.9f);
}
