// A run's communication as the examples report it for the cost model's
// check on simulated hosts (tests/multihost/multihost.sh costmodel): the
// bytes each of the engine's communicators counted (comm/comm_counters.h)
// and the engine's time in reductions and gathers, over the optimizer steps
// after the first (whose collectives also open the connections), beside
// the model's units in zest-estimate's --units format.
#pragma once

#include <string>

#include "zest/comm/comm_counters.h"
#include "zest/engine/engine.h"

namespace examples {

class CommMeter {
 public:
  explicit CommMeter(zest::Engine& engine) : engine_(engine) {}
  // Call with every step()'s result; the first boundary starts the count.
  void add(const zest::StepResult& result);
  // Lines of "comm-unit NAME NUMEL..." (one per unit), then
  // "comm-report steps=N world_bytes=B shard_bytes=B replica_bytes=B
  // hpz_bytes=B seconds=S": this rank's bytes sent on each communicator
  // (0 where the engine has none; shard_bytes 0 under flat sharding, whose
  // shard group is the world) and its reduce + gather seconds, summed.
  std::string format() const;

 private:
  struct Totals {
    double world = 0.0, shard = 0.0, replica = 0.0, hpz = 0.0;
  };
  Totals totals() const;

  zest::Engine& engine_;
  bool started_ = false;
  long steps_ = 0;
  double seconds_ = 0.0;
  Totals at_start_;
};

}  // namespace examples
