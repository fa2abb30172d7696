#include "zest/checkpoint/checkpoint_publish.h"

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <optional>

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "zest/checkpoint/checkpoint_paths.h"
#include "zest/core/check.h"
#include "zest/core/file_io.h"
#include "zest/core/logging.h"
#include "zest/core/system_error.h"

namespace zest {
namespace fs = std::filesystem;
namespace {

constexpr const char* kLockFileName = ".zest-lock";

void at_step(std::string_view step) {
  if (detail::publish_test_hooks().at_step) detail::publish_test_hooks().at_step(step);
}

// Refuses a `path` that exists as anything but a `want` (S_IFDIR, S_IFREG).
void check_kind(const fs::path& path, mode_t want, const char* what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    ZEST_CHECK(errno == ENOENT, "cannot look at '{}': {}", path.string(), errno_text(errno));
    return;
  }
  ZEST_CHECK((st.st_mode & S_IFMT) == want,
             "'{}' exists but is not {}{}; ZEST will not replace it or write through it: remove it, or save to "
             "another root",
             path.string(), what, S_ISLNK(st.st_mode) ? " (it is a symbolic link)" : "");
}

std::string holder_text() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '?';
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char when[32] = {};
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return fmt::format("pid {} on host {} since {}", ::getpid(), host, when);
}

void remove_tree_or_warn(const fs::path& path, const char* what) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) ZEST_LOG_WARN("cannot remove {} '{}': {}; remove it by hand", what, path.string(), ec.message());
}

}  // namespace

namespace detail {
PublishTestHooks& publish_test_hooks() {
  static PublishTestHooks hooks;
  return hooks;
}
}  // namespace detail

std::string partial_checkpoint_dir(const std::string& root, const std::string& tag, uint64_t nonce) {
  check_tag(tag);
  return (fs::path(root) / fmt::format(".{}.partial.{:016x}", tag, nonce)).string();
}

CheckpointPublisher::CheckpointPublisher(std::string root, std::string tag, bool move_latest)
    : root_(std::move(root)), tag_(std::move(tag)), move_latest_(move_latest) {
  check_tag(tag_);
  ZEST_CHECK(!root_.empty(), "the checkpoint root is an empty path; give a directory");
  std::error_code ec;
  fs::create_directories(root_, ec);
  ZEST_CHECK(!ec && fs::is_directory(root_), "cannot create the checkpoint root '{}': {}", root_,
             ec ? ec.message() : std::string("it exists and is not a directory"));

  const std::string lock_path = (fs::path(root_) / kLockFileName).string();
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  ZEST_CHECK(lock_fd_ >= 0, "cannot open the lock file '{}' of checkpoint root '{}': {}{}", lock_path, root_,
             errno_text(errno), errno == ELOOP ? " (it is a symbolic link: remove it)" : "");
  struct stat st {};
  // A hard link planted at the lock's name shares another file's content,
  // which recording the holder would overwrite: refused before any write.
  const bool stat_ok = ::fstat(lock_fd_, &st) == 0;
  if (stat_ok && S_ISREG(st.st_mode) && st.st_nlink != 1) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    ZEST_FAIL("the lock file '{}' of checkpoint root '{}' has {} hard links (another name shares its content, which "
              "ZEST would overwrite); remove it, and ZEST creates its own",
              lock_path, root_, st.st_nlink);
  }
  if (!stat_ok || !S_ISREG(st.st_mode) || ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder(256, '\0');
    const ssize_t n = S_ISREG(st.st_mode) ? ::pread(lock_fd_, holder.data(), holder.size(), 0) : -1;
    holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
    ::close(lock_fd_);
    lock_fd_ = -1;
    ZEST_CHECK(S_ISREG(st.st_mode), "the lock file '{}' of checkpoint root '{}' is not a regular file: remove it",
               lock_path, root_);
    ZEST_CHECK(err == EWOULDBLOCK, "cannot lock checkpoint root '{}' ({}): {}", root_, lock_path, errno_text(err));
    ZEST_FAIL("checkpoint root '{}' is locked by another save ({}); two saves to one root would corrupt each "
              "other: wait for that one to end, or save to another root",
              root_, holder.empty() ? std::string("holder unknown") : escape_for_message(holder, 200));
  }
  const std::string holder = holder_text();
  if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, holder.data(), holder.size(), 0) < 0) {
    ZEST_LOG_WARN("cannot record the holder in '{}': {}", lock_path, errno_text(errno));
  }

  try {
    if (move_latest_) check_kind(fs::path(root_) / kLatestFileName, S_IFREG, "a regular file");
    check_kind(fs::path(root_) / tag_, S_IFDIR, "a directory");
    clear_leftovers();
    nonce_ = random_u64();
    partial_ = partial_checkpoint_dir(root_, tag_, nonce_);
    ZEST_CHECK(::mkdir(partial_.c_str(), 0755) == 0, "cannot create '{}' in checkpoint root '{}': {}", partial_, root_,
               errno_text(errno));
  } catch (...) {
    ::close(lock_fd_);
    throw;
  }
}

CheckpointPublisher::~CheckpointPublisher() {
  if (!published_ && !partial_.empty()) remove_tree_or_warn(partial_, "the unfinished checkpoint");
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

// Under the lock no other save is running, so whatever these names hold was
// left by a save that was killed.
void CheckpointPublisher::clear_leftovers() {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("latest.tmp") ||
        (name[0] == '.' && (name.find(".partial") != std::string::npos || name.find(".deleting.") != std::string::npos))) {
      remove_tree_or_warn(e.path(), "the leftover");
    } else if (name[0] == '.' && name.size() > 5 && name.ends_with(".old")) {
      const std::string tag = name.substr(1, name.size() - 5);
      if (!is_plain_name(tag)) continue;
      const fs::path dir = fs::path(root_) / tag;
      std::error_code missing;
      // Only a real directory is a checkpoint moved aside; a link planted
      // under the name is removed (the link, never its target).
      if (!fs::is_directory(fs::symlink_status(e.path(), missing))) {
        remove_tree_or_warn(e.path(), "the leftover");
      } else if (!fs::exists(fs::symlink_status(dir, missing))) {
        // An interrupted replace (the fallback path): the old copy is whole.
        fs::rename(e.path(), dir, ec);
        if (ec) {
          ZEST_LOG_WARN("'{}' holds checkpoint '{}' from an interrupted re-save, but renaming it back failed: {}; "
                        "rename it by hand",
                        e.path().string(), tag, ec.message());
        } else {
          ZEST_LOG_WARN("restored checkpoint '{}' from '{}', left by an interrupted re-save", dir.string(),
                        e.path().string());
        }
      } else {
        remove_tree_or_warn(e.path(), "the replaced checkpoint");
      }
    }
  }
  ZEST_CHECK(!ec, "cannot list checkpoint root '{}': {}", root_, ec.message());
}

void CheckpointPublisher::replace_tag(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    ZEST_CHECK(::rename(partial_.c_str(), dir.c_str()) == 0, "renaming '{}' to '{}' failed: {}", partial_, dir,
               errno_text(errno));
    return;
  }
  ZEST_CHECK(S_ISDIR(st.st_mode), "'{}' exists and is not a directory; remove it or use another tag", dir);
  if (!detail::publish_test_hooks().no_rename_exchange &&
      ::renameat2(AT_FDCWD, partial_.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_directory(root_);
    at_step("tag exchanged");
    remove_tree_or_warn(partial_, "the replaced checkpoint");  // the old copy now
    return;
  }
  ZEST_CHECK(detail::publish_test_hooks().no_rename_exchange || errno == EINVAL || errno == ENOSYS ||
                 errno == ENOTSUP,
             "exchanging '{}' with '{}' failed: {}", partial_, dir, errno_text(errno));
  const std::string old = (fs::path(root_) / ("." + tag_ + ".old")).string();
  std::error_code ec;
  fs::remove_all(old, ec);
  ZEST_CHECK(!ec, "cannot remove '{}' (a replaced checkpoint) before replacing '{}': {}", old, dir, ec.message());
  ZEST_CHECK(::rename(dir.c_str(), old.c_str()) == 0, "moving '{}' aside to '{}' failed: {}", dir, old,
             errno_text(errno));
  at_step("old moved aside");
  if (::rename(partial_.c_str(), dir.c_str()) != 0) {
    const int err = errno;
    const bool back = ::rename(old.c_str(), dir.c_str()) == 0;
    ZEST_FAIL("renaming '{}' to '{}' failed: {}; {}", partial_, dir, errno_text(err),
              back ? std::string("the old checkpoint is back in place")
                   : fmt::format("'{}' holds the old checkpoint: rename it to '{}'", old, dir));
  }
  fsync_directory(root_);
  remove_tree_or_warn(old, "the replaced checkpoint");
}

std::string CheckpointPublisher::publish() {
  ZEST_CHECK(!published_ && lock_fd_ >= 0, "checkpoint '{}' in '{}' published twice", tag_, root_);
  const std::string dir = (fs::path(root_) / tag_).string();
  // Every fallible step of moving `latest` but the last rename happens
  // before root/TAG appears, so a failure leaves the root as it was.
  std::optional<AtomicFile> latest;
  if (move_latest_) {
    latest.emplace((fs::path(root_) / kLatestFileName).string());
    latest->write(tag_ + "\n");
    latest->sync();
  }
  fsync_directory(partial_);
  at_step("partial written");
  replace_tag(dir);
  fsync_directory(root_);
  at_step("tag in place");
  if (latest) latest->commit();
  // The commit point (Note [crash-safe publish]): nothing below may throw.
  published_ = true;
  try {
    at_step("latest moved");
  } catch (const std::exception& e) {
    ZEST_LOG_WARN("checkpoint '{}' is published; a step after publishing failed: {}", dir, e.what());
  }
  return dir;
}

}  // namespace zest
