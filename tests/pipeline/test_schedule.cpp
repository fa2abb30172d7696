// Pipeline schedules (pipeline/schedule.h): 1F1B as Megatron-LM orders it,
// GPipe, their invariants for every small pipeline, and the bubble: an
// event simulation of the stages with passes of one time unit each (sends
// asynchronous, a pass waiting for its input) gives a step of exactly
// 2 (m + p - 1) units, so each stage idles (p - 1) / (m + p - 1) of it.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "zest/pipeline/schedule.h"
#include "../error_of.h"

using namespace zest;

namespace {

std::string render(const std::vector<PipelineAction>& a) {
  std::string s;
  for (const PipelineAction& x : a) {
    if (!s.empty()) s += ' ';
    s += (x.pass == PipelinePass::kForward ? "F" : "B") + std::to_string(x.micro_batch) + (x.paired ? "+" : "");
  }
  return s;
}

// Simulates every stage running its actions in order, each pass one unit
// long: a forward of micro-batch i on stage s starts once stage s - 1 has
// finished it, a backward once stage s + 1 has finished its backward and
// this stage its forward. Returns the step's length (the last pass's end).
int simulated_step(PipelineKind kind, int p, int m) {
  std::vector<std::vector<PipelineAction>> actions;
  for (int s = 0; s < p; ++s) actions.push_back(pipeline_schedule(kind, p, s, m));
  std::map<std::tuple<int, int, int>, int> done;  // (stage, pass, micro-batch) -> end time
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<int> clock(static_cast<size_t>(p), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < p; ++s) {
      auto& i = next[static_cast<size_t>(s)];
      if (i == actions[static_cast<size_t>(s)].size()) continue;
      const PipelineAction a = actions[static_cast<size_t>(s)][i];
      const int pass = a.pass == PipelinePass::kForward ? 0 : 1;
      int ready = clock[static_cast<size_t>(s)];
      const int from = pass == 0 ? s - 1 : s + 1;
      if (from >= 0 && from < p) {
        const auto it = done.find({from, pass, a.micro_batch});
        if (it == done.end()) continue;  // its input is not there yet
        ready = std::max(ready, it->second);
      }
      clock[static_cast<size_t>(s)] = ready + 1;
      done[{s, pass, a.micro_batch}] = ready + 1;
      ++i;
      moved = true;
    }
  }
  for (int s = 0; s < p; ++s)
    REQUIRE_MESSAGE(next[static_cast<size_t>(s)] == actions[static_cast<size_t>(s)].size(), "stage ", s, " stuck");
  return *std::max_element(clock.begin(), clock.end());
}

}  // namespace

TEST_CASE("1F1B on 4 stages and 8 micro-batches: Megatron's warm-up, steady state and cool-down") {
  CHECK(render(pipeline_schedule(PipelineKind::k1F1B, 4, 0, 8)) ==
        "F0 F1 F2 F3+ B0+ F4+ B1+ F5+ B2+ F6+ B3+ F7+ B4 B5 B6 B7");
  CHECK(render(pipeline_schedule(PipelineKind::k1F1B, 4, 1, 8)) ==
        "F0 F1 F2+ B0+ F3+ B1+ F4+ B2+ F5+ B3+ F6+ B4+ F7+ B5 B6 B7");
  CHECK(render(pipeline_schedule(PipelineKind::k1F1B, 4, 3, 8)) ==
        "F0+ B0+ F1+ B1+ F2+ B2+ F3+ B3+ F4+ B4+ F5+ B5+ F6+ B6+ F7+ B7");
  // Fewer micro-batches than stages: all warm-up on the first stage.
  CHECK(render(pipeline_schedule(PipelineKind::k1F1B, 4, 0, 2)) == "F0 F1 B0 B1");
  CHECK(render(pipeline_schedule(PipelineKind::kGPipe, 2, 1, 3)) == "F0 F1 F2 B0 B1 B2");
}

TEST_CASE("every schedule runs each micro-batch forward then backward once, backwards in order") {
  for (const PipelineKind kind : {PipelineKind::kGPipe, PipelineKind::k1F1B})
    for (int p = 1; p <= 5; ++p)
      for (int s = 0; s < p; ++s)
        for (int m = 1; m <= 9; ++m) {
          CAPTURE(p);
          CAPTURE(s);
          CAPTURE(m);
          const std::vector<PipelineAction> a = pipeline_schedule(kind, p, s, m);
          REQUIRE(a.size() == 2 * static_cast<size_t>(m));
          int forwards = 0, backwards = 0, live = 0, most_live = 0;
          for (const PipelineAction& x : a) {
            if (x.pass == PipelinePass::kForward) {
              CHECK(x.micro_batch == forwards++);
              most_live = std::max(most_live, ++live);
            } else {
              CHECK(x.micro_batch == backwards++);  // same order under both: same gradient bits
              CHECK(x.micro_batch < forwards);
              --live;
            }
          }
          // Activations held at once: GPipe all m, 1F1B at most p - s.
          CHECK(most_live == (kind == PipelineKind::kGPipe ? m : std::min(p - s, m)));
        }
}

TEST_CASE("the simulated step is 2 (m + p - 1) passes: the bubble (p - 1) / (m + p - 1)") {
  for (const PipelineKind kind : {PipelineKind::kGPipe, PipelineKind::k1F1B})
    for (int p = 1; p <= 6; ++p)
      for (int m = 1; m <= 12; ++m) {
        CAPTURE(p);
        CAPTURE(m);
        const int step = simulated_step(kind, p, m);
        CHECK(step == 2 * (m + p - 1));
        // Each stage is busy 2m of the step's units.
        CHECK(1.0 - 2.0 * m / step == doctest::Approx(pipeline_bubble(p, m)).epsilon(1e-15));
      }
  CHECK(pipeline_bubble(4, 8) == doctest::Approx(3.0 / 11.0));
}

TEST_CASE("schedules refuse bad sizes, naming them") {
  CHECK(test::error_of([] { (void)pipeline_schedule(PipelineKind::k1F1B, 4, 4, 8); }) ==
        "stage 4 is not one of the pipeline's 4 stages (0 to 3)");
  CHECK(test::error_of([] { (void)pipeline_schedule(PipelineKind::k1F1B, 0, 0, 8); }) ==
        "a pipeline needs at least one stage, not 0");
  CHECK(test::error_of([] { (void)pipeline_schedule(PipelineKind::kGPipe, 2, 0, 0); }) ==
        "a pipeline step needs at least one micro-batch, not 0");
  CHECK(test::error_of([] { (void)parse_pipeline_kind("interleaved"); }) ==
        "pipeline schedule 'interleaved' is not one of: 1f1b, gpipe");
  CHECK(parse_pipeline_kind("1F1B") == PipelineKind::k1F1B);
  CHECK(parse_pipeline_kind("GPipe") == PipelineKind::kGPipe);
}
