// Build facts and the few macros every layer needs to compile the same source
// for host and device.
#pragma once

#include "zest_generated/build_config.h"

#if defined(__CUDACC__)
#define ZEST_HOST_DEVICE __host__ __device__
#else
#define ZEST_HOST_DEVICE
#endif

#if defined(__GNUC__) || defined(__clang__)
#define ZEST_LIKELY(x) __builtin_expect(!!(x), 1)
#define ZEST_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define ZEST_LIKELY(x) (x)
#define ZEST_UNLIKELY(x) (x)
#endif
