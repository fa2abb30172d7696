// LAMB through the engine: bit-identical parameters at stages 0-3 on 1, 2
// and 4 ranks with parameters split across shards and several buckets;
// agreement with a double-precision reference of DeepSpeed's formula; the
// offload refusal; and a save / resume that continues bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "checkpoint/temp_dir.h"
#include "engine_harness.h"
#include "zest/checkpoint/checkpoint.h"
#include "zest/core/check.h"

using namespace zest;
using namespace zest::test;

namespace {

// register_model's units and two larger ones, so that at 2 and 4 ranks a
// parameter spans shards (d.w: 1200 elements; shards of 768 and 512) and a
// shard holds the runs of two groups.
void lamb_model(Engine& engine) {
  register_model(engine);
  engine.add_unit("d", {{"d.w", {40, 30}}, {"d.b", {30}, "no_decay"}});
  engine.add_unit("e", {{"e.w", {700}}, {"e.g", {3, 100}, "no_decay"}});
}

EngineConfig lamb_config(int stage) {
  EngineConfig c = base_config(stage);
  c.optimizer.kind = OptimizerKind::kLamb;
  c.optimizer.max_coeff = 10.0f;
  c.optimizer.min_coeff = 0.01f;
  c.zero.reduce_bucket_size = 600;  // several buckets
  c.zero.allgather_bucket_size = 600;
  return c;
}

}  // namespace

TEST_CASE("fp32 LAMB: stages 1-3 match stage 0 bit for bit on 1, 2 and 4 ranks, with clipping") {
  EngineConfig config = lamb_config(0);
  config.gradient_accumulation_steps = 2;
  config.gradient_clipping = 0.5;
  for (int world : {1, 2, 4}) check_equivalence(config, world, Device::host(), lamb_model);
}

TEST_CASE("bf16 and fp16 LAMB (eps_inside_sqrt, no bias correction): stages match bit for bit") {
  EngineConfig config = lamb_config(0);
  config.optimizer.eps_inside_sqrt = true;
  config.optimizer.bias_correction = false;
  config.bf16 = true;
  check_equivalence(config, 2, Device::host(), lamb_model);
  config.bf16 = false;
  config.fp16.enabled = true;
  config.fp16.initial_scale_power = 8;
  check_equivalence(config, 4, Device::host(), lamb_model);
}

namespace {

// DeepSpeed's FusedLamb in double on one tensor.
struct RefTensor {
  std::vector<double> w, m, v;
  void step(const OptimizerConfig& c, const std::vector<double>& g, double wd, int64_t t) {
    const double b1 = c.beta1, b2 = c.beta2;
    const double step_size = c.lr * std::sqrt(1.0 - std::pow(b2, t)) / (1.0 - std::pow(b1, t));
    std::vector<double> u(w.size());
    double wn = 0.0, un = 0.0;
    for (size_t i = 0; i < w.size(); ++i) {
      m[i] = b1 * m[i] + (1.0 - b1) * g[i];
      v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
      u[i] = m[i] / (std::sqrt(v[i]) + c.eps) + wd * w[i];
      wn += w[i] * w[i];
      un += u[i] * u[i];
    }
    double r = 1.0;
    if (wn != 0.0 && un != 0.0) r = std::clamp(std::sqrt(wn / un), double{c.min_coeff}, double{c.max_coeff});
    for (size_t i = 0; i < w.size(); ++i) w[i] -= step_size * r * u[i];
  }
};

}  // namespace

TEST_CASE("fp32 LAMB through the engine agrees with a double reference of DeepSpeed's formula to 1e-6") {
  EngineConfig config = lamb_config(2);
  config.optimizer.lr = 0.02f;
  RunOptions opt = runs(2, 4);
  opt.model = lamb_model;
  // Gradients independent of the parameters and the rank: whole numbers the
  // reference recomputes exactly (write_grads's integer_valued).
  opt.backward.integer_valued = true;
  opt.backward.same_on_every_rank = true;
  const std::vector<RankResult> got = run_engine(config, opt);

  std::optional<ModelLayout> layout;
  run_inprocess(1, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
    lamb_model(engine);
    engine.finalize(init_values);
    layout.emplace(engine.layout());
  });
  double worst = 0.0;
  for (int u = 0; u < layout->num_units(); ++u) {
    for (const ParamLayout& p : layout->unit(u).params) {
      CAPTURE(p.name);
      std::vector<float> w0(p.numel);
      init_values(p, w0);
      RefTensor ref{std::vector<double>(w0.begin(), w0.end()), std::vector<double>(p.numel),
                    std::vector<double>(p.numel)};
      const double wd = layout->groups()[static_cast<size_t>(p.group)].weight_decay;
      for (int64_t s = 0; s < opt.steps; ++s) {
        std::vector<double> g(p.numel);
        for (size_t i = 0; i < p.numel; ++i) {
          const auto id = static_cast<uint32_t>(p.offset + i + 1000u * static_cast<uint32_t>(u));
          g[i] = std::round(8.0f * noise(id, 0, static_cast<uint32_t>(s * 8)));
        }
        ref.step(config.optimizer, g, wd, s + 1);
      }
      const std::vector<float>& mine = got[0].params.at(p.name);
      for (size_t i = 0; i < p.numel; ++i) {
        worst = std::max(worst, std::abs(mine[i] - ref.w[i]) / std::max(1e-3, std::abs(ref.w[i])));
      }
      CHECK(mine[0] != w0[0]);
    }
  }
  CAPTURE(worst);
  CHECK(worst < 1e-6);
}

TEST_CASE("LAMB with offload_optimizer is refused by name") {
  EngineConfig config = lamb_config(2);
  config.offload_optimizer.device = OffloadDevice::kCpu;
  run_inprocess(1, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    CachingAllocator host(make_host_allocator());
    CHECK_THROWS_WITH_AS(Engine(config, comm, alloc, host, Stream::default_for(Device::host())),
                         doctest::Contains("optimizer Lamb with zero_optimization.offload_optimizer is not "
                                           "supported"),
                         Error);
  });
}

namespace {

Params run_lamb(const EngineConfig& config, int world, int64_t first, int64_t last, const std::string& load_from,
                const std::string& save_to, bool weights_only = false) {
  std::vector<Params> out(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
    lamb_model(engine);
    engine.finalize(init_values);
    CheckpointOptions options;
    options.weights_only = weights_only;
    if (!load_from.empty()) load_checkpoint(engine, load_from, options);
    RankResult r;
    run_steps(engine, comm, runs(world, 0), first, last, r);
    if (!save_to.empty()) save_checkpoint(engine, save_to);
    out[static_cast<size_t>(comm.rank())] = master_params(engine);
  });
  for (const Params& p : out) check_same(p, out[0]);
  return out[0];
}

}  // namespace

TEST_CASE("LAMB: N steps straight equal k steps, save, load, N - k steps, bit for bit") {
  for (int stage : {0, 2, 3}) {
    for (int world : {1, 2}) {
      CAPTURE(stage);
      CAPTURE(world);
      TempDir dir;
      EngineConfig config = lamb_config(stage);
      config.fp16.enabled = stage == 3;
      const Params straight = run_lamb(config, world, 0, 5, "", "");
      run_lamb(config, world, 0, 2, "", dir.str());
      const Params resumed = run_lamb(config, world, 2, 5, dir.str(), "");
      check_same(resumed, straight);
      // The state matters: the saved weights without m and v do not
      // continue the run.
      CHECK_FALSE(same_bits(run_lamb(config, world, 2, 5, dir.str(), "", true).at("d.w"), straight.at("d.w")));
    }
  }
}
