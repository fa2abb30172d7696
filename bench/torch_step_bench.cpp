// A libtorch training step, plain and through ZEST: the GPT of examples/gpt
// (a mid size by default) and the same global batch, one process.
//
//   plain libtorch   forward, backward, torch::optim::AdamW, one thread
//   ZEST 1 rank      stage 0 through zest::TorchModule, one thread
//   ZEST N ranks     stages 0-3 on N in-process ranks (threads), one torch
//                    thread each, each rank on its share of the batch
//
// Per configuration: the median time of a step (the global batch; rank 0's
// clock, every step ending in the engine's collectives), the fastest of
// several rounds, and each rank's peak memory outside the activations: for
// ZEST the engine allocator's bytes in use at their highest over the steps
// (parameters, gathered ones included, gradients, master weights, optimizer
// state, communication buffers, all at once); for plain libtorch counted
// from the tensors it holds through a step (parameters, gradients, AdamW's
// two moments). Torch's activations are in neither. Ratios are against
// plain libtorch measured in this run. Targets (issue 14): ZEST on 1 rank no
// slower than plain libtorch; stage 3 on 4 ranks at most 1.3x stage 2.
//
//   torch_step_bench [--layers 4] [--d-model 256] [--heads 4] [--context 128] [--batch 16]
//                    [--steps 6] [--rounds 3] [--ranks 2,4]
//   torch_step_bench --unused-unit
//   torch_step_bench --loss-memory
//
// --loss-memory instead measures the head and loss's peak memory with a
// Llama-3 vocabulary (128256) at 2048 and 4096 tokens (hidden 256): the
// whole logits and torch's cross_entropy against zest::chunked_cross_entropy_sum
// in chunks of 512 tokens, forward and backward; libtorch's host tensors of
// 2 MiB and more counted by the huge-page cache (torch/host_tensor_allocator.h),
// its peak in use above what was in use before. The chunked runs go first,
// since the cache's peak only grows.
//
// --unused-unit instead counts the collectives of stage-3 steps on 2
// in-process ranks over a model of three units (fc1, skip, fc2) whose middle
// one the forward uses every other step: a step that leaves it unused
// reduces it from zeros (every rank joins its reduce-scatter) and gathers
// nothing for it (Engine::no_grads), so step() itself makes no all-gather.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/cli.h"
#include "common/corpus.h"
#include "model.h"
#include "trainer.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/memory/raw_allocator.h"
#include "zest/torch/chunked_loss.h"
#include "zest/torch/host_tensor_allocator.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  gpt::Config model{.vocab = 256, .context = 128, .layers = 4, .heads = 4, .d_model = 256};
  int64_t batch = 16;
  int steps = 6;  // timed, after 2 untimed, per round
  int rounds = 3;
  std::vector<int> ranks{2, 4};
  bool unused_unit = false;
  bool loss_memory = false;
};

constexpr int kWarmup = 2;
constexpr uint64_t kSeed = 1234;
constexpr float kLr = 1e-3f;

struct Result {
  std::string name;
  double ms = 0.0;            // median step
  int64_t peak_bytes = 0;     // per rank (the largest rank's)
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Text for the batches: fortune-like lines, so the bench needs no corpus.
const examples::Corpus& corpus() {
  static const examples::Corpus c = [] {
    std::string t;
    for (int i = 0; i < 2000; ++i) t += fmt::format("Fortune {} favours the {} mind.\n%\n", i, i % 3 ? "prepared" : "idle");
    return examples::Corpus::from_text(t);
  }();
  return c;
}

Result plain(const Options& o) {
  torch::set_num_threads(1);
  gpt::Gpt model(o.model, kSeed);
  torch::optim::AdamW adamw(model->parameters(),
                            torch::optim::AdamWOptions(kLr).betas({0.9, 0.95}).weight_decay(0.01));
  std::vector<double> ms;
  for (int s = 0; s < kWarmup + o.steps; ++s) {
    const examples::Batch b = corpus().train_batch(s, 0, o.batch, o.model.context, kSeed);
    const auto t0 = Clock::now();
    adamw.zero_grad();
    gpt::lm_loss(model->forward(b.inputs), b.targets).backward();
    adamw.step();
    if (s >= kWarmup) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  int64_t bytes = 0;
  for (const auto& p : model->parameters()) bytes += 4 * p.numel() * (1 + 1 + 2);  // value, grad, m, v
  return {"plain libtorch, AdamW", median(ms), bytes};
}

Result zest_run(const Options& o, int stage, int world) {
  zest::EngineConfig config;
  config.zero.stage = stage;
  config.zero.stage3_param_persistence_threshold = 0;  // every unit sharded at stage 3
  config.optimizer.lr = kLr;
  config.optimizer.beta2 = 0.95f;
  std::vector<double> ms;
  std::vector<int64_t> peaks(static_cast<size_t>(world));
  zest::run_inprocess(world, [&](zest::Communicator& comm) {
    torch::set_num_threads(1);
    zest::CachingAllocator alloc(zest::make_host_allocator());
    zest::Engine engine(config, comm, alloc, zest::Stream::default_for(comm.device()));
    gpt::Gpt model(o.model, kSeed);
    const auto zt = gpt::wrap(engine, model);
    alloc.reset_peak_stats();  // the steps' peak, not finalize's staging
    const int64_t rows = o.batch / world;
    for (int s = 0; s < kWarmup + o.steps; ++s) {
      const examples::Batch b = corpus().train_batch(s, comm.rank() * rows, rows, o.model.context, kSeed);
      const auto t0 = Clock::now();
      gpt::train_micro_step(*zt, *model, b);
      if (comm.rank() == 0 && s >= kWarmup) {
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
    }
    peaks[static_cast<size_t>(comm.rank())] =
        zest::at(alloc.stats().requested_bytes, zest::StatPool::kAggregate).peak;
  });
  return {fmt::format("ZEST stage {}, {} rank{}", stage, world, world > 1 ? "s" : ""), median(ms),
          *std::max_element(peaks.begin(), peaks.end())};
}

// --unused-unit: see the header comment.
struct Branchy : torch::nn::Module {
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(64, 256))};
  torch::nn::Linear skip{register_module("skip", torch::nn::Linear(256, 256))};
  torch::nn::Linear fc2{register_module("fc2", torch::nn::Linear(256, 8))};
};

void count_unused_unit_collectives() {
  zest::EngineConfig config;
  config.zero.stage = 3;
  config.zero.stage3_param_persistence_threshold = 0;  // every unit sharded
  config.zero.stage3_prefetch_bucket_size = 0;         // gathered where called, not ahead
  fmt::print("torch_step_bench --unused-unit: stage 3, 2 in-process ranks, units fc1, skip, fc2; skip used on odd "
             "steps\n{:<6} {:>10} {:>22} {:>19} {:>16}\n",
             "step", "skip used", "all-gathers fwd+bwd", "all-gathers step()", "reduce-scatters");
  zest::run_inprocess(2, [&](zest::Communicator& comm) {
    torch::set_num_threads(1);
    zest::CachingAllocator alloc(zest::make_host_allocator());
    zest::Engine engine(config, comm, alloc, zest::Stream::default_for(comm.device()));
    torch::manual_seed(kSeed);
    auto model = std::make_shared<Branchy>();
    zest::TorchModule zt(engine, model);
    for (int step = 0; step < 4; ++step) {
      const bool used = step % 2 == 1;  // the same on every rank, as the engine requires
      const torch::Tensor x = torch::randn({16, 64});
      const torch::Tensor y = torch::randn({16, 8});
      comm.reset_counters();
      torch::Tensor h = zt.forward(model->fc1, x);
      if (used) h = h + zt.forward(model->skip, h);
      zt.scale(torch::mse_loss(zt.forward(model->fc2, h), y)).backward();
      const uint64_t gathers = comm.counters()[zest::CollectiveKind::kAllGather].calls;
      zt.step();
      const auto& c = comm.counters();
      if (comm.rank() == 0) {
        fmt::print("{:<6} {:>10} {:>22} {:>19} {:>16}\n", step, used ? "yes" : "no", gathers,
                   c[zest::CollectiveKind::kAllGather].calls - gathers, c[zest::CollectiveKind::kReduceScatter].calls);
      }
    }
  });
}

// --loss-memory: see the header comment.
void measure_loss_memory() {
  if (!zest::use_huge_page_host_tensors()) throw std::runtime_error("the huge-page cache is off (ZEST_HOST_TENSOR_CACHE=0)");
  constexpr int64_t kVocab = 128256, kHidden = 256, kChunk = 512;
  torch::manual_seed(kSeed);
  const torch::Tensor weight = (torch::randn({kVocab, kHidden}) * 0.02).requires_grad_(true);
  fmt::print("torch_step_bench --loss-memory: vocab {}, hidden {}, fp32; peak MiB of libtorch's host tensors above the "
             "start, forward and backward\n{:<8} {:>16} {:>20} {:>10}\n",
             kVocab, kHidden, "tokens", "chunked (512)", "whole logits", "ratio");
  struct Row {
    double chunked = 0, whole = 0, loss_chunked = 0, loss_whole = 0;  // MiB; the losses keep the work alive
  };
  std::map<int64_t, Row> rows;
  const auto peak_above = [](const std::function<double()>& run, double& loss) {
    const size_t before = zest::host_tensor_memory().in_use_bytes;
    loss = run();
    return static_cast<double>(zest::host_tensor_memory().peak_in_use_bytes - before) / (1 << 20);
  };
  for (const int64_t tokens : {2048, 4096}) {
    const torch::Tensor hidden = torch::randn({tokens, kHidden}).requires_grad_(true);
    const torch::Tensor targets = torch::randint(0, kVocab, {tokens}, torch::kLong);
    rows[tokens].chunked = peak_above(
        [&] {
          const torch::Tensor loss = zest::chunked_cross_entropy_sum(hidden, weight, targets, kChunk);
          loss.backward();
          weight.mutable_grad() = torch::Tensor();
          return loss.item<double>();
        },
        rows[tokens].loss_chunked);
  }
  for (const int64_t tokens : {2048, 4096}) {
    torch::manual_seed(kSeed + 1);
    const torch::Tensor hidden = torch::randn({tokens, kHidden}).requires_grad_(true);
    const torch::Tensor targets = torch::randint(0, kVocab, {tokens}, torch::kLong);
    rows[tokens].whole = peak_above(
        [&] {
          const torch::Tensor loss = torch::nn::functional::cross_entropy(
              torch::matmul(hidden, weight.t()), targets,
              torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
          loss.backward();
          weight.mutable_grad() = torch::Tensor();
          return loss.item<double>();
        },
        rows[tokens].loss_whole);
  }
  for (const auto& [tokens, r] : rows) {
    fmt::print("{:<8} {:>16.1f} {:>20.1f} {:>10.3f}\n", tokens, r.chunked, r.whole, r.chunked / r.whole);
  }
}

// Throws cli::UsageError for --help and for a bad flag; `usage` is the help
// either way.
Options parse(int argc, char** argv, std::string& usage) {
  Options o;
  cli::App app("torch_step_bench: a libtorch training step, plain and through zest::TorchModule", "torch_step_bench");
  app.add_option("--layers", o.model.layers)->check(cli::Range(int64_t{1}, int64_t{1024}));
  app.add_option("--d-model", o.model.d_model)->check(cli::Range(int64_t{1}, int64_t{1} << 16));
  app.add_option("--heads", o.model.heads)->check(cli::Range(int64_t{1}, int64_t{1024}));
  app.add_option("--context", o.model.context)->check(cli::Range(int64_t{2}, int64_t{1} << 16));
  app.add_option("--batch", o.batch)->check(cli::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--steps", o.steps)->check(cli::Range(1, 1 << 20));
  app.add_option("--rounds", o.rounds)->check(cli::Range(1, 1000));
  app.add_option("--ranks", o.ranks)->delimiter(',')->check(cli::Range(1, 64));
  app.add_flag("--unused-unit", o.unused_unit, "count the collectives of steps that leave a unit unused");
  app.add_flag("--loss-memory", o.loss_memory, "the chunked loss's peak memory against the whole logits'");
  usage = app.help();
  cli::parse(app, argc, argv);
  for (int w : o.ranks) {
    if (o.batch % w != 0) cli::usage_error("--batch {} does not divide into {} ranks", o.batch, w);
  }
  if (o.model.d_model % o.model.heads != 0) cli::usage_error("--d-model does not divide into --heads");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string usage;
  try {
    o = parse(argc, argv, usage);
  } catch (const cli::UsageError& e) {
    return cli::usage_exit("torch_step_bench", e, usage);
  }
  try {
    if (o.unused_unit) {
      count_unused_unit_collectives();
      return 0;
    }
    if (o.loss_memory) {
      measure_loss_memory();
      return 0;
    }
    fmt::print("torch_step_bench ({} build, libtorch {}.{}): GPT of {} parameters ({}), global batch {} x {} "
               "tokens, AdamW, fp32, one torch thread per rank, per configuration the fastest of {} rounds' median of {} "
               "steps after {}\n",
               ZEST_BENCH_BUILD_TYPE, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, o.model.parameters(),
               o.model.str(), o.batch, o.model.context, o.rounds, o.steps, kWarmup);
    fmt::print("peak: the engine allocator's bytes in use at their highest over the steps, per rank (ZEST); parameters, "
               "gradients and AdamW's moments (plain libtorch); activations are in neither\n\n");
    std::fflush(stdout);
    // Every configuration once per round, the rounds one after another, and
    // each configuration's fastest round kept: on a machine shared with
    // other work, load that comes and goes then costs every configuration
    // alike instead of whichever ran at the time.
    std::vector<std::function<Result()>> runs = {[&] { return plain(o); }, [&] { return zest_run(o, 0, 1); }};
    for (int w : o.ranks) {
      for (int stage = 0; stage <= 3; ++stage) runs.push_back([&o, stage, w] { return zest_run(o, stage, w); });
    }
    std::vector<Result> rows;
    for (int round = 0; round < o.rounds; ++round) {
      for (size_t i = 0; i < runs.size(); ++i) {
        const Result r = runs[i]();
        if (round == 0) {
          rows.push_back(r);
        } else {
          rows[i].ms = std::min(rows[i].ms, r.ms);
        }
      }
    }
    const Result& base = rows[0];
    fmt::print("{:<24} {:>10} {:>10} {:>14} {:>10}\n", "configuration", "ms/step", "x plain", "peak MiB/rank",
               "x plain");
    for (const Result& r : rows) {
      fmt::print("{:<24} {:>10.1f} {:>10.2f} {:>14.2f} {:>10.2f}\n", r.name, r.ms, r.ms / base.ms,
                 static_cast<double>(r.peak_bytes) / (1 << 20),
                 static_cast<double>(r.peak_bytes) / static_cast<double>(base.peak_bytes));
    }
    fmt::print("\ntargets: ZEST 1 rank / plain = {:.2f} (<= 1.0)", rows[1].ms / base.ms);
    for (size_t i = 2; i + 3 < rows.size(); i += 4) {
      fmt::print("; stage 3 / stage 2 on {} ranks = {:.2f}", o.ranks[(i - 2) / 4], rows[i + 3].ms / rows[i + 2].ms);
    }
    fmt::print(" (<= 1.3 on 4 ranks)\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_step_bench: %s\n", e.what());
    return 1;
  }
}
