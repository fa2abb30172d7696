#include "zest/nvme/swap_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "zest/core/check.h"
#include "zest/core/file_io.h"
#include "zest/core/logging.h"
#include "zest/core/system_error.h"

namespace zest {
namespace {

constexpr size_t kMinAlignment = 4096;

// Note [swap file lifetime]: the paths of the files this process has open,
// removed by an atexit hook for a process that leaves through std::exit.
struct LiveFiles {
  std::mutex mu;
  std::set<std::string> paths;
};

LiveFiles& live_files() {
  // Never destroyed: the atexit hook runs after static destructors may have.
  static LiveFiles* files = new LiveFiles;
  return *files;
}

void remove_live_files_at_exit() {
  LiveFiles& files = live_files();
  std::lock_guard<std::mutex> lock(files.mu);
  for (const std::string& p : files.paths) ::unlink(p.c_str());
  files.paths.clear();
}

void register_live(const std::string& path) {
  static std::once_flag hook;
  std::call_once(hook, [] { std::atexit(remove_live_files_at_exit); });
  LiveFiles& files = live_files();
  std::lock_guard<std::mutex> lock(files.mu);
  files.paths.insert(path);
}

void unregister_live(const std::string& path) {
  LiveFiles& files = live_files();
  std::lock_guard<std::mutex> lock(files.mu);
  files.paths.erase(path);
}

// The pid in a swap file's name "zest_swap.r<rank>.<pid>.<random>.bin", or
// 0 where the name is not one of ours.
pid_t pid_of_name(std::string_view name) {
  if (!name.starts_with(kSwapFilePrefix) || !name.ends_with(".bin")) return 0;
  name.remove_prefix(std::string_view(kSwapFilePrefix).size());
  if (name.empty() || name[0] != 'r') return 0;
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos) return 0;
  name.remove_prefix(dot + 1);
  long pid = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), pid);
  if (ec != std::errc() || end == name.data() || *end != '.' || pid <= 0) return 0;
  return static_cast<pid_t>(pid);
}

bool process_alive(pid_t pid) {
  if (pid == ::getpid()) return true;
  // EPERM: alive but another user's.
  return ::kill(pid, 0) == 0 || errno == EPERM;
}

size_t direct_io_alignment(int fd) {
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) != 0 || !(sx.stx_mask & STATX_DIOALIGN)) {
    return kMinAlignment;
  }
  return std::max<size_t>({kMinAlignment, sx.stx_dio_mem_align, sx.stx_dio_offset_align});
}

}  // namespace

std::vector<std::string> remove_stale_swap_files(const std::string& dir) {
  std::vector<std::string> removed;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return removed;  // create() reports the directory's problem
  while (const dirent* e = ::readdir(d)) {
    const pid_t pid = pid_of_name(e->d_name);
    if (pid == 0 || process_alive(pid)) continue;
    const std::string path = dir + "/" + e->d_name;
    struct stat st {};
    // lstat: a link of this name is left alone (and never followed).
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    if (::unlink(path.c_str()) == 0) {
      removed.push_back(path);
    } else {
      ZEST_LOG_WARN("could not remove the stale swap file {} of process {} (gone): {}", path, pid,
                    errno_text(errno));
    }
  }
  ::closedir(d);
  for (const std::string& p : removed) ZEST_LOG_INFO("removed the stale swap file {} (its process is gone)", p);
  return removed;
}

SwapFile SwapFile::create(const std::string& dir, const SwapFileOptions& options) {
  ZEST_CHECK(!dir.empty(), "the NVMe swap directory (nvme_path) is empty: name a directory on the NVMe drive");
  struct stat st {};
  ZEST_CHECK(::stat(dir.c_str(), &st) == 0, "the NVMe swap directory (nvme_path) {} cannot be used: {}; create it "
             "or name another", dir, errno_text(errno));
  ZEST_CHECK(S_ISDIR(st.st_mode), "the NVMe swap directory (nvme_path) {} is not a directory; name a directory",
             dir);
  remove_stale_swap_files(dir);

  SwapFile f;
  const std::string path = options.name.empty()
                               ? fmt::format("{}/{}r{}.{}.bin", dir, kSwapFilePrefix, options.rank, unique_suffix())
                               : dir + "/" + options.name;
  const int base = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  f.direct_ = options.direct;
  f.fd_ = ::open(path.c_str(), base | (f.direct_ ? O_DIRECT : 0), 0600);
  if (f.fd_ >= 0 && f.direct_ && options.simulate_no_direct) {
    ::close(f.fd_);
    f.fd_ = -1;
    errno = EINVAL;
  }
  if (f.fd_ < 0 && f.direct_ && errno == EINVAL) {
    // The file system has no O_DIRECT (tmpfs before Linux 6.6, some FUSE).
    // The failed open may still have created the file.
    ::unlink(path.c_str());
    f.direct_ = false;
    ZEST_LOG_INFO("the file system of {} refuses O_DIRECT: its swap file uses buffered I/O (the page cache)", dir);
    f.fd_ = ::open(path.c_str(), base, 0600);
  }
  if (f.fd_ < 0) {
    // Nothing was created: a name in the way (EEXIST) is not ours to remove.
    const int err = errno;
    ZEST_FAIL("cannot create the NVMe swap file {}: {}{}", path, errno_text(err),
              err == EROFS || err == EACCES || err == EPERM
                  ? "; nvme_path must be a writable directory: give write permission or name another"
                  : "");
  }
  f.path_ = path;
  register_live(f.path_);
  f.alignment_ = direct_io_alignment(f.fd_);
  f.size_ = (options.bytes + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  if (f.size_ > 0) {
    int err = ::fallocate(f.fd_, 0, 0, static_cast<off_t>(f.size_)) == 0 ? 0 : errno;
    if (err == EOPNOTSUPP) {
      // No preallocation on this file system: a sparse file of the size,
      // whose blocks are taken at the first write (a full disk then fails
      // that write, with the same message as a write's ENOSPC).
      err = ::ftruncate(f.fd_, static_cast<off_t>(f.size_)) == 0 ? 0 : errno;
    }
    if (err != 0) {
      f.close_and_remove();
      ZEST_FAIL("cannot preallocate {} bytes for the NVMe swap file {}: {}{}", options.bytes, path,
                errno_text(err),
                err == ENOSPC || err == EDQUOT
                    ? "; free that much space on its file system, or point nvme_path at a larger drive"
                    : "");
    }
  }
  ZEST_LOG_DEBUG("NVMe swap file {}: {} bytes, {} I/O aligned to {}", f.path_, f.size_,
                 f.direct_ ? "direct" : "buffered", f.alignment_);
  return f;
}

SwapFile::SwapFile(SwapFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      size_(other.size_),
      direct_(other.direct_),
      alignment_(other.alignment_) {
  other.path_.clear();
}

SwapFile& SwapFile::operator=(SwapFile&& other) noexcept {
  if (this != &other) {
    close_and_remove();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    other.path_.clear();
    size_ = other.size_;
    direct_ = other.direct_;
    alignment_ = other.alignment_;
  }
  return *this;
}

SwapFile::~SwapFile() { close_and_remove(); }

void SwapFile::close_and_remove() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!path_.empty()) {
    if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
      ZEST_LOG_WARN("could not remove the NVMe swap file {}: {}", path_, errno_text(errno));
    }
    unregister_live(path_);
    path_.clear();
  }
}

}  // namespace zest
