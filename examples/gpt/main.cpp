// Trains the GPT of model.h on Debian's fortune cookies (common/corpus.h) through
// the ZeRO engine, wrapped around the libtorch module by zest::TorchModule:
// prints loss, validation loss, tokens/s and each rank's memory by category
// against the memory estimator, then a sample of generated text.
//
//   gpt --ranks 4 --stage 3                  4 in-process ranks (threads)
//   gpt --ranks 4 --stages 0,1,2,3           each stage in turn, then a table
//                                            (the same validation loss, bit
//                                            for bit, at every stage)
//   mpirun -np 4 gpt --launch --stage 2      one process per rank (MPI)
//   gpt --steps 100 --schedule-steps 200 --save ckpt
//   gpt --steps 100 --schedule-steps 200 --load ckpt --export gpt.safetensors
//   gpt --stage 3 --export-hf pretrained     a Hugging Face directory (config.json, shards)
//   gpt --hf pretrained --lora 8 --stage 3   fine-tune it with rank-8 adapters, the base frozen
//   gpt --device cuda --stages 0,1,2,3       on the GPU (in-process ranks share it; under a
//                                            launcher each rank takes cuda:(local rank), NCCL)
//   gpt --ranks 8 --tp 2 --pp 2 --accum 4    a device mesh, dp x tp x pp = 2 x 2 x 2: each layer
//                                            split over 2 ranks, the blocks over 2 pipeline stages
//                                            running 4 micro-batches 1F1B (common/mesh_trainer.h)
//   gpt --ranks 4 --tp 2 --pp 2 --export gpt.safetensors
//                                            the whole model from the mesh: the file
//                                            --ranks 1 writes (checkpoint/whole_model.h)
//
// Threads: libtorch's intra-op pool (OpenMP here) would give every rank as
// many threads as the machine has cores, so 4 in-process ranks on 2 cores
// would run 8 busy threads that wait on each other at every collective.
// Each rank sets torch::set_num_threads(--threads, default 1) on its own
// thread (OpenMP's thread count is per thread), which also keeps a rank's
// arithmetic, and so the comparison across stages, independent of how
// busy the machine is. Under mpirun the same holds per process.
//
// The global batch of a step is the same whatever the number of ranks: row
// r of step s is a window of the text drawn from (seed, s, r) alone, and
// each rank takes its rows, split again into accumulation micro-batches.
//
// Each stage ends with a line for scripts (bench/peer_compare.py):
//   timing stage=2 ranks=2 step_ms_median=12.345 timed_steps=17 reduce_ms=...
// the median of rank 0's step times (batch, forward, backward, step) and of
// the engine's phases in them (examples::StepTimings), leaving out the first
// kUntimedSteps steps (allocations, first gathers) when there are more;
// bench/peer/gpt_torch.py times its steps the same way.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/corpus.h"
#include "common/describe_model.h"
#include "common/lm_pretrained.h"
#include "common/lm_training.h"
#include "common/mesh_trainer.h"
#include "common/report.h"
#include "common/weights_digest.h"
#include "options.h"
#include "sample.h"
#include "trainer.h"
#include "zest/checkpoint/checkpoint.h"
#include "zest/comm/mpi_comm.h"
#include "zest/core/process_memory.h"
#include "zest/launch/bootstrap.h"
#include "zest/memory/raw_allocator.h"
#include "zest/torch/host_tensor_allocator.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kUntimedSteps = 3;  // see the top of this file

struct RunResult {
  double val_loss = 0.0;
  double tokens_per_s = 0.0;
  std::string timing;  // examples::StepTimings::format(), rank 0's clock
  std::vector<zest::MemoryReport> memory;  // every rank's
  zest::MemoryEstimate estimate;
  std::string sample;  // generated at the end (every rank the same)
};

RunResult train(const gpt::Options& opt, const examples::Corpus& corpus, const zest::EngineConfig& config,
                zest::Communicator& comm) {
  torch::set_num_threads(opt.threads);  // see the top of this file
  const bool printer = comm.rank() == 0;
  examples::NamedOptions shared = examples::shared_run_options(opt, opt, opt);
  shared.insert(shared.end(), {{"the model (--layers, --heads, --d-model, ...)", opt.model.to_json(opt.pretrained_dtype)},
                               {"--stages", fmt::format("{}", fmt::join(opt.stages, ","))},
                               {"--dtype", opt.dtype},
                               {"--offload-param", fmt::format("{}", opt.offload_param)},
                               {"--config", opt.config_path},
                               {"--accum", fmt::format("{}", opt.accum)},
                               {"--warmup", fmt::format("{}", opt.warmup)},
                               {"--schedule-steps", fmt::format("{}", opt.schedule_steps)}});
  examples::check_ranks_agree(comm, shared);
  // With --tp or --pp each rank holds a part of the model and the engine
  // shards it over the data-parallel group; the batch's rows are split
  // over that group.
  std::optional<zest::DeviceMesh> mesh;
  if (opt.mesh()) mesh.emplace(comm, zest::MeshShape{.dp = comm.size() / (opt.tp * opt.pp), .tp = opt.tp, .pp = opt.pp});
  zest::Communicator& group = mesh ? mesh->dp() : comm;
  const int world = group.size(), rank = group.rank();
  // Everything on the communicator's device. The engine works on the
  // device's legacy default stream, which is libtorch's too: the model's
  // kernels and the engine's are ordered without events.
  const zest::Device device = comm.device();
  // On a GPU some of libtorch's kernels add with atomics (the embedding's
  // backward), whose order changes run to run; its deterministic ones keep
  // the stages' results the same bits, as on the host (cuBLAS also wants
  // CUBLAS_WORKSPACE_CONFIG=:4096:8; warn_only: a kernel without a
  // deterministic form warns instead of failing).
  if (device.is_cuda()) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  zest::CachingAllocator allocator(device.is_cuda() ? zest::make_cuda_allocator(device.index())
                                                    : zest::make_host_allocator());
  zest::Engine engine(config, group, allocator, zest::Stream::default_for(device));
  if (mesh) engine.set_model_parallel(mesh->engine_model_parallel());
  gpt::Gpt model(opt.model, opt.seed, examples::placement_of(mesh ? &*mesh : nullptr));
  if (opt.lora_r > 0) zest::enable_lora(*model, gpt::lora_targets(), opt.lora(), opt.seed);
  const std::unique_ptr<zest::TorchModule> zt = gpt::wrap(engine, model);
  if (!opt.hf_dir.empty()) examples::load_pretrained(*zt, opt.hf_dir);

  int64_t first = 0;
  if (!opt.load_dir.empty()) {
    zt->load(opt.load_dir);
    first = engine.progress().applied_steps + engine.progress().skipped_steps;
    if (printer) fmt::print("resumed from {} at step {}\n", opt.load_dir, first);
  }
  const int64_t accum = engine.config().accumulation_steps();  // as the engine resolved it
  const int64_t rows_per_rank = opt.batch / world, rows_per_micro = rows_per_rank / accum;
  const int64_t context = opt.model.context;
  const int64_t windows = examples::validation_windows(corpus, opt.val_windows, context, world);
  examples::MeshTrainer trainer(mesh ? &*mesh : nullptr, *zt, *model, rows_per_micro, context, opt.pipeline_schedule);
  const auto validate = [&](int64_t step) {
    const double v = trainer.validation_loss(corpus, windows);
    if (printer) fmt::print("step {:5d}  validation loss {:.4f}  ({} windows of {} bytes)\n", step, v, windows, context);
    return v;
  };
  validate(first);

  RunResult out;
  double seconds = 0.0;
  examples::StepTimings timings(kUntimedSteps);
  for (int64_t step = first; step < first + opt.steps; ++step) {
    const auto start = Clock::now();
    std::vector<examples::Batch> micro_batches;
    for (int64_t m = 0; m < accum; ++m) {
      micro_batches.push_back(
          corpus.train_batch(step, rank * rows_per_rank + m * rows_per_micro, rows_per_micro, context, opt.seed));
    }
    const examples::MeshTrainer::Step s = trainer.train_step(micro_batches);
    const float loss = s.loss;
    const zest::StepResult& result = s.result;
    const double dt = std::chrono::duration<double>(Clock::now() - start).count();
    seconds += dt;
    timings.add(dt * 1e3, result.times);
    const bool last = step == first + opt.steps - 1;
    // The same decisions on every rank: what follows is collective.
    if ((step - first) % opt.print_every == 0 || last) {
      const float mean = examples::mean_over_ranks(engine, loss);
      if (printer) {
        examples::print_step(step, mean, result, dt * 1e3, static_cast<double>(opt.batch * context) / dt);
      }
    }
    if ((step + 1 - first) % opt.eval_every == 0 && !last) validate(step + 1);
  }
  out.val_loss = opt.steps > 0 ? validate(first + opt.steps) : 0.0;
  out.tokens_per_s = seconds > 0 ? static_cast<double>(opt.steps * opt.batch * context) / seconds : 0.0;
  out.timing = timings.format();
  out.memory = examples::gather_memory(engine);
  out.estimate = zest::estimate_memory(examples::describe_model(engine.layout()),
                                       zest::EstimateOptions::from_config(config, world));
  if (printer) {
    fmt::print("\nmemory per rank by category (the engine's allocator; torch's activations are not in it):\n{}",
               examples::format_memory(out.memory, out.estimate));
    fmt::print("{}", examples::format_process_memory(out.memory, !opt.launch));
    fmt::print("{}", examples::format_host_tensor_cache(zest::host_tensor_memory(),
                                                        opt.launch ? "rank 0 process" : "process"));
  }
  if (!opt.save_dir.empty()) {
    zest::CheckpointOptions co;
    co.exclude_frozen_parameters = opt.lora_r > 0;  // the adapters and their state, not the base
    co.keep_last = opt.save_total_limit;
    const std::string dir = zt->save(opt.save_dir, co);
    if (printer) fmt::print("saved {}\n", dir);
  }
  if (opt.digest) {
    const std::string digest = examples::format_weights_digest(engine, config.zero.stage);
    if (printer) fmt::print("{}\n", digest);
  }
  if (!opt.export_path.empty()) {
    zt->export_safetensors(opt.export_path);
    if (printer) fmt::print("exported {}\n", opt.export_path);
  }
  if (!opt.export_hf_dir.empty()) {
    examples::export_pretrained(engine, opt, opt.model.to_json(opt.pretrained_dtype), opt.pretrained_dtype,
                                gpt::lora_targets(), {opt.save_dir, opt.load_dir, opt.data, opt.export_path});
  }
  if (opt.sample.length > 0) {
    out.sample = gpt::generate([&](const torch::Tensor& tokens) { return trainer.last_logits(tokens); }, context,
                               opt.prompt, opt.sample);
  }
  if (printer) std::fflush(stdout);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const gpt::Options opt = gpt::parse_options(argc, argv);
    // Before any rank's thread uses libtorch: its allocator switch is not
    // synchronized.
    zest::use_huge_page_host_tensors();
    std::unique_ptr<zest::Communicator> launched;
    if (opt.launch) launched = zest::init_distributed(opt.device, opt.comm);
    const bool printer = !launched || launched->rank() == 0;
    const int world = launched ? launched->size() : opt.ranks;
    const int dp = opt.data_parallel(world);
    const examples::Corpus corpus = examples::Corpus::load(opt.data);
    if (printer) {
      fmt::print("corpus {}: {} fortune cookies, {} training bytes, {} validation bytes\n", opt.data,
                 corpus.cookies(), corpus.train().size(), corpus.validation().size());
    }

    std::vector<examples::StageRow> rows;
    std::vector<std::string> samples;  // rank 0's, per stage
    for (int stage : opt.stages) {
      const zest::EngineConfig config = gpt::engine_config(opt, stage, dp);
      if (printer) {
        const std::string mesh = opt.mesh() ? fmt::format(" (dp {} x tp {} x pp {})", dp, opt.tp, opt.pp) : "";
        fmt::print("\n== stage {}: {} ranks{}, GPT of {} parameters ({}), {}, {} ==\n", stage, world, mesh,
                   opt.model.parameters(), opt.model.str(), zest::dtype_name(config.compute_dtype()),
                   zest::optimizer_name(config.optimizer.kind));
        std::fflush(stdout);
      }
      RunResult rank0;
      // Each stage's peak resident memory its own (a stage run before
      // would otherwise set it).
      (void)zest::reset_peak_rss();
      const auto body = [&](zest::Communicator& comm) {
        RunResult r = train(opt, corpus, config, comm);
        // In-process: rank 0's. Under a launcher each process keeps its own
        // (every rank holds every rank's memory and the same losses).
        if (comm.rank() == 0 || launched) rank0 = std::move(r);
      };
      examples::run_on_ranks(launched.get(), opt.ranks, body, opt.comm, opt.device);
      if (printer) {
        fmt::print("timing stage={} ranks={} {}\n", stage, world, rank0.timing);
      }
      samples.push_back(rank0.sample);
      rows.push_back({stage, world, rank0.val_loss, rank0.tokens_per_s, rank0.memory.at(0).model_states(),
                      rank0.estimate.model_state_bytes, examples::memory_matches(rank0.memory, rank0.estimate)});
    }
    if (printer && opt.sample.length > 0) {
      const std::string how = opt.sample.temperature == 0.0
                                  ? std::string("greedy")
                                  : fmt::format("temperature {:g}, seed {}", opt.sample.temperature, opt.sample.seed);
      if (std::all_of(samples.begin(), samples.end(), [&](const std::string& s) { return s == samples[0]; })) {
        fmt::print("\nsample ({}{}):\n{}{}\n", how, samples.size() > 1 ? ", the same text at every stage" : "",
                   opt.prompt, samples[0]);
      } else {
        for (size_t i = 0; i < samples.size(); ++i) {
          fmt::print("\nsample, stage {} ({}; the stages' samples differ):\n{}{}\n", rows[i].stage, how, opt.prompt,
                     samples[i]);
        }
      }
    }
    if (printer) {
      fmt::print("\n{}", examples::format_stage_table(rows));
      for (const examples::StageRow& r : rows) fmt::print("final validation loss, stage {}: {:.17g}\n", r.stage, r.val_loss);
    }
    return 0;
  } catch (const gpt::UsageError& e) {
    return cli::usage_exit("gpt", e, gpt::usage());
  } catch (const std::exception& e) {
    // Under mpirun the other ranks would wait for this one (a missing
    // --data on one rank, say) in their next collective: end the job.
    zest::MpiEnvironment::abort_job(fmt::format("gpt: {}", e.what()));
  }
}
