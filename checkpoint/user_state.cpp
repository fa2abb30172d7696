#include "zest/checkpoint/user_state.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>

#include <fmt/format.h>

#include "zest/checkpoint/user_state_files.h"
#include "zest/core/file_io.h"

namespace zest::detail {
namespace {

constexpr char kMagic[8] = {'Z', 'E', 'S', 'T', 'U', 'S', 'R', '1'};
// Bounds what a damaged count or length can make a reader attempt.
constexpr uint64_t kMaxNameBytes = 4096;

static_assert(std::endian::native == std::endian::little, "user state files are little-endian");

void put_u64(std::string& out, uint64_t x) { out.append(reinterpret_cast<const char*>(&x), 8); }

class Cursor {
 public:
  Cursor(std::span<const std::byte> data, const std::string& what) : data_(data), what_(what) {}

  std::span<const std::byte> take(uint64_t n, const char* item) {
    ZEST_CHECK(n <= data_.size() - pos_,
               "{}: the file ends inside {} (byte {} of {}, {} more needed); it is truncated or damaged", what_,
               item, pos_, data_.size(), n);
    const auto out = data_.subspan(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return out;
  }
  uint64_t u64(const char* item) {
    uint64_t x = 0;
    std::memcpy(&x, take(8, item).data(), 8);
    return x;
  }
  size_t pos() const { return pos_; }
  bool at_end() const { return pos_ == data_.size(); }

 private:
  std::span<const std::byte> data_;
  const std::string& what_;
  size_t pos_ = 0;
};

}  // namespace

std::string serialize_user_blobs(const std::map<std::string, Blob>& blobs, const std::string& what) {
  std::string out(kMagic, sizeof kMagic);
  put_u64(out, blobs.size());
  for (const auto& [name, bytes] : blobs) {
    ZEST_CHECK(!name.empty() && name.size() <= kMaxNameBytes,
               "{}: a blob name has {} bytes; names must have 1 to {}", what, name.size(), kMaxNameBytes);
    put_u64(out, name.size());
    out += name;
    put_u64(out, bytes.size());
    out.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  return out;
}

std::map<std::string, Blob> parse_user_blobs(std::span<const std::byte> data, const std::string& what) {
  Cursor c(data, what);
  const auto magic = c.take(sizeof kMagic, "the header");
  ZEST_CHECK(std::memcmp(magic.data(), kMagic, sizeof kMagic) == 0,
             "{}: not a ZEST user state file (no \"ZESTUSR1\" header)", what);
  const uint64_t count = c.u64("the blob count");
  std::map<std::string, Blob> out;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t name_bytes = c.u64("a blob's name length");
    ZEST_CHECK(name_bytes >= 1 && name_bytes <= kMaxNameBytes,
               "{}: blob {} has a name of {} bytes (byte {}); names have 1 to {}: the file is damaged", what, i,
               name_bytes, c.pos(), kMaxNameBytes);
    const auto name_data = c.take(name_bytes, "a blob's name");
    std::string name(reinterpret_cast<const char*>(name_data.data()), name_data.size());
    const auto bytes = c.take(c.u64("a blob's length"), "a blob's bytes");
    const bool fresh = out.emplace(name, Blob(bytes.begin(), bytes.end())).second;
    ZEST_CHECK(fresh, "{}: the blob '{}' appears twice: the file is damaged", what, name);
  }
  ZEST_CHECK(c.at_end(), "{}: {} bytes after the last of {} blobs: the file is damaged", what,
             data.size() - c.pos(), count);
  return out;
}

}  // namespace zest::detail

namespace zest {
namespace {

std::map<std::string, Blob> read_blob_file(const std::string& dir, const UserStateFile& entry,
                                           const std::string& what) {
  const ReadOnlyFile file((std::filesystem::path(dir) / entry.name).string());
  ZEST_CHECK(file.size() == entry.bytes,
             "checkpoint file '{}' ({}) has {} bytes; the manifest says {} (truncated or from another save)",
             file.path(), what, file.size(), entry.bytes);
  const uint32_t crc = file.crc32();
  ZEST_CHECK(crc == entry.crc32, "checkpoint file '{}' ({}) is corrupt: CRC-32 {:08x}, the manifest says {:08x}",
             file.path(), what, crc, entry.crc32);
  std::vector<std::byte> data(static_cast<size_t>(file.size()));
  file.read_at(0, data);
  std::map<std::string, Blob> blobs = detail::parse_user_blobs(data, fmt::format("checkpoint file '{}'", file.path()));
  ZEST_CHECK(blobs.size() == entry.blobs, "checkpoint file '{}' ({}) holds {} blobs; the manifest says {}",
             file.path(), what, blobs.size(), entry.blobs);
  return blobs;
}

std::string per_rank_what(int rank) { return fmt::format("user state 'per_rank' of rank {}", rank); }

}  // namespace

std::string user_rank_file_name(int rank) { return fmt::format("user_rank_{:05d}.bin", rank); }

UserState read_user_state(const std::string& dir, const CheckpointManifest& m, int rank, int world,
                          PerRankUserState policy) {
  UserState out;
  if (!m.user_global) return out;
  out.global = read_blob_file(dir, *m.user_global, "user state 'global'");
  if (m.user_per_rank.empty()) return out;
  if (m.world_size == world) {
    out.per_rank = read_blob_file(dir, m.user_per_rank.at(static_cast<size_t>(rank)), per_rank_what(rank));
    return out;
  }
  const bool any = std::any_of(m.user_per_rank.begin(), m.user_per_rank.end(),
                               [](const UserStateFile& f) { return f.blobs > 0; });
  if (!any) return out;
  ZEST_CHECK(policy == PerRankUserState::kDrop,
             "checkpoint '{}' holds per-rank user state saved by {} ranks, and this job has {}: a rank's state "
             "(its data position, its RNG) has no owner at another world size. Load it at {} ranks, or set "
             "CheckpointOptions::per_rank_user_state = PerRankUserState::kDrop to load the rest and the global "
             "user state without it",
             dir, m.world_size, world, m.world_size);
  out.per_rank_dropped = true;
  return out;
}

void verify_user_state(const std::string& dir, const CheckpointManifest& m) {
  if (m.user_global) (void)read_blob_file(dir, *m.user_global, "user state 'global'");
  for (size_t r = 0; r < m.user_per_rank.size(); ++r) {
    (void)read_blob_file(dir, m.user_per_rank[r], per_rank_what(static_cast<int>(r)));
  }
}

}  // namespace zest
