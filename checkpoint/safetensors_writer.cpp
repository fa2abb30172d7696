// The safetensors writer: the header first, then each tensor's bytes in the
// declared order, into path + ".tmp"; finish() makes the file durable and
// gives it its name.
//
// Policies:
//  - Crash safety: the bytes go through an AtomicFile (core/file_io.h): a
//    temp file of a unique name, created O_EXCL|O_NOFOLLOW, fsynced and
//    renamed to `path`, then the directory fsynced. Until then a previous file
//    under `path` stays intact, and an abandoned writer's temp file is removed.
//  - The header is written as compact JSON with __metadata__ first and the
//    tensors in data order, each as {"dtype", "shape", "data_offsets"} (the
//    order the Hugging Face writer uses), padded with spaces to a multiple of
//    8 bytes so the data region starts 8-byte aligned.
//  - Small pieces gather in a buffer of kBufferBytes; a piece at least that
//    large goes straight to the file, so a large tensor is never copied.
//  - An I/O error (disk full, short write) marks the writer failed: later
//    calls refuse instead of writing after a gap.
#include <nlohmann/json.hpp>

#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/core/system_error.h"
#include "zest/core/file_io.h"
#include "zest/checkpoint/safetensors.h"

namespace zest {
namespace {

constexpr size_t kBufferBytes = size_t{1} << 20;

// s as a JSON string literal, escaped; names and metadata must be UTF-8.
std::string json_string(const std::string& s, const std::string& path, const char* what) {
  try {
    return nlohmann::json(s).dump();
  } catch (const nlohmann::json::exception& e) {
    ZEST_FAIL("safetensors writer '{}': {} \"{}\" is not valid UTF-8, which the JSON header requires ({})", path,
              what, s, e.what());
  }
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<SafetensorsEntry> tensors,
                                     std::map<std::string, std::string> metadata, SafetensorsProgress progress)
    : path_(std::move(path)), progress_(std::move(progress)) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    const char* sep = "";
    for (const auto& [key, value] : metadata) {
      header += sep + json_string(key, path_, "metadata key") + ":" + json_string(value, path_, "metadata value");
      sep = ",";
    }
    header += "}";
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  slots_.reserve(tensors.size());
  for (SafetensorsEntry& e : tensors) {
    const std::string where = fmt::format("safetensors writer '{}': tensor '{}'", path_, e.name);
    ZEST_CHECK(e.name != "__metadata__", "{}: the name is reserved for the metadata; rename the tensor", where);
    ZEST_CHECK(names.insert(e.name).second, "{}: the name is given twice; names must be unique", where);
    const size_t elem = safetensors_elem_size(e.dtype);
    ZEST_CHECK(elem != 0, "{}: unknown dtype \"{}\"; expected a safetensors name such as F32, F16, BF16, I64",
               where, e.dtype);
    const std::optional<uint64_t> numel = detail::safetensors_numel(e.shape, elem);
    ZEST_CHECK(numel.has_value(), "{}: shape {} has a negative dimension or holds more than 2^64 bytes", where,
               e.shape);
    const uint64_t size = *numel * elem;
    uint64_t end = 0;
    ZEST_CHECK(!__builtin_add_overflow(offset, size, &end), "{}: the tensors hold more than 2^64 bytes", where);
    header += fmt::format("{}{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          header.size() > 1 ? "," : "", json_string(e.name, path_, "tensor name"), e.dtype,
                          fmt::join(e.shape, ","), offset, end);
    slots_.push_back({std::move(e), size});
    offset = end;
  }
  header += "}";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  bytes_total_ = 8 + header.size() + offset;

  buffer_.reserve(kBufferBytes);
  // AtomicFile refuses an existing `path` that is not a regular file (a
  // device, a directory, a link) before anything is written.
  file_ = std::make_unique<AtomicFile>(path_);
  try {
    const uint64_t length = header.size();  // little-endian: the host's order (safetensors.h)
    append(std::as_bytes(std::span(&length, 1)));
    append(std::as_bytes(std::span(header)));
    if (progress_) progress_(bytes_written(), bytes_total_);
  } catch (...) {
    abandon();
    throw;
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!finished_) abandon();
}

void SafetensorsWriter::abandon() noexcept { file_.reset(); }  // removes the temp file

std::string SafetensorsWriter::temp_path() const { return file_ ? file_->temp_path() : std::string(); }

void SafetensorsWriter::check_usable(const char* what) const {
  ZEST_CHECK(!finished_, "safetensors writer '{}': {}() after finish()", path_, what);
  ZEST_CHECK(!failed_,
             "safetensors writer '{}': {}() after an earlier write to '{}' failed; the file cannot be completed, "
             "start a new writer",
             path_, what, temp_path());
}

void SafetensorsWriter::begin_tensor(std::string_view name) {
  check_usable("begin_tensor");
  if (in_tensor_) {
    const Slot& current = slots_[next_ - 1];
    ZEST_CHECK(tensor_received_ == current.size_bytes,
               "safetensors writer '{}': tensor '{}' begun while '{}' has received {} of its {} bytes; each tensor "
               "must be written completely before the next",
               path_, name, current.entry.name, tensor_received_, current.size_bytes);
  }
  // Tensors of zero bytes need no data, so the caller may pass over them.
  size_t i = next_;
  while (i < slots_.size() && slots_[i].entry.name != name && slots_[i].size_bytes == 0) ++i;
  if (i == slots_.size() || slots_[i].entry.name != name) {
    const bool declared =
        std::any_of(slots_.begin(), slots_.end(), [&](const Slot& s) { return s.entry.name == name; });
    ZEST_CHECK(declared, "safetensors writer '{}': tensor '{}' was not among the tensors given to the writer", path_,
               name);
    ZEST_CHECK(i < slots_.size(), "safetensors writer '{}': tensor '{}' begun again after every tensor was written",
               path_, name);
    ZEST_FAIL("safetensors writer '{}': tensor '{}' begun out of order; the next is '{}' (tensors are written in the "
              "order given to the writer)",
              path_, name, slots_[i].entry.name);
  }
  next_ = i + 1;
  in_tensor_ = true;
  tensor_received_ = 0;
}

void SafetensorsWriter::write(std::span<const std::byte> bytes) {
  check_usable("write");
  ZEST_CHECK(in_tensor_, "safetensors writer '{}': write() before begin_tensor(); name the tensor the bytes belong to",
             path_);
  const Slot& current = slots_[next_ - 1];
  ZEST_CHECK(bytes.size() <= current.size_bytes - tensor_received_,
             "safetensors writer '{}': tensor '{}' ({} {}) holds {} bytes; {} were written and {} more came", path_,
             current.entry.name, current.entry.dtype, current.entry.shape, current.size_bytes, tensor_received_,
             bytes.size());
  append(bytes);
  tensor_received_ += bytes.size();
  if (progress_) progress_(bytes_written(), bytes_total_);
}

void SafetensorsWriter::finish() {
  check_usable("finish");
  if (in_tensor_) {
    const Slot& current = slots_[next_ - 1];
    ZEST_CHECK(tensor_received_ == current.size_bytes,
               "safetensors writer '{}': finish() while tensor '{}' has received {} of its {} bytes", path_,
               current.entry.name, tensor_received_, current.size_bytes);
  }
  for (size_t i = next_; i < slots_.size(); ++i) {
    ZEST_CHECK(slots_[i].size_bytes == 0,
               "safetensors writer '{}': finish() before tensor '{}' ({} bytes) was written; every tensor given to "
               "the writer must be written",
               path_, slots_[i].entry.name, slots_[i].size_bytes);
  }
  flush_buffer();
  ZEST_INTERNAL_ASSERT(file_offset_ == bytes_total_, "wrote {} of {} bytes", file_offset_, bytes_total_);
  try {
    file_->commit();
  } catch (const std::exception& e) {
    failed_ = true;
    ZEST_FAIL("safetensors writer '{}': {}", path_, e.what());
  }
  finished_ = true;
}

void SafetensorsWriter::append(std::span<const std::byte> bytes) {
  if (buffer_.size() + bytes.size() > kBufferBytes) flush_buffer();
  if (bytes.size() >= kBufferBytes) {
    write_fully(bytes);
  } else {
    buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
  }
}

void SafetensorsWriter::flush_buffer() {
  write_fully(buffer_);
  buffer_.clear();
}

void SafetensorsWriter::write_fully(std::span<const std::byte> bytes) {
  try {
    file_->write(bytes);
  } catch (const std::exception& e) {
    failed_ = true;
    ZEST_FAIL("safetensors writer '{}': writing failed at byte {} of {}: {}", path_, file_offset_, bytes_total_,
              e.what());
  }
  file_offset_ += bytes.size();
}

}  // namespace zest
