#include "task.h"

#include <cmath>
#include <cstdint>

namespace mlp {
namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A standard normal from a counter (Box-Muller): the same value for the
// same (seed, stream, index) on every rank and run.
float normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t a = splitmix(seed ^ splitmix(stream * 0x632be59bd9b4e019ULL + index * 2));
  const uint64_t b = splitmix(a + 1);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) / 9007199254740993.0;
  const double u2 = static_cast<double>(b >> 11) / 9007199254740992.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace

void init_parameter(const zest::ParamLayout& param, std::span<float> values, unsigned seed) {
  const bool bias = param.shape.size() == 1;
  const float fan_in = bias ? 1.0f : static_cast<float>(param.shape[1]);
  const float stddev = bias ? 0.0f : std::sqrt(2.0f / fan_in);
  uint64_t id = 0;
  for (char c : param.name) id = id * 131 + static_cast<unsigned char>(c);
  for (size_t i = 0; i < values.size(); ++i) values[i] = stddev * normal(seed, id, i);
}

Teacher::Teacher(const Shape& shape, unsigned seed) : shape_(shape), seed_(seed) {
  const size_t h = static_cast<size_t>(shape.hidden);
  w1_.resize(h * static_cast<size_t>(shape.input));
  w2_.resize(static_cast<size_t>(shape.output) * h);
  for (size_t i = 0; i < w1_.size(); ++i) w1_[i] = normal(seed, 1, i) / std::sqrt(static_cast<float>(shape.input));
  for (size_t i = 0; i < w2_.size(); ++i) w2_[i] = normal(seed, 2, i) / std::sqrt(static_cast<float>(shape.hidden));
}

Batch Teacher::batch(long step, int first_row, int rows) const {
  const int in = shape_.input, hid = shape_.hidden, out = shape_.output;
  Batch b;
  b.rows = rows;
  b.x.resize(static_cast<size_t>(rows) * in);
  b.y.assign(static_cast<size_t>(rows) * out, 0.0f);
  std::vector<float> h(static_cast<size_t>(hid));
  for (int r = 0; r < rows; ++r) {
    const uint64_t row_id = (static_cast<uint64_t>(step) << 20) + static_cast<uint64_t>(first_row + r);
    float* x = &b.x[static_cast<size_t>(r) * in];
    for (int i = 0; i < in; ++i) x[i] = normal(seed_, 3 + row_id, static_cast<uint64_t>(i));
    for (int j = 0; j < hid; ++j) {
      float acc = 0.0f;
      for (int i = 0; i < in; ++i) acc += w1_[static_cast<size_t>(j) * in + i] * x[i];
      h[static_cast<size_t>(j)] = std::tanh(acc);
    }
    for (int o = 0; o < out; ++o) {
      float acc = 0.0f;
      for (int j = 0; j < hid; ++j) acc += w2_[static_cast<size_t>(o) * hid + j] * h[static_cast<size_t>(j)];
      b.y[static_cast<size_t>(r) * out + o] = acc;
    }
  }
  return b;
}

}  // namespace mlp
