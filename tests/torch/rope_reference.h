// RoPE as modeling_llama.py applies it, written out for the tests'
// references: angle[t][j] = t * theta^(-2 (j mod D/2) / D), computed in
// double, then x * cos + rotate_half(x) * sin over x [B, heads, T, D].
#pragma once

#include <cmath>
#include <cstdint>

#include <torch/torch.h>

struct RopeReference {
  RopeReference(int64_t T, int64_t D, double theta) : d(D) {
    torch::Tensor angle = torch::empty({T, D});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < D; ++j)
        angle[t][j] = static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(j % (D / 2)) / D);
    cos = angle.cos();
    sin = angle.sin();
  }
  torch::Tensor operator()(const torch::Tensor& x) const {
    const torch::Tensor rot = torch::cat({-x.slice(-1, d / 2, d), x.slice(-1, 0, d / 2)}, -1);
    return x * cos + rot * sin;
  }
  int64_t d;
  torch::Tensor cos, sin;
};
