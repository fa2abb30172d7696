// Model and pipeline parallelism on the host backend, in-process ranks with
// one torch thread each:
//
//   bubble   a model of equal stages (Linear + tanh layers) cut into pp
//            stages, 1F1B and GPipe, m micro-batches: each stage's idle
//            share of a batch (1 - its forward and backward seconds / the
//            batch's, the engine's micro-steps left out of both) against
//            the (p - 1) / (m + p - 1) of equal stages.
//   tp / dp  the same MLP blocks (column- then row-parallel) on 2 ranks as
//            tp = 2 (each rank half of every layer, the whole batch) and as
//            dp = 2 (each rank the whole model, half the batch), ZeRO stage
//            1, the median step.
//
// The idle share counts transfers as idle, as a real pipeline's bubble
// does; with more stages than cores the ranks also wait for a core, which
// shows as idle too: read rows with pp above the core count with that in
// mind.
//
//   parallel_bench [--width 512] [--layers 8] [--rows 32] [--steps 5] [--pp 2,4] [--micro 1,2,4,8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli/cli.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/engine/engine.h"
#include "zest/memory/caching_allocator.h"
#include "zest/memory/raw_allocator.h"
#include "zest/torch/pipeline_stage.h"
#include "zest/torch/tensor_parallel.h"
#include "zest/torch/torch_module.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int64_t width = 512;
  int layers = 8;  // in all, over the stages
  int64_t rows = 32;
  int steps = 5;
  std::vector<int> pp{2, 4};
  std::vector<int> micro{1, 2, 4, 8};
  bool verbose = false;  // each stage's seconds per step
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

zest::EngineConfig engine_config(int stage, int accumulation) {
  zest::EngineConfig c;
  c.zero.stage = stage;
  c.gradient_accumulation_steps = accumulation;
  c.optimizer.kind = zest::OptimizerKind::kAdamW;
  c.optimizer.lr = 1e-4f;
  return c;
}

// The median over steps (after one untimed) of the stages' mean idle share.
double measured_bubble(const Options& o, int pp, int m, zest::PipelineKind kind) {
  std::vector<std::vector<double>> idle(static_cast<size_t>(o.steps));
  std::mutex mutex;
  zest::run_inprocess(pp, [&](zest::Communicator& comm) {
    torch::set_num_threads(1);
    const std::unique_ptr<zest::Communicator> dp = comm.split(comm.rank(), 0);
    zest::CachingAllocator alloc(zest::make_host_allocator());
    zest::Engine engine(engine_config(0, m), *dp, alloc, zest::Stream::default_for(zest::Device::host()));
    auto stage = std::make_shared<torch::nn::Sequential>();
    for (int i = 0; i < o.layers / pp; ++i) {
      (*stage)->push_back(torch::nn::Linear(o.width, o.width));
      (*stage)->push_back(torch::nn::Tanh());
    }
    zest::TorchModule zt(engine, *stage);
    zest::PipelineOptions po;
    po.schedule = kind;
    po.micro_batches = m;
    po.activation_shape = {o.rows, o.width};
    zest::PipelineStage pipe(comm, zt, po);
    const torch::Tensor x = torch::randn({o.rows, o.width});
    for (int s = 0; s <= o.steps; ++s) {
      const zest::PipelineStage::Result r = pipe.run(
          [&](int, const torch::Tensor& in) { return (*stage)->forward(in.defined() ? in : x); },
          [&](int, const torch::Tensor& out) { return out.pow(2).mean(); });
      if (s == 0) continue;
      const std::lock_guard<std::mutex> lock(mutex);
      if (o.verbose)
        fmt::print("  {} pp {} m {} step {} stage {}: batch {:.2f} ms, compute {:.2f}, micro-steps {:.2f}\n",
                   zest::pipeline_kind_name(kind), pp, m, s, comm.rank(), 1e3 * r.batch_seconds,
                   1e3 * r.compute_seconds, 1e3 * r.step_seconds);
      // The schedule's time, without the engine's micro-steps (the optimizer
      // step is not part of the bubble's arithmetic).
      idle[static_cast<size_t>(s - 1)].push_back(1.0 - r.compute_seconds / (r.batch_seconds - r.step_seconds));
    }
  });
  std::vector<double> per_step;
  for (const auto& v : idle) {
    double sum = 0;
    for (double x : v) sum += x;
    per_step.push_back(sum / static_cast<double>(v.size()));
  }
  return median(per_step);
}

// The median step, in ms, of the MLP blocks on 2 ranks as tp = 2 or dp = 2.
double mlp_step_ms(const Options& o, bool tensor_parallel) {
  std::vector<double> ms;
  std::mutex mutex;
  zest::run_inprocess(2, [&](zest::Communicator& comm) {
    torch::set_num_threads(1);
    // tp = 2: one model over both ranks, ZeRO over a group of one; dp = 2:
    // the whole model on each, ZeRO over both.
    const std::unique_ptr<zest::Communicator> single = comm.split(comm.rank(), 0);
    zest::Communicator& dp = tensor_parallel ? *single : comm;
    zest::CachingAllocator alloc(zest::make_host_allocator());
    zest::Engine engine(engine_config(1, 1), dp, alloc, zest::Stream::default_for(zest::Device::host()));
    auto model = std::make_shared<torch::nn::Sequential>();
    for (int i = 0; i < o.layers / 2; ++i) {
      if (tensor_parallel) {
        (*model)->push_back(zest::tp::ColumnParallelLinear(comm, zest::tp::ParallelLinearOptions(o.width, 4 * o.width)));
        (*model)->push_back(torch::nn::GELU());
        (*model)->push_back(zest::tp::RowParallelLinear(comm, zest::tp::ParallelLinearOptions(4 * o.width, o.width)));
      } else {
        (*model)->push_back(torch::nn::Linear(o.width, 4 * o.width));
        (*model)->push_back(torch::nn::GELU());
        (*model)->push_back(torch::nn::Linear(4 * o.width, o.width));
      }
    }
    zest::TorchModule zt(engine, *model);
    const int64_t rows = tensor_parallel ? 2 * o.rows : o.rows;  // the same global batch of 2 x rows
    const torch::Tensor x = torch::randn({rows, o.width});
    for (int s = 0; s <= o.steps; ++s) {
      const auto t0 = Clock::now();
      zt.scale((*model)->forward(x).pow(2).mean()).backward();
      (void)zt.step();
      const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (s > 0 && comm.rank() == 0) {
        const std::lock_guard<std::mutex> lock(mutex);
        ms.push_back(t);
      }
    }
  });
  return median(ms);
}

Options parse(int argc, char** argv, std::string& usage) {
  Options o;
  cli::App app("parallel_bench: the pipeline bubble against its formula, and tp = 2 against dp = 2", "parallel_bench");
  app.add_option("--width", o.width, "the layers' width")->check(cli::Range(int64_t{8}, int64_t{1} << 14));
  app.add_option("--layers", o.layers, "layers in all")->check(cli::Range(1, 1024));
  app.add_option("--rows", o.rows, "rows of a micro-batch")->check(cli::Range(int64_t{1}, int64_t{1} << 16));
  app.add_option("--steps", o.steps, "timed steps")->check(cli::Range(1, 1000));
  app.add_option("--pp", o.pp, "pipeline sizes")->delimiter(',')->check(cli::Range(2, 64));
  app.add_option("--micro", o.micro, "micro-batch counts")->delimiter(',')->check(cli::Range(1, 1024));
  app.add_flag("--verbose", o.verbose, "each stage's batch, compute and micro-step seconds per step");
  usage = app.help();
  cli::parse(app, argc, argv);
  for (int p : o.pp)
    if (o.layers % p != 0) cli::usage_error("--layers {} does not divide into {} stages", o.layers, p);
  if (o.layers % 2 != 0) cli::usage_error("--layers {} must be even (the MLP blocks are pairs)", o.layers);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string usage;
  try {
    o = parse(argc, argv, usage);
  } catch (const cli::UsageError& e) {
    return cli::usage_exit("parallel_bench", e, usage);
  }
  try {
    fmt::print("parallel_bench ({} build): width {}, {} layers, micro-batch {} rows, median of {} steps, "
               "{} hardware threads\n\n",
               ZEST_BENCH_BUILD_TYPE, o.width, o.layers, o.rows, o.steps, std::thread::hardware_concurrency());
    fmt::print("{:<8} {:>4} {:>6} {:>10} {:>10} {:>10}\n", "schedule", "pp", "micro", "idle", "formula", "x formula");
    for (const zest::PipelineKind kind : {zest::PipelineKind::k1F1B, zest::PipelineKind::kGPipe})
      for (int p : o.pp)
        for (int m : o.micro) {
          const double got = measured_bubble(o, p, m, kind);
          const double want = zest::pipeline_bubble(p, m);
          fmt::print("{:<8} {:>4} {:>6} {:>10.3f} {:>10.3f} {:>10.2f}\n", zest::pipeline_kind_name(kind), p, m, got,
                     want, got / want);
          std::fflush(stdout);
        }
    const double dp = mlp_step_ms(o, false);
    const double tp = mlp_step_ms(o, true);
    fmt::print("\nMLP blocks on 2 ranks, global batch {} rows, ZeRO stage 1: dp = 2 {:.1f} ms, tp = 2 {:.1f} ms, "
               "tp / dp = {:.2f}\n",
               2 * o.rows, dp, tp, tp / dp);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parallel_bench: %s\n", e.what());
    return 1;
  }
}
