#include "zest/data/distributed_sampler.h"

#include <random>

#include "zest/core/check.h"

namespace zest {

std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed) {
  ZEST_CHECK(n >= 0, "torch_randperm: n is {}; it must be 0 or more", n);
  std::vector<int64_t> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)] = i;
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
  if (options.drop_last && dataset_size % R != 0) {
    num_samples_ = (dataset_size - R + R - 1) / R;  // ceil((n - R) / R), as torch
    if (num_samples_ < 0) num_samples_ = 0;
  } else {
    num_samples_ = (dataset_size + R - 1) / R;
  }
}

std::vector<int64_t> DistributedSampler::indices() const {
  const int64_t n = dataset_size_;
  std::vector<int64_t> all;
  if (options_.shuffle) {
    all = torch_randperm(n, options_.seed + static_cast<uint64_t>(epoch_));
  } else {
    all.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  }
  const int64_t total = total_size();
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
