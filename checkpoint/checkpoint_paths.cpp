#include "zest/checkpoint/checkpoint_paths.h"

#include <filesystem>
#include <vector>

#include <sys/stat.h>

#include <fmt/format.h>

#include "zest/core/check.h"
#include "zest/core/file_io.h"
#include "zest/core/logging.h"

namespace zest {
namespace fs = std::filesystem;

bool is_plain_name(std::string_view name) {
  if (name.empty() || name.size() > 255 || name[0] == '.') return false;
  for (const char c : name) {
    if (c == '/' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  }
  return true;
}

void check_tag(const std::string& tag) {
  ZEST_CHECK(is_plain_name(tag) && tag != kLatestFileName,
             "checkpoint tag '{}' must be a plain directory name (no '/', no control characters, at most 255 "
             "bytes), not '{}' and not starting with '.'",
             escape_for_message(tag), kLatestFileName);
}

std::string parse_latest(std::string_view text, const std::string& path) {
  std::string_view tag = text;
  if (!tag.empty() && tag.back() == '\n') tag.remove_suffix(1);
  ZEST_CHECK(is_plain_name(tag) && tag != kLatestFileName,
             "'{}' holds \"{}\", which is not a checkpoint directory name; it should hold one tag such as "
             "step_000100 and a newline: write the tag of a checkpoint in that directory into it",
             path, escape_for_message(text));
  return std::string(tag);
}

std::string latest_checkpoint_dir(const std::string& root) {
  const std::string latest = (fs::path(root) / kLatestFileName).string();
  std::optional<ReadOnlyFile> file = ReadOnlyFile::open_if_exists(latest, {.max_bytes = kMaxLatestBytes});
  ZEST_CHECK(file.has_value(), "no checkpoint to load in '{}': '{}' does not exist", root, latest);
  const std::string tag = parse_latest(file->read_all(), latest);
  const fs::path dir = fs::path(root) / tag;
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    // A re-save of the tag interrupted between its two renames (file
    // systems without RENAME_EXCHANGE, Note [crash-safe publish]): the old
    // copy is whole under .TAG.old. Reading it changes nothing; the next
    // save to the root renames it back.
    const fs::path old = fs::path(root) / ("." + tag + ".old");
    if (fs::is_directory(fs::symlink_status(old, ec)) && fs::exists(old / kManifestFileName, ec)) {
      ZEST_LOG_WARN("'{}' names '{}', which is missing: a re-save of the tag was interrupted, and '{}' holds the "
                    "checkpoint as it was before; reading that (the next save to '{}' renames it back, or: mv '{}' "
                    "'{}')",
                    latest, dir.string(), old.string(), root, old.string(), dir.string());
      return old.string();
    }
    ZEST_FAIL("'{}' names '{}', which does not exist (removed by hand?); write the tag of a checkpoint that exists "
              "into '{}'",
              latest, dir.string(), latest);
  }
  return dir.string();
}

namespace {

// `inner` is `outer` or lies inside it (both canonical).
bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

bool same_inode(const struct stat& a, const fs::path& b) {
  struct stat sb {};
  return ::stat(b.c_str(), &sb) == 0 && a.st_dev == sb.st_dev && a.st_ino == sb.st_ino;
}

}  // namespace

void check_output_apart(const std::string& output, const std::string& input_dir, const std::string& what) {
  ZEST_CHECK(!output.empty(), "{} is an empty path; give a file name", what);
  std::error_code ec;
  const fs::path in = fs::weakly_canonical(input_dir, ec);
  ZEST_CHECK(!ec, "cannot resolve the checkpoint directory '{}': {}", input_dir, ec.message());
  const fs::path out = fs::weakly_canonical(output, ec);
  ZEST_CHECK(!ec, "{} '{}' cannot be resolved: {}", what, output, ec.message());
  const fs::path root = in.parent_path();
  const auto refuse = [&](const std::string& why) {
    ZEST_FAIL("{} '{}' is {}; writing it would destroy the checkpoint being read: write outside '{}'", what, output,
              why, root.string());
  };
  if (within(out, in)) refuse(fmt::format("inside the input checkpoint '{}'", in.string()));
  if (within(in, out)) refuse(fmt::format("a directory holding the input checkpoint '{}'", in.string()));
  if (out == root / kLatestFileName) refuse("the checkpoint root's `latest`");
  // Another checkpoint of the root (or of any root): its files are listed
  // in its manifest, and a file added or replaced there is not a checkpoint.
  if (fs::exists(out.parent_path() / kManifestFileName, ec)) {
    refuse(fmt::format("inside the checkpoint directory '{}'", out.parent_path().string()));
  }
  struct stat st {};
  if (::stat(out.c_str(), &st) != 0) return;
  std::vector<fs::path> inputs = {in, root, root / kLatestFileName};
  for (const fs::directory_entry& e : fs::directory_iterator(in, ec)) inputs.push_back(e.path());
  for (const fs::path& p : inputs) {
    if (same_inode(st, p)) refuse(fmt::format("the same file as '{}'", p.string()));
  }
}

}  // namespace zest
