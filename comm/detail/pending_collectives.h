// The collectives a device backend's watchdog waits for: each one's
// completion event, its stream, its description and its deadline. Generic
// in the event type, so that the host tests drive it with fake events.
//
// Note [watching in order]. Work on one stream completes in the order it
// was queued, so of the events recorded on one stream only the oldest
// pending one needs a query: while it is pending every later one is, and
// its deadline (set when it was queued, like theirs) passes first. The
// watchdog therefore asks probes() for the oldest entry per stream (one
// query per stream per period, not one per pending collective), queries
// those without holding its mutex (a cudaEventQuery is a driver call), and
// then retires the completed ones, each taking the next of its stream to the
// head. Only the watchdog retires; the issuing thread only adds at the back,
// so a probe's entry is still at its stream's head when it is retired.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "zest/comm/collective.h"
#include "zest/core/check.h"
#include "zest/core/deadline.h"

namespace zest {

template <typename Event>
class PendingCollectives {
 public:
  struct Entry {
    Event event;
    const void* stream;  // compared, never dereferenced
    CollectiveDesc desc;
    Deadline deadline;                // from add()
    std::chrono::milliseconds limit;  // the deadline's timeout, for messages
    uint64_t id;                      // in the order added
  };

  // A collective queued on `stream`, whose `event` completes after it; it
  // must complete within `limit` from now.
  void add(Event event, const void* stream, const CollectiveDesc& desc,
           std::chrono::milliseconds limit) {
    entries_.push_back(Entry{event, stream, desc, Deadline(limit), limit, next_id_++});
  }

  // The oldest entry of each stream, oldest first: the only ones to query.
  std::vector<Entry> probes() const {
    std::vector<Entry> out;
    std::vector<const void*> seen;
    for (const Entry& e : entries_) {
      bool known = false;
      for (const void* s : seen) known = known || s == e.stream;
      if (known) continue;
      seen.push_back(e.stream);
      out.push_back(e);
    }
    return out;
  }

  // Removes the entry `id` (a probe's, found complete) and returns its event
  // for reuse.
  Event retire(uint64_t id) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->id != id) continue;
      Event event = std::move(it->event);
      entries_.erase(it);
      return event;
    }
    ZEST_INTERNAL_ASSERT(false, "retiring collective entry {}, which is not pending", id);
    return Event{};
  }

  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  // Every entry, oldest first (teardown waits for them and frees their events).
  const std::deque<Entry>& entries() const { return entries_; }

 private:
  std::deque<Entry> entries_;
  uint64_t next_id_ = 0;
};

}  // namespace zest
