// Internal: the communicators of hierarchical sharding (MiCS / HSDP; Note
// [MiCS] in config.h), split once from the data-parallel communicator.
#pragma once

#include <memory>

#include "zest/comm/communicator.h"
#include "zest/config/config.h"

namespace zest {

// Refuses a zero.mics_shard_size or zero_hpz_partition_size the engine
// cannot run on `world` ranks, naming what to change: either set at a stage
// other than 3, and ZeroConfig::check_mics's and check_hpz's refusals. Not
// collective.
void check_hierarchical(const ZeroConfig& zero, bool offloads_optimizer, bool offloads_params, int world);

struct ShardGroups {
  // Ranks [g S, (g+1) S): the model states are sharded over these.
  std::unique_ptr<Communicator> shard;
  // The ranks with this rank's index in their group, one per group: they
  // hold the same shard, and sum their gradient shards each optimizer step.
  std::unique_ptr<Communicator> replica;
  // hpZ (Note [hpZ] in config.h): ranks [k H, (k+1) H), over which the
  // secondary copy of the parameters is sharded and gathered.
  std::unique_ptr<Communicator> hpz;
};

// Splits `world` into groups of `shard_size` consecutive ranks and the
// replica groups across them (both left empty when shard_size is world's
// size: flat sharding), then into hpZ groups of `hpz_size` consecutive ranks
// (none when 0). Collective over `world`; nothing is split when nothing is
// asked for.
ShardGroups split_shard_groups(Communicator& world, int shard_size, int hpz_size);

}  // namespace zest
