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
    CHECK_THROWS_WITH_AS(engine.next_lr(), doctest::Contains("returned nan after 6 applied steps"), Error);
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
