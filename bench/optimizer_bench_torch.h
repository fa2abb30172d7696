// libtorch's AdamW on the optimizer bench's shape, for a ratio measured in
// the same run (optimizer_bench_torch.cpp, built only when CMake finds
// Torch).
#pragma once

#include <cstddef>

namespace zest_bench {

// Median milliseconds of torch::optim::AdamW::step() on one fp32 parameter
// of `numel` elements with a gradient, on `threads` intra-op threads.
double torch_adamw_ms(size_t numel, int iters, int threads);

}  // namespace zest_bench
