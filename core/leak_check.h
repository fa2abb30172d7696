// Memory ZEST keeps on purpose after its owner is gone: a CachingAllocator
// destroyed while Buffers still point into its segments keeps those segments
// rather than turn the caller's bug into a use-after-free (and says so in a
// warning). LeakSanitizer would report them as leaks at exit; marking them
// keeps sanitizer runs about real leaks.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define ZEST_HAS_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer)
#define ZEST_HAS_LSAN 1
#endif
#endif

#if defined(ZEST_HAS_LSAN)
#include <sanitizer/lsan_interface.h>
#endif

namespace zest {

// `heap_object` (the start of a malloc'ed object) is kept on purpose: it and
// what it points to are not leaks. Does nothing outside sanitizer builds.
inline void keep_on_purpose([[maybe_unused]] const void* heap_object) noexcept {
#if defined(ZEST_HAS_LSAN)
  if (heap_object != nullptr) __lsan_ignore_object(heap_object);
#endif
}

}  // namespace zest
