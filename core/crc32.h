// CRC-32 (the zlib / IEEE 802.3 polynomial), for checking that checkpoint
// files read back what was written. Incremental: pass the previous value to
// continue over the next piece.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zest {

uint32_t crc32(const void* data, size_t bytes, uint32_t previous = 0);

}  // namespace zest
