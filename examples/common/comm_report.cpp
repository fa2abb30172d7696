#include "common/comm_report.h"

#include <fmt/format.h>

#include "common/describe_model.h"

namespace examples {

CommMeter::Totals CommMeter::totals() const {
  Totals t;
  t.world = engine_.comm().counters().total_bytes_sent();
  // Under flat sharding the shard group is comm() itself: not counted twice.
  if (&engine_.shard_comm() != &engine_.comm()) t.shard = engine_.shard_comm().counters().total_bytes_sent();
  if (const zest::Communicator* r = engine_.replica_comm()) t.replica = r->counters().total_bytes_sent();
  if (const zest::Communicator* h = engine_.hpz_comm()) t.hpz = h->counters().total_bytes_sent();
  return t;
}

void CommMeter::add(const zest::StepResult& result) {
  if (!result.boundary) return;
  if (!started_) {
    started_ = true;
    at_start_ = totals();
    return;
  }
  ++steps_;
  seconds_ += (result.times.reduce_ms + result.times.gather_ms) / 1e3;
}

std::string CommMeter::format() const {
  std::string out;
  for (const zest::UnitDescription& u : describe_model(engine_.layout()).units) {
    out += fmt::format("comm-unit {} {}\n", u.name, fmt::join(u.param_numels, " "));
  }
  const Totals now = totals();
  out += fmt::format("comm-report steps={} world_bytes={:.0f} shard_bytes={:.0f} replica_bytes={:.0f} "
                     "hpz_bytes={:.0f} seconds={:.6f}",
                     steps_, now.world - at_start_.world, now.shard - at_start_.shard,
                     now.replica - at_start_.replica, now.hpz - at_start_.hpz, seconds_);
  return out;
}

}  // namespace examples
