// Files written so that a crash never leaves a half-written file under its
// final name, and read with positioned reads that fail loudly on a short
// file. Used by checkpoints.
//
//   // zest-example: run
//   std::filesystem::create_directories("dir");
//   std::vector<std::byte> bytes(64, std::byte{1});
//   AtomicFile f("dir/rank_00000.bin");   // writes "dir/rank_00000.bin.tmp"
//   f.write(bytes);
//   f.commit();                            // fsync, rename, fsync the directory
//
// Every error names the file and what failed (with strerror).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace zest {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  // Removes the temporary file unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(std::span<const std::byte> bytes);
  void write(const std::string& text) { write(std::as_bytes(std::span(text.data(), text.size()))); }
  void commit();

  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return written_; }
  uint32_t crc32() const { return crc_; }

 private:
  std::string path_;
  std::string temp_;
  int fd_ = -1;
  uint64_t written_ = 0;
  uint32_t crc_ = 0;
};

class ReadOnlyFile {
 public:
  // Throws naming the file when it cannot be opened (missing, no access).
  explicit ReadOnlyFile(std::string path);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Reads exactly out.size() bytes at `offset`; a read past the end is an
  // error naming the file, the offset and its size.
  void read_at(uint64_t offset, std::span<std::byte> out) const;
  // CRC-32 of the whole file, read in bounded pieces.
  uint32_t crc32() const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The whole file as text; throws naming it.
std::string read_text_file(const std::string& path);
// fsync of a directory, so a rename inside it is durable. File systems that
// refuse fsync on directories (EINVAL) are accepted.
void fsync_directory(const std::string& dir);

}  // namespace zest
