// The manifest of a checkpoint (checkpoint.h) as data, and its JSON form.
// Parsing is strict: a missing or mistyped field, an unknown format or a
// newer version is a zest::Error naming the file and the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zest/engine/engine.h"
#include "zest/engine/layout.h"

namespace zest {

struct ShardFile {
  std::string name;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

// A user state file (user_state.h); `blobs` is how many it holds.
struct UserStateFile {
  std::string name;
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
  uint64_t blobs = 0;
};

struct CheckpointManifest {
  int format_version = 0;
  int world_size = 1;
  int stage = 0;
  // Files that hold shards: 1 at stage 0, else world_size, or with MiCS
  // (stage 3) the shard group's size, the first group's ranks writing them.
  int partitions = 1;
  std::string compute_dtype;
  std::string optimizer;
  int shard_buffers = 1;  // master + optimizer state buffers
  Engine::Progress progress;
  std::vector<ParamGroupSpec> groups;
  std::vector<UnitSpec> units;
  std::vector<ShardFile> files;
  // Set when the program saved user state; per-rank files, one per rank of
  // world_size, or none (zest-ckpt reshard drops them).
  std::optional<UserStateFile> user_global;
  std::vector<UserStateFile> user_per_rank;
  // Saved with CheckpointOptions::exclude_frozen_parameters: the frozen
  // units' values are not in the shard files (which then hold the trainable
  // units' buffers only); each frozen unit has instead the fingerprint of its
  // values (frozen_fingerprint in checkpoint.h), by unit, 0 for trainable
  // units. Format 3.
  bool frozen_excluded = false;
  std::vector<uint64_t> frozen_fingerprints;

  // Whether the shard files hold `buffer` of `unit`: the trainable units'
  // every buffer, the frozen units' values (buffer 0) unless excluded.
  bool stores(const UnitLayout& unit, int buffer) const {
    return !unit.frozen || (buffer == 0 && !frozen_excluded);
  }
  // The floats of one partition's shard file.
  uint64_t shard_floats(const ModelLayout& layout) const {
    const uint64_t trainable = layout.trainable_owned();
    const uint64_t values = frozen_excluded ? trainable : layout.owned();
    return values + static_cast<uint64_t>(shard_buffers - 1) * trainable;
  }
  // Where `buffer` of `unit` starts in a partition's shard file, in floats.
  uint64_t shard_offset(const ModelLayout& layout, int buffer, int unit) const {
    if (buffer == 0 && !frozen_excluded) return layout.owned_offset(unit);
    const uint64_t first = frozen_excluded ? 0 : layout.owned() - layout.trainable_owned();
    return first + static_cast<uint64_t>(buffer) * layout.trainable_owned() + layout.trainable_offset(unit);
  }

  // The model's layout as it was split when saved.
  ModelLayout layout() const { return ModelLayout(groups, units, partitions); }
};

std::string manifest_to_json(const CheckpointManifest& manifest);
// `path` only names the file in errors.
CheckpointManifest parse_manifest(const std::string& json_text, const std::string& path);

}  // namespace zest
