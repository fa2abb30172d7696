#include "mlp.h"

#include <cmath>

#include "mlp_cuda.h"
#include "zest/core/check.h"
#include "zest/core/float16.h"

namespace mlp {
namespace {

// Forward through every layer (keeping activations for backward), the MSE
// loss, and when `backward` is set the gradients of loss x loss scale.
template <typename T>
float run(zest::Engine& engine, const Shape& shape, const Batch& batch, bool backward) {
  const int rows = batch.rows;
  // acts[l] is layer l's input; acts[layers] the network's output.
  std::vector<std::vector<float>> acts(static_cast<size_t>(shape.layers) + 1);
  acts[0] = batch.x;
  for (int l = 0; l < shape.layers; ++l) {
    const int in = shape.in_of(l), out = shape.out_of(l);
    // Without backward, an evaluation: stage 3 follows its own order.
    zest::UnitHandle unit = engine.gather(l, backward ? zest::Pass::kTraining : zest::Pass::kInference);
    std::span<const T> w = unit.param<T>(weight_name(l));
    std::span<const T> b = unit.param<T>(bias_name(l));
    const std::vector<float>& x = acts[static_cast<size_t>(l)];
    std::vector<float>& z = acts[static_cast<size_t>(l) + 1];
    z.assign(static_cast<size_t>(rows) * out, 0.0f);
    for (int r = 0; r < rows; ++r) {
      for (int o = 0; o < out; ++o) {
        float acc = static_cast<float>(b[o]);
        for (int i = 0; i < in; ++i) acc += static_cast<float>(w[o * in + i]) * x[r * in + i];
        z[r * out + o] = (l < shape.layers - 1 && acc < 0.0f) ? 0.0f : acc;  // ReLU
      }
    }
  }

  const std::vector<float>& pred = acts.back();
  const size_t n = pred.size();
  double loss = 0.0;
  std::vector<float> delta(n);  // d(loss x scale) / d(output)
  const float scale = static_cast<float>(engine.loss_scale());
  for (size_t k = 0; k < n; ++k) {
    const float diff = pred[k] - batch.y[k];
    loss += static_cast<double>(diff) * diff;
    delta[k] = 2.0f * diff / static_cast<float>(n) * scale;
  }
  if (!backward) {
    engine.end_forward();
    return static_cast<float>(loss / static_cast<double>(n));
  }

  for (int l = shape.layers - 1; l >= 0; --l) {
    const int in = shape.in_of(l), out = shape.out_of(l);
    zest::UnitHandle unit = engine.gather(l);
    zest::GradHandle grads = engine.grads(l);
    const std::vector<float>& x = acts[static_cast<size_t>(l)];
    std::span<T> gw = grads.grad<T>(weight_name(l));
    std::span<T> gb = grads.grad<T>(bias_name(l));
    for (int o = 0; o < out; ++o) {
      float db = 0.0f;
      for (int r = 0; r < rows; ++r) db += delta[r * out + o];
      gb[o] = T(db);
      for (int i = 0; i < in; ++i) {
        float dw = 0.0f;
        for (int r = 0; r < rows; ++r) dw += delta[r * out + o] * x[r * in + i];
        gw[o * in + i] = T(dw);
      }
    }
    grads.done();  // reduced from here on, while the layers below run backward
    if (l == 0) break;
    // delta for the layer below: through the weights, then ReLU's mask (its
    // output, acts[l], is zero exactly where the mask is).
    std::span<const T> w = unit.param<T>(weight_name(l));
    std::vector<float> below(static_cast<size_t>(rows) * in, 0.0f);
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < in; ++i) {
        if (x[r * in + i] == 0.0f) continue;
        float acc = 0.0f;
        for (int o = 0; o < out; ++o) acc += delta[r * out + o] * static_cast<float>(w[o * in + i]);
        below[r * in + i] = acc;
      }
    }
    delta = std::move(below);
  }
  return static_cast<float>(loss / static_cast<double>(n));
}

// The host loops above, or the device path on a CUDA engine.
template <typename T>
float run_where(zest::Engine& engine, const Shape& shape, const Batch& batch, DeviceContext* device,
                bool backward) {
  if (!engine.stream().device().is_cuda()) return run<T>(engine, shape, batch, backward);
  ZEST_CHECK(device != nullptr,
             "mlp: the engine computes on {}; pass forward_backward and evaluate the rank's "
             "mlp::DeviceContext (mlp_cuda.h), made with the engine's allocator and stream",
             engine.stream().device().str());
  return run_on_device<T>(*device, engine, shape, batch, backward);
}

template <typename Fn>
float dispatch(zest::DType dtype, Fn&& fn) {
  switch (dtype) {
    case zest::DType::kFloat16: return fn(zest::fp16{});
    case zest::DType::kBFloat16: return fn(zest::bf16{});
    default: return fn(float{});
  }
}

}  // namespace

long Shape::parameters() const {
  long n = 0;
  for (int l = 0; l < layers; ++l) n += static_cast<long>(out_of(l)) * (in_of(l) + 1);
  return n;
}

std::string weight_name(int layer) { return "layer" + std::to_string(layer) + ".weight"; }
std::string bias_name(int layer) { return "layer" + std::to_string(layer) + ".bias"; }

void register_layers(zest::Engine& engine, const Shape& shape) {
  engine.add_param_group("no_decay", 0.0f);
  for (int l = 0; l < shape.layers; ++l) {
    engine.add_unit("layer" + std::to_string(l),
                    {{weight_name(l), {shape.out_of(l), shape.in_of(l)}},
                     {bias_name(l), {shape.out_of(l)}, "no_decay"}});
  }
}

float forward_backward(zest::Engine& engine, const Shape& shape, const Batch& batch, DeviceContext* device) {
  return dispatch(engine.compute_dtype(),
                  [&]<typename T>(T) { return run_where<T>(engine, shape, batch, device, true); });
}

float evaluate(zest::Engine& engine, const Shape& shape, const Batch& batch, DeviceContext* device) {
  return dispatch(engine.compute_dtype(),
                  [&]<typename T>(T) { return run_where<T>(engine, shape, batch, device, false); });
}

}  // namespace mlp
