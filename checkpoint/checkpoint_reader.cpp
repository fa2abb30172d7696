#include "zest/checkpoint/checkpoint_reader.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "zest/checkpoint/checkpoint_paths.h"
#include "zest/core/check.h"

namespace zest {
namespace fs = std::filesystem;

std::string shard_buffer_name(int buffer) {
  return buffer == 0 ? std::string("master weights") : fmt::format("optimizer state {}", buffer - 1);
}

namespace {

CheckpointManifest read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifestFileName).string();
  std::optional<ReadOnlyFile> file = ReadOnlyFile::open_if_exists(path, {.max_bytes = kMaxManifestBytes});
  ZEST_CHECK(file.has_value(), "'{}' is not a checkpoint: it has no {} (an unfinished save leaves none)", dir,
             kManifestFileName);
  return parse_manifest(file->read_all(), path);
}

}  // namespace

CheckpointReader::CheckpointReader(std::string dir)
    : dir_(std::move(dir)), manifest_(read_manifest(dir_)), layout_(manifest_.layout()) {}

const ReadOnlyFile& CheckpointReader::file(int partition) {
  auto& f = open_[partition];
  if (!f) {
    const ShardFile& sf = manifest_.files.at(static_cast<size_t>(partition));
    // Every unit's values (the frozen ones' unless excluded), and the
    // optimizer state of the trainable ones.
    const uint64_t expected = manifest_.shard_floats(layout_) * sizeof(float);
    // Capped by what the manifest says, so a huge file is refused unread.
    f = std::make_unique<ReadOnlyFile>((fs::path(dir_) / sf.name).string(),
                                       ReadLimits{.max_bytes = std::max(sf.bytes, expected)});
    ZEST_CHECK(f->size() == sf.bytes && sf.bytes == expected,
               "checkpoint file '{}' has {} bytes; the manifest says {} and the model needs {} (truncated or "
               "from another save)",
               f->path(), f->size(), sf.bytes, expected);
    const uint32_t crc = f->crc32();
    ZEST_CHECK(crc == sf.crc32, "checkpoint file '{}' is corrupt: CRC-32 {:08x}, the manifest says {:08x}",
               f->path(), crc, sf.crc32);
  }
  return *f;
}

void CheckpointReader::verify_all() {
  for (int q = 0; q < manifest_.partitions; ++q) (void)file(q);
}

void CheckpointReader::read(int buffer, int unit, size_t begin, std::span<float> out) {
  ZEST_CHECK(buffer >= 0 && buffer < manifest_.shard_buffers, "checkpoint '{}' has no shard buffer {}", dir_,
             buffer);
  const UnitLayout& U = layout_.unit(unit);
  ZEST_CHECK(buffer == 0 || !U.frozen, "checkpoint '{}': unit '{}' is frozen, so it has no {}", dir_, U.name,
             shard_buffer_name(buffer));
  ZEST_CHECK(manifest_.stores(U, buffer),
             "checkpoint '{}' holds no values of frozen unit '{}': it was saved with exclude_frozen_parameters (a "
             "LoRA run's adapters and their state, without the base), so it loads whole onto the base it was "
             "trained on, and what needs the base's values (a weights-only load, an export) needs that base",
             dir_, U.name);
  const uint64_t base = manifest_.shard_offset(layout_, buffer, unit);
  std::fill(out.begin(), out.end(), 0.0f);
  const size_t end = std::min(begin + out.size(), U.padded);
  for (size_t i = begin; i < end;) {
    const int q = static_cast<int>(i / U.shard);
    const size_t in_shard = i - static_cast<size_t>(q) * U.shard;
    const size_t n = std::min(end - i, U.shard - in_shard);
    const uint64_t offset = (base + in_shard) * sizeof(float);
    file(q).read_at(offset, std::as_writable_bytes(out.subspan(i - begin, n)));
    i += n;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    ZEST_CHECK(checkpoint_value_ok(buffer, out[i]),
               "checkpoint '{}': {} of unit '{}' has {} at element {} of the unit; the checkpoint is corrupt", dir_,
               shard_buffer_name(buffer), U.name, out[i], begin + i);
  }
}

}  // namespace zest
