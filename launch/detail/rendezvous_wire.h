// Internal to the rendezvous: the grammar of the bytes they exchange.
// Fixed-width big-endian fields appended to a string and read back off the
// front of one, and the FNV-1a hash behind the file's checksum and the TCP
// hello's job hash. Each format itself is written down with its protocol
// (file_rendezvous.cpp, tcp_rendezvous.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace zest::wire {

void put32(std::string& out, uint32_t v);
void put64(std::string& out, uint64_t v);

// Reads fields off the front of `bytes` (which must outlive it). A read past
// the end returns zeros (an empty view for take) and fails the cursor for
// good, so a decoder reads every field and checks at_end() once.
class Cursor {
 public:
  explicit Cursor(std::string_view bytes) : rest_(bytes) {}
  // Every byte read, none missing.
  bool at_end() const { return ok_ && rest_.empty(); }
  uint32_t u32();
  uint64_t u64();
  std::string_view take(size_t n);

 private:
  std::string_view rest_;
  bool ok_ = true;
};

// 64-bit FNV-1a.
uint64_t fnv1a(std::string_view bytes);

}  // namespace zest::wire
