// Holds a CUDA stream at a point until the test opens the gate, so that "this
// stream's work is not done yet" is a fact the test controls rather than a race
// against a kernel's running time.
//
//   StreamGate gate;
//   gate.hold(stream);   // work queued on `stream` after this waits
//   ... check that events / allocations see the stream as busy ...
//   gate.open();
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "zest/core/cuda_check.h"

namespace zest::test {

class StreamGate {
 public:
  StreamGate() = default;
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  // Opens, so that a test failing half-way cannot leave a stream held (and the
  // allocator's destructor, which waits for pending events, hung).
  ~StreamGate() { open(); }

  void hold(cudaStream_t stream) {
    // The callback owns a reference: it may run after the gate is destroyed.
    auto* ref = new std::shared_ptr<State>(state_);
    const cudaError_t err = cudaLaunchHostFunc(stream, &StreamGate::wait_open, ref);
    if (err != cudaSuccess) delete ref;
    ZEST_CUDA_CHECK(err);
  }

  void open() {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->is_open = true;
    }
    state_->cv.notify_all();
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    bool is_open = false;
  };

  // Runs on CUDA's callback thread, which may not call CUDA; it only waits. The
  // time limit keeps a test that forgot to open the gate from hanging ctest.
  static void CUDART_CB wait_open(void* arg) {
    const std::unique_ptr<std::shared_ptr<State>> ref(static_cast<std::shared_ptr<State>*>(arg));
    State& s = **ref;
    std::unique_lock<std::mutex> lock(s.mutex);
    s.cv.wait_for(lock, std::chrono::seconds(60), [&] { return s.is_open; });
  }

  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace zest::test
