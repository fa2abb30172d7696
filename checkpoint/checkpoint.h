// Sharded checkpoints of an engine: every rank writes its own shard, rank 0 a
// manifest, and a `latest` pointer moves only once everything is on disk.
//
//   // zest-example: prelude=engine
//   zest::save_checkpoint(engine, "ckpt");        // ckpt/step_000100/, ckpt/latest
//   zest::load_checkpoint(engine, "ckpt");        // the one `latest` names
//
// Layout of a checkpoint directory:
//   manifest.json     format version, world size, stage, dtypes, optimizer,
//                     progress (steps, loss scaler), the registered model,
//                     and each shard file's size and CRC-32
//   rank_00003.bin    rank 3's owned fp32 shards: the master weights of every
//                     unit in order, then each optimizer state buffer the same
//                     way (stage 0: rank 0's file holds everything)
//   user_global.bin   the program's own state, when it gave one
//   user_rank_00003.bin  (CheckpointOptions::user_state, user_state.h)
//
// A save is atomic (Note [crash-safe publish] in checkpoint_publish.h): rank
// 0 locks the root, every file is written under a unique temporary name into
// a partial directory with a unique name, and rank 0 moves the directory into
// place (atomically exchanging it with a checkpoint of the same tag) and
// `latest` last. A process killed at any moment leaves the previous
// checkpoint loadable; a second save to the same root fails at once, naming
// the holder of the lock. The manifest carries a CRC-32 of its own content.
//
// A save happens at a gradient accumulation boundary, as in DeepSpeed: a
// save after some micro-steps of an accumulation and before its step() is
// an error (the partial gradients are not part of a checkpoint).
//
// Loading works on another world size or stage: a unit's flat layout does
// not depend on the number of shards (only its padding does), so each rank
// reads the byte ranges of the old files that hold its new shard. Files are
// checked against the manifest (size, CRC-32) and values for finiteness
// before anything is loaded; every problem is a zest::Error naming the file.
// A save refuses values a load would refuse: a run that diverged (a NaN or
// Inf in its master weights or optimizer state) is not saved, on any rank,
// and `latest` keeps naming the last checkpoint (Note [a diverged run is not
// saved] in checkpoint.cpp).
//
// An engine with tensor or pipeline parallelism (Engine::set_model_parallel)
// saves its part of the model under root/mp_rank_TT_PPP, every part at once
// or none (model_parallel_parts.h); it loads on the same tp x pp mesh, at
// any data-parallel size.
#pragma once

#include <functional>
#include <string>

#include "zest/checkpoint/user_state.h"
#include "zest/engine/engine.h"

namespace zest {

// 2: the manifest holds its own checksum; 3: the frozen units' values are
// left out (CheckpointOptions::exclude_frozen_parameters). A save writes 3
// only then, 2 otherwise, so that a reader of 2 reads what it can; 1 is
// still read.
inline constexpr int kCheckpointFormatVersion = 3;

struct CheckpointOptions {
  // The checkpoint's directory name under the root; empty: step_<applied
  // steps, 6 digits>.
  std::string tag;
  // Called on rank 0 with a line of progress (large models take a while).
  // Unset: saves of 1 GiB of shards or more log the lines at info level.
  std::function<void(const std::string&)> progress;
  // load_checkpoint only: read the master weights alone, for fine-tuning
  // (DeepSpeed's load_module_only): the optimizer state is zeroed, the step
  // counts restart at 0, the loss scaler and learning rate stay this
  // engine's, and the checkpoint may have been saved with another optimizer.
  // The weights are taken by parameter name: the units, parameter groups and
  // frozen units may differ from the checkpoint's; the parameters' names and
  // shapes may not.
  //
  // Without it, a load into an engine with another optimizer takes the state
  // the two share by name and drops the rest with a logged note (Adam and
  // AdamW share their moments), or fails naming a state the checkpoint lacks
  // (optimizer_state_map.h), as DeepSpeed's load_optimizer_states does.
  bool weights_only = false;
  // The program's own state (user_state.h). save_checkpoint: saved with the
  // checkpoint when set (on every rank, or on none). load_checkpoint: when
  // set, replaced by the state saved (empty sets when the checkpoint has
  // none), once everything was read and checked.
  UserState* user_state = nullptr;
  // load_checkpoint: per-rank user state saved at another world size.
  PerRankUserState per_rank_user_state = PerRankUserState::kFail;
  // save_checkpoint: leave the frozen units' values out (DeepSpeed's
  // save_checkpoint(exclude_frozen_parameters=True)); a LoRA run then saves
  // what it trains, the adapters and their optimizer state, not a copy of
  // the base. The manifest keeps each frozen unit's fingerprint instead (a
  // 64-bit hash of its values, the same at every world size and stage), and
  // load_checkpoint checks the engine's frozen values against it: load the
  // base first (import_hf, as the run that saved did), then the checkpoint.
  // A load that would need the values (weights_only) is refused by name.
  bool exclude_frozen_parameters = false;
  // save_checkpoint: > 0 keeps the last `keep_last` checkpoints of the root
  // once this one is published, removing older ones (Hugging Face's
  // save_total_limit; checkpoint_retention.h): never this one, nor the one
  // `latest` names. 0 keeps every checkpoint.
  int keep_last = 0;
};

// Collective. Returns the checkpoint's directory.
std::string save_checkpoint(Engine& engine, const std::string& root, const CheckpointOptions& options = {});

// Collective. Loads root/<tag>, or the checkpoint root/latest names.
// Returns the checkpoint's directory.
std::string load_checkpoint(Engine& engine, const std::string& root, const CheckpointOptions& options = {});

// For tools that write checkpoints without an engine (zest-ckpt reshard):
// shard files go into a CheckpointPublisher's partial directory
// (checkpoint_publish.h), then write_manifest() there, then publish().
struct CheckpointManifest;
// The name of partition `rank`'s shard file: rank_00003.bin.
std::string shard_file_name(int rank);
void write_manifest(const std::string& dir, const CheckpointManifest& manifest);

}  // namespace zest
