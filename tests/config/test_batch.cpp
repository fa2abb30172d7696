// DeepSpeed's batch triple: resolve_batch's table of rules, and the Engine,
// which resolves it at construction at its real world size and takes an
// optimizer step every gradient_accumulation_steps micro-steps.
#include <doctest/doctest.h>

#include <mutex>
#include <string_view>

#include "config_test_helpers.h"
#include "engine/engine_harness.h"
#include "zest/config/config.h"
#include "zest/core/logging.h"

using namespace zest;
using namespace zest::test;

namespace {

struct Triple {
  std::optional<int64_t> batch, micro, accum;
};

EngineConfig with(const Triple& t) {
  EngineConfig c = base_config(2);
  c.train_batch_size = t.batch;
  c.train_micro_batch_size_per_gpu = t.micro;
  c.gradient_accumulation_steps = t.accum;
  return c;
}

EngineConfig resolved(const Triple& t, int world) {
  EngineConfig c = with(t);
  c.resolve_batch(world);
  return c;
}

std::string resolve_error(const Triple& t, int world) {
  try {
    (void)resolved(t, world);
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

// What each rank saw over `micro_steps` calls of step(): whether each was a
// boundary, the applied steps after it, and the engine's resolved triple.
struct Seen {
  std::vector<bool> boundary;
  std::vector<int64_t> applied;
  EngineConfig config;
  std::string error;
};

std::vector<Seen> drive(const EngineConfig& config, int world, int micro_steps) {
  std::vector<Seen> seen(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    Seen& s = seen[static_cast<size_t>(comm.rank())];
    CachingAllocator alloc(make_host_allocator());
    const Stream stream = Stream::default_for(Device::host());
    std::unique_ptr<Engine> engine;
    try {
      engine = std::make_unique<Engine>(config, comm, alloc, stream);
    } catch (const Error& e) {
      s.error = e.message();  // every rank refuses alike, so none waits on another
      return;
    }
    s.config = engine->config();
    register_model(*engine);
    engine->finalize(init_values);
    const Backward bw;
    for (int m = 0; m < micro_steps; ++m) {
      for (int u = engine->layout().num_units() - 1; u >= 0; --u) write_grads<float>(*engine, u, comm.rank(), 0, m, bw);
      const StepResult r = engine->step();
      s.boundary.push_back(r.boundary);
      s.applied.push_back(r.applied_steps);
    }
  });
  return seen;
}

}  // namespace

TEST_CASE("resolve_batch follows DeepSpeed's _set_batch_related_parameters") {
  // batch and micro: accumulation = batch // micro // world
  EngineConfig a = resolved({32, 8, {}}, 1);
  CHECK(a.gradient_accumulation_steps == 4);
  CHECK(resolved({32, 8, {}}, 2).gradient_accumulation_steps == 2);
  CHECK(resolved({32, 8, {}}, 4).gradient_accumulation_steps == 1);
  CHECK(resolved({24, 3, {}}, 1).gradient_accumulation_steps == 8);
  // batch and accumulation: micro = batch // world // accumulation
  EngineConfig b = resolved({32, {}, 2}, 4);
  CHECK(b.train_micro_batch_size_per_gpu == 4);
  // micro and accumulation: batch = micro x accumulation x world
  CHECK(resolved({{}, 3, 5}, 2).train_batch_size == 30);
  // batch alone: accumulation 1, micro = batch // world
  EngineConfig c = resolved({64, {}, {}}, 4);
  CHECK(c.train_micro_batch_size_per_gpu == 16);
  CHECK(c.gradient_accumulation_steps == 1);
  // micro alone: accumulation 1, batch = micro x world
  EngineConfig d = resolved({{}, 6, {}}, 3);
  CHECK(d.train_batch_size == 18);
  CHECK(d.gradient_accumulation_steps == 1);
  // none: ZEST loads no data, so accumulation alone (or nothing) is kept
  EngineConfig e = resolved({{}, {}, 3}, 2);
  CHECK(e.gradient_accumulation_steps == 3);
  CHECK_FALSE(e.train_batch_size.has_value());
  CHECK(resolved({}, 2).gradient_accumulation_steps == 1);
  CHECK(a.batch_summary(1) == "train_batch_size 32 = micro 8 x accumulation 4 x 1 rank");
}

TEST_CASE("an inconsistent triple is an error with the arithmetic") {
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    CHECK(resolve_error({30, 8, 1}, world) ==
          fmt::format("config: train_batch_size 30 != train_micro_batch_size_per_gpu 8 x gradient_accumulation_steps "
                      "1 x {} rank{} = {}: make them agree (or leave one of the three out to have it derived)",
                      world, world == 1 ? "" : "s", 8 * world));
  }
  // 30 // 8 = 3 on one rank, and then 30 != 8 x 3 x 1, as DeepSpeed asserts.
  CHECK(resolve_error({30, 8, {}}, 1) ==
        "config: train_batch_size 30 != train_micro_batch_size_per_gpu 8 x gradient_accumulation_steps 3 x 1 rank = "
        "24 (gradient_accumulation_steps derived as 30 // 8 // 1 = 3): make them agree (or leave one of the three "
        "out to have it derived)");
  // 32 // 8 // 8 = 0 steps: DeepSpeed's "has to be greater than 0".
  CHECK(resolve_error({32, 8, {}}, 8) ==
        "config: train_batch_size 32 cannot be split over 8 ranks (gradient_accumulation_steps derived as 32 // 8 // "
        "8 = 0): make it a multiple of train_micro_batch_size_per_gpu x gradient_accumulation_steps x ranks");
  CHECK(resolve_error({0, 8, {}}, 1) == "config: train_batch_size is 0; it must be at least 1");
}

TEST_CASE("the Engine derives the accumulation from the file's batch sizes at its world size") {
  const EngineConfig from_file = test::parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8,
                                                       "zero_optimization": {"stage": 2}})");
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    const int64_t accum = 4 / world;  // 32 / 8 / world
    const std::vector<Seen> seen = drive(from_file, world, 12);
    for (const Seen& s : seen) {
      REQUIRE(s.error.empty());
      CHECK(s.config.gradient_accumulation_steps == accum);
      CHECK(s.config.train_micro_batch_size_per_gpu == 8);
      for (int m = 0; m < 12; ++m) {
        CAPTURE(m);
        CHECK(s.boundary[static_cast<size_t>(m)] == ((m + 1) % accum == 0));
        CHECK(s.applied[static_cast<size_t>(m)] == (m + 1) / accum);
      }
    }
  }
}

TEST_CASE("24 / 3 / - gives 8, 4 and 2 micro-steps per optimizer step on 1, 2 and 4 ranks") {
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    const int64_t accum = 8 / world;
    const std::vector<Seen> seen = drive(with({24, 3, {}}), world, 16);
    for (const Seen& s : seen) {
      REQUIRE(s.error.empty());
      CHECK(s.config.gradient_accumulation_steps == accum);
      CHECK(s.applied.back() == 16 / accum);
      CHECK(std::count(s.boundary.begin(), s.boundary.end(), true) == 16 / accum);
      CHECK(s.boundary[static_cast<size_t>(accum - 1)]);
    }
  }
}

TEST_CASE("30 / 8 / 1 is refused by the Engine on every rank, at every world size") {
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    const std::vector<Seen> seen = drive(with({30, 8, 1}), world, 1);
    for (const Seen& s : seen) {
      CHECK(s.error.starts_with("config: train_batch_size 30 != train_micro_batch_size_per_gpu 8 x "
                                "gradient_accumulation_steps 1 x "));
    }
  }
}

namespace {

std::mutex g_log_mutex;
std::vector<std::string> g_log_lines;
void capture(LogLevel, std::string_view line) {
  const std::lock_guard<std::mutex> lock(g_log_mutex);
  g_log_lines.emplace_back(line);
}

}  // namespace

TEST_CASE("the Engine logs what became of the config once, from rank 0") {
  const EngineConfig c = test::parse(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
      "steps_per_print": 10, "zero_optimization": {"stage": 1, "sub_group_size": 1e9}})");
  g_log_lines.clear();
  const LogLevel level = log_level();
  set_log_level(LogLevel::kInfo);
  set_log_sink(capture);
  (void)drive(c, 2, 2);
  set_log_sink(nullptr);
  set_log_level(level);
  std::vector<std::string> config_lines;
  for (const std::string& l : g_log_lines)
    if (l.find("] config: ") != std::string::npos) config_lines.push_back(l);
  REQUIRE(config_lines.size() == 3);
  CHECK(config_lines[0].find(" r0/2] config: ignored (ZEST does not do what they control): "
                             "zero_optimization.sub_group_size: the tile size of DeepSpeed's offloaded optimizer "
                             "step; ZEST steps each shard whole") != std::string::npos);
  CHECK(config_lines[1].find(" r0/2] config: from the program (\"auto\" and absent sections): optimizer: AdamW lr "
                             "0.001 weight_decay 0.01 (from AutoValues::optimizer: the file has no optimizer "
                             "section); scheduler: constant (from AutoValues::scheduler: the file has no scheduler "
                             "section)") != std::string::npos);
  CHECK(config_lines[2].find(" r0/2] config: train_batch_size 16 = micro 4 x accumulation 2 x 2 ranks") !=
        std::string::npos);
}

TEST_CASE("a grad_accum_dtype the Engine refuses under fp32 compute names the one choice there is") {
  const EngineConfig c = test::parse(R"({"train_micro_batch_size_per_gpu": 1,
      "data_types": {"grad_accum_dtype": "bf16"}})");
  const std::vector<Seen> seen = drive(c, 1, 1);
  CHECK(seen[0].error == "data_types.grad_accum_dtype is bf16 with fp32 compute: ZEST accumulates gradients in the "
                         "compute dtype or in fp32; set it to \"fp32\", or remove it");
}
