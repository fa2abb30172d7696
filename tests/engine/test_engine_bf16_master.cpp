// DeepSpeed's bf16.bf16_master_weights_and_grads and bf16_optimizer_states
// through the engine: at stages 1-3, on 1, 2 and 4 ranks, with and without
// offload_optimizer, every parameter ends as the rounded fp32 update of an
// element-by-element reference; the memory they take; a checkpoint resumed
// bit for bit; DeepSpeed's rules refused by name.
//
// The gradients are whole numbers, the same on every rank (Backward::
// integer_valued, same_on_every_rank), so their bf16 reductions and
// power-of-two averages are exact and the reference needs no model of the
// reduction order: what is tested is the kept precision.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "checkpoint/temp_dir.h"
#include "engine_harness.h"
#include "zest/checkpoint/checkpoint.h"
#include "zest/core/check.h"
#include "zest/optim/detail/optimizer_impl.h"

using namespace zest;
using namespace zest::test;

namespace {

// register_model's units and two of several host blocks (2048 elements)
// each, split across shards at 2 and 4 ranks.
void bf16_model(Engine& engine) {
  register_model(engine);
  engine.add_unit("d", {{"d.w", {60, 50}}, {"d.b", {50}, "no_decay"}});
  engine.add_unit("e", {{"e.w", {2500}}});
}

EngineConfig bf16_master_config(int stage, bool bf16_state) {
  EngineConfig c = base_config(stage);
  c.bf16 = true;
  c.bf16_master_weights_and_grads = true;
  c.bf16_optimizer_states = bf16_state;
  c.zero.reduce_bucket_size = 1500;  // several buckets
  c.zero.allgather_bucket_size = 1500;
  return c;
}

RunOptions exact_runs(int world, int steps) {
  RunOptions o = runs(world, steps);
  o.model = bf16_model;
  o.backward.integer_valued = true;
  o.backward.same_on_every_rank = true;
  return o;
}

// What write_grads gives element i of parameter p of unit u at `step`
// (Backward::integer_valued, rank 0's, micro-step 0).
float exact_grad(const ParamLayout& p, int u, size_t i, int64_t step) {
  const uint32_t id = static_cast<uint32_t>(p.offset + i + 1000u * static_cast<uint32_t>(u));
  return std::round(8.0f * noise(id, 0, static_cast<uint32_t>(step * 8)));
}

// Every parameter after `steps` AdamW steps of exact_grad, one element at a
// time: bf16 weights (the initial values rounded, as finalize narrows them),
// state kept in bf16 or fp32, each step optimizer_impl.h's fp32 update of
// the widened values and every kept value rounded to nearest even.
Params reference(const EngineConfig& c, const ModelLayout& layout, int steps) {
  Params out;
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const ParamLayout& p : layout.unit(u).params) {
      std::vector<float> init(p.numel);
      init_values(p, init);
      std::vector<float> w(p.numel), m(p.numel, 0.0f), v(p.numel, 0.0f);
      for (size_t i = 0; i < p.numel; ++i) w[i] = static_cast<float>(bf16(init[i]));
      const float decay = layout.groups()[static_cast<size_t>(p.group)].weight_decay;
      const auto keep = [&](float x) { return c.bf16_optimizer_states ? static_cast<float>(bf16(x)) : x; };
      for (int s = 0; s < steps; ++s) {
        const detail::AdamStep a = detail::adam_step(c.optimizer, StepScalars{c.optimizer.lr, decay, s + 1, 1.0f});
        for (size_t i = 0; i < p.numel; ++i) {
          detail::adam_update(a, exact_grad(p, u, i, s), w[i], m[i], v[i]);
          w[i] = static_cast<float>(bf16(w[i]));
          m[i] = keep(m[i]);
          v[i] = keep(v[i]);
        }
      }
      out[p.name] = w;
    }
  }
  return out;
}

struct Run {
  Params params;  // rank 0's; every rank's is checked equal to it
  Params expected;
  MemoryReport memory;
  size_t owned = 0;  // trainable elements rank 0 owns
};

Run run_exact(const EngineConfig& config, int world, int steps) {
  std::vector<Run> out(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    CachingAllocator host(make_host_allocator());
    const std::unique_ptr<Engine> engine =
        finalized_engine(config, comm, alloc, host, Stream::default_for(Device::host()), bf16_model);
    RankResult r;
    run_steps(*engine, comm, exact_runs(world, steps), 0, steps, r);
    Run& mine = out[static_cast<size_t>(comm.rank())];
    mine.params = master_params(*engine);
    mine.memory = engine->memory_report();
    mine.owned = engine->layout().trainable_owned();
    if (comm.rank() == 0) mine.expected = reference(config, engine->layout(), steps);
  });
  for (const Run& r : out) check_same(r.params, out[0].params);
  return out[0];
}

void check_against_reference(const EngineConfig& config, int world) {
  CAPTURE(config.zero.stage);
  CAPTURE(world);
  CAPTURE(config.bf16_optimizer_states);
  CAPTURE(config.offload_optimizer.ratio);
  const Run r = run_exact(config, world, 4);
  check_same(r.params, r.expected);
  // The weights moved.
  std::vector<float> initial(3000);
  init_values(ParamLayout{"d.w", {60, 50}, 3000, 0, 0}, initial);
  for (float& x : initial) x = static_cast<float>(bf16(x));
  CHECK_FALSE(same_bits(initial, r.params.at("d.w")));
}

}  // namespace

TEST_CASE("bf16 master weights and state: stages 1-3 on 1, 2 and 4 ranks give the rounded fp32 update of every "
          "element") {
  for (int stage : {1, 2, 3}) {
    for (int world : {1, 2, 4}) check_against_reference(bf16_master_config(stage, true), world);
  }
}

TEST_CASE("bf16 master weights with offload_optimizer: fp32 or bf16 state on the host, all of it or half") {
  for (bool bf16_state : {false, true}) {
    for (double ratio : {1.0, 0.5}) {
      EngineConfig c = bf16_master_config(2, bf16_state);
      c.offload_optimizer.device = OffloadDevice::kCpu;
      c.offload_optimizer.ratio = ratio;
      check_against_reference(c, 2);
      c.zero.stage = 3;
      check_against_reference(c, 2);
    }
  }
}

TEST_CASE("bf16 master weights take no bytes of their own and bf16 state half of fp32's") {
  const int world = 2;
  EngineConfig fp32_master = base_config(2);
  fp32_master.bf16 = true;
  const Run wide = run_exact(fp32_master, world, 1);
  const Run narrow = run_exact(bf16_master_config(2, true), world, 1);
  REQUIRE(wide.owned == narrow.owned);
  const auto owned = static_cast<int64_t>(narrow.owned);
  CHECK(wide.memory[MemoryCategory::kMasterWeights].current == owned * 4);
  CHECK(narrow.memory[MemoryCategory::kMasterWeights].current == 0);  // the bf16 parameters are the master
  CHECK(wide.memory[MemoryCategory::kOptimizerState].current == owned * 2 * 4);
  CHECK(narrow.memory[MemoryCategory::kOptimizerState].current == owned * 2 * 2);
  // Offloaded: the host keeps bf16 master weights beside the state.
  EngineConfig offloaded = bf16_master_config(2, false);
  offloaded.offload_optimizer.device = OffloadDevice::kCpu;
  const Run host = run_exact(offloaded, world, 1);
  CHECK(host.memory.host(MemoryCategory::kMasterWeights).current == owned * 2);
  CHECK(host.memory.host(MemoryCategory::kOptimizerState).current == owned * 2 * 4);
  CHECK(host.memory[MemoryCategory::kOptimizerState].current == 0);
}

namespace {

Params run_saved(const EngineConfig& config, int world, int64_t first, int64_t last, const std::string& load_from,
                 const std::string& save_to) {
  std::vector<Params> out(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    CachingAllocator host(make_host_allocator());
    const std::unique_ptr<Engine> engine =
        finalized_engine(config, comm, alloc, host, Stream::default_for(Device::host()), bf16_model);
    if (!load_from.empty()) load_checkpoint(*engine, load_from);
    RankResult r;
    run_steps(*engine, comm, exact_runs(world, 0), first, last, r);
    if (!save_to.empty()) save_checkpoint(*engine, save_to);
    out[static_cast<size_t>(comm.rank())] = master_params(*engine);
  });
  for (const Params& p : out) check_same(p, out[0]);
  return out[0];
}

}  // namespace

TEST_CASE("bf16 master weights and state: N steps straight equal k steps, save, load, N - k steps, bit for bit") {
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    EngineConfig config = bf16_master_config(stage, true);
    config.offload_optimizer.device = stage == 3 ? OffloadDevice::kCpu : OffloadDevice::kNone;
    TempDir dir;
    const Params straight = run_saved(config, 2, 0, 5, "", "");
    run_saved(config, 2, 0, 2, "", dir.str());
    check_same(run_saved(config, 2, 2, 5, dir.str(), ""), straight);
  }
}

TEST_CASE("bf16 master weights and state outside DeepSpeed's rules are refused by name") {
  const auto error = [](const EngineConfig& c) {
    std::string what;
    run_inprocess(1, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      CachingAllocator host(make_host_allocator());
      try {
        Engine engine(c, comm, alloc, host, Stream::default_for(Device::host()));
      } catch (const Error& e) {
        what = e.what();
      }
    });
    return what;
  };
  EngineConfig c = bf16_master_config(1, true);
  CHECK(error(c).empty());
  c.bf16 = false;
  CHECK(error(c).find("bf16.bf16_master_weights_and_grads with fp32 compute") != std::string::npos);
  c = bf16_master_config(0, true);
  CHECK(error(c).find("only supported with ZeRO stage 1, 2 or 3") != std::string::npos);
  c = bf16_master_config(2, false);
  CHECK(error(c).find("which DeepSpeed allows only with ZeRO-Offload") != std::string::npos);
  c.bf16_master_weights_and_grads = false;
  c.bf16_optimizer_states = true;
  CHECK(error(c).find("bf16_optimizer_states needs bf16.bf16_master_weights_and_grads") != std::string::npos);
  c = bf16_master_config(2, true);
  c.grad_accum_dtype = DType::kFloat32;
  CHECK(error(c).find("keeps the gradients in bf16, but data_types.grad_accum_dtype is fp32") != std::string::npos);
  c = bf16_master_config(2, true);
  c.optimizer.kind = OptimizerKind::kLamb;
  CHECK(error(c).find("optimizer Lamb with bf16.bf16_master_weights_and_grads is not supported") !=
        std::string::npos);
}
