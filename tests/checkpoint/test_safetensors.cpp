// Safetensors in and out: round trips for every dtype, byte-exact agreement
// with files built by hand the way other tools write them, every malformed
// header rejected with the file and the problem named, range reads,
// conversions with exact expected bits, and the writer's crash safety.
#include <doctest/doctest.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <csignal>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>

#include "error_of.h"
#include "zest/checkpoint/safetensors.h"
#include "zest/core/check.h"

using namespace zest;
using zest::test::error_of;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp dir, removed with its contents.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "zest-safetensors-XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  // A writer's temporary files ("NAME.tmp.<pid>.<random>") left in the directory.
  int temp_files() const {
    int n = 0;
    for (const fs::directory_entry& e : fs::directory_iterator(path)) {
      n += e.path().filename().string().find(".tmp.") != std::string::npos;
    }
    return n;
  }
};

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::string read_file(const std::string& path) {
  std::string bytes(fs::file_size(path), '\0');
  std::ifstream in(path, std::ios::binary);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(in.good());
  return bytes;
}

// A safetensors file as another tool lays it out: length, header, data.
std::string st_bytes(std::string_view header, std::string_view data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out += header;
  out += data;
  return out;
}

template <typename T>
std::string raw(std::initializer_list<T> values) {
  std::string s(values.size() * sizeof(T), '\0');
  std::memcpy(s.data(), values.begin(), s.size());
  return s;
}

std::string pad8(std::string header) {
  header.resize((header.size() + 7) / 8 * 8, ' ');
  return header;
}

// The bytes of a string, also of a temporary for the length of the call.
std::span<const std::byte> cbytes(const std::string& s) { return std::as_bytes(std::span(s)); }

template <typename T>
std::span<std::byte> bytes_of(std::vector<T>& v) {
  return std::as_writable_bytes(std::span(v));
}

void check_parts(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& part : parts) {
    CHECK_MESSAGE(message.find(part) != std::string::npos, "expected '" << part << "' in: " << message);
  }
}

// Opening `bytes` as a file fails with a message naming the file and `parts`.
void expect_open_error(const TempDir& dir, const std::string& bytes, std::vector<std::string> parts) {
  const std::string path = dir.file("bad.safetensors");
  write_file(path, bytes);
  parts.push_back(path);
  check_parts(error_of([&] { SafetensorsFile::open(path); }), parts);
}

constexpr std::string_view kAllNames[] = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16",
                                          "F16",  "BF16", "I32", "U32",     "F32",     "I64",     "U64", "F64"};

}  // namespace

TEST_CASE("every dtype round-trips through the writer and the reader") {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  std::vector<SafetensorsEntry> entries;
  std::vector<std::string> data;
  for (std::string_view name : kAllNames) {
    const size_t elem = safetensors_elem_size(name);
    REQUIRE(elem > 0);
    entries.push_back({"t_" + std::string(name), std::string(name), {3, 2}});
    std::string d(6 * elem, '\0');
    for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<char>(i * 37 + elem);
    data.push_back(d);
  }
  entries.push_back({"scalar", "F32", {}});
  data.push_back(raw<float>({4.5f}));
  entries.push_back({"empty", "BF16", {0, 4}});
  data.push_back("");
  {
    SafetensorsWriter w(path, entries, {{"format", "pt"}, {"step", "12"}});
    for (size_t i = 0; i < entries.size(); ++i) {
      w.write_tensor(entries[i].name, std::as_bytes(std::span(data[i])));
    }
    w.finish();
  }
  CHECK(dir.temp_files() == 0);
  const SafetensorsFile f = SafetensorsFile::open(path);
  CHECK(f.metadata() == std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}});
  CHECK(f.data_begin() % 8 == 0);
  REQUIRE(f.tensors().size() == entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsTensor& t = f.tensor(entries[i].name);
    CHECK(t.dtype == entries[i].dtype);
    CHECK(t.shape == entries[i].shape);
    CHECK(t.zest_dtype == safetensors_zest_dtype(t.dtype));
    std::string back(t.size_bytes(), '\0');
    f.read(t.name, std::as_writable_bytes(std::span(back)));
    CHECK(back == data[i]);
  }
  CHECK(f.tensor("scalar").numel == 1);
  CHECK(f.tensor("empty").numel == 0);
}

TEST_CASE("ZEST dtypes map to safetensors names and back") {
  for (DType t : kAllDTypes) {
    CHECK(safetensors_zest_dtype(safetensors_dtype_name(t)) == t);
    CHECK(safetensors_elem_size(safetensors_dtype_name(t)) == elem_size(t));
  }
  CHECK(safetensors_dtype_name(DType::kBFloat16) == "BF16");
  CHECK_FALSE(safetensors_zest_dtype("F64").has_value());
  CHECK(safetensors_elem_size("F4") == 0);
}

TEST_CASE("the writer's bytes match a file built by hand") {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  {
    SafetensorsWriter w(path, {{"b", "F32", {2}}, {"a", "I64", {1}}, {"z", "F16", {0}}}, {{"format", "pt"}});
    w.write_tensor("b", cbytes(raw<float>({1.0f, -2.0f})));
    w.begin_tensor("a");
    const std::string a = raw<int64_t>({7});
    w.write(std::as_bytes(std::span(a)).first(3));  // in pieces
    w.write(std::as_bytes(std::span(a)).subspan(3));
    w.finish();
  }
  const std::string header = pad8(
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"I64","shape":[1],"data_offsets":[8,16]},)"
      R"("z":{"dtype":"F16","shape":[0],"data_offsets":[16,16]}})");
  CHECK(read_file(path) == st_bytes(header, raw<float>({1.0f, -2.0f}) + raw<int64_t>({7})));
}

TEST_CASE("files as other tools write them read back, whatever the key and data orders") {
  TempDir dir;
  // Keys in header order a, b; data in order b, a; metadata last; no padding.
  const std::string header =
      R"({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [12, 16]},)"
      R"( "b": {"shape": [3], "data_offsets": [0, 12], "dtype": "F32"},)"
      R"( "__metadata__": {"format": "pt", "note": "x"}})";
  const std::string data = raw<float>({1.0f, 2.0f, 3.0f}) + raw<uint16_t>({0x3f80, 0xc000});
  for (const std::string& h : {header, pad8(header)}) {
    const std::string path = dir.file("other.safetensors");
    write_file(path, st_bytes(h, data));
    const SafetensorsFile f = SafetensorsFile::open(path);
    REQUIRE(f.tensors().size() == 2);
    CHECK(f.tensors()[0].name == "b");  // data order
    CHECK(f.tensors()[1].name == "a");
    CHECK(f.metadata().at("note") == "x");
    const SafetensorsTensor& a = f.tensor("a");
    CHECK(a.zest_dtype == DType::kBFloat16);
    CHECK(a.begin == 12);
    CHECK(a.end == 16);
    std::vector<float> av(2);
    f.read_as("a", DType::kFloat32, bytes_of(av));
    CHECK(av == std::vector<float>{1.0f, -2.0f});
    std::vector<float> bv(3);
    f.read("b", bytes_of(bv));
    CHECK(bv == std::vector<float>{1.0f, 2.0f, 3.0f});
  }
}

TEST_CASE("malformed headers are errors naming the file, the tensor and the problem") {
  TempDir dir;
  const auto entry = [](const std::string& body) { return "{\"w\": {" + body + "}}"; };
  const std::string ok_dtype = R"("dtype": "F32", )";
  const std::string eight = std::string(8, '\0');

  expect_open_error(dir, "abcde", {"5 bytes is too short", "8-byte"});
  expect_open_error(dir, st_bytes("", "{}"), {"not valid JSON"});
  {
    std::string bytes(8, '\0');
    const uint64_t n = 1000;
    std::memcpy(bytes.data(), &n, 8);
    expect_open_error(dir, bytes + "{}", {"says 1000 bytes", "only 2 bytes follow", "truncated"});
  }
  expect_open_error(dir, st_bytes(R"({"w": )", ""), {"not valid JSON", "expected a JSON object"});
  expect_open_error(dir, st_bytes("[1, 2]", ""), {"the header is a JSON array", "expected an object"});
  expect_open_error(dir, st_bytes(R"({"w": 5})", ""), {"tensor 'w'", "entry is a JSON number"});
  expect_open_error(dir, st_bytes(entry(R"("dtype": "F32", "shape": [2])"), eight),
                    {"tensor 'w'", "has no \"data_offsets\"", "expected dtype, shape and data_offsets"});
  expect_open_error(dir, st_bytes(entry(R"("dtype": 5, "shape": [2], "data_offsets": [0, 8])"), eight),
                    {"tensor 'w'", "dtype is 5", "expected a string"});
  const std::string offsets8 = R"(], "shape": [2], "data_offsets": [0, 8])";
  expect_open_error(dir, st_bytes(entry(R"("dtype": [)" + std::string(999, '1') + offsets8), eight),
                    {"(at w.dtype[0]): the number 1111111111111111111111111111111111111111... is beyond a double's "
                     "range"});  // long quotes are cut short
  std::string ones = "1";
  for (int k = 0; k < 300; ++k) ones += ",1";
  expect_open_error(dir, st_bytes(entry(R"("dtype": [)" + ones + offsets8), eight),
                    {"dtype is [1,1,1", "1,1...; expected a string"});
  expect_open_error(dir, st_bytes(entry(ok_dtype + R"("shape": "x", "data_offsets": [0, 8])"), eight),
                    {"tensor 'w'", "shape is \"x\"", "expected an array"});
  expect_open_error(dir, st_bytes(entry(ok_dtype + R"("shape": [2], "data_offsets": [0])"), eight),
                    {"tensor 'w'", "data_offsets is [0]", "expected [begin, end]"});
  expect_open_error(dir, st_bytes(entry(ok_dtype + R"("shape": [2], "data_offsets": ["0", 8])"), eight),
                    {"tensor 'w'", "data_offsets[0] is \"0\"", "non-negative integer"});
  expect_open_error(dir, st_bytes(entry(ok_dtype + R"("shape": [2], "data_offsets": [0, 8], "x": 1)"), eight),
                    {"tensor 'w'", "unknown key \"x\""});
  expect_open_error(dir, st_bytes(entry(R"("dtype": "F7", "shape": [2], "data_offsets": [0, 8])"), eight),
                    {"tensor 'w'", "unknown dtype \"F7\"", "expected one of BOOL, U8"});
  expect_open_error(dir, st_bytes(entry(ok_dtype + R"("shape": [2, -2], "data_offsets": [0, 8])"), eight),
                    {"tensor 'w'", "shape[1] is -2", "expected a non-negative integer"});
  expect_open_error(dir, st_bytes(entry(ok_dtype + R"("shape": [2.5], "data_offsets": [0, 8])"), eight),
                    {"tensor 'w'", "shape[0] is 2.5"});
  expect_open_error(dir, st_bytes(entry(ok_dtype + R"("shape": [4294967296, 4294967296], "data_offsets": [0, 8])"),
                                  eight),
                    {"tensor 'w'", "holds more than 2^64 bytes"});
  expect_open_error(dir, st_bytes(entry(ok_dtype + R"("shape": [2], "data_offsets": [8, 0])"), eight),
                    {"tensor 'w'", "[8, 0] end before they begin", "begin <= end"});
  expect_open_error(dir, st_bytes(entry(ok_dtype + R"("shape": [2], "data_offsets": [0, 12])"), eight + "1234"),
                    {"tensor 'w'", "span 12 bytes", "shape [2] of F32", "needs 8"});
  expect_open_error(dir, st_bytes(entry(ok_dtype + R"("shape": [2], "data_offsets": [0, 8])"), "1234"),
                    {"tensor 'w'", "reach past the end of the data region, which holds 4 bytes"});
  const std::string two = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                          R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [%]}})";
  const auto with_b = [&](const std::string& offsets) {
    std::string h = two;
    return h.replace(h.find('%'), 1, offsets);
  };
  expect_open_error(dir, st_bytes(with_b("4, 12"), eight + "1234"), {"'a' [0, 8) and 'b' [4, 12) overlap"});
  expect_open_error(dir, st_bytes(with_b("12, 20"), eight + eight + "1234"),
                    {"bytes [8, 12) of the data region, before tensor 'b', belong to no tensor", "without holes"});
  expect_open_error(dir, st_bytes(with_b("8, 16"), eight + eight + "1234"),
                    {"bytes [16, 20) at the end of the data region belong to no tensor"});
  expect_open_error(dir,
                    st_bytes(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},)"
                             R"( "a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                             "xy"),
                    {"(at a): the key \"a\" appears twice in one object", "each key may appear once"});
  expect_open_error(dir, st_bytes(entry(ok_dtype + R"("dtype": "F32", "shape": [2], "data_offsets": [0, 8])"), eight),
                    {"(at w.dtype): the key \"dtype\" appears twice"});
  expect_open_error(dir, st_bytes(R"({"__metadata__": {"a": 1}})", ""), {"__metadata__ \"a\" is 1", "strings"});
  expect_open_error(dir, st_bytes(R"({"__metadata__": [1]})", ""), {"__metadata__ is a JSON array"});
  expect_open_error(dir, st_bytes(R"({"w": {"dtype": "F32", "shape": [[[2]]], "data_offsets": [0, 8]}})", eight),
                    {"(at w.shape[0]): values nest 4 levels deep here, more than the 3"});
}

TEST_CASE("a header length beyond the cap is refused before anything is allocated") {
  TempDir dir;
  const std::string path = dir.file("huge.safetensors");
  std::string bytes(8, '\0');
  const uint64_t n = kSafetensorsMaxHeaderBytes + 1;
  std::memcpy(bytes.data(), &n, 8);
  write_file(path, bytes);
  fs::resize_file(path, n + 16);  // sparse: the length fits in the file
  check_parts(error_of([&] { SafetensorsFile::open(path); }), {path, "more than the 104857600 a reader accepts"});
}

TEST_CASE("every truncation of a valid file is an error naming it") {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  {
    SafetensorsWriter w(path, {{"a", "F32", {3}}, {"b", "U8", {5}}});
    w.write_tensor("a", cbytes(raw<float>({1, 2, 3})));
    w.write_tensor("b", cbytes(std::string("hello")));
    w.finish();
  }
  const std::string full = read_file(path);
  const std::string cut = dir.file("cut.safetensors");
  for (size_t len = 0; len < full.size(); ++len) {
    write_file(cut, full.substr(0, len));
    const std::string message = error_of([&] { SafetensorsFile::open(cut); });
    CHECK_MESSAGE(message.find(cut) != std::string::npos, message);
  }
  // Truncated after open: the read, not the open, fails.
  write_file(cut, full);
  const SafetensorsFile f = SafetensorsFile::open(cut);
  fs::resize_file(cut, full.size() - 2);
  std::string b(5, '\0');
  check_parts(error_of([&] { f.read("b", std::as_writable_bytes(std::span(b))); }), {cut, "short read"});
}

TEST_CASE("range reads stream a tensor through a small buffer") {
  TempDir dir;
  const std::string path = dir.file("r.safetensors");
  std::vector<float> values(1000);
  std::iota(values.begin(), values.end(), 0.5f);
  {
    SafetensorsWriter w(path, {{"pad", "U8", {3}}, {"v", "F32", {10, 100}}});
    w.write_tensor("pad", cbytes(std::string("abc")));
    w.write_tensor("v", std::as_bytes(std::span(values)));
    w.finish();
  }
  const SafetensorsFile f = SafetensorsFile::open(path);
  std::string streamed;
  std::string piece(37, '\0');
  for (uint64_t off = 0; off < f.tensor("v").size_bytes(); off += piece.size()) {
    piece.resize(std::min<uint64_t>(piece.size(), f.tensor("v").size_bytes() - off));
    f.read_range("v", off, std::as_writable_bytes(std::span(piece)));
    streamed += piece;
  }
  CHECK(streamed == std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  std::vector<float> some(3);
  f.read_range_as("v", DType::kFloat32, 997, bytes_of(some));
  CHECK(some == std::vector<float>{997.5f, 998.5f, 999.5f});
  check_parts(error_of([&] { f.read_range("v", 3990, bytes_of(some)); }),
              {path, "tensor 'v' holds 4000 bytes", "[3990, 4002) are past its end"});
  check_parts(error_of([&] { f.read_range_as("v", DType::kFloat32, 998, bytes_of(some)); }),
              {"elements [998, 1001) are past its end"});
  check_parts(error_of([&] { f.read("v", bytes_of(some)); }), {"holds 4000 bytes; the buffer has 12"});
  check_parts(error_of([&] { f.tensor("nope"); }), {path, "has no tensor 'nope'", "pad, v"});
}

TEST_CASE("conversions round to nearest even with exact results") {
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  const std::string f32 = raw<float>({1.0f, 0.1f, 65504.0f, -2.5f, 1.0f / 3.0f, 65520.0f});
  const std::string f16 = raw<uint16_t>({0x3c00, 0x0001, 0x7bff, 0xc100});
  const std::string b16 = raw<uint16_t>({0x3f80, 0x4780});
  const std::string f64 = raw<double>({0.1, 1e300});
  write_file(path, st_bytes(pad8(R"({"f32": {"dtype": "F32", "shape": [6], "data_offsets": [0, 24]},)"
                                 R"( "f16": {"dtype": "F16", "shape": [4], "data_offsets": [24, 32]},)"
                                 R"( "b16": {"dtype": "BF16", "shape": [2], "data_offsets": [32, 36]},)"
                                 R"( "f64": {"dtype": "F64", "shape": [2], "data_offsets": [40, 56]},)"
                                 R"( "i64": {"dtype": "I64", "shape": [1], "data_offsets": [56, 64]},)"
                                 R"( "pad": {"dtype": "U8", "shape": [4], "data_offsets": [36, 40]}})"),
                            f32 + f16 + b16 + "pad!" + f64 + raw<int64_t>({3})));
  const SafetensorsFile f = SafetensorsFile::open(path);

  std::vector<uint16_t> h(6);
  f.read_as("f32", DType::kFloat16, bytes_of(h));
  CHECK(h == std::vector<uint16_t>{0x3c00, 0x2e66, 0x7bff, 0xc100, 0x3555, 0x7c00});
  f.read_as("f32", DType::kBFloat16, bytes_of(h));
  CHECK(h == std::vector<uint16_t>{0x3f80, 0x3dcd, 0x4780, 0xc020, 0x3eab, 0x4780});
  check_parts(error_of([&] { f.read_as("f32", DType::kFloat16, bytes_of(h), {.check_finite = true}); }),
              {path, "tensor 'f32'", "element 5 = 65520 overflows fp16"});

  std::vector<float> x(4);
  f.read_as("f16", DType::kFloat32, bytes_of(x));
  CHECK(x == std::vector<float>{1.0f, std::ldexp(1.0f, -24), 65504.0f, -2.5f});
  std::vector<uint16_t> hb(2);
  f.read_as("b16", DType::kFloat16, bytes_of(hb));
  CHECK(hb == std::vector<uint16_t>{0x3c00, 0x7c00});
  std::vector<float> d(2);
  f.read_as("f64", DType::kFloat32, bytes_of(d));
  CHECK(d[0] == 0.1f);
  CHECK(std::isinf(d[1]));
  check_parts(error_of([&] { f.read_as("f64", DType::kFloat32, bytes_of(d), {.check_finite = true}); }),
              {"element 1 = 1e+300 overflows fp32"});
  std::vector<float> one(1);
  check_parts(error_of([&] { f.read_as("i64", DType::kFloat32, bytes_of(one)); }),
              {path, "tensor 'i64' is I64, which read_as cannot convert to fp32"});
  std::vector<int64_t> i(1);
  f.read_as("i64", DType::kInt64, bytes_of(i));
  CHECK(i[0] == 3);
}

TEST_CASE("conversions of large tensors cross the staging buffer unchanged") {
  TempDir dir;
  const std::string path = dir.file("big.safetensors");
  std::vector<float> values(200003);
  for (size_t k = 0; k < values.size(); ++k) values[k] = std::sin(static_cast<float>(k)) * 1000.0f;
  {
    SafetensorsWriter w(path, {{"v", "F32", {static_cast<int64_t>(values.size())}}});
    w.write_tensor("v", std::as_bytes(std::span(values)));
    w.finish();
  }
  const SafetensorsFile f = SafetensorsFile::open(path);
  std::vector<bf16> out(values.size());
  f.read_as("v", DType::kBFloat16, bytes_of(out), {.check_finite = true});
  size_t wrong = 0;
  for (size_t k = 0; k < values.size(); ++k) wrong += out[k].bits != float_to_bf16_bits(values[k]);
  CHECK(wrong == 0);
  std::vector<fp16> part(70000);
  f.read_range_as("v", DType::kFloat16, 65000, bytes_of(part));
  wrong = 0;
  for (size_t k = 0; k < part.size(); ++k) wrong += part[k].bits != float_to_fp16_bits(values[65000 + k]);
  CHECK(wrong == 0);
}

TEST_CASE("check_finite names the tensor and the first bad element") {
  TempDir dir;
  const std::string path = dir.file("nan.safetensors");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  write_file(path, st_bytes(pad8(R"({"x": {"dtype": "F32", "shape": [5], "data_offsets": [0, 20]},)"
                                 R"( "h": {"dtype": "F16", "shape": [2], "data_offsets": [20, 24]}})"),
                            raw<float>({1, 2, nan, 4, inf}) + raw<uint16_t>({0x3c00, 0xfc00})));
  const SafetensorsFile f = SafetensorsFile::open(path);
  std::vector<float> x(5);
  f.read("x", bytes_of(x));  // unchecked: fine
  check_parts(error_of([&] { f.read("x", bytes_of(x), {.check_finite = true}); }),
              {path, "tensor 'x' (F32 [5]): element 2 is nan"});
  std::vector<float> tail(2);
  check_parts(error_of([&] { f.read_range_as("x", DType::kFloat32, 3, bytes_of(tail), {.check_finite = true}); }),
              {"element 4 is inf"});
  std::vector<bf16> b(5);
  check_parts(error_of([&] { f.read_as("x", DType::kBFloat16, bytes_of(b), {.check_finite = true}); }),
              {"element 2 is nan"});
  std::vector<float> h(2);
  check_parts(error_of([&] { f.read_as("h", DType::kFloat32, bytes_of(h), {.check_finite = true}); }),
              {"tensor 'h'", "element 1 is -inf"});
}

TEST_CASE("an in-memory source reads like a file, with its name in errors") {
  const std::string bytes =
      st_bytes(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", "hi");
  const SafetensorsFile f =
      SafetensorsFile::from_source(make_safetensors_memory_source(std::as_bytes(std::span(bytes))), "<mem>");
  std::string a(2, '\0');
  f.read("a", std::as_writable_bytes(std::span(a)));
  CHECK(a == "hi");
  const std::string bad = bytes.substr(0, bytes.size() - 1);
  check_parts(error_of([&] {
                SafetensorsFile::from_source(make_safetensors_memory_source(std::as_bytes(std::span(bad))), "<mem>");
              }),
              {"safetensors file '<mem>'", "tensor 'a'"});
}

TEST_CASE("the writer enforces the declared order and sizes") {
  TempDir dir;
  const std::string path = dir.file("o.safetensors");
  const std::string four = "abcd";
  const auto bytes4 = std::as_bytes(std::span(four));
  SafetensorsWriter w(path, {{"a", "U8", {4}}, {"z", "U8", {0}}, {"b", "F32", {1}}, {"c", "U8", {2}}});
  check_parts(error_of([&] { w.write(bytes4); }), {path, "write() before begin_tensor()"});
  check_parts(error_of([&] { w.begin_tensor("b"); }), {path, "tensor 'b' begun out of order; the next is 'a'"});
  check_parts(error_of([&] { w.begin_tensor("q"); }), {"tensor 'q' was not among the tensors"});
  w.begin_tensor("a");
  w.write(bytes4.first(2));
  check_parts(error_of([&] { w.write(bytes4); }),
              {"tensor 'a' (U8 [4]) holds 4 bytes; 2 were written and 4 more came"});
  check_parts(error_of([&] { w.begin_tensor("b"); }), {"'b' begun while 'a' has received 2 of its 4 bytes"});
  check_parts(error_of([&] { w.finish(); }), {"finish() while tensor 'a' has received 2 of its 4 bytes"});
  w.write(bytes4.subspan(2));
  w.write_tensor("b", bytes4);  // "z" has no bytes and may be passed over
  check_parts(error_of([&] { w.finish(); }), {"finish() before tensor 'c' (2 bytes) was written"});
  w.write_tensor("c", bytes4.first(2));
  w.finish();
  check_parts(error_of([&] { w.begin_tensor("c"); }), {"begin_tensor() after finish()"});
  CHECK(SafetensorsFile::open(path).tensors().size() == 4);

  check_parts(error_of([&] { SafetensorsWriter(path, {{"a", "U8", {1}}, {"a", "U8", {1}}}); }),
              {path, "tensor 'a'", "given twice"});
  check_parts(error_of([&] { SafetensorsWriter(path, {{"a", "F7", {1}}}); }), {"unknown dtype \"F7\""});
  check_parts(error_of([&] { SafetensorsWriter(path, {{"a", "F32", {2, -1}}}); }), {"negative dimension"});
  check_parts(error_of([&] { SafetensorsWriter(path, {{"__metadata__", "F32", {1}}}); }), {"reserved"});
  check_parts(error_of([&] { SafetensorsWriter(path, {{"a\xff", "F32", {1}}}); }), {"not valid UTF-8"});
  check_parts(error_of([&] { SafetensorsWriter(dir.file("no/such/dir.safetensors"), {}); }),
              {"no/such/dir.safetensors.tmp", "No such file"});
}

TEST_CASE("an abandoned writer leaves the previous file intact and no temp file") {
  TempDir dir;
  const std::string path = dir.file("keep.safetensors");
  write_file(path, "previous contents");
  {
    SafetensorsWriter w(path, {{"a", "F32", {1000}}});
    w.begin_tensor("a");
    w.write(cbytes(std::string(100, 'x')));
    CHECK(fs::exists(w.temp_path()));
  }
  CHECK(dir.temp_files() == 0);
  CHECK(read_file(path) == "previous contents");
  // An exception between the pieces unwinds the same way.
  try {
    SafetensorsWriter w(path, {{"a", "U8", {1}}});
    throw std::runtime_error("the training loop failed");
  } catch (const std::runtime_error&) {
  }
  CHECK(dir.temp_files() == 0);
  CHECK(read_file(path) == "previous contents");
}

TEST_CASE("progress counts the file's bytes up to its size") {
  TempDir dir;
  const std::string path = dir.file("p.safetensors");
  std::vector<std::pair<uint64_t, uint64_t>> seen;
  std::vector<float> v(5000, 1.0f);
  SafetensorsWriter w(path, {{"v", "F32", {5000}}}, {}, [&](uint64_t done, uint64_t total) {
    seen.emplace_back(done, total);
  });
  w.begin_tensor("v");
  for (size_t k = 0; k < 5; ++k) w.write(std::as_bytes(std::span(v)).subspan(k * 4000, 4000));
  w.finish();
  REQUIRE(seen.size() == 6);  // the header, then each piece
  for (size_t k = 1; k < seen.size(); ++k) CHECK(seen[k].first > seen[k - 1].first);
  CHECK(seen.back().first == fs::file_size(path));
  CHECK(seen.back().second == fs::file_size(path));
}

TEST_CASE("a failed write names the file and the writer refuses to go on") {
  TempDir dir;
  const std::string path = dir.file("full.safetensors");
  // A file size limit makes write(2) fail with EFBIG as a full disk would
  // fail with ENOSPC; SIGXFSZ is ignored so the process survives it.
  rlimit old{};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string message;
  std::string after;
  {
    SafetensorsWriter w(path, {{"a", "U8", {4 << 20}}});
    w.begin_tensor("a");
    const std::string big(2 << 20, 'x');
    message = error_of([&] { w.write(std::as_bytes(std::span(big))); });
    after = error_of([&] { w.write(std::as_bytes(std::span(big))); });
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  check_parts(message, {path + ".tmp", "failed at byte"});
  check_parts(after, {"after an earlier write", "failed"});
  CHECK(dir.temp_files() == 0);
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("view_range shows the bytes read_range reads, from a file and from memory") {
  TempDir dir;
  const std::string path = dir.file("v.safetensors");
  std::vector<uint16_t> bits(5000);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i * 2654435761u >> 16);
  {
    SafetensorsWriter w(path, {{"head", "F32", {3}}, {"b", "BF16", {50, 100}}});
    const std::vector<float> head{1, 2, 3};
    w.write_tensor("head", std::as_bytes(std::span(head)));
    w.write_tensor("b", std::as_bytes(std::span(bits)));
    w.finish();
  }
  const std::string bytes = read_file(path);
  const SafetensorsFile from_file = SafetensorsFile::open(path);
  const SafetensorsFile from_memory = SafetensorsFile::from_source(
      make_safetensors_memory_source(std::as_bytes(std::span(bytes.data(), bytes.size()))), "in memory");
  for (const SafetensorsFile* f : {&from_file, &from_memory}) {
    CAPTURE(f->path());
    // An offset that is not page aligned, to the end of the tensor.
    const uint64_t at = 2 * 1234, n = bits.size() * 2 - at;
    std::vector<std::byte> read(n);
    f->read_range("b", at, read);
    const std::optional<FileView> v = f->view_range("b", at, n);
    REQUIRE(v.has_value());
    v->populate(0, n);
    REQUIRE(v->bytes().size() == n);
    CHECK(std::memcmp(v->bytes().data(), read.data(), n) == 0);
    CHECK_THROWS_WITH_AS(f->view_range("b", at, n + 1), doctest::Contains("are past its end"), Error);
  }
}
