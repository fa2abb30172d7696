#include "zest/core/file_io.h"

#include <cerrno>
#include <filesystem>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zest/core/check.h"
#include "zest/core/crc32.h"
#include "zest/core/system_error.h"

namespace zest {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), temp_(path_ + ".tmp") {
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZEST_CHECK(fd_ >= 0, "cannot create '{}': {}", temp_, errno_text(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_.c_str());
  }
}

void AtomicFile::write(std::span<const std::byte> bytes) {
  ZEST_CHECK(fd_ >= 0, "write to '{}' after commit()", path_);
  crc_ = zest::crc32(bytes.data(), bytes.size(), crc_);
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    ZEST_CHECK(n > 0, "writing '{}' failed after {} bytes: {}", temp_, written_, errno_text(errno));
    p += n;
    left -= static_cast<size_t>(n);
    written_ += static_cast<uint64_t>(n);
  }
}

void AtomicFile::commit() {
  ZEST_CHECK(fd_ >= 0, "'{}' committed twice", path_);
  ZEST_CHECK(::fsync(fd_) == 0, "fsync of '{}' failed: {}", temp_, errno_text(errno));
  ZEST_CHECK(::close(fd_) == 0, "closing '{}' failed: {}", temp_, errno_text(errno));
  fd_ = -1;
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_.c_str());
    ZEST_FAIL("renaming '{}' to '{}' failed: {}", temp_, path_, errno_text(err));
  }
  fsync_directory(std::filesystem::path(path_).parent_path().string());
}

ReadOnlyFile::ReadOnlyFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  ZEST_CHECK(fd_ >= 0, "cannot open '{}': {}", path_, errno_text(errno));
  struct stat st {};
  ZEST_CHECK(::fstat(fd_, &st) == 0, "cannot stat '{}': {}", path_, errno_text(errno));
  size_ = static_cast<uint64_t>(st.st_size);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadOnlyFile::read_at(uint64_t offset, std::span<std::byte> out) const {
  ZEST_CHECK(offset <= size_ && out.size() <= size_ - offset,
             "'{}' is too short: reading {} bytes at offset {} but the file has {}", path_, out.size(), offset,
             size_);
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    ZEST_CHECK(n > 0, "reading '{}' at offset {} failed: {}", path_, offset + done,
               n == 0 ? std::string("unexpected end of file") : errno_text(errno));
    done += static_cast<size_t>(n);
  }
}

uint32_t ReadOnlyFile::crc32() const {
  std::vector<std::byte> piece(size_t{1} << 22);
  uint32_t crc = 0;
  for (uint64_t at = 0; at < size_;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(piece.size(), size_ - at));
    read_at(at, std::span(piece.data(), n));
    crc = zest::crc32(piece.data(), n, crc);
    at += n;
  }
  return crc;
}

std::string read_text_file(const std::string& path) {
  const ReadOnlyFile f(path);
  std::string text(f.size(), '\0');
  f.read_at(0, std::as_writable_bytes(std::span(text.data(), text.size())));
  return text;
}

void fsync_directory(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ZEST_CHECK(fd >= 0, "cannot open directory '{}' to make a rename durable: {}", d, errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  ZEST_CHECK(rc == 0 || err == EINVAL, "fsync of directory '{}' failed: {}", d, errno_text(err));
}

}  // namespace zest
