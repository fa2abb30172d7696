// Stages 1, 2 and 3 give bit-identical parameters to stage 0, and every rank
// ends with the same parameters.
#include <doctest/doctest.h>

#include <cstring>

#include "engine_harness.h"
#include "zest/engine/layout_constants.h"
#include "zest/optim/chunk_sum_order.h"

using namespace zest;
using namespace zest::test;


TEST_CASE("fp32 AdamW: stages 1-3 match stage 0 bit for bit, 1-4 ranks, accumulation and clipping") {
  EngineConfig config = base_config(0);
  config.gradient_accumulation_steps = 2;
  config.gradient_clipping = 0.5;  // small enough to clip every step
  for (int world : {1, 2, 3, 4}) check_equivalence(config, world);
}

TEST_CASE("fp32 SGD with Nesterov momentum: stages match bit for bit") {
  EngineConfig config = base_config(0);
  config.optimizer.kind = OptimizerKind::kSgd;
  config.optimizer.momentum = 0.9f;
  config.optimizer.nesterov = true;
  config.gradient_accumulation_steps = 3;
  for (int world : {2, 3}) check_equivalence(config, world);
}

TEST_CASE("bf16 and fp16 Adam: stages match bit for bit") {
  EngineConfig config = base_config(0);
  config.optimizer.kind = OptimizerKind::kAdam;
  config.bf16 = true;
  config.gradient_clipping = 1.0;
  check_equivalence(config, 3);
  config.bf16 = false;
  config.fp16.enabled = true;
  config.fp16.initial_scale_power = 8;
  check_equivalence(config, 4);
}

TEST_CASE("W ranks with the same gradients match one rank: bitwise for W = 2, 4, closely for 3") {
  EngineConfig config = base_config(0);
  config.gradient_accumulation_steps = 2;
  config.gradient_clipping = 0.5;
  RunOptions opt = runs(1, 3);
  opt.backward.same_on_every_rank = true;
  for (int stage : {0, 2, 3}) {
    CAPTURE(stage);
    config.zero.stage = stage;
    opt.world = 1;
    const std::vector<RankResult> one = run_engine(config, opt);
    for (int world : {2, 3, 4}) {
      CAPTURE(world);
      opt.world = world;
      const std::vector<RankResult> many = run_engine(config, opt);
      for (const auto& [name, values] : one[0].params) {
        CAPTURE(name);
        const std::vector<float>& got = many[static_cast<size_t>(world - 1)].params.at(name);
        if (world != 3) {
          CHECK(same_bits(got, values));
        } else {
          for (size_t i = 0; i < values.size(); ++i) CHECK(got[i] == doctest::Approx(values[i]).epsilon(1e-6));
        }
      }
      if (world != 3) CHECK(many[0].steps.back().grad_norm == one[0].steps.back().grad_norm);
    }
  }
}

TEST_CASE("the reported norm is the norm of the averaged gradients, summed in layout order") {
  EngineConfig config = base_config(0);
  config.optimizer.lr = 0.0f;  // keep the parameters at their initial values
  config.optimizer.weight_decay = 0.0f;
  const std::vector<RankResult> one = run_engine(config, runs(1, 1));
  // The same gradients, recomputed here from the initial values, each unit
  // one chunk of 256 elements (all are smaller), its squares summed in the
  // chunk order of Note [a warp per chunk], the units' sums in layout order.
  ModelLayout layout({{"default", 0.0f}, {"no_decay", 0.0f}},
                     {{"a", {{"a.w", {7, 13}}, {"a.b", {7}, "no_decay"}}},
                      {"b", {{"b.w", {5, 7}}, {"b.b", {5}, "no_decay"}, {"b.s", {}, "no_decay"}}},
                      {"c", {{"c.w", {11, 3}}}}},
                     1);
  double total = 0.0;
  for (int u = 0; u < layout.num_units(); ++u) {
    REQUIRE(layout.unit(u).padded == kShardQuantum);
    std::vector<float> grads(layout.unit(u).padded, 0.0f);
    for (const ParamLayout& p : layout.unit(u).params) {
      std::vector<float> w(p.numel);
      init_values(p, w);
      for (size_t i = 0; i < p.numel; ++i) {
        const uint32_t id = static_cast<uint32_t>(p.offset + i + 1000u * static_cast<uint32_t>(u));
        const float a = noise(id, 0, 0);
        const float b = 0.1f * noise(id, 17u, 0);
        grads[p.offset + i] = w[i] * a + b;
      }
    }
    total += warp_order_sum_of_squares([&](size_t i) { return grads[i]; }, 0, grads.size(), 1.0f);
  }
  CHECK(one[0].steps.at(0).grad_norm == std::sqrt(total));
}

TEST_CASE("stage 3 stays exact when the gather order changes after the first iteration") {
  EngineConfig config = base_config(0);
  RunOptions opt = runs(3, 4);
  opt.change_order = true;
  const std::vector<RankResult> reference = run_engine(config, opt);
  config.zero.stage = 3;
  config.zero.stage3_prefetch_bucket_size = 2000;  // prefetch one or two units ahead
  const std::vector<RankResult> got = run_engine(config, opt);
  for (const auto& [name, values] : reference[0].params) {
    CAPTURE(name);
    CHECK(same_bits(got[2].params.at(name), values));
  }
  // Without the forward gathers a step moves Ψ (one gather) + Ψ (reduce-scatter).
  CHECK(got[0].last_step_counters[CollectiveKind::kAllGather].calls == 3);
}

TEST_CASE("overlap_comm and the reduce bucket change no bit") {
  EngineConfig config = base_config(2);
  config.gradient_accumulation_steps = 2;
  const std::vector<RankResult> reference = run_engine(config, runs(2, 2));
  for (const bool overlap : {false, true}) {
    for (const int64_t bucket : {1, 100000}) {
      CAPTURE(overlap);
      CAPTURE(bucket);
      for (int stage : {1, 2, 3}) {
        CAPTURE(stage);
        EngineConfig c = config;
        c.zero.stage = stage;
        c.zero.overlap_comm = overlap;
        c.zero.reduce_bucket_size = bucket;
        const std::vector<RankResult> got = run_engine(c, runs(2, 2));
        for (const auto& [name, values] : reference[0].params) {
          CAPTURE(name);
          CHECK(same_bits(got[1].params.at(name), values));
        }
      }
    }
  }
}
