#include "zest/core/trim_heap.h"

#include <cstdlib>  // defines __GLIBC__ where it is glibc

// Under a sanitizer the allocator is the sanitizer's, not glibc's:
// malloc_trim would walk glibc arenas that nothing uses consistently (it
// crashed under AddressSanitizer), and there is nothing of glibc's to trim.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ZEST_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define ZEST_SANITIZER_ALLOCATOR 1
#endif
#endif

#if defined(__GLIBC__) && !defined(ZEST_SANITIZER_ALLOCATOR)
#include <malloc.h>
#define ZEST_TRIM_HEAP 1
#endif

namespace zest {

void trim_heap() {
#ifdef ZEST_TRIM_HEAP
  malloc_trim(0);  // its result says only whether anything was released
#endif
}

}  // namespace zest
