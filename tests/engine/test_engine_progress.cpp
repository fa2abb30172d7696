// steps_per_print and wall_clock_breakdown: rank 0's progress lines at
// DeepSpeed's cadence (every n-th optimizer step, skipped ones counted), their
// fields, and the throughput StepResult carries.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "config/config_test_helpers.h"
#include "engine/engine_harness.h"
#include "zest/core/logging.h"

using namespace zest;
using namespace zest::test;

namespace {

std::vector<std::string> g_lines;
void capture(LogLevel, std::string_view line) { g_lines.emplace_back(line); }  // called under the logger's lock

struct CaptureLogs {
  LogLevel saved = log_level();
  CaptureLogs() {
    g_lines.clear();
    set_log_level(LogLevel::kInfo);
    set_log_sink(capture);
  }
  ~CaptureLogs() {
    set_log_sink(nullptr);
    set_log_level(saved);
  }
};

// The progress lines logged, and rank 0's step results, of `steps` steps on
// 2 ranks; the first step's gradients overflow (fp16: skipped).
std::vector<std::string> progress_lines(const EngineConfig& config, int steps, int64_t tokens,
                                        std::vector<StepResult>& results) {
  CaptureLogs logs;
  RunOptions opt = runs(2, steps);
  opt.backward.poison = [](int64_t step, int micro) { return step == 0 && micro == 0; };
  run_inprocess(2, [&](Communicator& comm) {
    const auto alloc = allocator_for(Device::host());
    CachingAllocator host(make_host_allocator());
    const std::unique_ptr<Engine> engine =
        finalized_engine(config, comm, *alloc, host, Stream::default_for(Device::host()));
    if (tokens > 0) engine->set_tokens_per_micro_batch(tokens);
    RankResult r;
    run_steps(*engine, comm, opt, 0, steps, r);
    if (comm.rank() == 0) results = r.steps;
  });
  std::vector<std::string> out;
  for (const std::string& l : g_lines)
    if (l.find("] step ") != std::string::npos) out.push_back(l);
  return out;
}

EngineConfig fp16_config() {
  EngineConfig c = base_config(2);
  c.fp16.enabled = true;
  c.train_micro_batch_size_per_gpu = 4;  // train_batch_size 4 x 2 accumulation x 2 ranks = 16
  c.gradient_accumulation_steps = 2;
  return c;
}

}  // namespace

TEST_CASE("steps_per_print: rank 0 logs every n-th optimizer step, skipped ones counted, with its numbers") {
  EngineConfig c = fp16_config();
  c.steps_per_print = 2;
  std::vector<StepResult> results;
  const std::vector<std::string> lines = progress_lines(c, 5, 100, results);
  REQUIRE(results.size() == 5);
  CHECK_FALSE(results[0].applied);  // the poisoned step
  REQUIRE(lines.size() == 2);       // steps 2 and 4, from rank 0 only
  for (int k = 0; k < 2; ++k) {
    const StepResult& r = results[static_cast<size_t>(2 * k + 1)];
    CAPTURE(lines[static_cast<size_t>(k)]);
    CHECK(lines[static_cast<size_t>(k)].find(" r0/2] ") != std::string::npos);
    const std::string want = fmt::format("step {} (skipped 1): loss scale {}, lr {}, grad norm {}, samples/s {:.1f}, "
                                         "tokens/s {:.1f}",
                                         2 * k + 2, r.loss_scale, r.lr, r.grad_norm, *r.samples_per_second,
                                         *r.tokens_per_second);
    CHECK(lines[static_cast<size_t>(k)].find(want) != std::string::npos);
    CHECK(lines[static_cast<size_t>(k)].find("time (ms)") == std::string::npos);
  }
  CHECK(results[0].skip_reason.find("fp16 overflow") != std::string::npos);
  // The throughput: 16 samples and 2 x 2 x 100 tokens per optimizer step.
  for (const StepResult& r : results) {
    REQUIRE(r.step_ms > 0.0);
    CHECK(*r.samples_per_second == 16.0 / (r.step_ms / 1000.0));
    CHECK(*r.tokens_per_second == 400.0 / (r.step_ms / 1000.0));
  }
}

TEST_CASE("wall_clock_breakdown adds the phase times, and alone logs every step as DeepSpeed timers do") {
  EngineConfig c = fp16_config();
  c.wall_clock_breakdown = true;
  std::vector<StepResult> results;
  std::vector<std::string> lines = progress_lines(c, 3, 0, results);
  REQUIRE(lines.size() == 3);
  for (size_t k = 0; k < 3; ++k) {
    const StepResult& r = results[k];
    CAPTURE(lines[k]);
    CHECK(lines[k].find(fmt::format("step {} (skipped 1)", k + 1)) != std::string::npos);
    CHECK(lines[k].find("tokens/s") == std::string::npos);  // no token count given
    CHECK_FALSE(r.tokens_per_second.has_value());
    CHECK(lines[k].find(fmt::format("| time (ms): step {:.2f}, reduce {:.2f}, norm {:.2f}, optimizer {:.2f}, gather "
                                    "{:.2f}",
                                    r.step_ms, r.times.reduce_ms, r.times.norm_ms, r.times.optimizer_ms,
                                    r.times.gather_ms)) != std::string::npos);
  }
  c.steps_per_print = 3;
  lines = progress_lines(c, 4, 0, results);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("step 3 (skipped 1)") != std::string::npos);
  CHECK(lines[0].find("| time (ms): step ") != std::string::npos);
}

TEST_CASE("no steps_per_print and no breakdown log no progress lines, and no batch size gives no samples/s") {
  EngineConfig c = base_config(1);
  c.fp16.enabled = true;
  std::vector<StepResult> results;
  CHECK(progress_lines(c, 3, 0, results).empty());
  REQUIRE(results.size() == 3);
  CHECK_FALSE(results[2].samples_per_second.has_value());
  CHECK(results[2].step_ms > 0.0);
}

TEST_CASE("steps_per_print and wall_clock_breakdown are read from the config") {
  const EngineConfig c = zest::test::parse(R"({"train_batch_size": 8, "steps_per_print": 7,
                                              "wall_clock_breakdown": true})");
  CHECK(c.steps_per_print == 7);
  CHECK(c.wall_clock_breakdown);
  CHECK_FALSE(zest::test::parse(R"({"steps_per_print": null})").steps_per_print.has_value());
  CHECK_THROWS_WITH_AS((void)zest::test::parse(R"({"steps_per_print": 0})"), doctest::Contains("steps_per_print"),
                       Error);
}
