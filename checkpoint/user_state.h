// The program's own state saved with a checkpoint (DeepSpeed's
// client_state): named byte blobs the engine stores and gives back without
// interpreting them, such as the data position or an RNG's state.
//
//   // zest-example: prelude=engine
//   #include <zest/checkpoint/checkpoint.h>
//   int64_t position = 4096;  // where the data loader is
//   zest::UserState state;
//   state.global["data.position"] = zest::to_bytes(position);
//   zest::CheckpointOptions options;
//   options.user_state = &state;
//   zest::save_checkpoint(engine, "ckpt", options);
//   // ... later, or in the next job:
//   zest::UserState loaded;
//   options.user_state = &loaded;
//   zest::load_checkpoint(engine, "ckpt", options);
//   position = zest::from_bytes<int64_t>(loaded.global.at("data.position"));
//
// Two sets:
//   global    the same on every rank (checked at save: a rank whose global
//             state differs from rank 0's fails the save, naming both);
//             written once, by rank 0, and given to every rank on load, at
//             any world size or stage.
//   per_rank  each rank's own (its sampler position, its RNG): one file per
//             rank, given back to the same rank on a load at the same world
//             size. At another world size a rank's state has no owner:
//             loading fails unless CheckpointOptions::per_rank_user_state is
//             kDrop, which gives back the global state and an empty per_rank
//             (per_rank_dropped says so). Checkpoints whose per-rank state is
//             empty on every rank load at any world size.
//
// The files (user_global.bin, user_rank_00003.bin) are listed in the
// manifest with their size and CRC-32, and checked like the shard files
// before anything is loaded; a load that fails leaves the UserState as it
// was.
#pragma once

#include <cstddef>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "zest/core/check.h"

namespace zest {

using Blob = std::vector<std::byte>;

struct UserState {
  std::map<std::string, Blob> global;
  std::map<std::string, Blob> per_rank;
  // Set by a load: the checkpoint held per-rank state from another world
  // size, and PerRankUserState::kDrop left per_rank empty.
  bool per_rank_dropped = false;
};

// What a load at another world size does with per-rank user state.
enum class PerRankUserState {
  kFail,  // the load fails, naming both world sizes
  kDrop   // per_rank comes back empty, per_rank_dropped is set
};

// A trivially copyable value's bytes, and back (the blob's size must match).
template <typename T>
Blob to_bytes(const T& value) {
  static_assert(std::is_trivially_copyable_v<T>, "to_bytes: T must be trivially copyable");
  Blob out(sizeof(T));
  std::memcpy(out.data(), &value, sizeof(T));
  return out;
}

inline Blob to_bytes(const std::string& text) {
  const auto bytes = std::as_bytes(std::span(text.data(), text.size()));
  return Blob(bytes.begin(), bytes.end());
}

template <typename T>
T from_bytes(const Blob& blob) {
  static_assert(std::is_trivially_copyable_v<T>, "from_bytes: T must be trivially copyable");
  ZEST_CHECK(blob.size() == sizeof(T), "from_bytes: the blob has {} bytes; the type needs {}", blob.size(),
             sizeof(T));
  T value;
  std::memcpy(&value, blob.data(), sizeof(T));
  return value;
}

namespace detail {
// The file form of one set of blobs: "ZESTUSR1", the count, then each blob's
// name and bytes, every length a little-endian uint64. `what` names the set
// in errors ("user state 'global'"); parsing checks every length against the
// data, so a damaged file is an error, never a crash.
std::string serialize_user_blobs(const std::map<std::string, Blob>& blobs, const std::string& what);
std::map<std::string, Blob> parse_user_blobs(std::span<const std::byte> data, const std::string& what);
}  // namespace detail

}  // namespace zest
