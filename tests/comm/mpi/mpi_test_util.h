// What the MPI test cases share.
#pragma once

#include <chrono>

#include "zest/comm/communicator.h"

namespace zest::test {

// Long enough for a rank of an oversubscribed, sanitized run to catch up
// (4 ranks on 2 cores, each also running an in-process group), short enough
// that a bug fails the test case well before ctest's timeout.
inline CommOptions mpi_test_options() {
  CommOptions o;
  o.timeout = std::chrono::seconds(120);
  return o;
}

inline const Stream& host_stream() {
  static const Stream s = Stream::default_for(Device::host());
  return s;
}

}  // namespace zest::test
