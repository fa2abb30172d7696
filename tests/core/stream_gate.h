// Holds a host stream's own thread (HostWork::kOwnThread) until opened, so a
// test sees what the stream has not run yet without depending on timing.
#pragma once

#include <future>

#include "zest/core/host_queue.h"

namespace zest::test {

struct StreamGate {
  std::promise<void> promise;
  std::shared_future<void> future = promise.get_future().share();
  // Queues a task that waits for open(): the stream's later work waits too.
  void hold(const Stream& stream) {
    host_launch(stream, [f = future] { f.wait(); });
  }
  void open() { promise.set_value(); }
};

}  // namespace zest::test
