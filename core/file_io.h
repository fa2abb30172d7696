// Files written so that a crash never leaves a half-written file under its
// final name, and files read so that no FIFO, device, link or giant file in
// place of the expected one can hang, redirect or exhaust a reader. Used by
// checkpoints, safetensors, configs and the file rendezvous.
//
//   // zest-example: run
//   std::filesystem::create_directories("dir");
//   std::vector<std::byte> bytes(64, std::byte{1});
//   AtomicFile f("dir/rank_00000.bin");   // writes "dir/rank_00000.bin.tmp.<pid>.<random>"
//   f.write(bytes);
//   f.commit();                            // fsync, rename, fsync the directory
//   // Refuses a FIFO, a device, a link and a file over max_bytes, unread:
//   ReadOnlyFile in("dir/rank_00000.bin", {.max_bytes = 1 << 20});
//   std::string text = read_text_file("dir/rank_00000.bin");  // the 64 bytes
//
// Every error names the file and what failed (with strerror).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "zest/core/file_view.h"

namespace zest {

// How a reader treats its file.
struct ReadLimits {
  // A larger file is refused by its size alone, before a byte is read.
  uint64_t max_bytes = UINT64_MAX;
  // A symbolic link as the last component: refused (files inside a
  // checkpoint, which a link could point anywhere), or followed (files a
  // user names, such as a Hugging Face cache's links to blobs).
  bool follow_links = false;
};

// The default cap of read_text_file: configs, manifests and rendezvous files
// are kilobytes to a few megabytes.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{256} << 20;

class AtomicFile {
 public:
  // Refuses before creating anything: an empty path, and a path that exists
  // as anything but a regular file (a directory, a link, a FIFO, a device:
  // never replaced). The temporary file has a unique name and is created
  // with O_EXCL|O_NOFOLLOW, so a link planted under any name cannot redirect
  // the write.
  explicit AtomicFile(std::string path);
  // Removes the temporary file unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(std::span<const std::byte> bytes);
  void write(const std::string& text) { write(std::as_bytes(std::span(text.data(), text.size()))); }
  // fsync and close: every fallible step of writing the file but the rename.
  void sync();
  // sync() if not done, rename over path(), fsync of the directory. Once the rename is
  // done the file is published: a failing directory fsync after it is a
  // warning, not an error, so commit() never reports a failure for a file
  // that is already in place.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_; }
  uint64_t bytes_written() const { return written_; }
  uint32_t crc32() const { return crc_; }

 private:
  std::string path_;
  std::string temp_;
  int fd_ = -1;
  uint64_t written_ = 0;
  uint32_t crc_ = 0;
  bool synced_ = false;
  bool committed_ = false;
};

class ReadOnlyFile {
 public:
  // The one way the project opens a file to read: open with
  // O_NONBLOCK|O_NOFOLLOW (a FIFO cannot block the open, a link is refused
  // unless limits.follow_links), fstat must show a regular file, then
  // O_NONBLOCK is cleared and the size checked against limits.max_bytes.
  // Throws naming the file and what it is instead (missing, a FIFO, ...).
  explicit ReadOnlyFile(std::string path, ReadLimits limits = {});
  // nullopt when the file does not exist; every other problem throws.
  static std::optional<ReadOnlyFile> open_if_exists(std::string path, ReadLimits limits = {});
  ~ReadOnlyFile();
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&&) = delete;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Reads exactly out.size() bytes at `offset`; a read past the end is an
  // error naming the file, the offset and its size. Safe from several
  // threads at once (pread).
  void read_at(uint64_t offset, std::span<std::byte> out) const;
  // Bytes [offset, offset + n) through the page cache's pages, with no copy
  // (file_view.h); out of the file is an error as for read_at.
  FileView view(uint64_t offset, uint64_t n) const;
  // Asks the kernel to start reading [offset, offset + n) into the page
  // cache now (POSIX_FADV_WILLNEED), so that a read_at of it later finds it
  // there. Advice: false where the kernel refused it, which changes nothing
  // but the speed.
  bool will_need(uint64_t offset, uint64_t n) const;
  // CRC-32 of the whole file, read in bounded pieces.
  uint32_t crc32() const;
  // The whole file as text.
  std::string read_all() const;

 private:
  ReadOnlyFile(std::string path, ReadLimits limits, bool may_be_missing);

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The whole file as text, through ReadOnlyFile; throws naming it. Links
// are followed by default: a user names the file (a config, a model list).
std::string read_text_file(const std::string& path,
                           ReadLimits limits = {.max_bytes = kMaxTextFileBytes, .follow_links = true});
// fsync of a directory, so a rename inside it is durable. File systems that
// refuse fsync on directories (EINVAL) are accepted.
void fsync_directory(const std::string& dir);
// Bytes from a file for an error message: printable ASCII as it is, the rest
// escaped (\n, \r, \0, \xNN), at most max_chars of input.
std::string escape_for_message(std::string_view bytes, size_t max_chars = 80);
// 64 bits no other process or call draws (random_device, mixed with the
// clock and the pid where it has no entropy), never 0: nonces, temp names.
uint64_t random_u64();
// A name no other process picks: "<pid>.<random_u64() in hex>".
std::string unique_suffix();

}  // namespace zest
