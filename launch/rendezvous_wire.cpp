#include "zest/launch/detail/rendezvous_wire.h"

namespace zest::wire {

void put32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (24 - 8 * i)));
}

void put64(std::string& out, uint64_t v) {
  put32(out, static_cast<uint32_t>(v >> 32));
  put32(out, static_cast<uint32_t>(v));
}

uint32_t Cursor::u32() {
  uint32_t v = 0;
  for (char c : take(4)) v = (v << 8) | static_cast<unsigned char>(c);
  return v;
}

uint64_t Cursor::u64() {
  const uint64_t hi = u32();
  return (hi << 32) | u32();
}

std::string_view Cursor::take(size_t n) {
  if (!ok_ || rest_.size() < n) {
    ok_ = false;
    return {};
  }
  std::string_view v = rest_.substr(0, n);
  rest_.remove_prefix(n);
  return v;
}

uint64_t fnv1a(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

}  // namespace zest::wire
