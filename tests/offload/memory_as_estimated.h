// The offload tests' check that a rank's memory is as estimated. Uses
// doctest's macros: include this after doctest.h.
#pragma once

#include <string>

#include "zest/engine/engine.h"
#include "zest/estimate/memory_estimate.h"

namespace zest::test {

// A rank's measured bytes equal the estimate's, category by category, on
// the device, the host and NVMe, and the swap ring's host buffers.
inline void check_memory_as_estimated(const MemoryReport& m, const MemoryEstimate& e) {
  for (MemoryCategory c : kAllMemoryCategories) {
    const std::string category(category_name(c));
    CAPTURE(category);
    CHECK(m[c].current == e[c].persistent);
    CHECK(m.host(c).current == e.host(c).persistent);
    CHECK(m.nvme(c).current == e.nvme(c).persistent);
  }
  CHECK(m.nvme_bytes() == e.nvme_bytes);
  CHECK(m.host_swap_buffers == e.host_swap_buffer_bytes);
}

}  // namespace zest::test
