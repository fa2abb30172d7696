// Keeping the last N checkpoints of a root (Hugging Face Trainer's
// save_total_limit): after a save, the oldest checkpoints beyond N are
// removed, by their manifests' applied steps (ties by tag), never the one
// just saved nor the one `latest` names. A directory is a candidate only if
// it is a ZEST checkpoint (a plain name holding a manifest that parses):
// anything else in the root is left alone. A checkpoint is first renamed
// aside (root/.TAG.deleting.*), then removed, so that a process killed
// while deleting leaves no checkpoint half there under its name; a save
// clears such leftovers (checkpoint_publish.h).
#pragma once

#include <string>
#include <vector>

namespace zest {

// Under the root's lock (save_checkpoint calls it while holding it).
// keep_last >= 1. Returns the tags removed, oldest first.
std::vector<std::string> prune_checkpoints(const std::string& root, int keep_last, const std::string& keep_tag);

}  // namespace zest
