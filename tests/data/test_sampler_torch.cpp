// torch_randperm against libtorch's own randperm with a seeded CPU generator
// (built only where find_package(Torch) succeeds).
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <vector>

#include "zest/data/distributed_sampler.h"

TEST_CASE("torch_randperm equals libtorch's randperm for several seeds and sizes") {
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{42}, uint64_t{123456789}, (uint64_t{1} << 32) + 5,
                        uint64_t{0xFFFFFFFFFFFFFFFF}}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{10}, int64_t{97}, int64_t{1000}, int64_t{262147}}) {
      CAPTURE(seed);
      CAPTURE(n);
      at::Generator gen = at::detail::createCPUGenerator(seed);
      const at::Tensor t = at::randperm(n, gen, at::kLong);
      const int64_t* p = t.data_ptr<int64_t>();
      const std::vector<int64_t> theirs(p, p + n);
      // DOCTEST_CHECK: torch's headers bring glog's CHECK macro.
      DOCTEST_CHECK(zest::torch_randperm(n, seed) == theirs);
    }
  }
}
