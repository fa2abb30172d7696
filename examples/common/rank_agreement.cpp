#include "common/rank_agreement.h"

#include <cstdint>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "zest/comm/gather_scalars.h"
#include "zest/core/check.h"
#include "zest/memory/caching_allocator.h"
#include "zest/memory/raw_allocator.h"

namespace examples {
namespace {

// FNV-1a (offset basis 0xcbf29ce484222325, as weights_digest.cpp) over the
// name and the value: equal options, equal hashes.
int64_t hash_of(const std::string& name, const std::string& value) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const std::string* s : {&name, &value}) {
    for (const char c : *s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull;  // the end of each string
  }
  return static_cast<int64_t>(h);
}

}  // namespace

void check_ranks_agree(zest::Communicator& comm, const NamedOptions& options) {
  if (comm.size() == 1) return;
  const zest::Device device = comm.device();
  zest::CachingAllocator alloc(device.is_cuda() ? zest::make_cuda_allocator(device.index())
                                                : zest::make_host_allocator());
  // The count first, so that ranks of different programs or versions fail
  // here too rather than in a gather of different lengths.
  std::vector<int64_t> mine = {static_cast<int64_t>(options.size())};
  for (const auto& [name, value] : options) mine.push_back(hash_of(name, value));
  const zest::Stream& stream = zest::Stream::default_for(device);
  const std::vector<int64_t> counts = zest::all_gather_int64(comm, alloc, stream, std::span(mine).first(1));
  for (int r = 0; r < comm.size(); ++r) {
    ZEST_CHECK(counts[static_cast<size_t>(r)] == counts[0],
               "ranks disagree on the options to compare: rank 0 has {}, rank {} has {} (are they the same program "
               "of the same build?)",
               counts[0], r, counts[static_cast<size_t>(r)]);
  }
  const size_t n = options.size();
  const std::vector<int64_t> all = zest::all_gather_int64(comm, alloc, stream, std::span(mine).subspan(1));
  for (size_t i = 0; i < n; ++i) {
    std::vector<int> differ;
    for (int r = 1; r < comm.size(); ++r) {
      if (all[static_cast<size_t>(r) * n + i] != all[i]) differ.push_back(r);
    }
    const auto& [name, value] = options[i];
    ZEST_CHECK(differ.empty(),
               "the ranks were started with different {}: rank(s) {} differ from rank 0 (this rank, {}, has '{}'); "
               "start every rank with the same {}",
               name, fmt::join(differ, ", "), comm.rank(), value, name);
  }
}

}  // namespace examples
