// The example's MLP through its device path (examples/mlp/mlp_cuda.cu: cuBLAS
// GEMMs and small kernels) on cuda:0 with 2 in-process ranks at stage 3: it
// learns its task in fp32, bf16 and fp16, and one fp32 step's gradients and
// loss are the host loops' to 1e-4.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>

#include "mlp_cuda.h"
#include "task.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/memory/raw_allocator.h"

using namespace zest;

namespace {

constexpr Device kCuda0 = Device::cuda(0);
const mlp::Shape kShape{.input = 16, .hidden = 64, .output = 4, .layers = 3};
constexpr int kRows = 16;  // per rank and step

// Runs `body(engine, context, rank)` on 2 in-process ranks of `device`, each
// with its own allocator, stream, engine (the MLP registered, initialized
// from seed 7) and DeviceContext, as examples/mlp/main.cpp sets them up.
template <typename Body>
void on_two_ranks(const EngineConfig& config, Device device, Body body) {
  run_inprocess(
      2,
      [&](Communicator& comm) {
        CachingAllocator alloc(device.is_cuda() ? make_cuda_allocator(device.index()) : make_host_allocator());
        const OwnedStream stream(device);
        Engine engine(config, comm, alloc, stream);
        mlp::DeviceContext context(alloc, stream);
        mlp::register_layers(engine, kShape);
        engine.finalize([](const ParamLayout& p, std::span<float> v) { mlp::init_parameter(p, v, 7); });
        body(engine, context, comm.rank());
      },
      device);
}

// Stage 3 with every layer sharded (the layers are under DeepSpeed's default
// persistence threshold), computing in `dtype`.
EngineConfig stage3(DType dtype) {
  EngineConfig config;
  config.zero.stage = 3;
  config.zero.stage3_param_persistence_threshold = 0;
  config.bf16 = dtype == DType::kBFloat16;
  config.fp16.enabled = dtype == DType::kFloat16;
  return config;
}

struct Losses {
  float before = 0.0f;
  float after = 0.0f;
  int skipped = 0;
};

Losses train(DType dtype, int steps) {
  EngineConfig config = stage3(dtype);
  config.optimizer.lr = 3e-3f;
  config.gradient_clipping = 1.0;
  Losses out;
  std::mutex mu;
  on_two_ranks(config, kCuda0, [&](Engine& engine, mlp::DeviceContext& context, int rank) {
    const mlp::Teacher teacher(kShape, 8);
    const mlp::Batch held_out = teacher.batch(-1, 0, 128);
    const float before = mlp::evaluate(engine, kShape, held_out, &context);
    int skipped = 0;
    for (long s = 0; s < steps; ++s) {
      mlp::forward_backward(engine, kShape, teacher.batch(s, rank * kRows, kRows), &context);
      skipped += engine.step().applied ? 0 : 1;
    }
    const float after = mlp::evaluate(engine, kShape, held_out, &context);
    if (rank == 0) {
      std::lock_guard lock(mu);
      out = {before, after, skipped};
    }
  });
  return out;
}

// The rank-averaged gradient of one fp32 micro-step, and its loss on rank 0.
// Read through one SGD step: lr 1024 (a power of two, so lr x g is exact),
// no momentum, decay or clipping, moves each parameter by exactly -1024 x g
// before rounding, and the rounding of p - 1024 g is relative to 1024 g, so
// (before - after) / 1024 is g to float precision wherever g is not tiny.
struct OneStep {
  std::map<std::string, std::vector<float>> grads;
  float loss = 0.0f;
  bool applied = false;
};

OneStep one_step(Device device) {
  constexpr float kLr = 1024.0f;
  EngineConfig config = stage3(DType::kFloat32);
  config.optimizer.kind = OptimizerKind::kSgd;
  config.optimizer.lr = kLr;
  config.optimizer.weight_decay = 0.0f;
  OneStep out;
  on_two_ranks(config, device, [&](Engine& engine, mlp::DeviceContext& context, int rank) {
    std::map<std::string, std::vector<float>> before;
    for (int l = 0; l < kShape.layers; ++l) {
      for (const std::string& name : {mlp::weight_name(l), mlp::bias_name(l)}) before[name] = engine.param_master(name);
    }
    const mlp::Teacher teacher(kShape, 8);
    const float loss = mlp::forward_backward(engine, kShape, teacher.batch(0, rank * kRows, kRows), &context);
    const bool applied = engine.step().applied;
    for (auto& [name, values] : before) {
      const std::vector<float> after = engine.param_master(name);  // collective: every rank
      for (size_t i = 0; i < values.size(); ++i) values[i] = (values[i] - after[i]) / kLr;
    }
    if (rank == 0) out = {std::move(before), loss, applied};
  });
  return out;
}

}  // namespace

TEST_CASE("the MLP converges on the GPU in fp32, bf16 and fp16 at stage 3") {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    CAPTURE(dtype_name(dtype));
    const Losses l = train(dtype, 200);
    MESSAGE(dtype_name(dtype), ": held-out loss ", l.before, " -> ", l.after);
    CHECK(l.after < 0.1f * l.before);
    // fp16 skips at most the few steps the scale needs to find its level.
    CHECK(l.skipped <= (dtype == DType::kFloat16 ? 10 : 0));
  }
}

TEST_CASE("one fp32 step: the GPU path's gradients and loss are the host loops' to 1e-4") {
  const OneStep host = one_step(Device::host());
  const OneStep gpu = one_step(kCuda0);
  REQUIRE(host.applied);
  REQUIRE(gpu.applied);
  CHECK(gpu.loss == doctest::Approx(host.loss).epsilon(1e-4));
  REQUIRE(gpu.grads.size() == host.grads.size());
  for (const auto& [name, expected] : host.grads) {
    CAPTURE(name);
    const std::vector<float>& got = gpu.grads.at(name);
    REQUIRE(got.size() == expected.size());
    // Relative to the tensor's largest gradient: the GEMMs sum in another
    // order than the host's loops, and elements near zero have no relative
    // precision of their own.
    float largest = 0.0f, worst = 0.0f;
    for (size_t i = 0; i < expected.size(); ++i) {
      largest = std::max(largest, std::abs(expected[i]));
      worst = std::max(worst, std::abs(got[i] - expected[i]));
    }
    MESSAGE(name, ": max |g| ", largest, ", max |gpu - host| ", worst);
    CHECK(largest > 0.0f);
    CHECK(worst <= 1e-4f * largest);
  }
}
