#include "zest/tokenizer/detail/sentencepiece_proto.h"

#include <cstdint>

#include "zest/core/check.h"

namespace zest::detail {

namespace {

constexpr uint32_t kNormalizerSpec = 3;  // ModelProto
constexpr uint32_t kName = 1;            // NormalizerSpec
constexpr uint32_t kAddDummyPrefix = 3;
constexpr uint32_t kRemoveExtraWhitespaces = 4;
constexpr uint32_t kEscapeWhitespaces = 5;

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

struct Field {
  uint32_t number = 0;
  uint32_t type = 0;
  uint64_t value = 0;     // kVarint
  std::string_view body;  // kBytes
  size_t begin = 0, end = 0;  // the field's bytes, tag included
};

class Reader {
 public:
  Reader(std::string_view bytes, const std::string& where) : bytes_(bytes), where_(where) {}
  bool done() const { return at_ == bytes_.size(); }

  Field next() {
    Field f;
    f.begin = at_;
    const uint64_t tag = varint();
    f.number = static_cast<uint32_t>(tag >> 3);
    f.type = static_cast<uint32_t>(tag & 7);
    switch (f.type) {
      case kVarint: f.value = varint(); break;
      case kFixed64: skip(8); break;
      case kFixed32: skip(4); break;
      case kBytes: {
        const uint64_t n = varint();
        ZEST_CHECK(n <= bytes_.size() - at_, "{}: not a SentencePiece model: field {} of {} bytes at byte {} runs past "
                   "the end ({} bytes)", where_, f.number, n, f.begin, bytes_.size());
        f.body = bytes_.substr(at_, static_cast<size_t>(n));
        at_ += static_cast<size_t>(n);
        break;
      }
      default:
        ZEST_FAIL("{}: not a SentencePiece model: wire type {} at byte {} (a tokenizer.model is a serialized "
                  "sentencepiece ModelProto)", where_, f.type, f.begin);
    }
    f.end = at_;
    return f;
  }

 private:
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      ZEST_CHECK(at_ < bytes_.size(), "{}: not a SentencePiece model: it ends inside a field", where_);
      const auto b = static_cast<uint8_t>(bytes_[at_++]);
      v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80u) == 0) return v;
    }
    ZEST_FAIL("{}: not a SentencePiece model: a varint longer than 10 bytes", where_);
  }
  void skip(size_t n) {
    ZEST_CHECK(n <= bytes_.size() - at_, "{}: not a SentencePiece model: it ends inside a field", where_);
    at_ += n;
  }

  std::string_view bytes_;
  const std::string& where_;
  size_t at_ = 0;
};

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// The normalizer_spec field of the model; none: the model has no
// normalizer_spec (protobuf's defaults).
bool find_normalizer(std::string_view model, const std::string& where, Field& out) {
  Reader r(model, where);
  bool found = false;
  while (!r.done()) {
    Field f = r.next();
    if (f.number == kNormalizerSpec) {
      ZEST_CHECK(f.type == kBytes, "{}: not a SentencePiece model: normalizer_spec is not a message", where);
      ZEST_CHECK(!found, "{}: two normalizer_spec fields", where);
      out = f;
      found = true;
    }
  }
  return found;
}

}  // namespace

SentencePieceNormalizer read_sentencepiece_normalizer(std::string_view model, const std::string& where) {
  SentencePieceNormalizer n;
  Field spec;
  if (!find_normalizer(model, where, spec)) return n;
  Reader r(spec.body, where);
  while (!r.done()) {
    const Field f = r.next();
    if (f.number == kName && f.type == kBytes) n.name = std::string(f.body);
    if (f.type != kVarint) continue;
    if (f.number == kAddDummyPrefix) n.add_dummy_prefix = f.value != 0;
    if (f.number == kRemoveExtraWhitespaces) n.remove_extra_whitespaces = f.value != 0;
    if (f.number == kEscapeWhitespaces) n.escape_whitespaces = f.value != 0;
  }
  return n;
}

std::string sentencepiece_without_dummy_prefix(std::string_view model, const std::string& where) {
  std::string body;
  size_t begin = model.size(), end = model.size();
  Field spec;
  if (find_normalizer(model, where, spec)) {
    body = std::string(spec.body);
    begin = spec.begin;
    end = spec.end;
  }
  put_varint(body, (uint64_t{kAddDummyPrefix} << 3) | kVarint);
  put_varint(body, 0);
  std::string out(model.substr(0, begin));
  put_varint(out, (uint64_t{kNormalizerSpec} << 3) | kBytes);
  put_varint(out, body.size());
  out += body;
  out += model.substr(end);
  return out;
}

}  // namespace zest::detail
