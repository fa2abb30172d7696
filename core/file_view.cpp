#include "zest/core/file_view.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <utility>

#include "zest/core/check.h"
#include "zest/core/system_error.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older kernels answer EINVAL
#endif

namespace zest {
namespace {

size_t page_size() {
  static const size_t size = [] {
    const long p = ::sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<size_t>(p) : size_t{4096};
  }();
  return size;
}

// Kernels before 5.14 lack MADV_POPULATE_READ: there each page is touched
// instead, which reads it as well, but a file shrunk by another process
// while it is read then kills the reader with SIGBUS rather than failing.
std::atomic<bool> populate_read_works{true};

}  // namespace

FileView FileView::borrowed(std::span<const std::byte> bytes) {
  FileView v;
  v.data_ = bytes.data();
  v.size_ = bytes.size();
  return v;
}

FileView FileView::map(int fd, const std::string& path, uint64_t offset, uint64_t n) {
  FileView v;
  v.path_ = path;
  v.file_offset_ = offset;
  v.size_ = static_cast<size_t>(n);
  if (n == 0) return v;
  const uint64_t start = offset / page_size() * page_size();
  v.map_bytes_ = static_cast<size_t>(offset + n - start);
  void* p = ::mmap(nullptr, v.map_bytes_, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
  ZEST_CHECK(p != MAP_FAILED, "mapping bytes [{}, {}) of '{}' failed: {}", offset, offset + n, path,
             errno_text(errno));
  v.map_ = p;
  v.data_ = static_cast<const std::byte*>(p) + (offset - start);
  return v;
}

FileView::~FileView() { release(); }

FileView::FileView(FileView&& other) noexcept { *this = std::move(other); }

FileView& FileView::operator=(FileView&& other) noexcept {
  if (this != &other) {
    release();
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
    file_offset_ = other.file_offset_;
  }
  return *this;
}

void FileView::release() noexcept {
  // munmap fails only for arguments that were never mapped.
  if (map_ != nullptr) (void)::munmap(map_, map_bytes_);
  map_ = nullptr;
}

void FileView::prefetch() const {
  // Refused only for arguments that were never mapped; a refusal costs
  // speed, not correctness.
  if (map_ != nullptr) (void)::madvise(map_, map_bytes_, MADV_WILLNEED);
}

void FileView::populate(size_t offset, size_t n) const {
  ZEST_INTERNAL_ASSERT(offset <= size_ && n <= size_ - offset, "FileView::populate of [{}, {}) in a view of {} bytes",
                       offset, offset + n, size_);
  if (map_ == nullptr || n == 0) return;
  const auto base = reinterpret_cast<uintptr_t>(map_);
  const uintptr_t first = reinterpret_cast<uintptr_t>(data_ + offset);
  const uintptr_t begin = first - (first - base) % page_size();
  const size_t len = static_cast<size_t>(first + n - begin);
  if (populate_read_works.load(std::memory_order_relaxed)) {
    int rc;
    do {
      rc = ::madvise(reinterpret_cast<void*>(begin), len, MADV_POPULATE_READ);
    } while (rc != 0 && errno == EINTR);
    if (rc == 0) return;
    const int e = errno;
    if (e != EINVAL) {
      ZEST_FAIL("reading bytes [{}, {}) of '{}' failed: {}{}", file_offset_ + offset, file_offset_ + offset + n,
                path_, errno_text(e),
                e == EFAULT ? " (the file ends early: it was truncated or replaced while open)" : "");
    }
    populate_read_works.store(false, std::memory_order_relaxed);
  }
  volatile std::byte sink{};
  for (uintptr_t p = begin; p < first + n; p += page_size()) sink = *reinterpret_cast<const std::byte*>(p);
  (void)sink;
}

}  // namespace zest
