// The indices of a dataset for one rank and epoch, exactly as PyTorch's
// torch.utils.data.DistributedSampler gives them, so a C++ loop reads the
// same samples on the same rank as the Python loop it replaces.
//
//   // zest-example: prelude=sampler
//   zest::DistributedSampler sampler(/*dataset_size=*/1000, /*num_replicas=*/4, /*rank=*/1,
//                                    {.shuffle = true, .seed = 42, .drop_last = false});
//   for (int64_t epoch = 0; epoch < 3; ++epoch) {
//     sampler.set_epoch(epoch);                  // a new order each epoch
//     for (int64_t i : sampler.indices()) { (void)i; /* load sample i */ }
//   }
//
// The algorithm (torch/utils/data/distributed.py, PyTorch 1.13):
//   1. shuffle: torch.randperm(n, generator seeded with seed + epoch);
//      otherwise 0, 1, ..., n-1.
//   2. drop_last=false: pad to a multiple of num_replicas by repeating the
//      indices from the start (cyclically when the padding is longer than
//      the dataset); drop_last=true: drop the tail instead.
//   3. this rank's indices: rank, rank + num_replicas, ...
// torch_randperm() is torch's CPU randperm with a CPU generator: mt19937
// seeded with the low 32 bits of the seed (at::mt19937 keeps only those),
// and a Fisher-Yates shuffle drawing one 32-bit number per position,
//   for i in 0 .. n-2: z = random() % (n - i); swap(r[i], r[i + z]).
// That is the loop of PyTorch 1.13's ATen/native/TensorFactories.cpp for
// every n (checked against libtorch 1.13 in tests/data/test_sampler_torch.cpp);
// PyTorch 2.1 and later draw 64-bit numbers once n reaches 2^32 / 20, so
// orders beyond 214748364 samples are 1.13's.
#pragma once

#include <cstdint>
#include <vector>

namespace zest {

struct DistributedSamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // num_replicas > 0, 0 <= rank < num_replicas, dataset_size >= 0.
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, DistributedSamplerOptions options = {});

  // The epoch the next indices() shuffles for (torch's set_epoch): the
  // generator's seed is seed + epoch.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch; size() of them.
  std::vector<int64_t> indices() const;
  // Samples per rank per epoch (torch's num_samples; len(sampler)).
  int64_t size() const { return num_samples_; }
  // size() x num_replicas.
  int64_t total_size() const { return num_samples_ * num_replicas_; }

 private:
  int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  DistributedSamplerOptions options_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
};

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the
// CPU: see the header comment.
std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed);

}  // namespace zest
