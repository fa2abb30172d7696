#include "rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <torch/torch.h>

namespace llama {
namespace {

// torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim
torch::Tensor exponents(int64_t dim) { return torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim; }

std::vector<float> values(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

}  // namespace

double rope_attention_scaling(const Config& c) {
  const RopeScaling& s = c.rope_scaling;
  if (s.type != "yarn") return 1.0;
  if (s.attention_factor > 0.0) return s.attention_factor;
  const auto mscale = [](double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  if (s.mscale != 0.0 && s.mscale_all_dim != 0.0) {
    return mscale(s.factor, s.mscale) / mscale(s.factor, s.mscale_all_dim);
  }
  return mscale(s.factor, 1.0);
}

int64_t rope_dynamic_length(const Config& c, int64_t seq_len, int64_t& cached) {
  if (c.rope_scaling.type != "dynamic") return 0;
  // dynamic_frequency_update: grow past the cached length; reset when the
  // batch is shorter than the original length and the cache is longer.
  const int64_t before = cached;
  if (seq_len > cached) cached = seq_len;
  if (seq_len < c.max_position_embeddings && before > c.max_position_embeddings) cached = c.max_position_embeddings;
  return cached;
}

std::vector<float> rope_inv_freq(const Config& c, int64_t seq_len) {
  const torch::NoGradGuard no_grad;
  const int64_t dim = c.resolved_head_dim();
  const RopeScaling& s = c.rope_scaling;
  const double base = c.rope_theta;
  if (s.type == "dynamic" && seq_len > c.max_position_embeddings) {
    // seq_len as dynamic_rope_update passes it: a tensor, max(position_ids) + 1.
    const torch::Tensor len = torch::tensor(seq_len, torch::kLong);
    const torch::Tensor grown =
        base * ((s.factor * len / c.max_position_embeddings) - (s.factor - 1))
                   .pow(static_cast<double>(dim) / static_cast<double>(dim - 2));
    return values(1.0 / grown.pow(exponents(dim)));
  }
  if (s.type == "yarn") {
    const double original = static_cast<double>(s.original_max_position_embeddings);
    // find_correction_range, in Python's doubles.
    const auto correction_dim = [&](double rotations) {
      return (static_cast<double>(dim) * std::log(original / (rotations * 2 * std::numbers::pi))) / (2 * std::log(base));
    };
    double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
    if (s.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;  // linear_ramp_factor's guard
    const torch::Tensor pos_freqs = torch::pow(base, torch::arange(0, dim, 2).to(torch::kFloat) / dim);
    const torch::Tensor extrapolation = 1.0 / pos_freqs;
    const torch::Tensor interpolation = 1.0 / (s.factor * pos_freqs);
    const torch::Tensor ramp = ((torch::arange(dim / 2, torch::kFloat) - low) / (high - low)).clamp(0, 1);
    const torch::Tensor extrapolation_factor = 1 - ramp;
    return values(interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor);
  }
  torch::Tensor inv_freq = 1.0 / torch::pow(base, exponents(dim));
  if (s.type == "linear") inv_freq /= s.factor;
  if (s.type == "llama3") {
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
    const torch::Tensor wavelen = 2 * std::numbers::pi / inv_freq;
    torch::Tensor scaled = torch::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
    const torch::Tensor smooth =
        (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    const torch::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
    const torch::Tensor medium = (wavelen < high_wavelen).logical_not() & (wavelen > low_wavelen).logical_not();
    inv_freq = torch::where(medium, smoothed, scaled);
  }
  return values(inv_freq);
}

}  // namespace llama
