#include "zest/core/file_io.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <random>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "zest/core/check.h"
#include "zest/core/crc32.h"
#include "zest/core/logging.h"
#include "zest/core/system_error.h"

namespace zest {
namespace {

// What a file that is not a regular file is, for messages.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

std::string parent_of(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace

uint64_t random_u64() {
  static std::atomic<uint64_t> counter{0};
  uint64_t n = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  n ^= static_cast<uint64_t>(::getpid()) << 40;
  n += 0x9e3779b97f4a7c15ull * ++counter;
  try {
    std::random_device rd;
    n ^= (uint64_t{rd()} << 32) ^ rd();
  } catch (const std::exception&) {
    // No entropy source: the clock, the pid and the counter still differ.
  }
  return n == 0 ? 1 : n;
}

std::string unique_suffix() { return fmt::format("{}.{:016x}", ::getpid(), random_u64()); }

std::string escape_for_message(std::string_view bytes, size_t max_chars) {
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < max_chars; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c >= 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (bytes.size() > max_chars) out += fmt::format("... ({} bytes)", bytes.size());
  return out;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  ZEST_CHECK(!path_.empty(), "cannot write a file with an empty name; give a path");
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0) {
    ZEST_CHECK(S_ISREG(st.st_mode),
               "'{}' exists and is {}; ZEST replaces only regular files (and never follows a link): remove it or "
               "write elsewhere",
               path_, file_kind(st.st_mode));
  } else {
    ZEST_CHECK(errno == ENOENT, "cannot write '{}': {}", path_, errno_text(errno));
  }
  temp_ = path_ + ".tmp." + unique_suffix();
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  ZEST_CHECK(fd_ >= 0, "cannot create '{}' (to write '{}'): {}; its directory '{}' must exist and be writable",
             temp_, path_, errno_text(errno), parent_of(path_));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::write(std::span<const std::byte> bytes) {
  ZEST_CHECK(!synced_, "write to '{}' after sync() or commit()", path_);
  crc_ = zest::crc32(bytes.data(), bytes.size(), crc_);
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, std::min<size_t>(left, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ZEST_FAIL("writing '{}' failed after {} bytes: {}{}", temp_, written_,
                err ? errno_text(err) : "the system wrote nothing (short write)",
                err == ENOSPC || err == EDQUOT ? "; free space on that disk or write elsewhere" : "");
    }
    p += n;
    left -= static_cast<size_t>(n);
    written_ += static_cast<uint64_t>(n);
  }
}

void AtomicFile::sync() {
  ZEST_CHECK(!synced_, "'{}' synced twice", path_);
  synced_ = true;
  ZEST_CHECK(::fsync(fd_) == 0, "fsync of '{}' failed: {}", temp_, errno_text(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  ZEST_CHECK(rc == 0, "closing '{}' failed: {}", temp_, errno_text(errno));
}

void AtomicFile::commit() {
  ZEST_CHECK(!committed_, "'{}' committed twice", path_);
  if (!synced_) sync();
  ZEST_CHECK(::rename(temp_.c_str(), path_.c_str()) == 0, "renaming '{}' to '{}' failed: {}", temp_, path_,
             errno_text(errno));
  committed_ = true;
  // Published: from here on nothing may report a failure.
  try {
    fsync_directory(parent_of(path_));
  } catch (const std::exception& e) {
    ZEST_LOG_WARN("'{}' is written, but making its name durable failed: {}", path_, e.what());
  }
}

ReadOnlyFile::ReadOnlyFile(std::string path, ReadLimits limits) : ReadOnlyFile(std::move(path), limits, false) {}

std::optional<ReadOnlyFile> ReadOnlyFile::open_if_exists(std::string path, ReadLimits limits) {
  ReadOnlyFile f(std::move(path), limits, true);
  if (f.fd_ < 0) return std::nullopt;
  return std::optional<ReadOnlyFile>(std::move(f));
}

ReadOnlyFile::ReadOnlyFile(std::string path, ReadLimits limits, bool may_be_missing) : path_(std::move(path)) {
  ZEST_CHECK(!path_.empty(), "cannot read a file with an empty name; give a path");
  // O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever.
  const int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | (limits.follow_links ? 0 : O_NOFOLLOW);
  fd_ = ::open(path_.c_str(), flags);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ENOENT && may_be_missing) return;
    ZEST_CHECK(err != ELOOP || limits.follow_links,
               "'{}' is a symbolic link; ZEST does not follow links here (one could point anywhere): replace it "
               "with the file itself",
               path_);
    ZEST_FAIL("cannot open '{}': {}", path_, errno_text(err));
  }
  struct stat st {};
  const int rc = ::fstat(fd_, &st);
  const int err = errno;
  const int cleared = rc == 0 && S_ISREG(st.st_mode) ? ::fcntl(fd_, F_SETFL, O_RDONLY) : 0;
  if (rc != 0 || !S_ISREG(st.st_mode) || cleared != 0) {
    const int clear_err = errno;
    ::close(fd_);
    fd_ = -1;
    ZEST_CHECK(rc == 0, "cannot stat '{}': {}", path_, errno_text(err));
    ZEST_CHECK(S_ISREG(st.st_mode), "'{}' is {}, not a regular file; ZEST reads only regular files here", path_,
               file_kind(st.st_mode));
    ZEST_FAIL("cannot make reads of '{}' blocking: {}", path_, errno_text(clear_err));
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > limits.max_bytes) {
    ::close(fd_);
    fd_ = -1;
    ZEST_FAIL("'{}' has {} bytes, more than the {} a file of its kind may have; it is not the file expected here",
              path_, size_, limits.max_bytes);
  }
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), size_(other.size_) {
  other.fd_ = -1;
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool ReadOnlyFile::will_need(uint64_t offset, uint64_t n) const {
  if (offset >= size_ || n == 0) return true;
  n = std::min(n, size_ - offset);
  return ::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(n), POSIX_FADV_WILLNEED) == 0;
}

void ReadOnlyFile::read_at(uint64_t offset, std::span<std::byte> out) const {
  ZEST_CHECK(offset <= size_ && out.size() <= size_ - offset,
             "'{}' is too short: reading {} bytes at offset {} but the file has {}", path_, out.size(), offset,
             size_);
  size_t done = 0;
  while (done < out.size()) {
    // pread takes at most SSIZE_MAX and Linux returns at most ~2 GiB: loop.
    const size_t want = std::min<size_t>(out.size() - done, size_t{1} << 30);
    const ssize_t n = ::pread(fd_, out.data() + done, want, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    ZEST_CHECK(n > 0, "reading '{}' at offset {} failed: {}", path_, offset + done,
               n == 0 ? std::string("short read: the file ends early; it was truncated or replaced while open")
                      : errno_text(errno));
    done += static_cast<size_t>(n);
  }
}

FileView ReadOnlyFile::view(uint64_t offset, uint64_t n) const {
  ZEST_CHECK(offset <= size_ && n <= size_ - offset,
             "'{}' is too short: viewing {} bytes at offset {} but the file has {}", path_, n, offset, size_);
  return FileView::map(fd_, path_, offset, n);
}

uint32_t ReadOnlyFile::crc32() const {
  std::vector<std::byte> piece(static_cast<size_t>(std::min<uint64_t>(size_, uint64_t{1} << 22)));
  uint32_t crc = 0;
  for (uint64_t at = 0; at < size_;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(piece.size(), size_ - at));
    read_at(at, std::span(piece.data(), n));
    crc = zest::crc32(piece.data(), n, crc);
    at += n;
  }
  return crc;
}

std::string ReadOnlyFile::read_all() const {
  std::string text(static_cast<size_t>(size_), '\0');
  read_at(0, std::as_writable_bytes(std::span(text.data(), text.size())));
  return text;
}

std::string read_text_file(const std::string& path, ReadLimits limits) {
  return ReadOnlyFile(path, limits).read_all();
}

void fsync_directory(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ZEST_CHECK(fd >= 0, "cannot open directory '{}' to make a rename durable: {}", d, errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  ZEST_CHECK(rc == 0 || err == EINVAL || err == EROFS, "fsync of directory '{}' failed: {}", d, errno_text(err));
}

}  // namespace zest
