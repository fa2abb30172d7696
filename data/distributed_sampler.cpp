#include "zest/data/distributed_sampler.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <new>
#include <numeric>
#include <random>
#include <stdexcept>

#include "zest/core/check.h"
#include "zest/core/units.h"

namespace zest {
namespace {

// 0, 1, ..., n-1, room reserved for `capacity` (>= n) indices. An order
// larger than the machine's memory is refused by name instead of ending in a
// bare std::bad_alloc (or, under a sanitizer, an abort).
std::vector<int64_t> iota_indices(int64_t n, int64_t capacity, const char* who) {
  const long page = sysconf(_SC_PAGESIZE);
  const long pages = sysconf(_SC_PHYS_PAGES);
  const uint64_t physical = page > 0 && pages > 0
                                ? static_cast<uint64_t>(page) * static_cast<uint64_t>(pages)
                                : std::numeric_limits<uint64_t>::max();
  const auto refuse = [&] {
    // capacity x 8 bytes passes 2^64 from capacity 2^61 on: said in index units then.
    const bool fits = static_cast<uint64_t>(capacity) <= (uint64_t{1} << 60);
    ZEST_FAIL("{}: an order of {} indices needs {} and this machine has {}; shard the dataset "
              "into parts that fit, each with its own sampler",
              who, capacity,
              fits ? format_bytes(capacity * static_cast<int64_t>(sizeof(int64_t)))
                   : fmt::format("{} x 8 bytes", capacity),
              format_bytes(static_cast<int64_t>(std::min<uint64_t>(physical, INT64_MAX))));
  };
  if (static_cast<uint64_t>(capacity) > physical / sizeof(int64_t)) refuse();
  try {
    std::vector<int64_t> r;
    r.reserve(static_cast<size_t>(capacity));
    r.resize(static_cast<size_t>(n));
    std::iota(r.begin(), r.end(), int64_t{0});
    return r;
  } catch (const std::bad_alloc&) {
    refuse();
  } catch (const std::length_error&) {
    refuse();
  }
  return {};
}

}  // namespace

std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed) {
  ZEST_CHECK(n >= 0, "torch_randperm: n is {}; it must be 0 or more", n);
  std::vector<int64_t> r = iota_indices(n, n, "torch_randperm");
  // at::mt19937 initializes its state from the seed's low 32 bits exactly as
  // std::mt19937 does, and CPUGeneratorImpl::random() is one 32-bit draw.
  std::mt19937 gen(static_cast<uint32_t>(seed));
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int64_t z = static_cast<int64_t>(gen()) % (n - i);
    std::swap(r[static_cast<size_t>(i)], r[static_cast<size_t>(z + i)]);
  }
  return r;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                                       DistributedSamplerOptions options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  ZEST_CHECK(num_replicas > 0, "DistributedSampler: num_replicas is {}; it must be at least 1 (the world size)",
             num_replicas);
  ZEST_CHECK(rank >= 0 && rank < num_replicas,
             "DistributedSampler: rank {} is outside [0, {}); pass this process's rank in the data-parallel group",
             rank, num_replicas);
  ZEST_CHECK(dataset_size >= 0, "DistributedSampler: dataset_size is {}; it must be 0 or more", dataset_size);
  const int64_t R = num_replicas;
  // torch's ceil(n / R), and with drop_last ceil((n - R) / R) when R does
  // not divide n: floor(n / R) either way. Without n + R - 1, which
  // overflows near INT64_MAX.
  num_samples_ = dataset_size / R + (!options.drop_last && dataset_size % R != 0 ? 1 : 0);
  ZEST_CHECK(num_samples_ <= std::numeric_limits<int64_t>::max() / R,
             "DistributedSampler: dataset_size {} padded to a multiple of {} replicas ({} x {}) "
             "exceeds the int64 range of indices; use drop_last, or a smaller dataset",
             dataset_size, num_replicas, num_samples_, num_replicas);
}

std::vector<int64_t> DistributedSampler::indices() const {
  const int64_t n = dataset_size_;
  const int64_t total = total_size();
  std::vector<int64_t> all;
  if (options_.shuffle) {
    all = torch_randperm(n, options_.seed + static_cast<uint64_t>(epoch_));
  } else {
    all = iota_indices(n, std::max(n, total), "DistributedSampler::indices");
  }
  if (!options_.drop_last) {
    // n == 0 gives total == 0: nothing to pad.
    // indices += (indices * ceil(padding / n))[:padding]: repeat from the start.
    for (int64_t i = n; i < total; ++i) all.push_back(all[static_cast<size_t>(i % n)]);
  } else {
    all.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total; i += num_replicas_) mine.push_back(all[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace zest
