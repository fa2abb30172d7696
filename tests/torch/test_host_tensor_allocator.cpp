// use_huge_page_host_tensors(): libtorch's large host tensors from the huge
// page cache, reused across steps, the small ones and the earlier ones left
// to libtorch's allocator, and the same values computed either way. Each
// case runs in a process of its own (ctest), so the process-wide switch
// reaches no other test.
#include <cstdint>

#include "torch_doctest.h"
#include "zest/torch/host_tensor_allocator.h"

using namespace zest;

namespace {

bool huge_aligned(const torch::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % HugePageCache::kHugePage == 0;
}

// relu(A B^T) and its backward on a seeded draw: activations and gradients of
// 2 MiB and more.
std::vector<torch::Tensor> step_values() {
  torch::manual_seed(7);
  torch::Tensor a = torch::randn({1024, 512}, torch::requires_grad());
  torch::Tensor b = torch::randn({1024, 512}, torch::requires_grad());
  torch::Tensor y = torch::relu(a.matmul(b.t()));
  y.sum().backward();
  return {y.detach(), a.grad(), b.grad()};
}

}  // namespace

TEST_CASE("host tensors: 2 MiB and more from cached huge pages, smaller ones from libtorch") {
  torch::Tensor before = torch::empty({1024, 1024});  // libtorch's, freed after the switch
  REQUIRE(use_huge_page_host_tensors());
  CHECK(use_huge_page_host_tensors());  // once is enough; again changes nothing
  const HugePageCache::Stats start = host_tensor_memory();
  before = torch::Tensor();  // goes back to libtorch's allocator, by its own deleter
  CHECK(host_tensor_memory().idle_bytes == start.idle_bytes);

  torch::Tensor big = torch::empty({1024, 1024});  // 4 MiB
  CHECK(huge_aligned(big));
  HugePageCache::Stats s = host_tensor_memory();
  CHECK(s.in_use_bytes == start.in_use_bytes + 4 * (size_t{1} << 20));
  const void* first = big.data_ptr();
  big = torch::Tensor();
  big = torch::ones({2048, 512});  // the same 4 MiB: the same block
  CHECK(big.data_ptr() == first);
  CHECK(big.sum().item<double>() == 2048.0 * 512.0);
  s = host_tensor_memory();
  CHECK(s.hits == start.hits + 1);

  const torch::Tensor small = torch::empty({1000});  // 4 KB: libtorch's own
  CHECK(host_tensor_memory().in_use_bytes == s.in_use_bytes);
  CHECK(small.data_ptr() != nullptr);

  // GELU takes scratch memory through Allocator::raw_allocate and gives it
  // back through raw_deleter(), small and large alike.
  const torch::Tensor g = torch::gelu(torch::full({1024, 1024}, 1.0f), "tanh");
  CHECK(g.max().item<float>() == g.min().item<float>());
  CHECK(torch::gelu(torch::full({100}, 1.0f), "tanh").sum().item<float>() > 0.0f);
}

TEST_CASE("host tensors: a forward and backward computes the same bits from huge pages") {
  // One thread: libtorch's products on more differ from call to call.
  torch::set_num_threads(1);
  const std::vector<torch::Tensor> plain = step_values();
  REQUIRE(use_huge_page_host_tensors());
  const HugePageCache::Stats start = host_tensor_memory();
  const std::vector<torch::Tensor> cached = step_values();
  CHECK(host_tensor_memory().misses > start.misses);  // the step's large tensors came from the cache
  for (size_t i = 0; i < plain.size(); ++i) {
    CHECK(huge_aligned(cached[i]));
    CHECK_MESSAGE(torch::equal(plain[i], cached[i]), "value " << i << " differs by up to "
                                                              << (plain[i] - cached[i]).abs().max().item<float>());
  }
}
