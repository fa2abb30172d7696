#include "zest/memory/stream_events.h"

#include <map>
#include <unordered_map>
#include <vector>

#include "zest/core/check.h"

namespace zest {
namespace {

class DeviceStreamEvents final : public StreamEvents {
 public:
  Token record(const Stream& stream) override {
    Event event = take_event(stream.device());
    event.record(stream);
    const Token token = next_token_++;
    live_.emplace(token, std::move(event));
    return token;
  }
  bool completed(Token token) override { return get(token).query(); }
  // Quietly: the allocator needs the point reached, and a failed host
  // stream's skipped work has reached it; the failure is reported to
  // whoever synchronizes that stream.
  void synchronize(Token token) override { get(token).synchronize_quietly(); }
  void release(Token token) override {
    auto it = live_.find(token);
    ZEST_INTERNAL_ASSERT(it != live_.end(), "release of unknown event token {}", token);
    free_[key(it->second.device())].push_back(std::move(it->second));
    live_.erase(it);
  }

 private:
  static int key(Device d) { return d.is_host() ? -1 : d.index(); }

  Event take_event(Device device) {
    std::vector<Event>& pool = free_[key(device)];
    if (pool.empty()) return Event(device);
    Event e = std::move(pool.back());
    pool.pop_back();
    return e;
  }
  Event& get(Token token) {
    auto it = live_.find(token);
    ZEST_INTERNAL_ASSERT(it != live_.end(), "unknown event token {}", token);
    return it->second;
  }

  // Called under the caching allocator's lock, so no lock of its own.
  Token next_token_ = 1;
  std::unordered_map<Token, Event> live_;
  std::map<int, std::vector<Event>> free_;  // by device: -1 host, else CUDA index
};

}  // namespace

std::unique_ptr<StreamEvents> make_device_stream_events() {
  return std::make_unique<DeviceStreamEvents>();
}

}  // namespace zest
