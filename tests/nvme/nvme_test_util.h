// What the NVMe tier's tests share: a small file system that refuses writes
// or fills up, patterned bytes, and the back ends this build and kernel have.
#pragma once

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "checkpoint/temp_dir.h"
#include "error_of.h"
#include "zest/core/check.h"
#include "zest/nvme/aio_backend.h"

namespace zest::test {

// A directory on a file system of its own where the test can make one
// (root: a tmpfs mounted there, `read_only` or `bytes` in size), or, for
// another user, a directory made read-only by its mode (a non-root process
// cannot mount; it can be refused by permissions, which root is not).
// `ready` says whether the condition could be set up; the tests then use
// another way to the same failure.
struct LimitedDir {
  TempDir base;
  std::string path;
  bool mounted = false;
  bool ready = false;
  LimitedDir(bool read_only, size_t bytes) {
    path = base / "fs";
    ::mkdir(path.c_str(), 0755);
    if (::geteuid() == 0) {
      const std::string opts = "size=" + std::to_string(bytes);
      mounted = ::mount("tmpfs", path.c_str(), "tmpfs", read_only ? MS_RDONLY : 0, opts.c_str()) == 0;
      ready = mounted;
    } else if (read_only) {
      ready = ::chmod(path.c_str(), 0555) == 0;
    }
  }
  ~LimitedDir() {
    if (mounted) ::umount2(path.c_str(), MNT_DETACH);
    ::chmod(path.c_str(), 0755);
  }
  LimitedDir(const LimitedDir&) = delete;
  LimitedDir& operator=(const LimitedDir&) = delete;
};

// Bytes that differ at every position and between seeds.
inline std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v[i] = static_cast<std::byte>(x);
  }
  return v;
}

// The back ends to test: the thread pool always, io_uring where built and
// the kernel allows it.
inline std::vector<AioBackendKind> backend_kinds() {
  std::vector<AioBackendKind> kinds{AioBackendKind::kThreadPool};
  int error = 0;
  if (aio_io_uring_built() && detail::make_io_uring_backend(AioConfig{}, error)) kinds.push_back(AioBackendKind::kIoUring);
  return kinds;
}

inline const char* kind_name(AioBackendKind k) { return k == AioBackendKind::kIoUring ? "io_uring" : "thread pool"; }

}  // namespace zest::test
