#include "zest/checkpoint/optimizer_state_map.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "zest/core/check.h"

namespace zest {

namespace {

// The state buffers' names, in shard buffer order after the master weights
// (ShardBuffers::state: Adam's m and v; SGD's momentum, when it has one).
// `dir` names a checkpoint whose manifest gave them, in the error.
std::vector<std::string> state_names(const std::string& optimizer, int state_buffers, const std::string& dir) {
  std::vector<std::string> names =
      optimizer == "SGD" ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{"exp_avg", "exp_avg_sq"};
  ZEST_CHECK(state_buffers >= 0 && static_cast<size_t>(state_buffers) <= names.size(),
             "checkpoint '{}': its manifest gives {} {} state buffers; {} has at most {}: the manifest is damaged",
             dir, optimizer, state_buffers, optimizer, names.size());
  names.resize(static_cast<size_t>(state_buffers));
  return names;
}

}  // namespace

ShardBufferMap map_shard_buffers(const CheckpointManifest& saved, const OptimizerConfig& mine,
                                 const std::string& dir) {
  const std::string my_name(optimizer_name(mine.kind));
  const std::vector<std::string> theirs = state_names(saved.optimizer, saved.shard_buffers - 1, dir);
  const std::vector<std::string> ours = state_names(my_name, mine.state_buffers(), dir);
  ShardBufferMap out;
  out.from.push_back(0);
  std::vector<std::string> carried;
  for (const std::string& name : ours) {
    const auto it = std::find(theirs.begin(), theirs.end(), name);
    ZEST_CHECK(it != theirs.end(),
               "checkpoint '{}' was saved with {} (optimizer state: {}); this engine's {} needs its '{}', which the "
               "checkpoint does not hold. Load it with CheckpointOptions::weights_only to start {} afresh from the "
               "saved weights, or configure the optimizer it was saved with",
               dir, saved.optimizer, theirs.empty() ? std::string("none") : fmt::format("{}", fmt::join(theirs, ", ")),
               my_name, name, my_name);
    out.from.push_back(static_cast<int>(it - theirs.begin()) + 1);
    carried.push_back(name);
  }
  std::vector<std::string> dropped;
  for (const std::string& name : theirs) {
    if (std::find(ours.begin(), ours.end(), name) == ours.end()) dropped.push_back(name);
  }
  if (saved.optimizer != my_name || !dropped.empty()) {
    out.note = fmt::format(
        "checkpoint '{}' was saved with {} and loads into this engine's {}: {} carried over; {} dropped", dir,
        saved.optimizer, my_name, carried.empty() ? std::string("no optimizer state") : fmt::format("{}", fmt::join(carried, ", ")),
        dropped.empty() ? std::string("nothing") : fmt::format("{} (unused by {})", fmt::join(dropped, ", "), my_name));
  }
  return out;
}

}  // namespace zest
