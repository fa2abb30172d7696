// The safetensors reader: strict header validation, positioned reads, and
// conversion between the floating types.
//
// Policies:
//  - open() reads the 8-byte length and the header, nothing else, and checks
//    everything a later read relies on: every entry's keys and types, the
//    dtype, shape and offsets, that the offsets agree with dtype and shape,
//    and that the tensors tile the data region exactly. After open() succeeds
//    a read can fail only through I/O (a file truncated while open).
//  - Duplicate JSON keys are errors (nlohmann keeps the last one silently),
//    and so is any nesting deeper than a header has, so a hostile header
//    cannot recurse deep into the parser (config/detail/json_parse.h).
//  - Reads are positioned (pread) and const: one SafetensorsFile may serve
//    several threads at once. Conversions stream through a bounded staging
//    buffer, so converting a 10 GB tensor costs kStagingElems of extra memory.
#include <nlohmann/json.hpp>

#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <set>

#include "zest/config/detail/json_parse.h"
#include "zest/core/check.h"
#include "zest/core/file_io.h"
#include "zest/core/system_error.h"
#include "zest/optim/grad_ops.h"
#include "zest/checkpoint/safetensors.h"

namespace zest {
namespace {

using nlohmann::json;

struct DTypeInfo {
  std::string_view name;
  size_t size;
  std::optional<DType> zest;
};

// Every byte-sized dtype of the format. The sub-byte ones (F4, F6_*) pack
// several elements a byte and are not supported.
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 1, std::nullopt},    {"U8", 1, DType::kUInt8},       {"I8", 1, std::nullopt},
    {"F8_E5M2", 1, std::nullopt}, {"F8_E4M3", 1, std::nullopt},   {"F8_E8M0", 1, std::nullopt},
    {"I16", 2, std::nullopt},     {"U16", 2, std::nullopt},       {"F16", 2, DType::kFloat16},
    {"BF16", 2, DType::kBFloat16}, {"I32", 4, DType::kInt32},     {"U32", 4, std::nullopt},
    {"F32", 4, DType::kFloat32},  {"I64", 8, DType::kInt64},      {"U64", 8, std::nullopt},
    {"F64", 8, std::nullopt},
};

const DTypeInfo* find_dtype(std::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::string known_dtypes() {
  std::string s;
  for (const DTypeInfo& d : kDTypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// ---- sources ----------------------------------------------------------------

// Opened through ReadOnlyFile, which refuses FIFOs and devices; links are
// followed, since a user names the file (and Hugging Face caches link to
// blobs).
class FileSource final : public SafetensorsSource {
 public:
  explicit FileSource(const std::string& path) : file_(path, {.follow_links = true}) {}
  uint64_t size() const override { return file_.size(); }
  void read_at(uint64_t offset, std::span<std::byte> out) const override { file_.read_at(offset, out); }
  std::optional<FileView> view(uint64_t offset, uint64_t n) const override { return file_.view(offset, n); }
  // Refused advice changes only the speed.
  void will_need(uint64_t offset, uint64_t n) const override { (void)file_.will_need(offset, n); }

 private:
  ReadOnlyFile file_;
};

class MemorySource final : public SafetensorsSource {
 public:
  explicit MemorySource(std::span<const std::byte> bytes) : bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  void read_at(uint64_t offset, std::span<std::byte> out) const override {
    ZEST_CHECK(offset <= bytes_.size() && out.size() <= bytes_.size() - offset,
               "safetensors in memory: {} bytes at offset {} are past the end of its {} bytes", out.size(), offset,
               bytes_.size());
    if (!out.empty()) std::memcpy(out.data(), bytes_.data() + offset, out.size());
  }
  std::optional<FileView> view(uint64_t offset, uint64_t n) const override {
    ZEST_CHECK(offset <= bytes_.size() && n <= bytes_.size() - offset,
               "safetensors in memory: {} bytes at offset {} are past the end of its {} bytes", n, offset,
               bytes_.size());
    return FileView::borrowed(bytes_.subspan(offset, n));
  }

 private:
  std::span<const std::byte> bytes_;
};

// ---- header -----------------------------------------------------------------

// Text for an error message: a hostile header's values can be megabytes
// long, and the start says enough.
std::string brief(const json& v) { return detail::json_brief(v, 64); }

// Objects in objects holding arrays of numbers: a header is 3 levels deep
// (top object, tensor entry, shape array); parse_json refuses duplicate
// keys (nlohmann would keep the last silently) and deeper nesting.
json parse_header_json(const std::string& text, const std::string& path) {
  try {
    return detail::parse_json(text, fmt::format("safetensors file '{}': the header", path), {.max_depth = 3});
  } catch (const Error& e) {
    ZEST_FAIL("{}; expected a JSON object of tensor name -> {{\"dtype\", \"shape\", \"data_offsets\"}}",
              e.message());
  }
}

// A JSON value that must be a non-negative integer; `what` names it in errors.
uint64_t read_count(const json& v, const std::string& where, const std::string& what) {
  ZEST_CHECK(v.is_number_integer() && (v.is_number_unsigned() || v.get<int64_t>() >= 0),
             "{}: {} is {}; expected a non-negative integer", where, what, brief(v));
  return v.get<uint64_t>();
}

std::map<std::string, std::string> parse_metadata(const json& v, const std::string& path) {
  ZEST_CHECK(v.is_object(), "safetensors file '{}': __metadata__ is a JSON {}; expected an object of string -> string",
             path, v.type_name());
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : v.items()) {
    ZEST_CHECK(value.is_string(), "safetensors file '{}': __metadata__ \"{}\" is {}; metadata values must be strings",
               path, key, brief(value));
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

SafetensorsTensor parse_entry(const std::string& name, const json& v, uint64_t data_size, const std::string& path) {
  const std::string where = fmt::format("safetensors file '{}': tensor '{}'", path, name);
  ZEST_CHECK(v.is_object(), "{}: the entry is a JSON {}; expected an object with dtype, shape and data_offsets", where,
             v.type_name());
  for (const auto& [key, value] : v.items()) {
    ZEST_CHECK(key == "dtype" || key == "shape" || key == "data_offsets",
               "{}: unknown key \"{}\"; an entry has exactly dtype, shape and data_offsets", where, key);
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    ZEST_CHECK(v.contains(key), "{}: the entry has no \"{}\"; expected dtype, shape and data_offsets", where, key);
  }
  SafetensorsTensor t;
  t.name = name;

  const json& dtype = v.at("dtype");
  ZEST_CHECK(dtype.is_string(), "{}: dtype is {}; expected a string such as \"F32\"", where, brief(dtype));
  t.dtype = dtype.get<std::string>();
  const DTypeInfo* info = find_dtype(t.dtype);
  ZEST_CHECK(info != nullptr, "{}: unknown dtype \"{}\"; expected one of {}", where, t.dtype, known_dtypes());
  t.elem_size = info->size;
  t.zest_dtype = info->zest;

  const json& shape = v.at("shape");
  ZEST_CHECK(shape.is_array(), "{}: shape is {}; expected an array of non-negative integers", where, brief(shape));
  for (size_t i = 0; i < shape.size(); ++i) {
    const uint64_t dim = read_count(shape[i], where, fmt::format("shape[{}]", i));
    ZEST_CHECK(dim <= static_cast<uint64_t>(INT64_MAX), "{}: shape[{}] = {} is beyond any real tensor", where, i, dim);
    t.shape.push_back(static_cast<int64_t>(dim));
  }
  const std::optional<uint64_t> numel = detail::safetensors_numel(t.shape, t.elem_size);
  ZEST_CHECK(numel.has_value(), "{}: shape {} of {} holds more than 2^64 bytes", where, t.shape, t.dtype);
  t.numel = *numel;

  const json& offsets = v.at("data_offsets");
  ZEST_CHECK(offsets.is_array() && offsets.size() == 2,
             "{}: data_offsets is {}; expected [begin, end], two non-negative integers", where, brief(offsets));
  t.begin = read_count(offsets[0], where, "data_offsets[0]");
  t.end = read_count(offsets[1], where, "data_offsets[1]");
  ZEST_CHECK(t.begin <= t.end, "{}: data_offsets [{}, {}] end before they begin; expected begin <= end", where,
             t.begin, t.end);
  const uint64_t expected = t.numel * t.elem_size;
  ZEST_CHECK(t.size_bytes() == expected,
             "{}: data_offsets [{}, {}] span {} bytes, but shape {} of {} ({} elements of {} bytes) needs {}", where,
             t.begin, t.end, t.size_bytes(), t.shape, t.dtype, t.numel, t.elem_size, expected);
  ZEST_CHECK(t.end <= data_size,
             "{}: data_offsets [{}, {}] reach past the end of the data region, which holds {} bytes; the file is "
             "truncated or the offsets are wrong",
             where, t.begin, t.end, data_size);
  return t;
}

// The tensors, sorted by offset, must tile [0, data_size) exactly.
void check_tiling(const std::vector<SafetensorsTensor>& sorted, uint64_t data_size, const std::string& path) {
  uint64_t covered = 0;
  const SafetensorsTensor* last = nullptr;  // the tensor that ends at `covered`
  for (const SafetensorsTensor& t : sorted) {
    ZEST_CHECK(t.begin >= covered,
               "safetensors file '{}': tensors '{}' [{}, {}) and '{}' [{}, {}) overlap; every byte of the data region "
               "belongs to exactly one tensor",
               path, last->name, last->begin, last->end, t.name, t.begin, t.end);
    ZEST_CHECK(t.begin == covered,
               "safetensors file '{}': bytes [{}, {}) of the data region, before tensor '{}', belong to no tensor; "
               "the tensors must cover the data region without holes",
               path, covered, t.begin, t.name);
    covered = t.end;
    last = &t;
  }
  ZEST_CHECK(covered == data_size,
             "safetensors file '{}': bytes [{}, {}) at the end of the data region belong to no tensor; the tensors "
             "must cover the data region without holes",
             path, covered, data_size);
}

// ---- conversions ------------------------------------------------------------

// Storage of the floating types as they sit in the file or in memory.
template <typename Bits, double (*Load)(Bits), Bits (*Store)(float)>
struct FloatStorage {
  static constexpr size_t kSize = sizeof(Bits);
  static double load(const std::byte* p) {
    Bits b;
    std::memcpy(&b, p, sizeof(b));
    return Load(b);
  }
  static void store(float f, std::byte* p) {
    const Bits b = Store(f);
    std::memcpy(p, &b, sizeof(b));
  }
};
double f64_load(double d) { return d; }
double f32_load(float f) { return f; }
double f16_load(uint16_t b) { return fp16_bits_to_float(b); }
double bf16_load(uint16_t b) { return bf16_bits_to_float(b); }
double f64_store(float f) { return f; }
float f32_store(float f) { return f; }
using F64 = FloatStorage<double, f64_load, f64_store>;
using F32 = FloatStorage<float, f32_load, f32_store>;
using F16 = FloatStorage<uint16_t, f16_load, float_to_fp16_bits>;
using BF16 = FloatStorage<uint16_t, bf16_load, float_to_bf16_bits>;

enum class FloatKind { kF64, kF32, kF16, kBF16 };

std::optional<FloatKind> float_kind(std::string_view dtype) {
  if (dtype == "F64") return FloatKind::kF64;
  if (dtype == "F32") return FloatKind::kF32;
  if (dtype == "F16") return FloatKind::kF16;
  if (dtype == "BF16") return FloatKind::kBF16;
  return std::nullopt;
}

template <typename Fn>
void with_storage(FloatKind kind, Fn&& fn) {
  switch (kind) {
    case FloatKind::kF64: fn(F64{}); return;
    case FloatKind::kF32: fn(F32{}); return;
    case FloatKind::kF16: fn(F16{}); return;
    case FloatKind::kBF16: fn(BF16{}); return;
  }
}

struct ElementContext {
  const std::string& path;
  const SafetensorsTensor& tensor;
  uint64_t first_element;  // index in the tensor of the chunk's element 0
};

[[noreturn]] void fail_not_finite(const ElementContext& c, size_t i, double v) {
  ZEST_FAIL("safetensors file '{}': tensor '{}' ({} {}): element {} is {} (not finite); the first bad element is "
            "reported, fix the source or read without check_finite",
            c.path, c.tensor.name, c.tensor.dtype, c.tensor.shape, c.first_element + i, v);
}

// Converts n elements from Src to Dst storage; with `check`, a non-finite
// source or a result that overflowed to Inf is an error.
template <typename Src, typename Dst>
void convert(const std::byte* src, std::byte* dst, size_t n, bool check, const ElementContext& c, DType want) {
  for (size_t i = 0; i < n; ++i) {
    const double v = Src::load(src + i * Src::kSize);
    // Rounds to nearest even; a finite double beyond float becomes +-Inf (IEEE).
    const float f = static_cast<float>(v);
    Dst::store(f, dst + i * Dst::kSize);
    if (check) {
      if (!std::isfinite(v)) fail_not_finite(c, i, v);
      ZEST_CHECK(std::isfinite(Dst::load(dst + i * Dst::kSize)),
                 "safetensors file '{}': tensor '{}' ({} {}): element {} = {} overflows {}; its largest finite "
                 "value is smaller",
                 c.path, c.tensor.name, c.tensor.dtype, c.tensor.shape, c.first_element + i, v, dtype_name(want));
    }
  }
}

template <typename Src>
void scan_finite(std::span<const std::byte> bytes, const ElementContext& c) {
  const size_t n = bytes.size() / Src::kSize;
  for (size_t i = 0; i < n; ++i) {
    const double v = Src::load(bytes.data() + i * Src::kSize);
    if (!std::isfinite(v)) fail_not_finite(c, i, v);
  }
}

FloatKind float_kind_of(DType t) {
  switch (t) {
    case DType::kFloat32: return FloatKind::kF32;
    case DType::kFloat16: return FloatKind::kF16;
    default: return FloatKind::kBF16;
  }
}

// Elements converted per staging round: 512 KiB of F64 at most.
constexpr uint64_t kStagingElems = uint64_t{1} << 16;

}  // namespace

size_t safetensors_elem_size(std::string_view dtype) {
  const DTypeInfo* d = find_dtype(dtype);
  return d ? d->size : 0;
}

std::optional<DType> safetensors_zest_dtype(std::string_view dtype) {
  const DTypeInfo* d = find_dtype(dtype);
  return d ? d->zest : std::nullopt;
}

std::string_view safetensors_dtype_name(DType t) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.zest == t) return d.name;
  }
  ZEST_INTERNAL_ASSERT(false, "DType {} has no safetensors name", dtype_name(t));
  return {};
}

namespace detail {
std::optional<uint64_t> safetensors_numel(std::span<const int64_t> shape, size_t elem_size) {
  uint64_t numel = 1;
  uint64_t bytes = elem_size;
  for (const int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    const auto d = static_cast<uint64_t>(dim);
    if (__builtin_mul_overflow(numel, d, &numel) || __builtin_mul_overflow(bytes, d, &bytes)) return std::nullopt;
  }
  return numel;
}
}  // namespace detail

std::unique_ptr<SafetensorsSource> make_safetensors_file_source(const std::string& path) {
  return std::make_unique<FileSource>(path);
}

std::unique_ptr<SafetensorsSource> make_safetensors_memory_source(std::span<const std::byte> bytes) {
  return std::make_unique<MemorySource>(bytes);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  return from_source(make_safetensors_file_source(path), path);
}

SafetensorsFile SafetensorsFile::from_source(std::unique_ptr<SafetensorsSource> source, std::string name) {
  ZEST_CHECK(source != nullptr, "SafetensorsFile::from_source: no source for '{}'", name);
  SafetensorsFile f;
  f.source_ = std::move(source);
  f.path_ = std::move(name);
  f.parse_header();
  return f;
}

void SafetensorsFile::parse_header() {
  const uint64_t file_size = source_->size();
  ZEST_CHECK(file_size >= 8,
             "safetensors file '{}': {} bytes is too short; a safetensors file starts with an 8-byte little-endian "
             "header length",
             path_, file_size);
  std::array<std::byte, 8> length{};
  source_->read_at(0, length);
  std::memcpy(&header_bytes_, length.data(), sizeof(header_bytes_));
  ZEST_CHECK(header_bytes_ <= file_size - 8,
             "safetensors file '{}': the header length field says {} bytes, but only {} bytes follow it (file size "
             "{}); the file is truncated or not a safetensors file",
             path_, header_bytes_, file_size - 8, file_size);
  ZEST_CHECK(header_bytes_ <= kSafetensorsMaxHeaderBytes,
             "safetensors file '{}': the header length field says {} bytes, more than the {} a reader accepts; the "
             "file is corrupt or not a safetensors file",
             path_, header_bytes_, kSafetensorsMaxHeaderBytes);
  std::string text(header_bytes_, '\0');
  source_->read_at(8, std::as_writable_bytes(std::span(text)));

  const json header = parse_header_json(text, path_);
  ZEST_CHECK(header.is_object(),
             "safetensors file '{}': the header is a JSON {}; expected an object of tensor name -> "
             "{{\"dtype\", \"shape\", \"data_offsets\"}}",
             path_, header.type_name());
  const uint64_t data_size = file_size - data_begin();
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      metadata_ = parse_metadata(value, path_);
    } else {
      tensors_.push_back(parse_entry(name, value, data_size, path_));
    }
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  check_tiling(tensors_, data_size, path_);
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafetensorsTensor& SafetensorsFile::tensor(std::string_view name) const {
  if (const SafetensorsTensor* t = find(name)) return *t;
  std::string some;
  for (size_t i = 0; i < tensors_.size() && i < 8; ++i) some += (i ? ", " : "") + tensors_[i].name;
  ZEST_FAIL("safetensors file '{}' has no tensor '{}'; it has {} tensors ({}{})", path_, name, tensors_.size(), some,
            tensors_.size() > 8 ? ", ..." : "");
}

void SafetensorsFile::read(std::string_view name, std::span<std::byte> out,
                           const SafetensorsReadOptions& options) const {
  const SafetensorsTensor& t = tensor(name);
  ZEST_CHECK(out.size() == t.size_bytes(),
             "safetensors file '{}': tensor '{}' ({} {}) holds {} bytes; the buffer has {}; use read_range for a part",
             path_, t.name, t.dtype, t.shape, t.size_bytes(), out.size());
  source_->read_at(data_begin() + t.begin, out);
  const std::optional<FloatKind> kind = float_kind(t.dtype);
  if (options.check_finite && kind) {
    const ElementContext c{path_, t, 0};
    with_storage(*kind, [&](auto src) { scan_finite<decltype(src)>(out, c); });
  }
}

void SafetensorsFile::read_range(std::string_view name, uint64_t byte_offset, std::span<std::byte> out) const {
  const SafetensorsTensor& t = tensor(name);
  ZEST_CHECK(byte_offset <= t.size_bytes() && out.size() <= t.size_bytes() - byte_offset,
             "safetensors file '{}': tensor '{}' holds {} bytes; bytes [{}, {}) are past its end", path_, t.name,
             t.size_bytes(), byte_offset, byte_offset + out.size());
  source_->read_at(data_begin() + t.begin + byte_offset, out);
}

std::optional<FileView> SafetensorsFile::view_range(std::string_view name, uint64_t byte_offset, uint64_t n) const {
  const SafetensorsTensor& t = tensor(name);
  ZEST_CHECK(byte_offset <= t.size_bytes() && n <= t.size_bytes() - byte_offset,
             "safetensors file '{}': tensor '{}' holds {} bytes; bytes [{}, {}) are past its end", path_, t.name,
             t.size_bytes(), byte_offset, byte_offset + n);
  return source_->view(data_begin() + t.begin + byte_offset, n);
}

void SafetensorsFile::will_need_range(std::string_view name, uint64_t byte_offset, uint64_t n) const {
  const SafetensorsTensor& t = tensor(name);
  if (byte_offset >= t.size_bytes()) return;
  source_->will_need(data_begin() + t.begin + byte_offset, std::min(n, t.size_bytes() - byte_offset));
}

void SafetensorsFile::read_as(std::string_view name, DType want, std::span<std::byte> out,
                              const SafetensorsReadOptions& options) const {
  const SafetensorsTensor& t = tensor(name);
  ZEST_CHECK(out.size() == t.numel * elem_size(want),
             "safetensors file '{}': tensor '{}' ({} {}) as {} needs {} bytes; the buffer has {}; use read_range_as "
             "for a part",
             path_, t.name, t.dtype, t.shape, dtype_name(want), t.numel * elem_size(want), out.size());
  read_range_as(name, want, 0, out, options);
}

void SafetensorsFile::read_range_as(std::string_view name, DType want, uint64_t first_element, std::span<std::byte> out,
                                    const SafetensorsReadOptions& options) const {
  const SafetensorsTensor& t = tensor(name);
  const size_t out_size = elem_size(want);
  ZEST_CHECK(out.size() % out_size == 0,
             "safetensors file '{}': tensor '{}': a buffer of {} bytes is not a whole number of {} elements", path_,
             t.name, out.size(), dtype_name(want));
  const uint64_t count = out.size() / out_size;
  ZEST_CHECK(first_element <= t.numel && count <= t.numel - first_element,
             "safetensors file '{}': tensor '{}' has {} elements; elements [{}, {}) are past its end", path_, t.name,
             t.numel, first_element, first_element + count);
  const std::optional<FloatKind> from = float_kind(t.dtype);
  if (t.zest_dtype == want) {
    read_range(name, first_element * t.elem_size, out);
    if (options.check_finite && from) {
      const ElementContext c{path_, t, first_element};
      with_storage(*from, [&](auto src) { scan_finite<decltype(src)>(out, c); });
    }
    return;
  }
  ZEST_CHECK(from && is_floating(want),
             "safetensors file '{}': tensor '{}' is {}, which read_as cannot convert to {}; it converts F64, F32, F16 "
             "and BF16 to fp32, fp16 and bf16 (read the raw bytes with read() otherwise)",
             path_, t.name, t.dtype, dtype_name(want));
  std::vector<std::byte> staging(std::min(count, kStagingElems) * t.elem_size);
  // F16 and BF16 widen to fp32 exactly (nothing can overflow), so without
  // check_finite the vectorized conversion of the optimizer's kernels does
  // the work, several times faster than the element loop below.
  if (want == DType::kFloat32 && t.zest_dtype && is_floating(*t.zest_dtype) && !options.check_finite) {
    for (uint64_t done = 0; done < count;) {
      const uint64_t n = std::min(count - done, kStagingElems);
      source_->read_at(data_begin() + t.begin + (first_element + done) * t.elem_size,
                       std::span(staging.data(), n * t.elem_size));
      zest::convert(Stream::default_for(Device::host()), staging.data(), *t.zest_dtype, out.data() + done * out_size, want,
              n);
      done += n;
    }
    return;
  }
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min(count - done, kStagingElems);
    const std::span<std::byte> chunk(staging.data(), n * t.elem_size);
    source_->read_at(data_begin() + t.begin + (first_element + done) * t.elem_size, chunk);
    const ElementContext c{path_, t, first_element + done};
    with_storage(*from, [&](auto src) {
      with_storage(float_kind_of(want), [&](auto dst) {
        convert<decltype(src), decltype(dst)>(chunk.data(), out.data() + done * out_size, n, options.check_finite, c,
                                              want);
      });
    });
    done += n;
  }
}

}  // namespace zest
