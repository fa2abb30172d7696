// Which saved optimizer state a full load takes when the engine's optimizer
// is not the one that saved the checkpoint.
//
// DeepSpeed's load_checkpoint(load_optimizer_states=True) hands the saved
// state to the engine's PyTorch optimizer, which keeps it by key: Adam and
// AdamW share exp_avg and exp_avg_sq, SGD with momentum has momentum_buffer.
// So here: each of this engine's state buffers is read from the saved buffer
// of the same name, and saved buffers this optimizer has no use for are
// dropped, with a note naming them. A buffer this engine needs that the
// checkpoint does not hold is an error naming it: zeroes are not where a
// fresh optimizer starts (SGD's first step takes the gradient as its
// momentum, and Adam's bias correction would not restart), so such a
// checkpoint loads weights-only (CheckpointOptions::weights_only).
#pragma once

#include <string>
#include <vector>

#include "zest/checkpoint/checkpoint_manifest.h"
#include "zest/optim/optimizer.h"

namespace zest {

struct ShardBufferMap {
  // For each shard buffer of the engine (0: the master weights), the saved
  // buffer it is read from.
  std::vector<int> from;
  // Empty when the optimizers are the same; else what was carried over and
  // what was dropped, for the log.
  std::string note;
};

// `dir` names the checkpoint in the error and the note.
ShardBufferMap map_shard_buffers(const CheckpointManifest& saved, const OptimizerConfig& mine,
                                 const std::string& dir);

}  // namespace zest
