// Publishing a checkpoint directory: the one routine that save_checkpoint
// and zest-ckpt reshard write through (a single file, such as an export,
// goes through AtomicFile, which this builds on).
//
//   // zest-example: run
//   #include "zest/core/file_io.h"
//   CheckpointPublisher pub("ckpt_root", "step_000100");  // locks ckpt_root
//   AtomicFile shard(pub.partial_dir() + "/rank_00000.bin");
//   shard.write(std::string("the shard's bytes"));
//   shard.commit();
//   pub.publish();  // ckpt_root/step_000100 appears, then ckpt_root/latest names it
//
// Other ranks of a save write into partial_checkpoint_dir(root, tag,
// pub.nonce()), the nonce having travelled from the publishing rank.
//
// Note [crash-safe publish]
// - One saver per root: the publisher holds an exclusive flock on
//   root/.zest-lock from construction to destruction (released by the
//   kernel if the process dies) and writes its holder (pid, host, time)
//   into it, so a second saver fails at once naming the root and the holder.
// - Files are written under unique names (O_CREAT|O_EXCL|O_NOFOLLOW) into a
//   partial directory with a unique name (mkdir never follows a link), so no
//   planted link can redirect a write and no other saver's partial
//   directory is ever touched. Everything is fsynced before it is renamed,
//   and each directory after a rename in it.
// - root/TAG appears by one rename of the complete partial directory. An
//   existing TAG is replaced by renameat2(RENAME_EXCHANGE), which swaps the
//   two names atomically: at every instant root/TAG is a complete checkpoint
//   (old or new), so `latest` never names anything else. The old copy, now
//   under the partial name, is removed afterwards; a kill before that leaves
//   a partial directory, which the next publisher removes under the lock.
// - Where the file system has no RENAME_EXCHANGE, TAG is renamed to .TAG.old
//   first. A kill between the two renames leaves .TAG.old holding the whole
//   old checkpoint: the next publisher renames it back, and a reader that
//   finds TAG missing names .TAG.old and says how to restore it.
// - `latest` moves last, by AtomicFile (a rename over the old pointer).
//   That rename is the commit point: nothing after it may fail the save, so
//   a save never reports a failure once the new checkpoint is published.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace zest {

class CheckpointPublisher {
 public:
  // Creates root if needed and locks it, clears what killed saves left
  // there, and creates an empty partial directory for `tag`. Refuses a
  // root/latest or root/TAG that is a link or not of its kind.
  // `move_latest` false publishes root/TAG alone, for a directory that is
  // not one of a series of checkpoints (a Hugging Face export): root/latest
  // is neither checked nor written, and the commit point is TAG's rename.
  CheckpointPublisher(std::string root, std::string tag, bool move_latest = true);
  // Unpublished: removes the partial directory. Releases the lock.
  ~CheckpointPublisher();
  CheckpointPublisher(const CheckpointPublisher&) = delete;
  CheckpointPublisher& operator=(const CheckpointPublisher&) = delete;

  const std::string& partial_dir() const { return partial_; }
  uint64_t nonce() const { return nonce_; }
  // Moves the partial directory into place as root/TAG, then `latest`.
  // Returns root/TAG. Throws only before the commit point (see the Note).
  std::string publish();

 private:
  void clear_leftovers();
  void replace_tag(const std::string& dir);

  std::string root_;
  std::string tag_;
  bool move_latest_ = true;
  uint64_t nonce_ = 0;
  std::string partial_;
  int lock_fd_ = -1;
  bool published_ = false;
};

// The partial directory of the save `nonce` of `tag`: root/.TAG.partial.<nonce>.
std::string partial_checkpoint_dir(const std::string& root, const std::string& tag, uint64_t nonce);

namespace detail {
// For tests: at_step is called at each step of publish(), in order:
// "partial written" (every file in the partial directory), "tag exchanged"
// (an existing tag swapped with the new copy, the old copy not yet removed)
// or "old moved aside" (the fallback path), "tag in place" (before `latest`
// moves) and "latest moved" (after the commit point). It may throw (or kill
// the process) there;
// no_rename_exchange takes the fallback path of file systems without it.
struct PublishTestHooks {
  std::function<void(std::string_view step)> at_step;
  bool no_rename_exchange = false;
};
PublishTestHooks& publish_test_hooks();
}  // namespace detail

}  // namespace zest
