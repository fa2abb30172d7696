#include "zest/engine/detail/shard_groups.h"

#include "zest/core/check.h"

namespace zest {

void check_hierarchical(const ZeroConfig& zero, bool offloads_optimizer, bool offloads_params, int world) {
  ZEST_CHECK(zero.mics_shard_size <= 0 || zero.stage == 3,
             "zero.mics_shard_size is {} at stage {}: MiCS shards within groups at stage 3 only, as DeepSpeed "
             "(its MiCS_Optimizer); set zero.stage to 3, or mics_shard_size to -1",
             zero.mics_shard_size, zero.stage);
  ZEST_CHECK(zero.zero_hpz_partition_size <= 1 || zero.stage == 3,
             "zero.zero_hpz_partition_size is {} at stage {}: hpZ's secondary parameter copy is a stage-3 "
             "feature, as in DeepSpeed; set zero.stage to 3, or zero_hpz_partition_size to 1",
             zero.zero_hpz_partition_size, zero.stage);
  zero.check_mics(world, offloads_optimizer);
  zero.check_hpz(world, offloads_params);
}

ShardGroups split_shard_groups(Communicator& world, int shard_size, int hpz_size) {
  ZEST_INTERNAL_ASSERT(shard_size > 0 && world.size() % shard_size == 0, "shard groups of {} on {} ranks",
                       shard_size, world.size());
  ZEST_INTERNAL_ASSERT(hpz_size >= 0 && (hpz_size == 0 || world.size() % hpz_size == 0),
                       "hpZ groups of {} on {} ranks", hpz_size, world.size());
  ShardGroups g;
  const int r = world.rank();
  // The children on the parent's resources where the backend can (NCCL):
  // no new connections for what is a regrouping of the same ranks.
  if (shard_size < world.size()) {
    g.shard = world.split(r / shard_size, r, /*share_resources=*/true);
    g.replica = world.split(r % shard_size, r, /*share_resources=*/true);
    ZEST_INTERNAL_ASSERT(g.shard && g.replica && g.shard->rank() == r % shard_size &&
                             g.replica->rank() == r / shard_size,
                         "rank {}: the shard and replica groups split unexpectedly", r);
  }
  if (hpz_size > 0) {
    g.hpz = world.split(r / hpz_size, r, /*share_resources=*/true);
    ZEST_INTERNAL_ASSERT(g.hpz && g.hpz->rank() == r % hpz_size, "rank {}: the hpZ group split unexpectedly", r);
  }
  return g;
}

}  // namespace zest
