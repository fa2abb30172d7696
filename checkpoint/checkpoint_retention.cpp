#include "zest/checkpoint/checkpoint_retention.h"

#include <algorithm>
#include <filesystem>
#include <tuple>

#include <fmt/format.h>

#include "zest/checkpoint/checkpoint_manifest.h"
#include "zest/checkpoint/checkpoint_paths.h"
#include "zest/core/check.h"
#include "zest/core/file_io.h"
#include "zest/core/logging.h"

namespace zest {

namespace fs = std::filesystem;

std::vector<std::string> prune_checkpoints(const std::string& root, int keep_last, const std::string& keep_tag) {
  ZEST_CHECK(keep_last >= 1, "keep the last {} checkpoints: keep at least 1", keep_last);
  // The tag `latest` names stays whatever happens (it is keep_tag after a
  // save; read again in case a user pointed it elsewhere).
  std::string latest;
  try {
    latest = fs::path(latest_checkpoint_dir(root)).filename().string();
  } catch (const Error&) {
  }
  struct Candidate {
    int64_t steps = 0;
    std::string tag;
  };
  std::vector<Candidate> found;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string tag = e.path().filename().string();
    std::error_code kind;
    if (!is_plain_name(tag) || tag == kLatestFileName || !fs::is_directory(fs::symlink_status(e.path(), kind))) continue;
    const fs::path manifest = e.path() / kManifestFileName;
    try {
      const std::optional<ReadOnlyFile> f = ReadOnlyFile::open_if_exists(manifest.string(), {.max_bytes = kMaxManifestBytes});
      if (!f) continue;
      found.push_back({parse_manifest(f->read_all(), manifest.string()).progress.applied_steps, tag});
    } catch (const Error&) {
      continue;  // not a ZEST checkpoint, or a damaged one: not ours to delete
    }
  }
  ZEST_CHECK(!ec, "listing checkpoint root '{}': {}", root, ec.message());
  std::sort(found.begin(), found.end(),
            [](const Candidate& a, const Candidate& b) { return std::tie(a.steps, a.tag) < std::tie(b.steps, b.tag); });
  std::vector<std::string> removed;
  int64_t excess = static_cast<int64_t>(found.size()) - keep_last;
  for (const Candidate& c : found) {
    if (excess <= 0) break;
    if (c.tag == keep_tag || c.tag == latest) continue;
    const fs::path from = fs::path(root) / c.tag;
    const fs::path aside = fs::path(root) / fmt::format(".{}.deleting.{:016x}", c.tag, random_u64());
    fs::rename(from, aside, ec);
    if (ec) {
      ZEST_LOG_WARN("keeping the last {} checkpoints of '{}': cannot move '{}' aside to delete it: {}", keep_last, root,
                    from.string(), ec.message());
      continue;
    }
    fs::remove_all(aside, ec);
    if (ec) ZEST_LOG_WARN("cannot remove '{}' (checkpoint '{}'): {}; remove it by hand", aside.string(), c.tag, ec.message());
    removed.push_back(c.tag);
    --excess;
  }
  return removed;
}

}  // namespace zest
