// The sampler against sequences torch 1.13 produced (torch.randperm with a
// seeded CPU generator), so a build without libtorch still checks the
// algorithm; test_sampler_torch.cpp compares with libtorch itself.
#include <doctest/doctest.h>

#include <limits>
#include <vector>

#include "zest/core/check.h"
#include "zest/data/distributed_sampler.h"

using zest::DistributedSampler;
using V = std::vector<int64_t>;

TEST_CASE("torch_randperm gives torch 1.13's permutations") {
  // torch.randperm(n, generator=torch.Generator().manual_seed(seed))
  CHECK(zest::torch_randperm(10, 0) == V{4, 1, 7, 5, 3, 9, 0, 8, 6, 2});
  CHECK(zest::torch_randperm(10, 42) == V{2, 6, 1, 8, 4, 5, 0, 9, 3, 7});
  CHECK(zest::torch_randperm(17, 7) == V{9, 5, 3, 11, 7, 8, 6, 16, 12, 10, 13, 1, 15, 14, 4, 2, 0});
  CHECK(zest::torch_randperm(23, 12345) ==
        V{19, 16, 5, 1, 22, 12, 13, 21, 14, 0, 8, 2, 17, 18, 4, 7, 11, 20, 10, 15, 9, 3, 6});
  // at::mt19937 keeps the seed's low 32 bits.
  CHECK(zest::torch_randperm(10, uint64_t{1} << 32) == zest::torch_randperm(10, 0));
  const V big = zest::torch_randperm(100003, 3);
  CHECK(V(big.begin(), big.begin() + 8) == V{88021, 54975, 41325, 53670, 38858, 12707, 53666, 71340});
  CHECK(zest::torch_randperm(0, 1).empty());
  CHECK(zest::torch_randperm(1, 1) == V{0});
}

TEST_CASE("DistributedSampler pads from the start, strides by rank, reshuffles per epoch") {
  // randperm(10, seed 0) = 4 1 7 5 3 9 0 8 6 2, padded with 4 1 to 12.
  DistributedSampler s(10, 4, 1, {.shuffle = true, .seed = 0, .drop_last = false});
  CHECK(s.size() == 3);
  CHECK(s.total_size() == 12);
  CHECK(s.indices() == V{1, 9, 2});
  DistributedSampler s0(10, 4, 0, {.shuffle = true, .seed = 0, .drop_last = false});
  CHECK(s0.indices() == V{4, 3, 6});
  // Epoch 42 with seed 0 is randperm(10, 42) = 2 6 1 8 4 5 0 9 3 7, + 2 6.
  DistributedSampler s3(10, 4, 3, {.shuffle = true, .seed = 0, .drop_last = false});
  s3.set_epoch(42);
  CHECK(s3.indices() == V{8, 9, 6});
  // seed 40 + epoch 2 is the same generator seed.
  DistributedSampler t3(10, 4, 3, {.shuffle = true, .seed = 40, .drop_last = false});
  t3.set_epoch(2);
  CHECK(t3.indices() == s3.indices());
}

TEST_CASE("DistributedSampler with drop_last drops the tail") {
  // randperm(10, 0) cut to 8: 4 1 7 5 3 9 0 8.
  DistributedSampler s(10, 4, 1, {.shuffle = true, .seed = 0, .drop_last = true});
  CHECK(s.size() == 2);
  CHECK(s.indices() == V{1, 9});
  DistributedSampler e(8, 4, 2, {.shuffle = false, .seed = 0, .drop_last = true});
  CHECK(e.indices() == V{2, 6});
  // Fewer samples than ranks: nothing for anyone (torch: ceil((3 - 4) / 4) = 0).
  DistributedSampler few(3, 4, 0, {.shuffle = true, .seed = 0, .drop_last = true});
  CHECK(few.size() == 0);
  CHECK(few.indices().empty());
}

TEST_CASE("DistributedSampler pads cyclically when the padding exceeds the dataset") {
  // 0 1 2 0 1 2 0 1 for 8 ranks.
  for (int r = 0; r < 8; ++r) {
    DistributedSampler s(3, 8, r, {.shuffle = false, .seed = 0, .drop_last = false});
    CHECK(s.indices() == V{r % 3});
  }
  // Every index appears, each rank the same count, across ranks.
  std::vector<int> seen(37, 0);
  for (int r = 0; r < 5; ++r) {
    DistributedSampler s(37, 5, r, {.shuffle = true, .seed = 9, .drop_last = false});
    CHECK(s.indices().size() == 8);
    for (int64_t i : s.indices()) ++seen[static_cast<size_t>(i)];
  }
  int twice = 0;
  for (int c : seen) {
    CHECK((c == 1 || c == 2));
    twice += c == 2 ? 1 : 0;
  }
  CHECK(twice == 3);  // 40 - 37 padded
}

TEST_CASE("DistributedSampler refuses bad arguments by name") {
  CHECK_THROWS_WITH_AS(DistributedSampler(10, 0, 0), doctest::Contains("num_replicas is 0"), zest::Error);
  CHECK_THROWS_WITH_AS(DistributedSampler(10, 4, 4), doctest::Contains("rank 4 is outside [0, 4)"), zest::Error);
  CHECK_THROWS_WITH_AS(DistributedSampler(-1, 4, 0), doctest::Contains("dataset_size is -1"), zest::Error);
  // An empty dataset needs no padding: nothing for anyone, as torch.
  CHECK(DistributedSampler(0, 4, 0).indices().empty());
}

TEST_CASE("DistributedSampler sizes near INT64_MAX: exact counts, or a clear error") {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();  // 3 x 3074457345618258602 + 1
  // Padding to a multiple of 3 would pass INT64_MAX: refused by name, not a
  // negative size().
  CHECK_THROWS_WITH_AS(DistributedSampler(kMax, 3, 0, {.shuffle = false}),
                       doctest::Contains("exceeds the int64 range of indices"), zest::Error);
  // drop_last drops the one extra sample; one replica pads nothing.
  const DistributedSampler dropped(kMax, 3, 2, {.shuffle = false, .drop_last = true});
  CHECK(dropped.size() == 3074457345618258602);
  CHECK(dropped.total_size() == kMax - 1);
  const DistributedSampler one(kMax, 1, 0, {.shuffle = false});
  CHECK(one.size() == kMax);
  CHECK(one.total_size() == kMax);
  // ceil(n / R) where n + R - 1 overflows.
  const DistributedSampler padded(kMax - 1, 2, 1);
  CHECK(padded.size() == int64_t{4611686018427387903});
  CHECK(padded.total_size() == kMax - 1);
  const DistributedSampler odd(kMax - 2, 2, 0);
  CHECK(odd.size() == int64_t{4611686018427387903});
  CHECK(odd.total_size() == kMax - 1);
  // Orders larger than memory are refused by name before allocating, not a
  // bare std::bad_alloc.
  CHECK_THROWS_WITH_AS(static_cast<void>(one.indices()),
                       doctest::Contains("DistributedSampler::indices: an order of 9223372036854775807 "
                                         "indices needs"),
                       zest::Error);
  CHECK_THROWS_WITH_AS(static_cast<void>(DistributedSampler(int64_t{1} << 50, 4, 0).indices()),
                       doctest::Contains("torch_randperm: an order of 1125899906842624 indices needs"),
                       zest::Error);
  CHECK_THROWS_WITH_AS(static_cast<void>(zest::torch_randperm(kMax, 0)),
                       doctest::Contains("shard the dataset"), zest::Error);
}
