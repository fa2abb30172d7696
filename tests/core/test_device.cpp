#include <doctest/doctest.h>

#include "zest/core/check.h"
#include "zest/core/device.h"
#include "zest/core/stream.h"

using zest::Device;

TEST_CASE("devices parse and print") {
  CHECK(zest::parse_device("host") == Device::host());
  CHECK(zest::parse_device("cpu") == Device::host());
  CHECK(Device::cuda(3).str() == "cuda:3");
  CHECK(Device::host().str() == "host");
  CHECK_THROWS_WITH_AS(zest::parse_device("tpu"), doctest::Contains("expected host, cpu, cuda or cuda:N"),
                       zest::Error);
  CHECK_THROWS_AS(zest::parse_device("cuda:x"), zest::Error);
  CHECK_THROWS_AS(zest::parse_device("cuda:-1"), zest::Error);
  // A device beyond those visible is refused with the count.
  CHECK_THROWS_WITH_AS(zest::parse_device("cuda:4096"), doctest::Contains("cuda:4096 requested"),
                       zest::Error);
}

TEST_CASE("host streams are distinct and trivially ordered") {
  zest::OwnedStream a(Device::host());
  zest::OwnedStream b(Device::host());
  const zest::Stream def = zest::Stream::default_for(Device::host());
  CHECK(def.id() == 0);
  CHECK(a.get().id() != b.get().id());
  CHECK(a.get().id() != 0);
  CHECK_FALSE(a.get() == b.get());
  CHECK(a.get().query());

  zest::Event e(Device::host());
  e.record(a);
  CHECK(e.query());
  b.get().wait(e);
  e.synchronize();

  zest::OwnedStream moved = std::move(a);
  CHECK(moved.get().id() != 0);
}

TEST_CASE("stream ids are never given twice, even after the stream is gone") {
  uint64_t previous = 0;
  for (int i = 0; i < 4; ++i) {
    const zest::OwnedStream s(Device::host());  // destroyed at each iteration's end
    CHECK(s.get().id() > previous);
    previous = s.get().id();
  }
}

TEST_CASE("host timing events measure elapsed time") {
  zest::Event start(Device::host(), true);
  zest::Event end(Device::host(), true);
  const zest::Stream s = zest::Stream::default_for(Device::host());
  start.record(s);
  volatile double x = 0;
  for (int i = 0; i < 100000; ++i) x = x + i;
  end.record(s);
  CHECK(start.elapsed_ms(end) >= 0.0f);
  zest::Event untimed(Device::host());
  untimed.record(s);
  CHECK_THROWS_WITH_AS((void)start.elapsed_ms(untimed), doctest::Contains("timing=true"), zest::Error);
}

TEST_CASE("a CUDA device beyond those visible is refused clearly") {
  const int n = zest::cuda_device_count();
  CHECK_THROWS_WITH_AS(zest::OwnedStream(Device::cuda(n)), doctest::Contains("requested but"),
                       zest::Error);
  CHECK_THROWS_WITH_AS(zest::Event(Device::cuda(n)), doctest::Contains("requested but"),
                       zest::Error);
}
