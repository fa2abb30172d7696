// A few integers from every rank of a communicator, on the host: what ranks
// exchange to agree (sizes, flags, checksums) before a collective step.
//
//   // zest-example: run
//   #include <zest/comm/inprocess_comm.h>
//   #include <zest/memory/raw_allocator.h>
//   zest::run_inprocess(2, [](zest::Communicator& comm) {
//     zest::CachingAllocator alloc(zest::make_host_allocator());
//     const int64_t mine[2] = {comm.rank(), 10 * comm.rank()};
//     const std::vector<int64_t> all =
//         zest::all_gather_int64(comm, alloc, zest::Stream::default_for(comm.device()), mine);
//     ZEST_CHECK(all == std::vector<int64_t>({0, 0, 1, 10}), "rank by rank");
//   });
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "zest/comm/communicator.h"
#include "zest/memory/caching_allocator.h"

namespace zest {

// Every rank's `mine` (the same length on every rank), rank by rank. The
// transfer goes through a buffer from `alloc` on the communicator's device
// (NCCL moves device memory only), staged on `stream`, which it synchronizes.
// Collective.
std::vector<int64_t> all_gather_int64(Communicator& comm, CachingAllocator& alloc, const Stream& stream,
                                      std::span<const int64_t> mine);

}  // namespace zest
