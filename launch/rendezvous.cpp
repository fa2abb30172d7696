#include "zest/launch/rendezvous.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "zest/core/check.h"

namespace zest {

void check_rendezvous_member(const RendezvousMember& me, std::string_view kind) {
  ZEST_CHECK(me.world_size >= 1 && me.rank >= 0 && me.rank < me.world_size,
             "{} rendezvous: rank {} is not a rank of a world of {}", kind, me.rank, me.world_size);
  ZEST_CHECK(me.timeout.count() > 0, "{} rendezvous: the timeout must be positive, got {} ms",
             kind, me.timeout.count());
}

void check_rendezvous_blob(std::string_view blob, std::string_view kind) {
  ZEST_CHECK(blob.size() <= kMaxRendezvousBlob,
             "{} rendezvous: a blob of {} bytes is more than the {} a rendezvous carries", kind,
             blob.size(), kMaxRendezvousBlob);
}

std::string rendezvous_timeout_message(std::string_view kind, std::string_view where,
                                       const RendezvousMember& me, const Deadline& deadline,
                                       std::string_view what) {
  return fmt::format("{} rendezvous at {} timed out on rank {} of {} after {} ms: {}", kind, where,
                     me.rank, me.world_size, deadline.elapsed().count(), what);
}

void sleep_within(const Deadline& deadline, std::chrono::milliseconds wait) {
  std::this_thread::sleep_for(std::min(wait, deadline.remaining()));
}

}  // namespace zest
