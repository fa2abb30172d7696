// hpZ (zero.zero_hpz_partition_size, Note [hpZ] in config.h): on 4
// in-process ranks with groups of 2, stage 3 keeps flat stage 3's bits, one
// gather of each unit per optimizer step spans the world and the others run
// within the group from the secondary copy, whose memory is counted, and
// the DeepSpeed key is honoured at stage 3 and refused where ZEST cannot.
#include <doctest/doctest.h>

#include <algorithm>

#include "engine_harness.h"
#include "zest/engine/layout_constants.h"

namespace test_engine_hpz {

using namespace zest;
using namespace zest::test;

namespace {

constexpr int kWorld = 4;
constexpr int kGroup = 2;
constexpr int kUnits = 3;  // register_model's, each padded to kShardQuantum x 4 on 4 ranks

EngineConfig hpz_config(int group, int accumulation = 1) {
  EngineConfig c = base_config(3);
  c.zero.zero_hpz_partition_size = group;
  // Every unit gathered again for backward, from the secondary copy: at the
  // default reuse distance (1e9) this small model keeps its units gathered
  // from forward to backward, and the group would gather only across
  // micro-steps.
  c.zero.stage3_max_reuse_distance = 0;
  c.gradient_accumulation_steps = accumulation;
  c.gradient_clipping = 0.5;
  return c;
}

}  // namespace

TEST_CASE("hpZ on 4 ranks in groups of 2: flat stage 3's bits, fp32 and bf16, with accumulation") {
  // A gather moves values and computes nothing, so wherever the parameters
  // come from the results are flat stage 3's exactly, real-valued gradients
  // included.
  for (const bool bf16 : {false, true}) {
    for (const int accumulation : {1, 3}) {
      CAPTURE(bf16);
      CAPTURE(accumulation);
      EngineConfig flat = hpz_config(1, accumulation);
      flat.bf16 = bf16;
      EngineConfig hpz = hpz_config(kGroup, accumulation);
      hpz.bf16 = bf16;
      const RunOptions opt = runs(kWorld, 3);
      const std::vector<RankResult> want = run_engine(flat, opt);
      const std::vector<RankResult> got = run_engine(hpz, opt);
      for (int r = 0; r < kWorld; ++r) {
        CAPTURE(r);
        check_same(got[static_cast<size_t>(r)].params, want[0].params);
        REQUIRE(got[static_cast<size_t>(r)].steps.size() == want[0].steps.size());
        for (size_t s = 0; s < want[0].steps.size(); ++s) {
          CHECK(got[static_cast<size_t>(r)].steps[s].grad_norm == want[0].steps[s].grad_norm);
        }
      }
      std::vector<float> initial(want[0].params.at("a.w").size());
      init_values(ParamLayout{"a.w", {7, 13}, 91, 0, 0}, initial);
      CHECK_FALSE(same_bits(initial, got[0].params.at("a.w")));
    }
  }
}

TEST_CASE("hpZ traffic: one world gather of each unit per optimizer step, the rest within the group") {
  // Per optimizer step (A micro-steps, each a forward and a backward gather
  // of every unit): the first gather of each unit spans the world, (W-1)/W
  // of its P = 1024 elements; every later one gathers the secondary copy
  // within the group of H, (H-1)/H of P. Gradients are reduce-scattered over
  // the world as in flat stage 3.
  constexpr int kAccumulation = 2;
  const RunOptions opt = runs(kWorld, 2);
  const std::vector<RankResult> flat = run_engine(hpz_config(1, kAccumulation), opt);
  const std::vector<RankResult> got = run_engine(hpz_config(kGroup, kAccumulation), opt);
  constexpr size_t kPadded = kShardQuantum * kWorld;
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    const CommCounters& f = flat[static_cast<size_t>(r)].last_step_counters;
    const CommCounters& world = got[static_cast<size_t>(r)].last_step_counters;
    const CommCounters& group = got[static_cast<size_t>(r)].last_step_hpz_counters;
    const CollectiveCounter& all = f[CollectiveKind::kAllGather];
    // Forward and backward of every unit in every micro-step, at least (a
    // prefetch dropped unused adds more).
    CHECK(all.calls >= 2u * kUnits * kAccumulation);
    CHECK(world[CollectiveKind::kAllGather].calls == kUnits);
    CHECK(world[CollectiveKind::kAllGather].elements == kUnits * kPadded);
    CHECK(world[CollectiveKind::kAllGather].bytes_sent == 0.75 * 4.0 * kUnits * kPadded);
    CHECK(group[CollectiveKind::kAllGather].calls == all.calls - kUnits);
    CHECK(group[CollectiveKind::kAllGather].elements == (all.calls - kUnits) * kPadded);
    CHECK(group[CollectiveKind::kAllGather].bytes_sent == 0.5 * 4.0 * static_cast<double>((all.calls - kUnits) * kPadded));
    CHECK(group.total_bytes_sent() == group[CollectiveKind::kAllGather].bytes_sent);
    // The reductions are flat stage 3's.
    CHECK(world[CollectiveKind::kReduceScatter].calls == f[CollectiveKind::kReduceScatter].calls);
    CHECK(world[CollectiveKind::kReduceScatter].bytes_sent == f[CollectiveKind::kReduceScatter].bytes_sent);
  }
}

TEST_CASE("hpZ memory: the secondary copy, padded / H a unit, held from the first gather until the step") {
  // After a forward, each of the 3 units holds 1024 / 2 fp32 elements of
  // secondary copy beyond flat stage 3's parameters; step() drops them.
  std::vector<int64_t> during(2), after(2);
  for (const int group : {1, kGroup}) {
    run_inprocess(kWorld, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      Engine engine(hpz_config(group), comm, alloc, Stream::default_for(Device::host()));
      register_model(engine);
      engine.finalize(init_values);
      RunOptions opt = runs(kWorld, 0);
      RankResult r;
      run_steps(engine, comm, opt, 0, 1, r);
      for (int u = 0; u < kUnits; ++u) UnitHandle h = engine.gather(u);
      const int64_t now = engine.memory_report()[MemoryCategory::kParameters].current;
      run_steps(engine, comm, opt, 1, 2, r);
      if (comm.rank() == 0) {
        during[group == 1 ? 0 : 1] = now;
        after[group == 1 ? 0 : 1] = engine.memory_report()[MemoryCategory::kParameters].current;
      }
    });
  }
  CHECK(during[1] - during[0] == kUnits * (kShardQuantum * kWorld / kGroup) * 4);
  CHECK(after[1] == after[0]);
}

TEST_CASE("zero_hpz_partition_size from a DeepSpeed file: honoured at stage 3, noted elsewhere, refused where it "
          "cannot run") {
  AutoValues program;
  program.scheduler = LrScheduleConfig{};
  program.optimizer = base_config(3).optimizer;
  const EngineConfig c = parse_config_json(R"({"train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2, "stage3_param_persistence_threshold": 0,
                            "stage3_max_reuse_distance": 0}})",
                                           program);
  CHECK(c.zero.zero_hpz_partition_size == 2);
  CHECK(c.zero.hpz_group_size(kWorld) == 2);
  CHECK(c.zero.hpz_group_size(2) == 0);  // H >= W: flat stage 3
  const std::vector<RankResult> got = run_engine(c, runs(kWorld, 2));
  CHECK(got[0].last_step_hpz_counters[CollectiveKind::kAllGather].calls > 0u);

  const EngineConfig stage2 = parse_config_json(R"({"train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"stage": 2, "zero_hpz_partition_size": 2}})",
                                                program);
  CHECK(stage2.zero.zero_hpz_partition_size == 1);
  const auto note = std::find_if(stage2.ignored.begin(), stage2.ignored.end(), [](const ConfigNote& n) {
    return n.key == "zero_optimization.zero_hpz_partition_size";
  });
  REQUIRE(note != stage2.ignored.end());
  CHECK(note->text.find("only at stage 3") != std::string::npos);

  const auto construct = [](const EngineConfig& config) { construct_engines(config, kWorld); };
  CHECK_THROWS_WITH_AS(construct(hpz_config(3)),
                       doctest::Contains("zero_hpz_partition_size is 3 but the data-parallel world has 4 ranks"), Error);
  EngineConfig at2 = hpz_config(kGroup);
  at2.zero.stage = 2;
  CHECK_THROWS_WITH_AS(construct(at2), doctest::Contains("zero_hpz_partition_size is 2 at stage 2"), Error);
  EngineConfig with_mics = hpz_config(kGroup);
  with_mics.zero.mics_shard_size = 2;
  CHECK_THROWS_WITH_AS(construct(with_mics), doctest::Contains("ZEST does not combine the two"), Error);
  EngineConfig offloaded = hpz_config(kGroup);
  offloaded.offload_optimizer.device = OffloadDevice::kCpu;
  offloaded.offload_param.device = OffloadDevice::kCpu;
  CHECK_THROWS_WITH_AS(construct(offloaded), doctest::Contains("with offload_param (device cpu or nvme) is not supported"),
                       Error);
  CHECK_NOTHROW(construct(hpz_config(8)));  // min(H, W) = W: flat stage 3
}

}  // namespace test_engine_hpz
