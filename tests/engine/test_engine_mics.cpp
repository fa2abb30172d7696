// MiCS / HSDP (zero.mics_shard_size, Note [MiCS] in config.h): on 4
// in-process ranks in groups of 2, the parameters equal flat stage 3's, the
// traffic splits into the shard groups' and the replica groups' as the
// closed formulas say, the DeepSpeed key is honoured, and what DeepSpeed
// refuses is refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "engine_harness.h"
#include "zest/engine/layout_constants.h"

using namespace zest;
using namespace zest::test;

namespace {

constexpr int kWorld = 4;
constexpr int kShard = 2;
constexpr int kReplicas = kWorld / kShard;

EngineConfig mics_config(int shard_size) {
  EngineConfig c = base_config(3);
  c.zero.mics_shard_size = shard_size;
  c.gradient_clipping = 0.5;  // small enough to clip: the norm matters
  return c;
}

// Every rank's parameters have rank 0's bits, and moved from their start.
void check_ranks_agree(const std::vector<RankResult>& got) {
  for (size_t r = 0; r < got.size(); ++r) {
    CAPTURE(r);
    check_same(got[r].params, got[0].params);
  }
  std::vector<float> initial(got[0].params.at("a.w").size());
  init_values(ParamLayout{"a.w", {7, 13}, 91, 0, 0}, initial);
  CHECK_FALSE(same_bits(initial, got[0].params.at("a.w")));
}

double sum_kind(const CommCounters& c, CollectiveKind k) { return c[k].bytes_sent; }

}  // namespace

// The runs of `flat` and of `mics` (its groups) on 4 ranks, with integer
// gradients: the same parameters, norms, clipping and skipped steps.
// Returns flat's steps.
std::vector<StepResult> check_integer_equivalence(const EngineConfig& flat, const EngineConfig& mics,
                                                  const std::function<bool(int64_t, int)>& poison = {}) {
  RunOptions opt = runs(kWorld, 3);
  opt.backward.integer_valued = true;
  opt.backward.poison = poison;
  const std::vector<RankResult> want = run_engine(flat, opt);
  const std::vector<RankResult> got = run_engine(mics, opt);
  check_ranks_agree(got);
  check_same(got[0].params, want[0].params);
  for (int r = 0; r < kWorld; ++r) {
    REQUIRE(got[static_cast<size_t>(r)].steps.size() == want[0].steps.size());
    for (size_t s = 0; s < want[0].steps.size(); ++s) {
      CAPTURE(s);
      const StepResult& g = got[static_cast<size_t>(r)].steps[s];
      CHECK(g.grad_norm == want[0].steps[s].grad_norm);
      CHECK(g.clipped == want[0].steps[s].clipped);
      CHECK(g.applied == want[0].steps[s].applied);
      CHECK(g.loss_scale == want[0].steps[s].loss_scale);
    }
  }
  return want[0].steps;
}

TEST_CASE("MiCS on 4 ranks in groups of 2 gives flat stage 3's bits with integer gradients, with accumulation") {
  // Whole-number gradients: every partial sum and power-of-two average is
  // exact in fp32, so averaging within the group, then across the groups
  // (MiCS), and averaging over all four at once (flat) give the same bits
  // although the additions happen in another order.
  for (int accumulation : {1, 3}) {
    CAPTURE(accumulation);
    EngineConfig flat = mics_config(-1);
    flat.gradient_accumulation_steps = accumulation;
    EngineConfig mics = mics_config(kShard);
    mics.gradient_accumulation_steps = accumulation;
    check_integer_equivalence(flat, mics);
    // A group of the whole world is flat sharding, with no groups split.
    EngineConfig whole = mics;
    whole.zero.mics_shard_size = kWorld;
    check_integer_equivalence(flat, whole);
  }
}

TEST_CASE("MiCS with LAMB, and with fp16 whose overflow skips the step on every rank alike") {
  // LAMB's per-parameter norms are summed within the group, as the global
  // norm is; an Inf written by backward reaches every group through the
  // all-reduce across groups, so every rank skips the step and lowers the
  // loss scale together.
  EngineConfig lamb = mics_config(-1);
  lamb.optimizer.kind = OptimizerKind::kLamb;
  EngineConfig lamb_mics = lamb;
  lamb_mics.zero.mics_shard_size = kShard;
  check_integer_equivalence(lamb, lamb_mics);

  EngineConfig fp16 = mics_config(-1);
  fp16.fp16.enabled = true;
  fp16.fp16.initial_scale_power = 4;
  fp16.gradient_accumulation_steps = 2;
  EngineConfig fp16_mics = fp16;
  fp16_mics.zero.mics_shard_size = kShard;
  const std::vector<StepResult> steps =
      check_integer_equivalence(fp16, fp16_mics, [](int64_t step, int micro) { return step == 1 && micro == 1; });
  REQUIRE(steps.size() == 3u);
  CHECK(steps[0].applied);
  CHECK_FALSE(steps[1].applied);  // the poisoned step, skipped
  CHECK(steps[2].applied);
}

TEST_CASE("MiCS: an Inf on one rank of one group skips the step on every rank of both groups") {
  // Rank 3 (group 1) alone writes an Inf, at element 5 of unit b: its
  // group's reduce-scatter carries it into shard 0 (rank 2's), the
  // all-reduce across groups into rank 0's replica of that shard, so both
  // groups see a non-finite norm. Without that all-reduce group 0 would
  // apply the step.
  EngineConfig config = mics_config(kShard);
  config.fp16.enabled = true;
  std::vector<StepResult> results(kWorld);
  run_inprocess(kWorld, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    for (int u = 0; u < engine.layout().num_units(); ++u) {
      UnitHandle h = engine.gather(u);
      GradHandle g = engine.grads(u);
      std::vector<fp16> values(engine.layout().unit(u).padded, fp16(1.0f));
      if (comm.rank() == 3 && u == 1) values[5] = fp16(INFINITY);
      copy_bytes(engine.stream(), g.data(), values.data(), values.size() * sizeof(fp16));
      g.done();
    }
    results[static_cast<size_t>(comm.rank())] = engine.step();
  });
  for (const StepResult& r : results) {
    CHECK(r.boundary);
    CHECK_FALSE(r.applied);
    CHECK(r.skipped_steps == 1);
  }
}

TEST_CASE("MiCS with real-valued fp32 gradients stays within 1e-6 of flat stage 3, and every replica agrees") {
  // Now the sums round: flat adds ((g0 + g1) + g2) + g3, MiCS (g0 + g1) +
  // (g2 + g3); the halvings are exact. A reduced gradient then differs by an
  // ulp or two (relative 1e-7), which moves an Adam step lr m/(sqrt(v) + eps)
  // (lr = 0.01) by about 1e-9, and the parameters (|w| < 1) round to the
  // nearest of values 6e-8 apart: over three steps a few ulps of the
  // weights at most. 1e-6 is 16 ulps at 0.5 (measured: 3e-8, one ulp).
  EngineConfig flat = mics_config(-1);
  RunOptions opt = runs(kWorld, 3);
  const std::vector<RankResult> want = run_engine(flat, opt);
  const std::vector<RankResult> got = run_engine(mics_config(kShard), opt);
  check_ranks_agree(got);
  float worst = 0.0f;
  for (const auto& [name, values] : want[0].params) {
    const std::vector<float>& mine = got[0].params.at(name);
    REQUIRE(mine.size() == values.size());
    for (size_t i = 0; i < values.size(); ++i) worst = std::max(worst, std::fabs(mine[i] - values[i]));
  }
  MESSAGE("largest difference from flat sharding: " << worst);
  CHECK(worst <= 1e-6f);
}

TEST_CASE("MiCS traffic: within the group the stage-3 collectives over 2 ranks, across groups 2(R-1)/R x N/S "
          "per optimizer step") {
  // The counters' ring model (comm_counters.h), fp32: a reduce-scatter of a
  // unit of P elements over S ranks sends (S-1)/S x 4P bytes, an all-reduce
  // of n over R ranks 2(R-1)/R x 4n. Per optimizer step of A micro-steps:
  //   shard group:   A reduce-scatters of every unit, (S-1)/S x 4 A sum P;
  //                  the gathers flat stage 3 issues, at (S-1)/S instead of
  //                  (W-1)/W of their bytes
  //   replica group: one all-reduce of every unit's shard (P/S), once per
  //                  step whatever A: 2(R-1)/R x 4 sum P / S
  //   the world:     nothing (MiCS's traffic is on its groups).
  constexpr int kAccumulation = 2;
  EngineConfig flat = mics_config(-1);
  flat.gradient_accumulation_steps = kAccumulation;
  EngineConfig mics = mics_config(kShard);
  mics.gradient_accumulation_steps = kAccumulation;
  const RunOptions opt = runs(kWorld, 2);
  const std::vector<RankResult> base = run_engine(flat, opt);
  const std::vector<RankResult> got = run_engine(mics, opt);

  // The model's units (98, 41 and 33 elements) are each padded to one
  // kShardQuantum per partition: 3 x 256 S elements under MiCS, 3 x 256 W flat.
  const auto padded_per_unit = [](int partitions) {
    std::vector<size_t> padded;
    run_inprocess(partitions, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      Engine e(base_config(3), comm, alloc, Stream::default_for(Device::host()));
      register_model(e);
      e.finalize(init_values);
      if (comm.rank() == 0) {
        for (const UnitLayout& u : e.layout().units()) padded.push_back(u.padded);
      }
    });
    return padded;
  };
  CHECK(padded_per_unit(kShard) == std::vector<size_t>(3, kShardQuantum * kShard));
  CHECK(padded_per_unit(kWorld) == std::vector<size_t>(3, kShardQuantum * kWorld));
  const size_t sum_padded = 3 * kShardQuantum * kShard;
  const size_t flat_padded = 3 * kShardQuantum * kWorld;
  const double s_frac = (kShard - 1.0) / kShard;
  const double w_frac = (kWorld - 1.0) / kWorld;

  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    const RankResult& g = got[static_cast<size_t>(r)];
    const CollectiveCounter& rs = g.last_step_shard_counters[CollectiveKind::kReduceScatter];
    CHECK(rs.calls == 3u * kAccumulation);
    CHECK(rs.elements == kAccumulation * sum_padded);
    CHECK(rs.bytes_sent == s_frac * 4.0 * kAccumulation * static_cast<double>(sum_padded));
    CHECK(g.last_step_shard_counters[CollectiveKind::kAllReduce].calls == 0u);

    const CollectiveCounter& ag = g.last_step_shard_counters[CollectiveKind::kAllGather];
    const CollectiveCounter& flat_ag = base[static_cast<size_t>(r)].last_step_counters[CollectiveKind::kAllGather];
    CHECK(ag.calls > 0u);
    CHECK(ag.calls == flat_ag.calls);
    CHECK(ag.elements == ag.calls * kShardQuantum * kShard);
    CHECK(ag.bytes_sent == s_frac * 4.0 * static_cast<double>(ag.elements));
    CHECK(flat_ag.elements == flat_ag.calls * kShardQuantum * kWorld);
    CHECK(flat_ag.bytes_sent == w_frac * 4.0 * static_cast<double>(flat_ag.elements));

    const CommCounters& across = g.last_step_replica_counters;
    CHECK(across[CollectiveKind::kAllReduce].calls == 3u);
    CHECK(across[CollectiveKind::kAllReduce].elements == sum_padded / kShard);
    CHECK(across[CollectiveKind::kAllReduce].bytes_sent ==
          2.0 * (kReplicas - 1.0) / kReplicas * 4.0 * static_cast<double>(sum_padded / kShard));
    CHECK(across.total_bytes_sent() == across[CollectiveKind::kAllReduce].bytes_sent);
    CHECK(g.last_step_counters.total_bytes_sent() == 0.0);
    for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter, CollectiveKind::kAllGather,
                             CollectiveKind::kBroadcast}) {
      CHECK(g.last_step_counters[k].calls == 0u);
    }
    // Flat sharding, for comparison: everything on the world's communicator.
    CHECK(sum_kind(base[static_cast<size_t>(r)].last_step_counters, CollectiveKind::kReduceScatter) ==
          w_frac * 4.0 * kAccumulation * static_cast<double>(flat_padded));
  }
}

TEST_CASE("a DeepSpeed file's mics_shard_size trains on 4 ranks in groups of 2, and at stages 0-2 it is ignored") {
  const char* file = R"({
    "train_micro_batch_size_per_gpu": 1,
    "gradient_clipping": 0.5,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.05}},
    "zero_optimization": {"stage": 3, "mics_shard_size": 2, "mics_hierarchical_params_gather": true,
                          "stage3_param_persistence_threshold": 0}
  })";
  AutoValues program;
  program.scheduler = LrScheduleConfig{};  // a constant learning rate
  program.optimizer = base_config(3).optimizer;
  const EngineConfig config = parse_config_json(file, program);
  CHECK(config.zero.mics_shard_size == 2);
  CHECK(config.zero.shard_group_size(kWorld) == 2);
  const bool noted = std::any_of(config.ignored.begin(), config.ignored.end(), [](const ConfigNote& n) {
    return n.key == "zero_optimization.mics_hierarchical_params_gather";
  });
  CHECK(noted);
  RunOptions opt = runs(kWorld, 2);
  opt.backward.integer_valued = true;
  const std::vector<RankResult> got = run_engine(config, opt);
  check_ranks_agree(got);
  EngineConfig flat = config;
  flat.zero.mics_shard_size = -1;
  check_same(got[0].params, run_engine(flat, opt)[0].params);
  CHECK(got[0].last_step_replica_counters[CollectiveKind::kAllReduce].calls == 3u);

  // DeepSpeed builds MiCS only at stage 3: elsewhere the key is noted and
  // the model states are sharded over every rank.
  const EngineConfig stage2 = parse_config_json(R"({"train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"stage": 2, "mics_shard_size": 2}})",
                                                program);
  CHECK(stage2.zero.mics_shard_size == -1);
  const auto note = std::find_if(stage2.ignored.begin(), stage2.ignored.end(), [](const ConfigNote& n) {
    return n.key == "zero_optimization.mics_shard_size";
  });
  REQUIRE(note != stage2.ignored.end());
  CHECK(note->text.find("stage 3") != std::string::npos);

  // "auto" (a ZEST extension): groups of one host's ranks, from the
  // launcher's local size; without it, an error naming what to set.
  const char* per_host = R"({"train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"stage": 3, "mics_shard_size": "auto", "zero_hpz_partition_size": "auto"}})";
  CHECK_THROWS_WITH_AS(parse_config_json(per_host, program), doctest::Contains("AutoValues::local_world_size"),
                       Error);
  program.local_world_size = 2;
  const EngineConfig from_host = parse_config_json(per_host, program);
  CHECK(from_host.zero.mics_shard_size == 2);
  CHECK(from_host.zero.zero_hpz_partition_size == 2);
}

TEST_CASE("MiCS refusals: a shard size not dividing the world, a stage other than 3, CPU offload") {
  const auto construct = [](const EngineConfig& config) { construct_engines(config, kWorld); };
  CHECK_THROWS_WITH_AS(construct(mics_config(3)),
                       doctest::Contains("zero.mics_shard_size is 3 but the data-parallel world has 4 ranks"), Error);
  CHECK_THROWS_WITH_AS(construct(mics_config(8)), doctest::Contains("set mics_shard_size to a divisor of 4"), Error);
  EngineConfig stage2 = mics_config(kShard);
  stage2.zero.stage = 2;
  CHECK_THROWS_WITH_AS(construct(stage2), doctest::Contains("zero.mics_shard_size is 2 at stage 2"), Error);
  EngineConfig offload = mics_config(kShard);
  offload.offload_optimizer.device = OffloadDevice::kCpu;
  CHECK_THROWS_WITH_AS(construct(offload), doctest::Contains("Local sharding has no support for CPU offloading"),
                       Error);
  // Off (-1, 0) at any stage is accepted, as DeepSpeed's default.
  EngineConfig off = base_config(1);
  off.zero.mics_shard_size = 0;
  CHECK_NOTHROW(construct(off));
}
