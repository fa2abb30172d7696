#include "optimizer_bench_torch.h"

#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace zest_bench {

double torch_adamw_ms(size_t numel, int iters, int threads) {
  at::set_num_threads(threads);
  torch::NoGradGuard no_grad;
  torch::Tensor param = torch::zeros({static_cast<int64_t>(numel)});
  param.mutable_grad() = torch::full({static_cast<int64_t>(numel)}, 0.5f);
  // ZEST's defaults (OptimizerConfig): lr 1e-3, betas (0.9, 0.999), eps 1e-8,
  // weight decay 0.01.
  torch::optim::AdamW opt({param}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  opt.step();  // warm-up; creates the state
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    opt.step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace zest_bench
