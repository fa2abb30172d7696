// Internal: the communicators of hierarchical sharding (MiCS / HSDP; Note
// [MiCS] in config.h), split once from the data-parallel communicator.
#pragma once

#include <memory>

#include "zest/comm/communicator.h"
#include "zest/config/config.h"

namespace zest {

// Refuses a zero.mics_shard_size the engine cannot run on `world` ranks,
// naming what to change: set (> 0) at a stage other than 3, and
// ZeroConfig::check_mics's refusals. Not collective.
void check_mics(const ZeroConfig& zero, bool offloads_optimizer, int world);

struct ShardGroups {
  // Ranks [g S, (g+1) S): the model states are sharded over these.
  std::unique_ptr<Communicator> shard;
  // The ranks with this rank's index in their group, one per group: they
  // hold the same shard, and sum their gradient shards each optimizer step.
  std::unique_ptr<Communicator> replica;
};

// Splits `world` into groups of `shard_size` consecutive ranks and the
// replica groups across them. Collective over `world`. Both empty (no
// collective) when shard_size is world's size: flat sharding.
ShardGroups split_shard_groups(Communicator& world, int shard_size);

}  // namespace zest
