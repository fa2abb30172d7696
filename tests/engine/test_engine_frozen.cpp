// Frozen parameters (ParamSpec::trainable = false): no gradient, no master
// weights, no optimizer state; values unchanged bit for bit at every stage
// and world size; counted as frozen in memory_report; saved and loaded with
// checkpoints, and taken from an all-trainable checkpoint by a weights-only
// load (fine-tuning with part of the model frozen).
#include <doctest/doctest.h>

#include "engine/engine_harness.h"
#include "checkpoint/temp_dir.h"
#include "zest/checkpoint/checkpoint.h"
#include "zest/checkpoint/checkpoint_manifest.h"
#include "zest/core/file_io.h"
#include "zest/estimate/memory_estimate.h"

using namespace zest;
using namespace zest::test;

namespace {

// register_model's units a, b, c, and then "f": frozen (or, for the
// checkpoint a fine-tuning starts from, trainable).
void register_with_frozen(Engine& engine, bool frozen = true) {
  register_model(engine);
  engine.add_unit("f", {{"f.w", {5, 7}, "default", !frozen}, {"f.b", {5}, "no_decay", !frozen}});
}

struct FrozenRun {
  Params params;  // rank 0's master values
  MemoryReport memory;
  int64_t owned = 0, trainable_owned = 0;
};

// `steps` optimizer steps of register_model's gradients (the harness's), with
// "f" gathered in forward and backward but given no gradients.
void frozen_steps(Engine& engine, Communicator& comm, int64_t first, int64_t last) {
  const int units = engine.layout().num_units();
  for (int64_t s = first; s < last; ++s) {
    for (int m = 0; m < static_cast<int>(engine.config().accumulation_steps()); ++m) {
      for (int u = 0; u < units; ++u) UnitHandle h = engine.gather(u);
      for (int u = units - 1; u >= 0; --u) {
        if (engine.layout().unit(u).frozen) {
          UnitHandle h = engine.gather(u);  // used by backward, no gradient
          continue;
        }
        if (engine.compute_dtype() == DType::kFloat32) {
          write_grads<float>(engine, u, comm.rank(), s, m, Backward{});
        } else {
          write_grads<bf16>(engine, u, comm.rank(), s, m, Backward{});
        }
      }
      engine.step();
    }
  }
}

FrozenRun run_frozen(const EngineConfig& config, int world, int steps,
                     const std::function<void(Engine&, Communicator&)>& after = {}) {
  std::vector<FrozenRun> out(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
    register_with_frozen(engine);
    engine.finalize(init_values);
    frozen_steps(engine, comm, 0, steps);
    if (after) after(engine, comm);
    FrozenRun r;
    r.params = master_params(engine);
    r.memory = engine.memory_report();
    r.owned = static_cast<int64_t>(engine.layout().owned());
    r.trainable_owned = static_cast<int64_t>(engine.layout().trainable_owned());
    out[static_cast<size_t>(comm.rank())] = r;
  });
  return out[0];
}

std::vector<float> initial(const std::string& name, size_t numel, DType dtype) {
  ParamLayout p;
  p.name = name;
  std::vector<float> v(numel);
  init_values(p, v);
  if (dtype == DType::kBFloat16) {
    for (float& x : v) x = static_cast<float>(bf16(x));
  }
  return v;
}

}  // namespace

TEST_CASE("frozen parameters keep their values bit for bit and leave training as without them, stages 0-3") {
  for (bool bf16_compute : {false, true}) {
    for (int world : {1, 2, 4}) {
      for (int stage = 0; stage <= 3; ++stage) {
        CAPTURE(bf16_compute);
        CAPTURE(world);
        CAPTURE(stage);
        EngineConfig config = base_config(stage);
        config.bf16 = bf16_compute;
        config.gradient_clipping = 0.05;  // the norm must leave the frozen unit out
        config.gradient_accumulation_steps = 2;
        const FrozenRun frozen = run_frozen(config, world, 3);
        const std::vector<RankResult> plain = run_engine(config, runs(world, 3));
        const DType dtype = bf16_compute ? DType::kBFloat16 : DType::kFloat32;
        CHECK(same_bits(frozen.params.at("f.w"), initial("f.w", 35, dtype)));
        CHECK(same_bits(frozen.params.at("f.b"), initial("f.b", 5, dtype)));
        for (const auto& [name, values] : plain[0].params) {
          CAPTURE(name);
          CHECK(same_bits(frozen.params.at(name), values));
        }
        // Nothing but parameters for "f": its padded 256 x partitions
        // elements, all of them held except at stage 3 (one shard).
        const int64_t bc = bf16_compute ? 2 : 4;
        const int64_t partitions = stage == 0 ? 1 : world;
        const int64_t held = (stage == 3 ? 256 : 256 * partitions) * bc;
        CHECK(frozen.memory.frozen_parameters == held);
        CHECK(frozen.memory[MemoryCategory::kParameters].current ==
              plain[0].memory[MemoryCategory::kParameters].current + held);
        for (MemoryCategory c :
             {MemoryCategory::kGradients, MemoryCategory::kMasterWeights, MemoryCategory::kOptimizerState}) {
          const std::string category(category_name(c));
          CAPTURE(category);
          CHECK(frozen.memory[c].current == plain[0].memory[c].current);
        }
        CHECK(frozen.owned - frozen.trainable_owned == 256);
        // The estimator, told which unit is frozen, says the same bytes.
        ModelDescription md;
        md.units = {{"a", {91, 7}, 1}, {"b", {35, 5, 1}, 1}, {"c", {33}, 1}, {"f", {35, 5}, 1, true}};
        const MemoryEstimate e = estimate_memory(md, EstimateOptions::from_config(config, world));
        for (MemoryCategory c : kAllMemoryCategories) {
          const std::string category(category_name(c));
          CAPTURE(category);
          CHECK(frozen.memory[c].current == e[c].persistent);
          CHECK(frozen.memory[c].peak == e[c].peak);
        }
        CHECK(plain[0].memory.frozen_parameters == 0);
      }
    }
  }
}

TEST_CASE("frozen units: no gradients to ask for, and a unit mixing both is refused") {
  CHECK_THROWS_WITH_AS(run_frozen(base_config(1), 1, 0,
                                  [](Engine& e, Communicator&) {
                                    UnitHandle h = e.gather(3);
                                    (void)e.grads(3);
                                  }),
                       doctest::Contains("grads() of unit 'f', whose parameters are frozen"), Error);
  CHECK_THROWS_WITH_AS(run_inprocess(1,
                                     [](Communicator& comm) {
                                       CachingAllocator alloc(make_host_allocator());
                                       Engine e(base_config(0), comm, alloc, Stream::default_for(Device::host()));
                                       e.add_unit("m", {{"m.w", {4}}, {"m.f", {4}, "default", false}});
                                       e.finalize(init_values);
                                     }),
                       doctest::Contains("unit 'm' mixes trainable and frozen parameters ('m.w' is trainable, "
                                         "'m.f' is frozen)"),
                       Error);
}

TEST_CASE("frozen units are saved and loaded with checkpoints, resharded, and take weights from a trainable save") {
  TempDir dir;
  EngineConfig config = base_config(2);
  config.bf16 = true;
  const FrozenRun saved = run_frozen(config, 2, 2, [&](Engine& e, Communicator&) { save_checkpoint(e, dir.str()); });
  // Shard files hold the frozen unit's values and no optimizer state for it.
  const CheckpointManifest m =
      parse_manifest(read_text_file(dir.str() + "/step_000002/manifest.json"), "manifest.json");
  CHECK(m.units[3].params[0].trainable == false);
  CHECK(m.files[0].bytes == static_cast<uint64_t>(saved.owned + 2 * saved.trainable_owned) * 4);  // Adam: 2 buffers
  // Loaded at other stages and world sizes into engines initialized with
  // zeros: every value comes back, the frozen ones included.
  const Initializer zeros = [](const ParamLayout&, std::span<float> v) { std::fill(v.begin(), v.end(), 0.0f); };
  for (int stage : {0, 1, 3}) {
    for (int world : {1, 4}) {
      CAPTURE(stage);
      CAPTURE(world);
      EngineConfig c = base_config(stage);
      c.bf16 = true;
      std::vector<Params> loaded(static_cast<size_t>(world));
      std::vector<std::vector<float>> seen(static_cast<size_t>(world));  // what forward reads on each rank
      run_inprocess(world, [&](Communicator& comm) {
        CachingAllocator alloc(make_host_allocator());
        Engine e(c, comm, alloc, Stream::default_for(Device::host()));
        register_with_frozen(e);
        e.finalize(zeros);
        load_checkpoint(e, dir.str());
        {
          const UnitHandle h = e.gather(3);
          for (bf16 x : h.param<bf16>("f.w")) seen[static_cast<size_t>(comm.rank())].push_back(static_cast<float>(x));
        }
        frozen_steps(e, comm, 2, 3);  // and training goes on
        loaded[static_cast<size_t>(comm.rank())] = master_params(e);
      });
      for (const std::vector<float>& s : seen) CHECK(same_bits(s, saved.params.at("f.w")));
      CHECK(same_bits(loaded[0].at("f.w"), saved.params.at("f.w")));
      CHECK(same_bits(loaded[0].at("f.b"), saved.params.at("f.b")));
    }
  }
  // Fine-tuning: a checkpoint of the model with "f" trainable, loaded
  // weights-only into the model with "f" frozen.
  TempDir pre;
  Params pretrained;
  run_inprocess(2, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine e(base_config(1), comm, alloc, Stream::default_for(Device::host()));
    register_with_frozen(e, /*frozen=*/false);
    e.finalize(init_values);
    for (int u = 0; u < 4; ++u) {
      UnitHandle h = e.gather(u);
      write_grads<float>(e, u, comm.rank(), 0, 0, Backward{});
    }
    e.step();
    save_checkpoint(e, pre.str());
    const Params p = master_params(e);
    if (comm.rank() == 0) pretrained = p;
  });
  CHECK_FALSE(same_bits(pretrained.at("f.w"), initial("f.w", 35, DType::kFloat32)));
  CheckpointOptions weights;
  weights.weights_only = true;
  const FrozenRun tuned = run_frozen(base_config(3), 2, 0, [&](Engine& e, Communicator& comm) {
    CHECK_THROWS_WITH_AS(load_checkpoint(e, pre.str()), doctest::Contains("is of another model"), Error);
    load_checkpoint(e, pre.str(), weights);
    frozen_steps(e, comm, 0, 2);
  });
  CHECK(same_bits(tuned.params.at("f.w"), pretrained.at("f.w")));
  CHECK(same_bits(tuned.params.at("f.b"), pretrained.at("f.b")));
  CHECK_FALSE(same_bits(tuned.params.at("a.w"), pretrained.at("a.w")));
}
