#include "zest/engine/shard_groups.h"

#include "zest/core/check.h"

namespace zest {

void check_mics(const ZeroConfig& zero, bool offloads_optimizer, int world) {
  ZEST_CHECK(zero.mics_shard_size <= 0 || zero.stage == 3,
             "zero.mics_shard_size is {} at stage {}: MiCS shards within groups at stage 3 only, as DeepSpeed "
             "(its MiCS_Optimizer); set zero.stage to 3, or mics_shard_size to -1",
             zero.mics_shard_size, zero.stage);
  zero.check_mics(world, offloads_optimizer);
}

ShardGroups split_shard_groups(Communicator& world, int shard_size) {
  ZEST_INTERNAL_ASSERT(shard_size > 0 && world.size() % shard_size == 0, "shard groups of {} on {} ranks",
                       shard_size, world.size());
  ShardGroups g;
  if (shard_size == world.size()) return g;
  const int r = world.rank();
  // Both children on the parent's resources where the backend can (NCCL):
  // no new connections for what is a regrouping of the same ranks.
  g.shard = world.split(r / shard_size, r, /*share_resources=*/true);
  g.replica = world.split(r % shard_size, r, /*share_resources=*/true);
  ZEST_INTERNAL_ASSERT(g.shard && g.replica && g.shard->rank() == r % shard_size &&
                           g.replica->rank() == r / shard_size,
                       "rank {}: the shard and replica groups split unexpectedly", r);
  return g;
}

}  // namespace zest
