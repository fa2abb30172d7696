// Trains a Llama-family decoder (model.h: LlamaForCausalLM's modules and
// parameter names) byte by byte on Debian's fortune cookies
// (common/corpus.h) through the ZeRO engine, wrapped around the libtorch
// module by zest::TorchModule: prints loss, validation loss, tokens/s and
// each rank's memory by category, the parameters split into frozen and
// trainable, against the memory estimator.
//
//   llama --ranks 2 --stage 3                    the example's small model, from scratch
//   llama --config config.json --lora 8          a config.json's sizes; rank-8 adapters on
//                                                the projections, the base frozen
//   mpirun -np 4 llama --launch --stage 3        one process per rank (MPI)
//   llama --hf DIR --steps 0 --export-hf OUT     load a Hugging Face checkpoint, write it back
//
// A checkpoint with a vocabulary larger than 256 still trains on byte ids.
// Threads: one torch intra-op thread per rank by default, as in
// examples/gpt/main.cpp (which says why).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "common/corpus.h"
#include "common/describe_model.h"
#include "common/lm_training.h"
#include "common/report.h"
#include "model.h"
#include "options.h"
#include "trainer.h"
#include "zest/comm/mpi_comm.h"
#include "zest/core/check.h"
#include "zest/launch/bootstrap.h"
#include "zest/memory/raw_allocator.h"
#include "zest/torch/lora.h"

namespace {

using Clock = std::chrono::steady_clock;

// Note [flags wired at the merge]: --hf needs the Hugging Face importer (by
// name, allowing the adapters to be missing) and a TorchModule built from
// make_block factories, so that no rank holds every block at once;
// --export-hf the exporter (with merge_lora as its per-unit callback when
// --lora is on, and adapter_config_json beside it); --recompute activation
// checkpointing in TorchModuleOptions. Until this build has them, each is
// refused before any work starts, rather than ignored.
void refuse_unavailable(const llama::Options& opt) {
  ZEST_CHECK(opt.hf_dir.empty(), "--hf {}: loading Hugging Face checkpoints is not available in this build; "
             "train from --config or the default sizes", opt.hf_dir);
  ZEST_CHECK(opt.export_hf_dir.empty(), "--export-hf {}: Hugging Face export is not available in this build; "
             "use --save for a ZEST checkpoint", opt.export_hf_dir);
  ZEST_CHECK(!opt.recompute, "--recompute: activation checkpointing is not available in this build; run without it");
}

zest::LoraOptions lora_options(const llama::Options& opt) {
  zest::LoraOptions l;
  l.r = opt.lora_r;
  l.alpha = opt.lora_alpha;
  return l;
}

void train(const llama::Options& opt, const examples::Corpus& corpus, const zest::EngineConfig& config,
           zest::Communicator& comm) {
  torch::set_num_threads(opt.threads);
  const int world = comm.size(), rank = comm.rank();
  const bool printer = rank == 0;
  zest::CachingAllocator allocator(zest::make_host_allocator());
  zest::Engine engine(config, comm, allocator, zest::Stream::default_for(comm.device()));
  llama::LlamaForCausalLM model(opt.model, opt.seed);
  if (opt.lora_r > 0) llama::enable_lora(*model, lora_options(opt), opt.seed);
  const std::unique_ptr<zest::TorchModule> zt = llama::wrap(engine, model);

  int64_t first = 0;
  if (!opt.load_dir.empty()) {
    zt->load(opt.load_dir);
    first = engine.progress().applied_steps + engine.progress().skipped_steps;
    if (printer) fmt::print("resumed from {} at step {}\n", opt.load_dir, first);
  }
  const int64_t rows = opt.batch / world, context = opt.context;
  const int64_t windows =
      std::min(opt.val_windows, corpus.validation_window_count(context, opt.val_windows)) / world * world;
  ZEST_CHECK(windows > 0, "the validation split has fewer than {} windows of {} bytes: use a smaller --ranks or --context",
             world, context);
  const auto validate = [&](int64_t step) {
    const double v = llama::validation_loss(*zt, *model, corpus, windows, context);
    if (printer) fmt::print("step {:5d}  validation loss {:.4f}  ({} windows of {} bytes)\n", step, v, windows, context);
  };
  if (opt.steps > 0) validate(first);
  double seconds = 0.0;
  for (int64_t step = first; step < first + opt.steps; ++step) {
    const auto start = Clock::now();
    const llama::MicroStep s =
        llama::train_micro_step(*zt, *model, corpus.train_batch(step, rank * rows, rows, context, opt.seed));
    const double dt = std::chrono::duration<double>(Clock::now() - start).count();
    seconds += dt;
    const bool last = step == first + opt.steps - 1;
    // The same decisions on every rank: what follows is collective.
    if ((step - first) % opt.print_every == 0 || last) {
      const float mean = examples::mean_over_ranks(engine, s.loss);
      if (printer) examples::print_step(step, mean, s.result, dt * 1e3, static_cast<double>(opt.batch * context) / dt);
    }
    if ((step + 1 - first) % opt.eval_every == 0 || last) validate(step + 1);
  }
  const std::vector<zest::MemoryReport> memory = examples::gather_memory(engine);
  const zest::MemoryEstimate estimate = zest::estimate_memory(examples::describe_model(engine.layout()),
                                                              zest::EstimateOptions::from_config(config, world));
  if (printer) {
    if (seconds > 0) fmt::print("mean {:.0f} tokens/s\n", static_cast<double>(opt.steps * opt.batch * context) / seconds);
    fmt::print("\nmemory per rank by category (the engine's allocator; torch's activations are not in it):\n{}",
               examples::format_memory(memory, estimate));
    fmt::print("\nparameters on the device, frozen and trainable:\n{}", examples::format_parameter_split(memory, estimate));
  }
  if (!opt.save_dir.empty()) {
    const std::string dir = zt->save(opt.save_dir);
    if (printer) fmt::print("saved {}\n", dir);
  }
  if (printer) std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const llama::Options opt = llama::parse_options(argc, argv);
    refuse_unavailable(opt);
    std::unique_ptr<zest::Communicator> launched;
    if (opt.launch) launched = zest::init_distributed(zest::Device::host(), opt.comm);
    const bool printer = !launched || launched->rank() == 0;
    const int world = launched ? launched->size() : opt.ranks;
    const zest::EngineConfig config = llama::engine_config(opt, world);
    const examples::Corpus corpus = examples::Corpus::load(opt.data);
    if (printer) {
      fmt::print("corpus {}: {} fortune cookies, {} training bytes, {} validation bytes\n", opt.data,
                 corpus.cookies(), corpus.train().size(), corpus.validation().size());
      fmt::print("stage {}: {} ranks, Llama of {} parameters ({}), {}, {}{}\n", opt.stage, world,
                 opt.model.parameters(), opt.model.str(), zest::dtype_name(config.compute_dtype()),
                 zest::optimizer_name(config.optimizer.kind),
                 opt.lora_r > 0 ? fmt::format(", LoRA r {} alpha {:g} on {}", opt.lora_r, opt.lora_alpha,
                                              fmt::join(zest::llama_lora_targets(), ", "))
                                : std::string());
      std::fflush(stdout);
    }
    examples::run_on_ranks(
        launched.get(), opt.ranks, [&](zest::Communicator& comm) { train(opt, corpus, config, comm); }, opt.comm);
    return 0;
  } catch (const llama::UsageError& e) {
    std::fprintf(stderr, "llama: %s\n%s", e.what(), llama::usage().c_str());
    return 2;
  } catch (const std::exception& e) {
    // Under mpirun the other ranks would wait for this one in their next
    // collective: end the job.
    zest::MpiEnvironment::abort_job(fmt::format("llama: {}", e.what()));
  }
}
