// How the caching allocator learns that work queued on a stream is finished
// with a block, so that a block used on several streams is reused only after
// all of them are done with it.
//
// The allocator owns one StreamEvents. The device implementation records real
// events on the stream's own device (pooled, since creating CUDA events is not
// free), so pinned host memory used by CUDA copies is tracked by CUDA events;
// on an inline host stream every event is complete when recorded, and on a
// host stream with its own thread once the thread gets to it. Tests substitute an implementation whose
// events complete when the test says so, to check the deferral on any machine.
#pragma once

#include <cstdint>
#include <memory>

#include "zest/core/stream.h"

namespace zest {

class StreamEvents {
 public:
  using Token = uint64_t;
  virtual ~StreamEvents() = default;

  // Marks the current end of `stream`'s queue.
  virtual Token record(const Stream& stream) = 0;
  // True once the work queued before the mark is done.
  virtual bool completed(Token token) = 0;
  // Blocks the host until it is.
  virtual void synchronize(Token token) = 0;
  // The token is not used again.
  virtual void release(Token token) = 0;
};

std::unique_ptr<StreamEvents> make_device_stream_events();

}  // namespace zest
