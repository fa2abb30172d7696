// A read-only window on part of a file through its page-cache pages
// (mmap), for readers that look at the bytes once: no copy into a buffer of
// their own, and no fresh anonymous memory to fault in. The Hugging Face
// loader reads its shards so on request (HfImportOptions::map_files: on
// the machines measured, the kernel's copy into a buffer was faster).
//
// Reading a mapping whose file shrank, or whose page the disk cannot read,
// raises SIGBUS instead of returning an error, so a reader populates each
// range before it touches it: populate() makes the kernel read the pages
// (MADV_POPULATE_READ) and turns those failures into an error naming the
// file and the range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace zest {

class FileView {
 public:
  FileView() = default;
  // Bytes that stay where they are (a safetensors file held in memory):
  // nothing to map or populate.
  static FileView borrowed(std::span<const std::byte> bytes);
  // Maps bytes [offset, offset + n) of the open file `fd`, named `path` in
  // errors; the caller has checked they are inside the file.
  static FileView map(int fd, const std::string& path, uint64_t offset, uint64_t n);
  ~FileView();
  FileView(FileView&& other) noexcept;
  FileView& operator=(FileView&& other) noexcept;
  FileView(const FileView&) = delete;
  FileView& operator=(const FileView&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  // Asks the kernel to start reading the whole view into the page cache in
  // the background (MADV_WILLNEED), so that populate() later finds it
  // there: a cold read overlapped with other work. Advice only.
  void prefetch() const;
  // Reads bytes [offset, offset + n) of the view into the page cache and
  // maps them, so touching them afterwards cannot fault on I/O. Safe from
  // several threads at once for any ranges.
  void populate(size_t offset, size_t n) const;

 private:
  void release() noexcept;

  void* map_ = nullptr;  // the mapping (page aligned); null for borrowed bytes
  size_t map_bytes_ = 0;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  uint64_t file_offset_ = 0;  // of data_, for messages
};

}  // namespace zest
