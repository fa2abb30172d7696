// The names inside a checkpoint root, in one place: the `latest` pointer,
// each checkpoint's manifest, the tags and shard file names a root may hold,
// and reading `latest` (a small file anyone could have replaced).
//
//   root/latest                  "step_000100\n": the checkpoint to resume
//   root/step_000100/            a published checkpoint (tag "step_000100")
//   root/step_000100/manifest.json
//   root/.zest-lock              the lock a save holds (checkpoint_publish.h)
//   root/.step_000100.partial.*  a save in progress, or killed
//   root/.step_000100.old        a re-saved tag moved aside (fallback path)
//   root/.step_000100.deleting.* an old checkpoint being removed (checkpoint_retention.h)
//
// Names starting with '.' belong to ZEST, so no tag or file name may.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zest {

inline constexpr const char* kManifestFileName = "manifest.json";
inline constexpr const char* kLatestFileName = "latest";
// A `latest` holds one tag; a larger file is refused by its size, unread.
inline constexpr uint64_t kMaxLatestBytes = 4096;
// Manifests are kilobytes to a few megabytes.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;

// A name that stays inside its directory and is not ZEST's own: not empty,
// at most 255 bytes, no '/', no control bytes, not starting with '.'.
bool is_plain_name(std::string_view name);
// Throws unless `tag` is a plain name other than "latest".
void check_tag(const std::string& tag);

// The tag a `latest` file's text names (the text without its final
// newline); `path` names the file in errors, which show its bytes escaped.
std::string parse_latest(std::string_view text, const std::string& path);
// The checkpoint directory root/latest names. When it is missing because a
// re-save of the tag was interrupted with the old copy in root/.TAG.old,
// that copy (with a warning); otherwise an error naming both.
std::string latest_checkpoint_dir(const std::string& root);

// Refuses an output that would overwrite what is being read from the
// checkpoint directory `input_dir`: the directory itself or anything inside
// it, its root, the root's `latest`, a directory holding the input, or any
// of these under another name (the same inode: a hard link, a bind mount);
// and a file inside any checkpoint directory (one holding a manifest).
// `what` names the output in the message ("zest-ckpt export: the output").
void check_output_apart(const std::string& output, const std::string& input_dir, const std::string& what);

}  // namespace zest
