// A learning rate the program sets itself, a schedule callback, and both
// across a checkpoint.
#include <doctest/doctest.h>

#include <filesystem>
#include <random>

#include "engine/engine_harness.h"
#include "zest/checkpoint/checkpoint.h"

using namespace zest;
using namespace zest::test;
namespace fs = std::filesystem;

namespace {

using Params = std::map<std::string, std::vector<float>>;

// Runs `body` on one in-process rank with a finalized engine.
void with_engine(const EngineConfig& config, const std::function<void(Engine&, Communicator&)>& body) {
  run_inprocess(1, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    body(engine, comm);
  });
}

CheckpointOptions tagged(const std::string& tag) {
  CheckpointOptions o;
  o.tag = tag;
  return o;
}

std::vector<double> step_lrs(Engine& engine, Communicator& comm, int64_t first, int64_t last) {
  RankResult r;
  run_steps(engine, comm, runs(1, 0), first, last, r);
  std::vector<double> out;
  for (const StepResult& s : r.steps) out.push_back(s.lr);
  return out;
}

}  // namespace

TEST_CASE("set_lr overrides the schedule, a callback replaces it, StepResult reports the one used") {
  EngineConfig config = base_config(1);
  config.optimizer.lr = 0.01f;
  with_engine(config, [](Engine& engine, Communicator& comm) {
    CHECK(step_lrs(engine, comm, 0, 1) == std::vector<double>{static_cast<double>(0.01f)});
    engine.set_lr_schedule([](int64_t applied) { return 0.25 * static_cast<double>(applied); });
    CHECK(engine.next_lr() == 0.25);
    CHECK(step_lrs(engine, comm, 1, 3) == std::vector<double>{0.25, 0.5});
    engine.set_lr(0.125);
    CHECK(step_lrs(engine, comm, 3, 5) == std::vector<double>{0.125, 0.125});
    engine.clear_lr();
    CHECK(step_lrs(engine, comm, 5, 6) == std::vector<double>{1.25});
    engine.set_lr_schedule({});
    CHECK(engine.next_lr() == static_cast<double>(0.01f));
    CHECK_THROWS_WITH_AS(engine.set_lr(-1.0), doctest::Contains("set_lr(-1)"), Error);
    engine.set_lr_schedule([](int64_t) { return std::nan(""); });
    CHECK_THROWS_WITH_AS(engine.next_lr(), doctest::Contains("set_lr_schedule() after 6 applied steps is nan"), Error);
  });
}

TEST_CASE("set_lr steps with that learning rate: the parameters equal a config with it, bit for bit") {
  EngineConfig high = base_config(2);
  high.optimizer.lr = 0.03f;
  Params want, got;
  with_engine(high, [&](Engine& engine, Communicator& comm) {
    step_lrs(engine, comm, 0, 3);
    want = master_params(engine);
  });
  EngineConfig low = base_config(2);
  low.optimizer.lr = 0.01f;
  with_engine(low, [&](Engine& engine, Communicator& comm) {
    engine.set_lr(0.03f);
    step_lrs(engine, comm, 0, 3);
    got = master_params(engine);
  });
  for (const auto& [name, values] : want) {
    CAPTURE(name);
    CHECK(same_bits(values, got.at(name)));
  }
}

TEST_CASE("a set_lr value is saved with a checkpoint and restored, a callback resumes from the steps") {
  std::random_device rd;
  const fs::path dir = fs::temp_directory_path() / fmt::format("zest_lr_{:08x}", rd());
  with_engine(base_config(1), [&](Engine& engine, Communicator& comm) {
    step_lrs(engine, comm, 0, 2);
    engine.set_lr(0.375);
    save_checkpoint(engine, dir.string(), tagged("with_lr"));
    engine.clear_lr();
    save_checkpoint(engine, dir.string(), tagged("without_lr"));
  });
  with_engine(base_config(1), [&](Engine& engine, Communicator&) {
    load_checkpoint(engine, dir.string(), tagged("with_lr"));
    CHECK(engine.progress().lr_override == 0.375);
    CHECK(engine.next_lr() == 0.375);
    load_checkpoint(engine, dir.string(), tagged("without_lr"));
    CHECK_FALSE(engine.progress().lr_override.has_value());
    engine.set_lr_schedule([](int64_t applied) { return static_cast<double>(applied); });
    CHECK(engine.next_lr() == 2.0);  // two steps were applied before the save
  });
  fs::remove_all(dir);
}

TEST_CASE("a learning rate that overflows fp32 is refused where it enters, and no weight changes") {
  EngineConfig config = base_config(1);
  config.optimizer.lr = 0.01f;
  config.optimizer.weight_decay = 4.0f;
  with_engine(config, [](Engine& engine, Communicator& comm) {
    const Params before = master_params(engine);
    // Past fp32's range: the float the update takes would be Inf.
    CHECK_THROWS_WITH_AS(engine.set_lr(1e39), doctest::Contains("set_lr(1e+39) is 1e+39, past fp32's range"), Error);
    // lr times the weight decay 4 overflows.
    CHECK_THROWS_WITH_AS(engine.set_lr(1e38), doctest::Contains("times the weight_decay 4 it overflows"), Error);
    // In range, times 4 too, but lr / (1 - 0.9) at the first step is 5e38.
    CHECK_THROWS_WITH_AS(engine.set_lr(5e37), doctest::Contains("divided by the bias correction"), Error);
    CHECK_FALSE(engine.progress().lr_override.has_value());
    // A schedule's value is checked when a step is due, before anything
    // changes: the step throws, and may be taken again once it is fixed.
    engine.set_lr_schedule([](int64_t) { return 1e39; });
    CHECK_THROWS_WITH_AS(step_lrs(engine, comm, 0, 1),
                         doctest::Contains("the lr schedule set with set_lr_schedule() after 0 applied steps is 1e+39"),
                         Error);
    const Params after = master_params(engine);
    for (const auto& [name, values] : before) {
      CAPTURE(name);
      CHECK(same_bits(values, after.at(name)));
    }
    CHECK(engine.progress().applied_steps == 0);
    CHECK(engine.micro_steps_pending() == 0);
    engine.set_lr_schedule([](int64_t) { return 0.5; });
    const StepResult r = engine.step();  // the same micro-step's gradients
    CHECK(r.applied);
    CHECK(r.lr == 0.5);
    CHECK(engine.progress().applied_steps == 1);
  });
}

TEST_CASE("check_learning_rate: the first step's Adam constants, SGD's decay product, and the source named") {
  OptimizerConfig adam;
  adam.beta1 = 0.999f;  // 1 - beta1^1 = 0.001 (in fp32): lr 1e36 makes a step size near 1e39
  CHECK_NOTHROW(check_learning_rate(adam, 1e34, 0.0f, "test"));
  CHECK_THROWS_WITH_AS(check_learning_rate(adam, 1e36, 0.0f, "the unit test"),
                       doctest::Contains("AdamW: the learning rate from the unit test is 1e+36"), Error);
  adam.bias_correction = false;  // no division: 1e36 is usable
  CHECK_NOTHROW(check_learning_rate(adam, 1e36, 0.0f, "test"));
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::kSgd;
  CHECK_NOTHROW(check_learning_rate(sgd, 3e38, 0.0f, "test"));
  CHECK_THROWS_WITH_AS(check_learning_rate(sgd, 3e38, 2.0f, "test"), doctest::Contains("weight_decay 2"), Error);
  CHECK_THROWS_WITH_AS(check_learning_rate(sgd, std::numeric_limits<double>::infinity(), 0.0f, "test"),
                       doctest::Contains("is inf; it must be finite"), Error);
}
