#include "zest/memory/allocator_config.h"

#include <charconv>
#include <cstdlib>

#include "zest/core/check.h"
#include "zest/core/units.h"
#include "zest/memory/block_pool.h"

namespace zest {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

AllocatorConfig AllocatorConfig::parse(std::string_view text) {
  AllocatorConfig cfg;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view item = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    if (item.empty()) continue;

    const size_t colon = item.find(':');
    ZEST_CHECK(colon != std::string_view::npos,
               "allocator option '{}' has no value; write it as key:value, e.g. "
               "max_split_size_mb:256", item);
    const std::string_view key = trim(item.substr(0, colon));
    const std::string_view value = trim(item.substr(colon + 1));
    if (key == "max_split_size_mb") {
      uint64_t mb = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), mb);
      ZEST_CHECK(ec == std::errc() && end == value.data() + value.size(),
                 "max_split_size_mb needs a whole number of MiB, got '{}'", value);
      ZEST_CHECK(mb * kMiB > kLargeBuffer && mb < (uint64_t{1} << 40),
                 "max_split_size_mb:{} is out of range; it must be more than {} (the large "
                 "pool's segment size) and less than 2^40", mb, kLargeBuffer / kMiB);
      cfg.max_split_size = static_cast<size_t>(mb) * kMiB;
    } else {
      ZEST_FAIL("unknown allocator option '{}'; the accepted option is max_split_size_mb", key);
    }
  }
  return cfg;
}

AllocatorConfig AllocatorConfig::from_env() {
  const char* v = std::getenv("ZEST_ALLOC_CONF");
  return v == nullptr ? AllocatorConfig{} : parse(v);
}

}  // namespace zest
