// One rank's scratch file of the NVMe tier: where its offloaded optimizer
// state or parameters live between uses. Scratch, not a checkpoint (those go
// through core/file_io.h's atomic publish): its bytes mean nothing once the
// process is gone.
//
//   // zest-example: run
//   std::filesystem::create_directories("swap");
//   zest::SwapFile f = zest::SwapFile::create("swap", {.bytes = 1 << 20, .rank = 0});
//   // f.path() is "swap/zest_swap.r0.<pid>.<random>.bin": 1 MiB, preallocated,
//   // opened with O_DIRECT where the file system allows it.
//   size_t align = f.alignment();  // offsets, sizes and buffers of its I/O
//
// Note [swap file lifetime]: the file is created with O_CREAT|O_EXCL|
// O_NOFOLLOW under a name no other process picks (pid and random), so a file
// or link planted at that name is refused, never written through. It is
// removed by the destructor and, for a process that exits without unwinding
// (std::exit), by an atexit hook over every file still open. A process that
// dies (a signal, a crash, kill -9) leaves its files; the next create() in the
// same directory removes every swap file whose pid is no longer alive on this
// host (only regular files of this naming, never through links). A directory
// shared between hosts (NFS) must not be given to two hosts at once: a pid is
// alive or not only on its own host.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zest {

struct SwapFileOptions {
  uint64_t bytes = 0;  // preallocated; rounded up to alignment()
  int rank = 0;        // in the name, for a person reading the directory
  // Test seam and escape hatch: false opens without O_DIRECT at once.
  bool direct = true;
  // Test seam: act as if the file system refused O_DIRECT (EINVAL).
  bool simulate_no_direct = false;
  // Test seam: this file name (in dir) instead of a unique one.
  std::string name = {};
};

class SwapFile {
 public:
  // Creates the file in `dir` (which must exist): removes stale swap files
  // of dead processes there first, then creates, opens and preallocates.
  // Throws zest::Error naming the path for a missing or read-only directory
  // and, for a disk too full to preallocate, the bytes and what to do.
  static SwapFile create(const std::string& dir, const SwapFileOptions& options);

  SwapFile(SwapFile&& other) noexcept;
  SwapFile& operator=(SwapFile&& other) noexcept;
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;
  // Closes and removes the file.
  ~SwapFile();

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // Whether the file is open with O_DIRECT (false where the file system
  // refused it, e.g. an older tmpfs: then I/O goes through the page cache).
  bool direct() const { return direct_; }
  // The alignment of offsets, sizes and buffer addresses of direct I/O: the
  // file system's (statx STATX_DIOALIGN) where it says, at least 4096.
  size_t alignment() const { return alignment_; }

 private:
  SwapFile() = default;
  void close_and_remove() noexcept;

  int fd_ = -1;
  std::string path_;
  uint64_t size_ = 0;
  bool direct_ = false;
  size_t alignment_ = 4096;
};

// The swap files in `dir` whose process is gone, removed; returns their
// paths. create() calls it; exposed for tests and tools.
std::vector<std::string> remove_stale_swap_files(const std::string& dir);

// The name prefix of swap files ("zest_swap."), for tools and tests.
inline constexpr const char* kSwapFilePrefix = "zest_swap.";

}  // namespace zest
