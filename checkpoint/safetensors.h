// Reading and writing safetensors files, the weight format of the Hugging Face
// ecosystem, so that ZEST checkpoints can be exported to and imported from
// PyTorch, transformers and the like.
//
// The format (https://github.com/huggingface/safetensors):
//   8 bytes   N, a little-endian uint64: the header's length in bytes
//   N bytes   a JSON object: name -> {"dtype": "F32", "shape": [2, 3],
//             "data_offsets": [begin, end]}, and optionally "__metadata__":
//             an object of string -> string. Writers pad it with spaces to a
//             multiple of 8 so the data starts aligned.
//   the rest  the tensors' bytes, little-endian and row-major. Offsets count
//             from the first byte after the header; the tensors tile the data
//             region exactly (in any order: no holes, no overlaps).
//
// Reading validates the whole header on open (and reads no tensor data); any
// departure from the format is a zest::Error naming the file, the tensor, what
// is wrong and what was expected. Data is read with positioned reads into the
// caller's memory, whole, by byte range (to stream a large tensor through a
// bounded buffer), or converted to a ZEST DType:
//
//   // zest-example
//   SafetensorsFile f = SafetensorsFile::open("model.safetensors");
//   for (const SafetensorsTensor& t : f.tensors()) fmt::print("{} {}\n", t.name, t.dtype);
//   std::vector<float> w(f.tensor("w").numel);
//   f.read_as("w", DType::kFloat32, std::as_writable_bytes(std::span(w)), {.check_finite = true});
//
// Writing streams: the writer is told every tensor up front (so it can write
// the header first), then takes each tensor's bytes in that order, in as many
// pieces as the caller likes. The file appears under its name only on
// finish() (fsync, then an atomic rename of a temp file next to it), so a crash or an
// exception never leaves a partial file where a complete one is expected:
//
//   // zest-example: run
//   std::vector<float> first_half{1, 2, 3}, second_half{4, 5, 6};
//   SafetensorsWriter out("model.safetensors", {{"w", "F32", {2, 3}}}, {{"format", "pt"}});
//   out.begin_tensor("w");
//   out.write(std::as_bytes(std::span(first_half)));
//   out.write(std::as_bytes(std::span(second_half)));
//   out.finish();
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "zest/core/dtype.h"
#include "zest/core/file_view.h"

namespace zest {

class AtomicFile;

// The format is little-endian and ZEST copies bytes as they are.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

// The largest header the reader accepts: real headers are kilobytes to a few
// megabytes; a larger length is a corrupt file, not a reason to allocate.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = uint64_t{100} << 20;

// Safetensors dtype names ("F32", "BF16", "I64", "BOOL", "F8_E4M3", ...).
// Bytes per element, or 0 for a name the format does not define.
size_t safetensors_elem_size(std::string_view dtype);
// The ZEST DType of a safetensors dtype (F32, F16, BF16, I32, I64, U8), if any.
std::optional<DType> safetensors_zest_dtype(std::string_view dtype);
// The safetensors name of a ZEST DType: kFloat32 -> "F32", kBFloat16 -> "BF16".
std::string_view safetensors_dtype_name(DType t);

// One tensor as the header describes it (validated).
struct SafetensorsTensor {
  std::string name;
  std::string dtype;                // as the file spells it
  std::optional<DType> zest_dtype;  // when ZEST has the type
  size_t elem_size = 0;             // bytes per element
  std::vector<int64_t> shape;       // [] is a scalar (numel 1)
  uint64_t numel = 0;
  uint64_t begin = 0;               // data_offsets: bytes from the start of the data region
  uint64_t end = 0;

  uint64_t size_bytes() const { return end - begin; }
};

struct SafetensorsReadOptions {
  // Floating tensors only: a NaN or Inf in the file, or a finite value that
  // overflows the requested type in read_as, is an error naming the tensor
  // and the first such element's index (in the whole tensor).
  bool check_finite = false;
};

// Where a reader's bytes come from: a file (positioned reads), or memory (for
// tests and fuzzing, or a file that arrived over the network). Reads are
// const and may run on several threads at once.
class SafetensorsSource {
 public:
  virtual ~SafetensorsSource() = default;
  virtual uint64_t size() const = 0;
  // Exactly out.size() bytes at offset; anything less is a zest::Error.
  virtual void read_at(uint64_t offset, std::span<std::byte> out) const = 0;
  // The n bytes at offset in place, without a copy (file_view.h), or
  // nullopt where the source cannot show them so (then read_at them).
  virtual std::optional<FileView> view(uint64_t /*offset*/, uint64_t /*n*/) const { return std::nullopt; }
  // Advice that the n bytes at offset are read soon (ReadOnlyFile::will_need).
  virtual void will_need(uint64_t /*offset*/, uint64_t /*n*/) const {}
};
std::unique_ptr<SafetensorsSource> make_safetensors_file_source(const std::string& path);
// Refers to bytes, which must outlive the source.
std::unique_ptr<SafetensorsSource> make_safetensors_memory_source(std::span<const std::byte> bytes);

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);
  // name stands for the file in error messages.
  static SafetensorsFile from_source(std::unique_ptr<SafetensorsSource> source, std::string name);

  const std::string& path() const { return path_; }
  // In data order (by offset), which is the order that reads them sequentially.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t header_bytes() const { return header_bytes_; }  // N
  uint64_t data_begin() const { return 8 + header_bytes_; }  // file offset of the data region

  const SafetensorsTensor* find(std::string_view name) const;
  // A missing name is an error listing some of the names the file has.
  const SafetensorsTensor& tensor(std::string_view name) const;

  // The whole tensor's bytes, as stored; out.size() must be its size_bytes().
  void read(std::string_view name, std::span<std::byte> out, const SafetensorsReadOptions& options = {}) const;
  // out.size() bytes starting byte_offset bytes into the tensor.
  void read_range(std::string_view name, uint64_t byte_offset, std::span<std::byte> out) const;
  // n bytes starting byte_offset bytes into the tensor, in place (a file's
  // page-cache pages: populate() each range before reading it), or nullopt
  // where the source cannot show them without a copy.
  std::optional<FileView> view_range(std::string_view name, uint64_t byte_offset, uint64_t n) const;
  // Advice that those n bytes are read soon: a file source starts reading
  // them into the page cache (SafetensorsSource::will_need).
  void will_need_range(std::string_view name, uint64_t byte_offset, uint64_t n) const;
  // The whole tensor converted to `want`: out.size() must be numel *
  // elem_size(want). Same type: a plain read. Between F32, F16, BF16 and F64
  // in the file and fp32, fp16 and bf16 in memory: rounded to nearest even
  // (F64 to fp16/bf16 rounds through fp32). Other pairs are an error.
  void read_as(std::string_view name, DType want, std::span<std::byte> out,
               const SafetensorsReadOptions& options = {}) const;
  // Elements [first_element, first_element + out.size() / elem_size(want)).
  void read_range_as(std::string_view name, DType want, uint64_t first_element, std::span<std::byte> out,
                     const SafetensorsReadOptions& options = {}) const;

 private:
  SafetensorsFile() = default;
  void parse_header();

  std::unique_ptr<SafetensorsSource> source_;
  std::string path_;
  uint64_t header_bytes_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// What the writer is told about each tensor before any data.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // a safetensors name; safetensors_dtype_name(DType) for ZEST's types
  std::vector<int64_t> shape;
};

// Called after the header and after each write(), with the bytes of the file
// handed to the writer so far (header included) and the file's final size. It
// runs on the writing thread: keep it cheap, or throttle inside it.
using SafetensorsProgress = std::function<void(uint64_t bytes_done, uint64_t bytes_total)>;

class SafetensorsWriter {
 public:
  // Validates the entries (known dtypes, non-negative dims, unique names, no
  // "__metadata__"), refuses a `path` that exists as anything but a regular
  // file, creates a unique temp file next to it and writes the header.
  SafetensorsWriter(std::string path, std::vector<SafetensorsEntry> tensors,
                    std::map<std::string, std::string> metadata = {}, SafetensorsProgress progress = {});
  // Without finish(): closes and removes the temp file; `path` is untouched.
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Starts the next tensor in the order given to the constructor; the one
  // before must have received all its bytes. Tensors of zero bytes may be
  // skipped.
  void begin_tensor(std::string_view name);
  // The next bytes of the current tensor; more than it holds is an error.
  void write(std::span<const std::byte> bytes);
  void write_tensor(std::string_view name, std::span<const std::byte> bytes) {
    begin_tensor(name);
    write(bytes);
  }
  // Checks that every tensor is complete, flushes, fsyncs, renames the temp
  // file to `path` and fsyncs the directory. Required; once only.
  void finish();

  const std::string& path() const { return path_; }
  // The temporary file being written (a unique name next to `path`).
  std::string temp_path() const;
  uint64_t bytes_written() const { return file_offset_ + buffer_.size(); }
  uint64_t bytes_total() const { return bytes_total_; }

 private:
  struct Slot {
    SafetensorsEntry entry;
    uint64_t size_bytes = 0;
  };
  void append(std::span<const std::byte> bytes);
  void flush_buffer();
  void write_fully(std::span<const std::byte> bytes);
  void check_usable(const char* what) const;
  void abandon() noexcept;

  std::string path_;
  std::vector<Slot> slots_;
  SafetensorsProgress progress_;
  std::unique_ptr<AtomicFile> file_;
  bool finished_ = false;
  bool failed_ = false;        // an I/O error: the temp file is not to be trusted
  size_t next_ = 0;            // slots_ before this are complete or skipped
  bool in_tensor_ = false;     // slots_[next_ - 1] is being written
  uint64_t tensor_received_ = 0;
  uint64_t file_offset_ = 0;   // bytes handed to the OS
  uint64_t bytes_total_ = 0;
  std::vector<std::byte> buffer_;  // small pieces gather here to save syscalls
};

namespace detail {
// Elements of `shape` when every dim is >= 0 and numel * elem_size fits in
// uint64; nullopt otherwise. Shared by the reader and the writer.
std::optional<uint64_t> safetensors_numel(std::span<const int64_t> shape, size_t elem_size);
}  // namespace detail

}  // namespace zest
