// Loads into an engine that changed since the save: a weights-only load
// takes the weights by parameter name (other units, parameter groups or
// frozen units), and a full load into another optimizer carries the state
// both share, dropping the rest with a note or refusing, by name, a state
// the checkpoint lacks (optimizer_state_map.h).
#include <doctest/doctest.h>

#include <mutex>

#include "checkpoint/checkpoint_test_util.h"
#include "zest/core/logging.h"

using namespace zest;
using namespace zest::test;

namespace {

std::mutex log_mutex;
std::vector<std::string> warnings;

void capture(LogLevel level, std::string_view line) {
  std::lock_guard<std::mutex> lock(log_mutex);
  if (level == LogLevel::kWarn) warnings.emplace_back(line);
}

// Collects the warnings logged (by any rank's thread) while it lives.
struct WarningCapture {
  WarningCapture() {
    warnings.clear();
    set_log_sink(capture);
  }
  ~WarningCapture() { set_log_sink(nullptr); }
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(log_mutex);
    return warnings;
  }
};

// On `world` ranks: a finalized engine of `config` registered by `model`,
// then body; returns rank 0's master parameters after it.
Params on_ranks(const EngineConfig& config, int world, const std::function<void(Engine&)>& model,
                const std::function<void(Engine&, Communicator&)>& body) {
  std::vector<Params> out(static_cast<size_t>(world));
  on_each_rank(
      world, config,
      [&](Engine& engine, Communicator& comm) {
        body(engine, comm);
        out[static_cast<size_t>(comm.rank())] = master_params(engine);
      },
      model);
  return out[0];
}

void steps(Engine& engine, Communicator& comm, int64_t first, int64_t last) {
  RankResult r;
  run_steps(engine, comm, runs(1, 0), first, last, r);
}

// register_model's parameters, regrouped: a.b in the default group, b.w in
// no_decay, a and b in one unit, c frozen.
void regrouped_model(Engine& engine) {
  engine.add_param_group("no_decay", 0.0f);
  engine.add_unit("ab", {{"a.w", {7, 13}},
                         {"a.b", {7}},
                         {"b.w", {5, 7}, "no_decay"},
                         {"b.b", {5}, "no_decay"},
                         {"b.s", {}, "no_decay"}});
  engine.add_unit("c", {{"c.w", {11, 3}, "default", false}});
}

EngineConfig with_optimizer(OptimizerKind kind, float momentum = 0.0f) {
  EngineConfig c = base_config(1);
  c.optimizer.kind = kind;
  c.optimizer.momentum = momentum;
  return c;
}

}  // namespace

TEST_CASE("a weights-only load takes the weights by name: other parameter groups, units and frozen units") {
  TempDir dir;
  const Params saved = on_ranks(base_config(2), 2, register_model, [&](Engine& e, Communicator& c) {
    steps(e, c, 0, 3);
    save_checkpoint(e, dir.str());
  });
  CheckpointOptions weights;
  weights.weights_only = true;
  for (int world : {1, 3}) {
    CAPTURE(world);
    const Params loaded = on_ranks(base_config(3), world, regrouped_model, [&](Engine& e, Communicator&) {
      load_checkpoint(e, dir.str(), weights);
      CHECK(e.progress().applied_steps == 0);
    });
    check_same(loaded, saved);
  }
  // A full load still needs the same registration, and says how to load the weights.
  CHECK_THROWS_WITH_AS(on_ranks(base_config(1), 1, regrouped_model,
                                [&](Engine& e, Communicator&) { load_checkpoint(e, dir.str()); }),
                       doctest::Contains("is of another model: line 1: 'unit a' against 'unit ab'"), Error);
  // Parameters missing, extra or of another shape are refused by name.
  const auto other = [&](const std::function<void(Engine&)>& model) {
    return error_text([&] { on_ranks(base_config(1), 1, model, [&](Engine& e, Communicator&) { load_checkpoint(e, dir.str(), weights); }); });
  };
  CHECK(other([](Engine& e) {
          e.add_param_group("no_decay", 0.0f);
          e.add_unit("a", {{"a.w", {7, 13}}, {"a.b", {7}}});
          e.add_unit("b", {{"b.w", {5, 7}}, {"b.b", {5}}, {"b.s", {}}, {"b.t", {2}}});
          e.add_unit("c", {{"c.w", {11, 3}}});
        }).find("it has no parameter 'b.t' (registered in unit 'b' with shape [2])") != std::string::npos);
  CHECK(other([](Engine& e) {
          e.add_unit("a", {{"a.w", {7, 13}}, {"a.b", {7}}});
          e.add_unit("b", {{"b.w", {5, 7}}, {"b.b", {5}}, {"b.s", {}}});
        }).find("it holds parameter 'c.w' (unit 'c'), which this model does not register") != std::string::npos);
  CHECK(other([](Engine& e) {
          e.add_unit("a", {{"a.w", {13, 7}}, {"a.b", {7}}});
          e.add_unit("b", {{"b.w", {5, 7}}, {"b.b", {5}}, {"b.s", {}}});
          e.add_unit("c", {{"c.w", {11, 3}}});
        }).find("parameter 'a.w' has shape [7, 13] there, [13, 7] here") != std::string::npos);
}

TEST_CASE("a full load into another optimizer carries the shared state with a note, or refuses by name") {
  TempDir adamw, momentum;
  on_ranks(with_optimizer(OptimizerKind::kAdamW), 2, register_model, [&](Engine& e, Communicator& c) {
    steps(e, c, 0, 3);
    save_checkpoint(e, adamw.str());
  });
  on_ranks(with_optimizer(OptimizerKind::kSgd, 0.9f), 2, register_model, [&](Engine& e, Communicator& c) {
    steps(e, c, 0, 3);
    save_checkpoint(e, momentum.str());
  });
  // The saved state buffers, rank by rank (stage 1 on 2 ranks, as saved).
  std::vector<std::vector<std::vector<float>>> moments(2);
  {
    WarningCapture log;
    on_ranks(with_optimizer(OptimizerKind::kAdamW), 2, register_model, [&](Engine& e, Communicator& c) {
      load_checkpoint(e, adamw.str());
      for (int u = 0; u < 3; ++u) {
        for (int b = 1; b < 3; ++b) moments[static_cast<size_t>(c.rank())].push_back(e.read_shard(u, b));
      }
    });
    CHECK(log.lines().empty());  // the same optimizer: no note
  }
  SUBCASE("AdamW's moments go to Adam, with a note") {
    WarningCapture log;
    on_ranks(with_optimizer(OptimizerKind::kAdam), 2, register_model, [&](Engine& e, Communicator& c) {
      load_checkpoint(e, adamw.str());
      size_t i = 0;
      for (int u = 0; u < 3; ++u) {
        for (int b = 1; b < 3; ++b) CHECK(same_bits(e.read_shard(u, b), moments[static_cast<size_t>(c.rank())][i++]));
      }
      CHECK(e.progress().applied_steps == 3);
    });
    const std::vector<std::string> w = log.lines();
    REQUIRE(w.size() == 1);  // rank 0 only
    CHECK(w[0].find(fmt::format("checkpoint '{}' was saved with AdamW and loads into this engine's Adam: exp_avg, "
                                "exp_avg_sq carried over; nothing dropped",
                                (adamw.path / "step_000003").string())) != std::string::npos);
  }
  SUBCASE("plain SGD takes the weights and progress; the moments are dropped with a note") {
    WarningCapture log;
    on_ranks(with_optimizer(OptimizerKind::kSgd), 2, register_model, [&](Engine& e, Communicator&) {
      load_checkpoint(e, adamw.str());
      CHECK(e.progress().applied_steps == 3);
    });
    const std::vector<std::string> w = log.lines();
    REQUIRE(w.size() == 1);
    CHECK(w[0].find("was saved with AdamW and loads into this engine's SGD: no optimizer state carried over; "
                    "exp_avg, exp_avg_sq (unused by SGD) dropped") != std::string::npos);
  }
  SUBCASE("SGD's momentum is dropped, with a note, by SGD without momentum") {
    WarningCapture log;
    on_ranks(with_optimizer(OptimizerKind::kSgd), 2, register_model,
             [&](Engine& e, Communicator&) { load_checkpoint(e, momentum.str()); });
    const std::vector<std::string> w = log.lines();
    REQUIRE(w.size() == 1);
    CHECK(w[0].find("was saved with SGD and loads into this engine's SGD: no optimizer state carried over; "
                    "momentum_buffer (unused by SGD) dropped") != std::string::npos);
  }
  SUBCASE("a state the checkpoint lacks is refused by name") {
    CHECK_THROWS_WITH_AS(
        on_ranks(with_optimizer(OptimizerKind::kSgd, 0.9f), 2, register_model,
                 [&](Engine& e, Communicator&) { load_checkpoint(e, adamw.str()); }),
        doctest::Contains("was saved with AdamW (optimizer state: exp_avg, exp_avg_sq); this engine's SGD needs its "
                          "'momentum_buffer', which the checkpoint does not hold. Load it with "
                          "CheckpointOptions::weights_only"),
        Error);
    CHECK_THROWS_WITH_AS(on_ranks(with_optimizer(OptimizerKind::kAdam), 2, register_model,
                                  [&](Engine& e, Communicator&) { load_checkpoint(e, momentum.str()); }),
                         doctest::Contains("was saved with SGD (optimizer state: momentum_buffer); this engine's "
                                           "Adam needs its 'exp_avg'"),
                         Error);
    // Weights-only, it loads.
    CheckpointOptions weights;
    weights.weights_only = true;
    on_ranks(with_optimizer(OptimizerKind::kAdam), 2, register_model,
             [&](Engine& e, Communicator&) { load_checkpoint(e, momentum.str(), weights); });
  }
}

namespace {

// A LoRA-like model: a frozen base unit larger than the trainable ones.
void adapter_model(Engine& engine) {
  engine.add_unit("base", {{"base.w", {37, 29}, "default", false}, {"base.b", {37}, "default", false}});
  engine.add_param_group("no_decay", 0.0f);
  engine.add_unit("a", {{"a.w", {7, 13}}, {"a.b", {7}, "no_decay"}});
  engine.add_unit("b", {{"b.w", {5, 7}}});
}

// Steps [first, last) with gradients for the trainable units only, whole
// numbers the same on every rank: the update is exact at any world size.
void adapter_steps(Engine& engine, Communicator& comm, int64_t first, int64_t last) {
  Backward bw;
  bw.same_on_every_rank = true;
  bw.integer_valued = true;
  for (int64_t s = first; s < last; ++s) {
    for (int u = 0; u < engine.layout().num_units(); ++u) UnitHandle h = engine.gather(u);
    for (int u = engine.layout().num_units() - 1; u >= 0; --u) {
      if (!engine.layout().unit(u).frozen) write_grads<float>(engine, u, comm.rank(), s, 0, bw);
    }
    (void)engine.step();
  }
}

// On `world` ranks at `stage`: a finalized adapter_model (the base's values
// scaled by `base_scale`), then body; rank 0's master values after it.
Params on_adapter_ranks(int world, int stage, float base_scale, const std::function<void(Engine&, Communicator&)>& body) {
  std::vector<Params> out(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(base_config(stage), comm, alloc, Stream::default_for(Device::host()));
    adapter_model(engine);
    engine.finalize([&](const ParamLayout& p, std::span<float> v) {
      init_values(p, v);
      if (p.name.starts_with("base.")) {
        for (float& x : v) x *= base_scale;
      }
    });
    body(engine, comm);
    out[static_cast<size_t>(comm.rank())] = master_params(engine);
  });
  return out[0];
}

}  // namespace

TEST_CASE("exclude_frozen_parameters: a checkpoint of what is trained, loaded onto its base at any world size") {
  TempDir whole, adapters, straight_dir;
  CheckpointOptions exclude;
  exclude.exclude_frozen_parameters = true;
  // 3 steps, saved both ways, at 2 ranks stage 3.
  uint64_t trainable_padded = 0, frozen_padded = 0;
  on_adapter_ranks(2, 3, 1.0f, [&](Engine& e, Communicator& c) {
    if (c.rank() == 0) {
      for (const UnitLayout& u : e.layout().units()) (u.frozen ? frozen_padded : trainable_padded) += u.padded;
    }
    adapter_steps(e, c, 0, 3);
    save_checkpoint(e, whole.str());
    save_checkpoint(e, adapters.str(), exclude);
  });
  const Params straight = on_adapter_ranks(2, 3, 1.0f, [&](Engine& e, Communicator& c) { adapter_steps(e, c, 0, 5); });

  // The files hold the trainable units' master weights and Adam's two
  // moments (3 x their padded floats over the 2 files), and no value of the
  // base, which the other checkpoint holds once.
  const auto file_bytes = [](const fs::path& dir) {
    uint64_t n = 0;
    for (const char* f : {"rank_00000.bin", "rank_00001.bin"}) n += fs::file_size(dir / "step_000003" / f);
    return n;
  };
  CHECK(file_bytes(adapters.path) == 3 * trainable_padded * sizeof(float));
  CHECK(file_bytes(whole.path) == file_bytes(adapters.path) + frozen_padded * sizeof(float));
  CHECK(frozen_padded >= 37 * 29 + 37);
  const nlohmann::json m = read_manifest_json(adapters.path / "step_000003");
  CHECK(m["format_version"] == 3);
  CHECK(m["frozen_parameters"]["excluded"] == true);
  CHECK(m["frozen_parameters"]["fingerprints"].size() == 1);
  CHECK(m["frozen_parameters"]["fingerprints"]["base"].get<std::string>().size() == 16);

  // Loaded onto the same base at another world size and stage, 2 more steps
  // give the bits of 5 straight (the base's fingerprint is the same at any
  // split: Note [the fingerprint of a frozen unit]).
  for (auto [world, stage] : {std::pair{2, 3}, std::pair{3, 2}, std::pair{1, 0}}) {
    CAPTURE(world);
    const Params resumed = on_adapter_ranks(world, stage, 1.0f, [&](Engine& e, Communicator& c) {
      load_checkpoint(e, adapters.str());
      CHECK(e.progress().applied_steps == 3);
      adapter_steps(e, c, 3, 5);
    });
    CHECK(resumed == straight);
  }
  // Onto another base: refused by name, on every rank.
  const std::string other = error_text([&] {
    on_adapter_ranks(2, 3, 2.0f, [&](Engine& e, Communicator&) { load_checkpoint(e, adapters.str()); });
  });
  CHECK_MESSAGE(other.find("frozen unit 'base' here holds other values") != std::string::npos, other);
  CHECK_MESSAGE(other.find("Load that base first") != std::string::npos, other);
  // A change of one element of the base is seen.
  const std::string one = error_text([&] {
    on_adapter_ranks(3, 2, 1.0f, [&](Engine& e, Communicator&) {
      std::vector<float> v = e.read_shard(0, 0);
      if (e.partition() == 1) v[5] = std::nextafter(v[5], 1.0f);
      e.write_shard(0, 0, v);
      load_checkpoint(e, adapters.str());
    });
  });
  CHECK_MESSAGE(one.find("frozen unit 'base' here holds other values") != std::string::npos, one);
  // A weights-only load needs the base's values: refused naming why.
  CheckpointOptions weights;
  weights.weights_only = true;
  const std::string w = error_text([&] {
    on_adapter_ranks(1, 1, 1.0f, [&](Engine& e, Communicator&) { load_checkpoint(e, adapters.str(), weights); });
  });
  CHECK_MESSAGE(w.find("holds no values of frozen unit 'base'") != std::string::npos, w);
  // The whole checkpoint still loads onto any base (it carries the values).
  const Params from_whole = on_adapter_ranks(3, 2, 2.0f, [&](Engine& e, Communicator& c) {
    load_checkpoint(e, whole.str());
    adapter_steps(e, c, 3, 5);
  });
  CHECK(from_whole == straight);
#ifdef ZEST_CKPT_TOOL
  // zest-ckpt verifies it, and reshards it to 1 rank at stage 1 keeping the
  // fingerprints; the result loads onto the base as the original does.
  TempDir resharded, logs;
  const auto zest_ckpt = [&](const std::string& args) {
    const std::string command = fmt::format("'{}' {} > '{}/out.txt' 2>&1", ZEST_CKPT_TOOL, args, logs.str());
    return std::system(command.c_str());
  };
  const std::string step3 = (adapters.path / "step_000003").string();
  CHECK(zest_ckpt(fmt::format("verify '{}'", step3)) == 0);
  CHECK(zest_ckpt(fmt::format("inspect '{}'", step3)) == 0);
  CHECK(slurp(logs.path / "out.txt").find("values excluded (fingerprints only") != std::string::npos);
  REQUIRE(zest_ckpt(fmt::format("reshard '{}' '{}' --world 1 --stage 1", step3, resharded.str())) == 0);
  CHECK(read_manifest_json(resharded.path / "step_000003")["frozen_parameters"] == m["frozen_parameters"]);
  const Params from_resharded = on_adapter_ranks(1, 1, 1.0f, [&](Engine& e, Communicator& c) {
    load_checkpoint(e, resharded.str());
    adapter_steps(e, c, 3, 5);
  });
  CHECK(from_resharded == straight);
  // An export needs the base's values: refused naming why.
  CHECK(zest_ckpt(fmt::format("export '{}' '{}/w.safetensors'", step3, logs.str())) != 0);
  CHECK(slurp(logs.path / "out.txt").find("holds no values of frozen unit 'base'") != std::string::npos);
#endif
}

TEST_CASE("ranks that read different copies of one checkpoint (the same tag and step) are refused, naming them") {
  TempDir a, b;
  on_ranks(base_config(2), 2, register_model, [&](Engine& e, Communicator& c) {
    steps(e, c, 0, 2);
    save_checkpoint(e, a.str());
  });
  fs::copy(a.path, b.path, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  // b's copy: another learning rate set at the same step (a copy from another run).
  nlohmann::json m = read_manifest_json(b.path / "step_000002");
  m["progress"]["lr_override"] = 0.5;
  write_manifest_resealed(b.path / "step_000002", m);
  std::mutex mu;
  std::vector<std::string> errors;
  run_inprocess(2, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(base_config(2), comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    const std::string e = error_text([&] { load_checkpoint(engine, comm.rank() == 0 ? a.str() : b.str()); });
    const std::lock_guard<std::mutex> lock(mu);
    errors.push_back(e);
  });
  REQUIRE(errors.size() == 2);
  for (const std::string& e : errors) {
    CAPTURE(e);
    CHECK(e.find("ranks read different copies of checkpoint") != std::string::npos);
    CHECK(e.find("rank 1's manifest") != std::string::npos);
  }
}
