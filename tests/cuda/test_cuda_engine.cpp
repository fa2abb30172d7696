// The engine on one GPU with in-process ranks: stages 1-3 match stage 0 bit
// for bit on the CUDA path too, the CUDA engine matches the host engine, and
// offload_optimizer (pinned host memory, copy streams), and offload_param
// at stage 3 with it, match the device.
#include <doctest/doctest.h>

#include "engine/engine_harness.h"

using namespace zest;
using namespace zest::test;

namespace {
constexpr Device kCuda0 = Device::cuda(0);
}

TEST_CASE("CUDA, fp32 AdamW: stages 1-3 match stage 0 bit for bit, 1-4 ranks, accumulation and clipping") {
  EngineConfig config = base_config(0);
  config.gradient_accumulation_steps = 2;
  config.gradient_clipping = 0.5;
  for (int world : {1, 2, 3, 4}) check_equivalence(config, world, kCuda0);
}

TEST_CASE("CUDA, bf16 and fp16: stages match bit for bit") {
  EngineConfig config = base_config(0);
  config.bf16 = true;
  check_equivalence(config, 3, kCuda0);
  config.bf16 = false;
  config.fp16.enabled = true;
  config.fp16.initial_scale_power = 8;
  check_equivalence(config, 4, kCuda0);
}

TEST_CASE("CUDA and host engines agree bit for bit, the norm and clipping included") {
  // The host adds each norm chunk in the GPU's order (chunk_sum_order.h) and
  // the chunks exactly, so the norm, and so the clip coefficient, have the
  // same bits; every other operation is elementwise.
  for (int stage : {0, 2, 3}) {
    CAPTURE(stage);
    EngineConfig config = base_config(stage);
    config.bf16 = true;
    config.gradient_clipping = 0.5;  // below every step's norm (about 1.4-1.6): each step clips
    RunOptions opt = runs(2, 3);
    const std::vector<RankResult> host = run_engine(config, opt);
    opt.device = kCuda0;
    const std::vector<RankResult> cuda = run_engine(config, opt);
    for (const auto& [name, values] : host[0].params) {
      CAPTURE(name);
      CHECK(same_bits(cuda[1].params.at(name), values));
    }
    for (size_t step = 0; step < host[0].steps.size(); ++step) {
      CAPTURE(step);
      CHECK(cuda[0].steps[step].grad_norm == host[0].steps[step].grad_norm);
      CHECK(host[0].steps[step].clipped);
      CHECK(cuda[0].steps[step].clipped);
    }
  }
}

TEST_CASE("CUDA, offload_optimizer: the pinned-host pipeline equals the device run bit for bit, stages 1-3") {
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    EngineConfig config = base_config(stage);
    config.bf16 = true;
    config.gradient_clipping = 0.5;
    RunOptions opt = runs(2, 3);
    opt.device = kCuda0;
    const std::vector<RankResult> device = run_engine(config, opt);
    config.offload_optimizer.device = OffloadDevice::kCpu;
    for (double ratio : {1.0, 0.5}) {
      CAPTURE(ratio);
      config.offload_optimizer.ratio = ratio;
      const std::vector<RankResult> offloaded = run_engine(config, opt);
      for (int r = 0; r < 2; ++r) {
        CAPTURE(r);
        check_same(offloaded[static_cast<size_t>(r)].params, device[static_cast<size_t>(r)].params);
        CHECK(offloaded[static_cast<size_t>(r)].memory[MemoryCategory::kOptimizerState].current <
              device[static_cast<size_t>(r)].memory[MemoryCategory::kOptimizerState].current);
        CHECK(offloaded[static_cast<size_t>(r)].memory.host(MemoryCategory::kOptimizerState).current > 0);
      }
    }
    if (stage == 3) {
      // offload_param: shards in pinned host memory, copied to the device
      // at each gather, written by the host update.
      config.offload_optimizer.ratio = 1.0;
      config.offload_param.device = OffloadDevice::kCpu;
      config.offload_param.pin_memory = true;
      const std::vector<RankResult> params_offloaded = run_engine(config, opt);
      for (int r = 0; r < 2; ++r) {
        CAPTURE(r);
        check_same(params_offloaded[static_cast<size_t>(r)].params, device[static_cast<size_t>(r)].params);
        CHECK(params_offloaded[static_cast<size_t>(r)].memory[MemoryCategory::kParameters].current == 0);
        CHECK(params_offloaded[static_cast<size_t>(r)].memory.host(MemoryCategory::kParameters).current > 0);
      }
    }
  }
}
