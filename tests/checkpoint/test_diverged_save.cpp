// A run whose values diverged is not saved (Note [a diverged run is not
// saved] in checkpoint.cpp): every rank refuses together, naming the unit,
// the parameter and the element, and the root keeps its last checkpoint and
// `latest`. fp16 runs, whose overflowing steps are skipped, save as usual.
#include <doctest/doctest.h>

#include <cmath>

#include "checkpoint/checkpoint_test_util.h"

using namespace zest;
using namespace zest::test;

namespace {

// SGD without weight decay at a learning rate near FLT_MAX: a gradient of 1
// at one element moves it by -3e38 a step, so the second step overflows it
// to -inf, while every other element (gradient 0) keeps its value.
EngineConfig blowing_up() {
  EngineConfig c = base_config(1);
  c.optimizer.kind = OptimizerKind::kSgd;
  c.optimizer.weight_decay = 0.0f;
  c.optimizer.lr = 3e38f;
  return c;
}

// Two units; c.w is large enough that its last elements lie in the last
// rank's shard at 2 ranks (units are padded in large blocks).
void two_units(Engine& engine) {
  engine.add_unit("a", {{"a.w", {7, 13}}});
  engine.add_unit("c", {{"c.w", {40, 40}}});
}

// One step whose gradient is 1 at element `element` of `param`, 0 elsewhere.
void step_pushing(Engine& engine, const std::string& param, size_t element) {
  for (int u = engine.layout().num_units() - 1; u >= 0; --u) {
    UnitHandle h = engine.gather(u);
    GradHandle g = engine.grads(u);
    for (const ParamLayout& p : engine.layout().unit(u).params) {
      std::span<float> gw = g.grad<float>(p.name);
      std::fill(gw.begin(), gw.end(), 0.0f);
      if (p.name == param) gw[element] = 1.0f;
    }
    g.done();
  }
  engine.step();
}

// The root's files, the lock's holder text aside (it names the last saver).
std::map<std::string, std::string> root_state(const fs::path& root) {
  std::map<std::string, std::string> out = snapshot(root);
  out.erase((root / ".zest-lock").string());
  return out;
}

}  // namespace

TEST_CASE("a diverged run is not saved: every rank refuses, naming the unit, parameter and element, and latest stays") {
  for (int world : {1, 2}) {
    CAPTURE(world);
    TempDir root;
    std::vector<std::string> errors(static_cast<size_t>(world));
    std::map<std::string, std::string> before;
    std::string expected;
    float initial = 0.0f;
    on_each_rank(
        world, blowing_up(),
        [&](Engine& engine, Communicator& comm) {
      const float w = engine.param_master("c.w")[1500];
      if (comm.rank() == 0) initial = w;
      step_pushing(engine, "c.w", 1500);
      save_checkpoint(engine, root.str());  // step_000001: -3e38 there, finite
      if (comm.rank() == 0) before = root_state(root.path);
      step_pushing(engine, "c.w", 1500);
      // Element 1500 of c.w lies in the last rank's shard only: the others'
      // values are all finite, and they must refuse too.
      const UnitLayout& c = engine.layout().unit(1);
      const size_t at = c.params[0].offset + 1500;
      const int owner = static_cast<int>(at / c.shard);
      REQUIRE(owner == world - 1);
      const size_t in_shard = at - c.shard * static_cast<size_t>(owner);
      if (comm.rank() == owner) REQUIRE(engine.read_shard(1, 0)[in_shard] == -INFINITY);
      if (comm.rank() == 0) {
        expected = fmt::format("the master weights of unit 'c' hold -inf at parameter 'c.w' element 1500 (shard "
                               "element {}): the training has diverged",
                               in_shard);
      }
      errors[static_cast<size_t>(comm.rank())] = error_text([&] { save_checkpoint(engine, root.str()); });
        },
        two_units);
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      CHECK(errors[static_cast<size_t>(r)].find(expected) != std::string::npos);
      CHECK(errors[static_cast<size_t>(r)].find("Checkpoint 'step_000002' was not saved and `latest` was not moved") !=
            std::string::npos);
    }
    if (world == 2) CHECK(errors[0].find("writing the shard files failed on rank 1") != std::string::npos);
    // Nothing was published or left behind: the root is as it was, and its
    // checkpoint loads.
    CHECK(root_state(root.path) == before);
    CHECK(slurp(root.path / "latest") == "step_000001\n");
    on_each_rank(
        1, blowing_up(),
        [&](Engine& e, Communicator&) {
          load_checkpoint(e, root.str());
          CHECK(e.progress().applied_steps == 1);
          CHECK(e.param_master("c.w")[1500] == initial - 3e38f);
        },
        two_units);
  }
}

TEST_CASE("an fp16 run with skipped overflow steps saves and resumes: its master weights stay finite") {
  TempDir root;
  EngineConfig config = base_config(2);
  config.fp16.enabled = true;
  RunOptions opt = runs(2, 0);
  opt.backward.poison = [](int64_t step, int) { return step == 1; };  // an Inf gradient: skipped
  std::vector<Engine::Progress> saved(2);
  on_each_rank(2, config, [&](Engine& engine, Communicator& comm) {
    RankResult r;
    run_steps(engine, comm, opt, 0, 3, r);
    REQUIRE(engine.progress().skipped_steps == 1);
    save_checkpoint(engine, root.str());
    saved[static_cast<size_t>(comm.rank())] = engine.progress();
  });
  CHECK(slurp(root.path / "latest") == "step_000002\n");
  on_each_rank(2, config, [&](Engine& engine, Communicator& comm) {
    load_checkpoint(engine, root.str());
    CHECK(engine.progress().applied_steps == 2);
    CHECK(engine.progress().skipped_steps == 1);
    CHECK(engine.progress().loss_scaler.scale == saved[static_cast<size_t>(comm.rank())].loss_scaler.scale);
  });
}
