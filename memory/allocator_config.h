// Settings of the caching allocator, from code or from the environment
// variable ZEST_ALLOC_CONF ("max_split_size_mb:128", comma-separated options).
#pragma once

#include <cstddef>
#include <limits>
#include <string_view>

namespace zest {

struct AllocatorConfig {
  // Blocks of at least this size are never split, and requests below it never
  // take such a block: large cached blocks stay whole for large requests,
  // which bounds fragmentation. Unlimited by default. Must exceed 20 MiB (the
  // large pool's segment size) when set.
  size_t max_split_size = std::numeric_limits<size_t>::max();

  // Parses "key:value[,key:value]"; throws zest::Error naming the bad option
  // and the accepted ones.
  static AllocatorConfig parse(std::string_view text);
  // parse(getenv("ZEST_ALLOC_CONF")), or the defaults when it is unset.
  static AllocatorConfig from_env();
};

}  // namespace zest
