// The GPT example's model (examples/gpt) trained through zest::TorchModule:
// a few steps at stages 0-3 on 2 in-process ranks give the same losses, the
// same validation loss, the same parameters and the same sampled text, bit
// for bit, and the loss falls; a run saved and resumed continues exactly.
// Also the corpus split and the batch rows, the parameter count, and the
// timing line that bench/peer_compare.py reads.
#include <bit>
#include <filesystem>

#include "common/corpus.h"
#include "gpt_test_text.h"
#include "common/report.h"
#include "model.h"
#include "sample.h"
#include "trainer.h"
#include "torch_doctest.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/memory/raw_allocator.h"

namespace test_gpt_example {

namespace {

gpt::Config tiny() {
  gpt::Config c;
  c.context = 16;
  c.layers = 2;
  c.heads = 2;
  c.d_model = 32;
  return c;
}

constexpr int64_t kRows = 8;  // global batch
constexpr uint64_t kSeed = 7;

zest::EngineConfig config(int stage, bool offload) {
  zest::EngineConfig c;
  if (offload) c.offload_optimizer.device = zest::OffloadDevice::kCpu;
  c.zero.stage = stage;
  c.zero.stage3_param_persistence_threshold = 0;  // every unit sharded
  c.zero.reduce_bucket_size = 3000;               // several buckets
  c.optimizer.lr = 1e-2f;
  c.optimizer.beta2 = 0.95f;
  c.gradient_clipping = 1.0;
  return c;
}

struct Run {
  std::vector<float> losses;  // per step, the mean over ranks
  double val_loss = 0.0;
  std::vector<std::vector<float>> masters;  // per parameter, fp32
  std::string sample;
};

// Steps [first, last) at `stage` on 2 ranks, loading `load` first and saving
// to `save` after, when given.
// With `offload`, the optimizer state lives in host memory (the example's
// --offload).
Run train(int stage, int64_t first, int64_t last, const std::string& load = "", const std::string& save = "",
          bool offload = false) {
  const examples::Corpus corpus = examples::Corpus::from_text(gpt_test_text());
  std::vector<Run> runs(2);
  zest::run_inprocess(2, [&](zest::Communicator& comm) {
    torch::set_num_threads(1);
    zest::CachingAllocator alloc(zest::make_host_allocator());
    zest::Engine engine(config(stage, offload), comm, alloc, zest::Stream::default_for(comm.device()));
    gpt::Gpt model(tiny(), kSeed);
    const auto zt = gpt::wrap(engine, model);
    if (!load.empty()) zt->load(load);
    Run& r = runs[static_cast<size_t>(comm.rank())];
    const int64_t rows = kRows / comm.size();
    for (int64_t s = first; s < last; ++s) {
      const gpt::MicroStep m = gpt::train_micro_step(
          *zt, *model, corpus.train_batch(s, comm.rank() * rows, rows, tiny().context, kSeed));
      REQUIRE(m.result.applied);
      r.losses.push_back(m.loss);
    }
    r.val_loss = gpt::validation_loss(*zt, *model, corpus, 4);
    // By parameter: a unit's flat buffer pads differently at stage 0.
    for (const zest::UnitLayout& u : engine.layout().units()) {
      for (const zest::ParamLayout& p : u.params) r.masters.push_back(engine.param_master(p.name));
    }
    r.sample = gpt::generate(*model, gpt::runner(*zt), "The ", {.length = 24, .temperature = 0.8, .seed = 3});
    if (!save.empty()) zt->save(save);
  });
  Run out = runs[0];
  for (size_t s = 0; s < out.losses.size(); ++s) out.losses[s] = (runs[0].losses[s] + runs[1].losses[s]) / 2.0f;
  CHECK(runs[1].val_loss == runs[0].val_loss);  // every rank the same sum, in rank order
  CHECK(runs[1].sample == runs[0].sample);
  return out;
}

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> out;
  for (float x : v) out.push_back(std::bit_cast<uint32_t>(x));
  return out;
}

}  // namespace

TEST_CASE("gpt example: stages 0-3 on 2 ranks, and 1-3 with --offload, agree bit for bit, and the loss falls") {
  constexpr int64_t kSteps = 12;
  const Run s0 = train(0, 0, kSteps);
  // The loss falls: the last steps' mean well under the first's, and under
  // ln(256) = 5.55, where an untrained byte model starts.
  REQUIRE(s0.losses.size() == kSteps);
  CHECK(s0.losses[0] > 5.0f);
  CHECK(s0.losses[0] < 5.8f);
  const float tail = (s0.losses[kSteps - 1] + s0.losses[kSteps - 2]) / 2.0f;
  CHECK(tail < s0.losses[0] - 1.0f);
  CHECK(s0.val_loss < static_cast<double>(s0.losses[0]) - 0.5);
  for (int stage = 1; stage <= 3; ++stage) {
    for (bool offload : {false, true}) {
      CAPTURE(stage);
      CAPTURE(offload);
      const Run s = train(stage, 0, kSteps, "", "", offload);
      CHECK(bits(s.losses) == bits(s0.losses));
      CHECK(std::bit_cast<uint64_t>(s.val_loss) == std::bit_cast<uint64_t>(s0.val_loss));
      REQUIRE(s.masters.size() == s0.masters.size());
      for (size_t u = 0; u < s.masters.size(); ++u) CHECK(bits(s.masters[u]) == bits(s0.masters[u]));
      CHECK(s.sample == s0.sample);
    }
  }
}

TEST_CASE("gpt example: a run saved at step 4 and resumed at stage 3 continues as if never stopped") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "zest_test_gpt_resume";
  std::filesystem::remove_all(dir);
  const Run straight = train(2, 0, 8);
  train(2, 0, 4, "", dir.string());
  const Run resumed = train(3, 4, 8, dir.string());
  const std::vector<float> tail(straight.losses.begin() + 4, straight.losses.end());
  CHECK(bits(resumed.losses) == bits(tail));
  CHECK(std::bit_cast<uint64_t>(resumed.val_loss) == std::bit_cast<uint64_t>(straight.val_loss));
  for (size_t u = 0; u < straight.masters.size(); ++u) CHECK(bits(resumed.masters[u]) == bits(straight.masters[u]));
  std::filesystem::remove_all(dir);
}

TEST_CASE("gpt corpus: every 20th cookie is held out, and a row is the same whichever rank takes it") {
  const examples::Corpus c = examples::Corpus::from_text(gpt_test_text());
  CHECK(c.cookies() == 24);
  // Cookies 0 and 20 held out.
  CHECK(c.validation() ==
        "The early bird gets the worm.\n\t-- proverb 0\n%\nActions speak louder than words.\n\t-- proverb 20\n%\n");
  CHECK(c.train().find("proverb 1\n%\n") != std::string::npos);
  CHECK(c.train().find("proverb 20\n") == std::string::npos);
  const examples::Batch whole = c.train_batch(5, 0, 4, 16, 9);
  const examples::Batch part = c.train_batch(5, 2, 2, 16, 9);
  CHECK(torch::equal(whole.inputs.slice(0, 2, 4), part.inputs));
  CHECK(torch::equal(whole.targets.slice(0, 2, 4), part.targets));
  // Targets are the inputs shifted by one byte.
  CHECK(torch::equal(whole.inputs.slice(1, 1, 16), whole.targets.slice(1, 0, 15)));
  CHECK_FALSE(torch::equal(c.train_batch(6, 0, 4, 16, 9).inputs, whole.inputs));
  CHECK(examples::decode(examples::encode("fortune\n")) == "fortune\n");
  CHECK_THROWS_WITH_AS(examples::Corpus::load("/nonexistent/fortunes"), doctest::Contains("apt-get install fortunes"),
                       std::runtime_error);
}

TEST_CASE("gpt model: the parameter count, tied and untied, and GPT-2 small's") {
  for (bool tied : {true, false}) {
    gpt::Config c = tiny();
    c.tied_head = tied;
    gpt::Gpt m(c, 1);
    int64_t n = 0;
    for (const auto& p : m->parameters()) n += p.numel();
    CHECK(n == c.parameters());
  }
  gpt::Config small{.vocab = 50257, .context = 1024, .layers = 12, .heads = 12, .d_model = 768};
  CHECK(small.parameters() == 124'439'808);  // GPT-2 small, as Hugging Face counts it
  gpt::Config bad = tiny();
  bad.heads = 3;
  CHECK_THROWS_AS(bad.validate(), std::invalid_argument);
}

TEST_CASE("gpt timing line: medians after the untimed steps, an even count's as Python's statistics.median") {
  CHECK(examples::median({}) == 0.0);
  CHECK(examples::median({3.0, 1.0, 2.0}) == 2.0);
  CHECK(examples::median({4.0, 1.0, 3.0, 2.0}) == 2.5);

  examples::StepTimings t(/*untimed=*/2);
  t.add(100.0, zest::StepTimes{.reduce_ms = 50.0, .norm_ms = 50.0, .optimizer_ms = 50.0, .gather_ms = 50.0});
  t.add(90.0, zest::StepTimes{.reduce_ms = 40.0});
  t.add(10.0, zest::StepTimes{.reduce_ms = 1.0, .norm_ms = 0.5, .optimizer_ms = 2.0, .gather_ms = 0.25});
  t.add(12.0, zest::StepTimes{.reduce_ms = 3.0, .norm_ms = 0.5, .optimizer_ms = 4.0, .gather_ms = 0.75});
  t.add(11.5, zest::StepTimes{.reduce_ms = 2.5, .norm_ms = 1.5, .optimizer_ms = 3.0, .gather_ms = 0.5});
  CHECK(t.format() ==
        "step_ms_median=11.500 timed_steps=3 reduce_ms=2.500 norm_ms=0.500 optimizer_ms=3.000 gather_ms=0.500");

  // No more steps than the untimed ones: all of them count.
  examples::StepTimings few(/*untimed=*/3);
  few.add(7.0, zest::StepTimes{.reduce_ms = 1.0});
  few.add(9.0, zest::StepTimes{.reduce_ms = 2.0});
  CHECK(few.format() ==
        "step_ms_median=8.000 timed_steps=2 reduce_ms=1.500 norm_ms=0.000 optimizer_ms=0.000 gather_ms=0.000");
}

}  // namespace test_gpt_example
