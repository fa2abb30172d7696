#include "zest/core/trim_heap.h"

#include <cstdlib>  // defines __GLIBC__ where it is glibc

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace zest {

void trim_heap() {
#ifdef __GLIBC__
  malloc_trim(0);  // its result says only whether anything was released
#endif
}

}  // namespace zest
